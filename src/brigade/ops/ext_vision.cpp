// Vision ops: front-end checks, the widened 16-bit path, and the cpu backend (see
// ext_vision.h). Convolutions run oneDNN's convolution_forward / _backward_data /
// _backward_weights primitives on plain NCHW / OIHW (grouped: GOIHW) memory (no layout
// reorders), or for channels-last activations on NHWC memory with the weights reordered to and
// from the layout the primitive picks; primitives are created once per (shape, stride, padding
// per side, groups, bias, element type, layout) and cached under a mutex, and their scratchpads
// come from the caching allocator; bf16 convolutions with groups 1 run oneDNN's bf16 primitives where
// it has a non-reference kernel (f32 accumulation). Depthwise convolutions (groups == C == O)
// run the direct kernel below instead of oneDNN: for NCHW memory oneDNN 2.6 picks "x64:gemm:jit"
// for them (im2col, then per channel a GEMM with K = KH KW), slower than the direct loops,
// most of all in the weight gradient (timings in docs/architecture.md, "Depthwise
// convolutions").
// The ref backend runs the scalar oracle in ext_vision.h. Batch norm runs one channel per
// OpenMP iteration, pooling and the spatial mean one (H, W) plane per iteration, both with the
// oracle's own per-element code (double accumulators, fixed order), so cpu and ref agree
// closely and the cpu results do not depend on the thread count.
#include "brigade/ops/ext_vision.h"

#include <dnnl.hpp>

#include <mutex>
#include <string>
#include <unordered_map>

#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/ops.h"

namespace brigade::ops {

namespace {

namespace vr = ref::vision;

bool on_cpu() { return current_backend() == Backend::Cpu; }

void check_float(const Tensor& t, const char* op, const char* name) {
  BRIGADE_CHECK(t.defined(), ValueError, "{}: argument '{}' is an undefined tensor", op, name);
  BRIGADE_CHECK(is_floating(t.dtype()), ShapeError,
                "{}: '{}' is {} but must be a floating tensor (f32, bf16 or f16); convert it with ops::cast", op,
                name, t.str());
}
void check_nchw(const Tensor& t, const char* op, const char* name) {
  check_float(t, op, name);
  BRIGADE_CHECK(t.dim() == 4, ShapeError, "{}: '{}' must be 4-D (N, C, H, W), got {}", op, name,
                shape_str(t.shape()));
}
void check_vec(const Tensor& t, int64_t C, const char* op, const char* name) {
  check_float(t, op, name);
  BRIGADE_CHECK(t.dim() == 1 && t.size(0) == C, ShapeError, "{}: '{}' must be ({}) (one value per channel), got {}",
                op, name, C, shape_str(t.shape()));
}
void check_window(int64_t k, int64_t s, int64_t p, const char* op) {
  BRIGADE_CHECK(k >= 1 && s >= 1 && p >= 0, ValueError,
                "{}: kernel {} and stride {} must be >= 1 and padding {} >= 0", op, k, s, p);
}

bool is_half(const Tensor& t) { return t.defined() && (t.dtype() == DType::BF16 || t.dtype() == DType::F16); }
Tensor f32_of(const Tensor& t) { return is_half(t) ? cast(t, DType::F32) : t; }
Tensor round_to(const Tensor& t, DType dt) { return t.defined() && t.dtype() != dt ? cast(t, dt) : t; }
Tensor contig(const Tensor& t) { return t.defined() ? t.contiguous() : t; }
const float* fptr(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
float* fptr_mut(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

// ---------------------------------------------------------------- oneDNN convolutions

using dnnl::memory;

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

struct ConvPrims {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  bool have_bwd_d = false, have_bwd_w = false;
  dnnl::convolution_backward_data::primitive_desc bwd_d_pd;
  dnnl::convolution_backward_data bwd_d;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd;
  dnnl::convolution_backward_weights bwd_w;
};

std::mutex g_conv_mu;
std::unordered_map<std::string, ConvPrims>& conv_cache() {
  static std::unordered_map<std::string, ConvPrims> c;
  return c;
}

// Memory descriptors of one geometry. `t` is the element type of the activations and weights
// (src, wei, dst and their diffs): f32, or bf16 for the native 16-bit path. The bias, its
// gradient and the weight gradient (gwei) are always f32: the 16-bit path rounds gw / gb once
// afterwards (ops::cast), as the contract says. Grouped weights are (G, O/G, C/G, KH, KW)
// goihw, the same bytes as our (O, C/G, KH, KW).
// Channels-last (`cl`): src and dst are NHWC; the primitives choose their weight layouts
// (format_tag::any: with NHWC activations and plain OIHW weights oneDNN 2.6 has only its
// reference kernel), and wei_user / gwei_user are our OIHW tensors, reordered to and from them.
struct ConvMds {
  memory::desc src, wei, bias, dst, gwei;
  memory::desc wei_user, gwei_user;
  memory::dims strides, pad_l, pad_r;
};
ConvMds conv_mds(const vr::ConvGeom& g, memory::data_type t = memory::data_type::f32, bool cl = false) {
  ConvMds m;
  const memory::format_tag act = cl ? memory::format_tag::nhwc : memory::format_tag::nchw;
  m.src = memory::desc({g.N, g.C, g.H, g.W}, t, act);
  if (g.groups == 1) {
    m.wei = memory::desc({g.O, g.C, g.KH, g.KW}, t, memory::format_tag::oihw);
    m.gwei = memory::desc({g.O, g.C, g.KH, g.KW}, memory::data_type::f32, memory::format_tag::oihw);
  } else {
    const memory::dims wd{g.groups, g.Og(), g.Cg(), g.KH, g.KW};
    m.wei = memory::desc(wd, t, memory::format_tag::goihw);
    m.gwei = memory::desc(wd, memory::data_type::f32, memory::format_tag::goihw);
  }
  m.wei_user = m.wei;
  m.gwei_user = m.gwei;
  if (cl) {
    m.wei = memory::desc(m.wei.dims(), t, memory::format_tag::any);
    m.gwei = memory::desc(m.gwei.dims(), memory::data_type::f32, memory::format_tag::any);
  }
  m.bias = memory::desc({g.O}, memory::data_type::f32, memory::format_tag::x);
  m.dst = memory::desc({g.N, g.O, g.OH, g.OW}, t, act);
  m.strides = {g.stride, g.stride};
  m.pad_l = {g.pt, g.pl};
  m.pad_r = {g.pb, g.pr};
  return m;
}

std::string g_last_conv_impl;  // guarded by g_conv_mu

// Every buffer a convolution needs besides its tensors (oneDNN's scratchpad, reordered weights,
// the weight gradient in the primitive's layout), and the batch norm's per-block sums, come from
// the caching allocator as workspace (WorkspaceBuffer):
// oneDNN's own allocations are malloc'ed and freed on every call, and at these sizes glibc maps
// and unmaps them each time, so every step paid page faults and page clearing for them.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}
class WorkspaceBuffer {
 public:
  explicit WorkspaceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_) p_ = Allocator::instance().allocate(bytes_, MemTag::Workspace);
  }
  ~WorkspaceBuffer() {
    if (p_) Allocator::instance().deallocate(p_, bytes_, MemTag::Workspace);
  }
  WorkspaceBuffer(const WorkspaceBuffer&) = delete;
  WorkspaceBuffer& operator=(const WorkspaceBuffer&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  size_t bytes_;
  void* p_ = nullptr;
};

// The cached primitives of one geometry and element type (with bias in the forward and weight
// backward when `bias`); the backward primitives are created on first use. Caller holds
// g_conv_mu.
ConvPrims& conv_prims_locked(const vr::ConvGeom& g, bool bias, bool want_bwd_d, bool want_bwd_w,
                             memory::data_type t = memory::data_type::f32, bool cl = false) {
  const std::string key =
      fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}", g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.stride,
                  g.pt, g.pb, g.pl, g.pr, g.groups, bias ? 1 : 0, int(t), cl ? "nhwc" : "nchw");
  auto it = conv_cache().find(key);
  const ConvMds m = conv_mds(g, t, cl);
  if (it == conv_cache().end()) {
    ConvPrims p;
    auto d = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                    dnnl::algorithm::convolution_direct, m.src, m.wei, m.bias, m.dst,
                                                    m.strides, m.pad_l, m.pad_r)
                  : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                    dnnl::algorithm::convolution_direct, m.src, m.wei, m.dst,
                                                    m.strides, m.pad_l, m.pad_r);
    p.fwd_pd = dnnl::convolution_forward::primitive_desc(d, user_scratchpad(), engine());
    p.fwd = dnnl::convolution_forward(p.fwd_pd);
    it = conv_cache().emplace(key, std::move(p)).first;
  }
  ConvPrims& p = it->second;
  if (want_bwd_d && !p.have_bwd_d) {
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, m.src, m.wei, m.dst, m.strides,
                                            m.pad_l, m.pad_r);
    p.bwd_d_pd = dnnl::convolution_backward_data::primitive_desc(d, user_scratchpad(), engine(), p.fwd_pd);
    p.bwd_d = dnnl::convolution_backward_data(p.bwd_d_pd);
    p.have_bwd_d = true;
  }
  if (want_bwd_w && !p.have_bwd_w) {
    auto d = bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, m.src, m.gwei,
                                                             m.bias, m.dst, m.strides, m.pad_l, m.pad_r)
                  : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, m.src, m.gwei,
                                                             m.dst, m.strides, m.pad_l, m.pad_r);
    p.bwd_w_pd = dnnl::convolution_backward_weights::primitive_desc(d, user_scratchpad(), engine(), p.fwd_pd);
    p.bwd_w = dnnl::convolution_backward_weights(p.bwd_w_pd);
    p.have_bwd_w = true;
  }
  return p;
}

memory mem(const memory::desc& d, const void* p) { return memory(d, engine(), const_cast<void*>(p)); }

// Our weights (user layout) as a primitive wants them: the same memory when the layouts agree,
// else a reorder into a fresh buffer (channels-last primitives pick blocked weight layouts).
memory weights_as(const memory::desc& want, const memory::desc& user, const void* w, dnnl::stream& s,
                  WorkspaceBuffer& buf) {
  memory u = mem(user, w);
  if (want == user) return u;
  memory r(want, engine(), buf.get());
  dnnl::reorder(u, r).execute(s, u, r);
  return r;
}
size_t reorder_bytes(const memory::desc& want, const memory::desc& user) {
  return want == user ? 0 : want.get_size();
}

// x, w, y hold elements of type t (f32 or bf16); b is f32 or null. cl: NHWC x and y.
void cpu_conv2d(const vr::ConvGeom& g, const void* x, const void* w, const float* b, void* y,
                memory::data_type t = memory::data_type::f32, bool cl = false) {
  dnnl::convolution_forward prim;
  memory::desc wei, scratch;
  {
    std::lock_guard<std::mutex> lock(g_conv_mu);
    ConvPrims& p = conv_prims_locked(g, b != nullptr, false, false, t, cl);
    prim = p.fwd;
    wei = p.fwd_pd.weights_desc();
    scratch = p.fwd_pd.scratchpad_desc();
    g_last_conv_impl = fmt::format("{} {}{}", p.fwd_pd.impl_info_str(), t == memory::data_type::bf16 ? "bf16" : "f32",
                                   cl ? " nhwc" : "");
  }
  const ConvMds m = conv_mds(g, t, cl);
  dnnl::stream s(engine());
  WorkspaceBuffer wbuf(reorder_bytes(wei, m.wei_user)), sbuf(scratch.get_size());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(m.src, x)},
                                       {DNNL_ARG_WEIGHTS, weights_as(wei, m.wei_user, w, s, wbuf)},
                                       {DNNL_ARG_DST, mem(m.dst, y)},
                                       {DNNL_ARG_SCRATCHPAD, memory(scratch, engine(), sbuf.get())}};
  if (b) args.emplace(DNNL_ARG_BIAS, mem(m.bias, b));
  prim.execute(s, args);
  s.wait();
}

// gy, x, w, gx hold elements of type t (f32 or bf16); gw and gb are f32 (either may be null).
void cpu_conv2d_backward(const vr::ConvGeom& g, const void* gy, const void* x, const void* w, void* gx, float* gw,
                         float* gb, memory::data_type t = memory::data_type::f32, bool cl = false) {
  // The weight primitive computes gw and gb together; a gb without gw goes to scratch.
  const WorkspaceBuffer gw_scratch(gb && !gw ? size_t(g.O * g.Cg() * g.KH * g.KW) * sizeof(float) : 0);
  if (gb && !gw) gw = gw_scratch.as<float>();
  dnnl::convolution_backward_data bd;
  dnnl::convolution_backward_weights bw;
  memory::desc bd_wei, bw_gwei, bd_scratch, bw_scratch;
  {
    std::lock_guard<std::mutex> lock(g_conv_mu);
    ConvPrims& p = conv_prims_locked(g, gb != nullptr, gx != nullptr, gw != nullptr, t, cl);
    if (gx) bd = p.bwd_d, bd_wei = p.bwd_d_pd.weights_desc(), bd_scratch = p.bwd_d_pd.scratchpad_desc();
    if (gw) bw = p.bwd_w, bw_gwei = p.bwd_w_pd.diff_weights_desc(), bw_scratch = p.bwd_w_pd.scratchpad_desc();
  }
  const ConvMds m = conv_mds(g, t, cl);
  dnnl::stream s(engine());
  if (gx) {
    WorkspaceBuffer wbuf(reorder_bytes(bd_wei, m.wei_user)), sbuf(bd_scratch.get_size());
    bd.execute(s, {{DNNL_ARG_DIFF_DST, mem(m.dst, gy)},
                   {DNNL_ARG_WEIGHTS, weights_as(bd_wei, m.wei_user, w, s, wbuf)},
                   {DNNL_ARG_DIFF_SRC, mem(m.src, gx)},
                   {DNNL_ARG_SCRATCHPAD, memory(bd_scratch, engine(), sbuf.get())}});
    s.wait();  // before the buffers go back to the allocator
  }
  if (gw) {
    // the primitive's own weight-gradient layout, reordered into our f32 OIHW afterwards
    WorkspaceBuffer gbuf(reorder_bytes(bw_gwei, m.gwei_user)), sbuf(bw_scratch.get_size());
    memory user = mem(m.gwei_user, gw);
    memory gwm = bw_gwei == m.gwei_user ? user : memory(bw_gwei, engine(), gbuf.get());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(m.src, x)}, {DNNL_ARG_DIFF_DST, mem(m.dst, gy)},
                                         {DNNL_ARG_DIFF_WEIGHTS, gwm},
                                         {DNNL_ARG_SCRATCHPAD, memory(bw_scratch, engine(), sbuf.get())}};
    if (gb) args.emplace(DNNL_ARG_DIFF_BIAS, mem(m.bias, gb));
    bw.execute(s, args);
    if (!(bw_gwei == m.gwei_user)) dnnl::reorder(gwm, user).execute(s, gwm, user);
    s.wait();
  }
}

// oneDNN has a non-reference bf16 convolution (forward, backward data and weights) on this
// CPU: probed once on a small 3x3 geometry (AVX512-BF16 or AMX machines have one; elsewhere
// oneDNN would only offer its slow reference kernel, and the widened f32 path is used).
bool bf16_conv_available() {
  static std::once_flag once;
  static bool avail = false;
  std::call_once(once, [] {
    try {
      const vr::ConvGeom g{2, 8, 8, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8};
      const ConvMds m = conv_mds(g, memory::data_type::bf16);
      dnnl::convolution_forward::primitive_desc f(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                          m.src, m.wei, m.dst, m.strides, m.pad_l, m.pad_r),
          engine());
      dnnl::convolution_backward_data::primitive_desc d(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, m.src, m.wei, m.dst, m.strides,
                                                m.pad_l, m.pad_r),
          engine(), f);
      dnnl::convolution_backward_weights::primitive_desc w(
          dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, m.src, m.gwei, m.dst,
                                                   m.strides, m.pad_l, m.pad_r),
          engine(), f);
      avail = true;
      for (const char* impl : {f.impl_info_str(), d.impl_info_str(), w.impl_info_str()})
        avail = avail && std::string(impl).find("ref") == std::string::npos;
    } catch (const dnnl::error&) {
      avail = false;
    }
  });
  return avail;
}

// Output size of a window with padding lo and hi: (in + lo + hi - k) / stride + 1.
int64_t conv_out_size2(int64_t in, int64_t k, int64_t stride, int64_t lo, int64_t hi, const char* op) {
  const int64_t span = in + lo + hi - k;
  const int64_t o = span >= 0 ? span / stride + 1 : 0;
  BRIGADE_CHECK(o >= 1, ShapeError,
                "{}: a window of {} with padding {} + {} does not fit an input of size {}; use a larger input or "
                "padding",
                op, k, lo, hi, in);
  return o;
}

vr::ConvGeom conv_geom(const Tensor& x, const Tensor& w, const Conv2dParams& p, const char* op) {
  check_nchw(x, op, "x");
  check_nchw(w, op, "w");
  BRIGADE_CHECK(p.stride >= 1 && p.pad_top >= 0 && p.pad_bottom >= 0 && p.pad_left >= 0 && p.pad_right >= 0,
                ValueError, "{}: stride {} must be >= 1 and padding (top {}, bottom {}, left {}, right {}) >= 0", op,
                p.stride, p.pad_top, p.pad_bottom, p.pad_left, p.pad_right);
  // channels-last x is (N, H, W, C)
  const int64_t C = p.channels_last ? x.size(3) : x.size(1), H = p.channels_last ? x.size(1) : x.size(2),
                W = p.channels_last ? x.size(2) : x.size(3);
  const char* layout = p.channels_last ? "channels-last (N, H, W, C)" : "(N, C, H, W)";
  BRIGADE_CHECK(p.groups >= 1 && C % p.groups == 0 && w.size(0) % p.groups == 0, ShapeError,
                "{}: groups {} must be >= 1 and divide the input channels of x {} {} and the output channels of w {}",
                op, p.groups, layout, shape_str(x.shape()), shape_str(w.shape()));
  BRIGADE_CHECK(w.size(1) * p.groups == C, ShapeError,
                "{}: w {} expects {} input channels per group but x {} {} has {} in {} group(s); w must be "
                "(O, C / groups, KH, KW)",
                op, shape_str(w.shape()), w.size(1), layout, shape_str(x.shape()), C, p.groups);
  vr::ConvGeom g{x.size(0), C, H, W, w.size(0), w.size(2), w.size(3), p.stride, p.pad_top,
                 p.pad_bottom, p.pad_left, p.pad_right, p.groups, 0, 0};
  g.OH = conv_out_size2(g.H, g.KH, p.stride, p.pad_top, p.pad_bottom, op);
  g.OW = conv_out_size2(g.W, g.KW, p.stride, p.pad_left, p.pad_right, op);
  return g;
}

// ---------------------------------------------------------------- direct depthwise convolution
// groups == C == O on plain NCHW memory. oneDNN 2.6's depthwise jit kernels need blocked or
// NHWC layouts; for NCHW it runs im2col + a GEMM per channel (x64:gemm:jit), which loses to
// these loops (docs/architecture.md, "Depthwise convolutions"). Each (n, c) plane is independent: the forward and the data gradient run one
// plane per OpenMP iteration, accumulating each output row in float over (kh, kw) in order
// (bias first), vectorised along the row; the weight and bias gradients run one channel per
// iteration, a float sum per (n, kh, kw) plane added in double over n in order. Every element
// has one fixed summation order: bitwise reproducible whatever the thread count.

bool is_depthwise(const vr::ConvGeom& g) { return g.groups > 1 && g.groups == g.C && g.O == g.C; }

// Range [lo, hi) of output columns ow whose input column ow s - pl + kw lies in [0, W).
inline void valid_cols(int64_t W, int64_t OW, int64_t s, int64_t pl, int64_t kw, int64_t& lo, int64_t& hi) {
  const int64_t a = pl - kw;  // iw = ow s - a >= 0  <=>  ow >= ceil(a / s)
  lo = a > 0 ? (a + s - 1) / s : 0;
  const int64_t b = W - 1 + pl - kw;  // iw <= W - 1  <=>  ow <= floor(b / s)
  hi = b < 0 ? 0 : std::min(OW, b / s + 1);
  lo = std::min(lo, hi);
}
// valid_cols for every kw, computed once per call (the divisions stay out of the row loops).
struct ColRanges {
  std::vector<int64_t> lo, hi;
  explicit ColRanges(const vr::ConvGeom& g) : lo(size_t(g.KW)), hi(size_t(g.KW)) {
    for (int64_t kw = 0; kw < g.KW; ++kw) valid_cols(g.W, g.OW, g.stride, g.pl, kw, lo[size_t(kw)], hi[size_t(kw)]);
  }
};

void depthwise_forward(const vr::ConvGeom& g, const float* x, const float* w, const float* b, float* y) {
  const ColRanges cr(g);
  const int64_t P = g.N * g.C, HW = g.H * g.W, OHW = g.OH * g.OW, s = g.stride;
#pragma omp parallel for schedule(static) if (P * HW > (1 << 15))
  for (int64_t p = 0; p < P; ++p) {
    const int64_t c = p % g.C;
    const float* xp = x + p * HW;
    const float* wc = w + c * g.KH * g.KW;
    float* yp = y + p * OHW;
    const float bv = b ? b[c] : 0.f;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      float* yr = yp + oh * g.OW;
      for (int64_t ow = 0; ow < g.OW; ++ow) yr[ow] = bv;
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * s - g.pt + kh;
        if (ih < 0 || ih >= g.H) continue;
        const float* xr = xp + ih * g.W;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t lo = cr.lo[size_t(kw)], hi = cr.hi[size_t(kw)];
          const float wv = wc[kh * g.KW + kw];
          const float* xs = xr - g.pl + kw;  // xs[ow s] is x[ih, ow s - pl + kw]
          if (s == 1) {
#pragma omp simd
            for (int64_t ow = lo; ow < hi; ++ow) yr[ow] += wv * xs[ow];
          } else {  // strided: scalar (gathers measured slower)
            for (int64_t ow = lo; ow < hi; ++ow) yr[ow] += wv * xs[ow * s];
          }
        }
      }
    }
  }
}

void depthwise_backward_data(const vr::ConvGeom& g, const float* gy, const float* w, float* gx) {
  const ColRanges cr(g);
  const int64_t P = g.N * g.C, HW = g.H * g.W, OHW = g.OH * g.OW, s = g.stride;
#pragma omp parallel for schedule(static) if (P * HW > (1 << 15))
  for (int64_t p = 0; p < P; ++p) {
    const int64_t c = p % g.C;
    const float* gp = gy + p * OHW;
    const float* wc = w + c * g.KH * g.KW;
    float* xp = gx + p * HW;
    std::fill(xp, xp + HW, 0.f);
    // forward: y[oh, ow] += w[kh, kw] x[oh s - pt + kh, ow s - pl + kw]  -> scatter gy back
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const float* gr = gp + oh * g.OW;
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * s - g.pt + kh;
        if (ih < 0 || ih >= g.H) continue;
        float* xr = xp + ih * g.W;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t lo = cr.lo[size_t(kw)], hi = cr.hi[size_t(kw)];
          const float wv = wc[kh * g.KW + kw];
          float* xs = xr - g.pl + kw;
          if (s == 1) {
#pragma omp simd
            for (int64_t ow = lo; ow < hi; ++ow) xs[ow] += wv * gr[ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) xs[ow * s] += wv * gr[ow];
          }
        }
      }
    }
  }
}

// gw (C, 1, KH, KW) and gb (C); either may be null.
void depthwise_backward_weights(const vr::ConvGeom& g, const float* gy, const float* x, float* gw, float* gb) {
  const ColRanges cr(g);
  const int64_t HW = g.H * g.W, OHW = g.OH * g.OW, s = g.stride, K = g.KH * g.KW;
#pragma omp parallel for schedule(static) if (g.N * g.C * HW > (1 << 15))
  for (int64_t c = 0; c < g.C; ++c) {
    std::vector<double> acc(static_cast<size_t>(K), 0.0);
    double bacc = 0;
    for (int64_t n = 0; n < g.N; ++n) {
      const float* gp = gy + (n * g.C + c) * OHW;
      const float* xp = x + (n * g.C + c) * HW;
      if (gb) {
        float sb = 0.f;
#pragma omp simd reduction(+ : sb)
        for (int64_t i = 0; i < OHW; ++i) sb += gp[i];
        bacc += double(sb);
      }
      if (!gw) continue;
      for (int64_t kh = 0; kh < g.KH; ++kh)
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t lo = cr.lo[size_t(kw)], hi = cr.hi[size_t(kw)];
          float sum = 0.f;
          for (int64_t oh = 0; oh < g.OH; ++oh) {
            const int64_t ih = oh * s - g.pt + kh;
            if (ih < 0 || ih >= g.H) continue;
            const float* gr = gp + oh * g.OW;
            const float* xs = xp + ih * g.W - g.pl + kw;
            float r = 0.f;
            if (s == 1) {
#pragma omp simd reduction(+ : r)
              for (int64_t ow = lo; ow < hi; ++ow) r += gr[ow] * xs[ow];
            } else {  // strided: scalar (gathers measured slower)
              for (int64_t ow = lo; ow < hi; ++ow) r += gr[ow] * xs[ow * s];
            }
            sum += r;
          }
          acc[size_t(kh * g.KW + kw)] += double(sum);
        }
    }
    if (gw)
      for (int64_t k = 0; k < K; ++k) gw[c * K + k] = float(acc[size_t(k)]);
    if (gb) gb[c] = float(bacc);
  }
}

// Pooling windows: (N C) planes of x (N, C, H, W).
struct PoolGeom {
  int64_t P, H, W, OH, OW;
};
PoolGeom pool_geom(const Shape& xs, int64_t k, int64_t s, int64_t p, const char* op) {
  check_window(k, s, p, op);
  BRIGADE_CHECK(xs.size() == 4, ShapeError, "{}: x must be 4-D (N, C, H, W), got {}", op, shape_str(xs));
  BRIGADE_CHECK(2 * p <= k, ValueError, "{}: padding {} must be at most half the kernel {} (as torch requires)", op,
                p, k);
  return {xs[0] * xs[1], xs[2], xs[3], conv_out_size(xs[2], k, s, p, op), conv_out_size(xs[3], k, s, p, op)};
}

// plane(p) for each of the P (N * C) planes of a pooling op, of HW input values each: in parallel
// on the cpu backend above 2^15 input values (planes are independent: the thread count changes
// nothing).
template <class F>
void for_each_plane(int64_t P, int64_t HW, F plane) {
  const bool par = on_cpu() && P * HW > (1 << 15);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t p = 0; p < P; ++p) plane(p);
}

}  // namespace

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, const char* op) {
  const int64_t o = in + 2 * pad - k >= 0 ? (in + 2 * pad - k) / stride + 1 : 0;
  BRIGADE_CHECK(o >= 1, ShapeError,
                "{}: a window of {} with padding {} does not fit an input of size {}; use a larger input or padding",
                op, k, pad, in);
  return o;
}

// ---------------------------------------------------------------- conv2d

bool conv2d_native_bf16() { return bf16_conv_available(); }

std::string last_conv2d_impl() {
  std::lock_guard<std::mutex> lock(g_conv_mu);
  return g_last_conv_impl;
}

// A channels-last tensor (N, H, W, C) as an NCHW view, and back (contiguous).
Tensor nchw_view(const Tensor& t) { return t.permute({0, 3, 1, 2}); }
Tensor nhwc_of(const Tensor& t) { return t.defined() ? t.permute({0, 2, 3, 1}).contiguous() : t; }
Conv2dParams nchw_params(Conv2dParams p) {
  p.channels_last = false;
  return p;
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  const vr::ConvGeom g = conv_geom(x, w, p, "conv2d");
  if (bias.defined()) check_vec(bias, g.O, "conv2d", "bias");
  const bool cl = p.channels_last;
  // the ref backend has the NCHW oracle only: the same convolution on permuted copies
  if (cl && !on_cpu()) return nhwc_of(conv2d(nchw_view(x), w, bias, nchw_params(p)));
  const Shape ys = cl ? Shape{g.N, g.OH, g.OW, g.O} : Shape{g.N, g.O, g.OH, g.OW};
  if (on_cpu() && g.groups == 1 && x.dtype() == DType::BF16 && w.dtype() == DType::BF16 && bf16_conv_available()) {
    // native: oneDNN's bf16 convolution, f32 accumulation, the output rounded once to bf16
    const Tensor xc = x.contiguous(), wc = w.contiguous(), bc = contig(f32_of(bias));
    Tensor y = Tensor::empty(ys, DType::BF16);  // (N, O, OH, OW) or channels-last (N, OH, OW, O)
    cpu_conv2d(g, xc.raw_data(), wc.raw_data(), fptr(bc), y.raw_data(), memory::data_type::bf16, cl);
    return y;
  }
  if (is_half(x) || is_half(w) || is_half(bias)) {
    const DType ot = x.dtype() == w.dtype() ? x.dtype() : DType::F32;
    return round_to(conv2d(f32_of(x), f32_of(w), f32_of(bias), p), ot);
  }
  const Tensor xc = x.contiguous(), wc = w.contiguous(), bc = contig(bias);
  Tensor y = Tensor::empty(ys);  // (N, O, OH, OW) or channels-last (N, OH, OW, O)
  if (cl) {  // oneDNN has depthwise kernels of its own for NHWC
    cpu_conv2d(g, xc.data<float>(), wc.data<float>(), fptr(bc), y.data<float>(), memory::data_type::f32, true);
  } else if (on_cpu() && is_depthwise(g)) {
    depthwise_forward(g, xc.data<float>(), wc.data<float>(), fptr(bc), y.data<float>());
    std::lock_guard<std::mutex> lock(g_conv_mu);
    g_last_conv_impl = "direct_depthwise f32";
  } else if (on_cpu()) {
    cpu_conv2d(g, xc.data<float>(), wc.data<float>(), fptr(bc), y.data<float>());
  } else {
    vr::conv2d<float>(g, xc.data<float>(), wc.data<float>(), fptr(bc), y.data<float>());
  }
  return y;
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding) {
  return conv2d(x, w, bias, Conv2dParams::symmetric(stride, padding));
}

Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dParams& p, bool need_gx,
                            bool need_gw, bool need_gb) {
  const vr::ConvGeom g = conv_geom(x, w, p, "conv2d_backward");
  check_nchw(gy, "conv2d_backward", "gy");
  const bool cl = p.channels_last;
  const Shape ys = cl ? Shape{g.N, g.OH, g.OW, g.O} : Shape{g.N, g.O, g.OH, g.OW};
  BRIGADE_CHECK(gy.shape() == ys, ShapeError, "conv2d_backward: gy must be the output's shape {}, got {}",
                shape_str(ys), shape_str(gy.shape()));
  if (cl && !on_cpu()) {  // the NCHW oracle on permuted copies, as the forward
    Conv2dGrads r = conv2d_backward(nchw_view(gy), nchw_view(x), w, nchw_params(p), need_gx, need_gw, need_gb);
    r.gx = nhwc_of(r.gx);
    return r;
  }
  if (on_cpu() && g.groups == 1 && gy.dtype() == DType::BF16 && x.dtype() == DType::BF16 &&
      w.dtype() == DType::BF16 && bf16_conv_available()) {
    // native: bf16 operands, f32 accumulation; gx written in bf16 by oneDNN, gw and gb
    // computed in f32 and rounded once to bf16
    const Tensor gyc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous();
    Conv2dGrads r;
    Tensor gw32, gb32;
    if (need_gx) r.gx = Tensor::empty(x.shape(), DType::BF16);  // x's shape and layout
    if (need_gw) gw32 = Tensor::empty(w.shape());               // (O, C, KH, KW) f32
    if (need_gb) gb32 = Tensor::empty({g.O});                   // (O) f32
    if (!need_gx && !need_gw && !need_gb) return r;
    cpu_conv2d_backward(g, gyc.raw_data(), xc.raw_data(), wc.raw_data(), need_gx ? r.gx.raw_data() : nullptr,
                        fptr_mut(gw32), fptr_mut(gb32), memory::data_type::bf16, cl);
    r.gw = round_to(gw32, DType::BF16);
    r.gb = round_to(gb32, DType::BF16);
    return r;
  }
  if (is_half(gy) || is_half(x) || is_half(w)) {
    Conv2dGrads r = conv2d_backward(f32_of(gy), f32_of(x), f32_of(w), p, need_gx, need_gw, need_gb);
    r.gx = round_to(r.gx, x.dtype());
    r.gw = round_to(r.gw, w.dtype());
    r.gb = round_to(r.gb, gy.dtype());
    return r;
  }
  const Tensor gyc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous();
  Conv2dGrads r;
  if (need_gx) r.gx = Tensor::empty(x.shape());  // x's shape and layout
  if (need_gw) r.gw = Tensor::empty(w.shape());  // (O, C / G, KH, KW)
  if (need_gb) r.gb = Tensor::empty({g.O});      // (O)
  if (!need_gx && !need_gw && !need_gb) return r;
  if (cl) {
    cpu_conv2d_backward(g, gyc.data<float>(), xc.data<float>(), wc.data<float>(), fptr_mut(r.gx), fptr_mut(r.gw),
                        fptr_mut(r.gb), memory::data_type::f32, true);
  } else if (on_cpu() && is_depthwise(g)) {
    if (need_gx) depthwise_backward_data(g, gyc.data<float>(), wc.data<float>(), r.gx.data<float>());
    if (need_gw || need_gb)
      depthwise_backward_weights(g, gyc.data<float>(), xc.data<float>(), fptr_mut(r.gw), fptr_mut(r.gb));
  } else if (on_cpu()) {
    cpu_conv2d_backward(g, gyc.data<float>(), xc.data<float>(), wc.data<float>(), fptr_mut(r.gx), fptr_mut(r.gw),
                        fptr_mut(r.gb));
  } else {
    vr::conv2d_backward<float>(g, gyc.data<float>(), xc.data<float>(), wc.data<float>(), fptr_mut(r.gx),
                               fptr_mut(r.gw), fptr_mut(r.gb));
  }
  return r;
}

Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, int64_t stride, int64_t padding,
                            bool need_gx, bool need_gw, bool need_gb) {
  return conv2d_backward(gy, x, w, Conv2dParams::symmetric(stride, padding), need_gx, need_gw, need_gb);
}

// ---------------------------------------------------------------- batch norm

// ---------------------------------------------------------------- cpu kernels (batch norm, relu)
// Branch-free and vectorisable; statistics accumulate each (n, c) row of HW values in float
// (16-lane partial sums), then the rows in double, in a fixed order per channel: bitwise
// reproducible for any thread count (one channel per iteration). The ref templates above are
// the double oracle the op harness compares against.
namespace {

// Sum of a row, and sum of (x - m)^2 when `m` is given, as float partial sums in lane order.
inline float row_sum(const float* x, int64_t n) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) acc[l] += x[i + l];
  float s = 0;
  for (; i < n; ++i) s += x[i];
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}
inline float row_sq_dev(const float* x, int64_t n, float m) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) {
      const float d = x[i + l] - m;
      acc[l] += d * d;
    }
  float s = 0;
  for (; i < n; ++i) s += (x[i] - m) * (x[i] - m);
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}
// sum(gy) and sum(gy * (x - m)) of a row.
inline void row_grad_sums(const float* gy, const float* x, int64_t n, float m, float& sg, float& sgx) {
  float a[16] = {0}, b[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) {
      a[l] += gy[i + l];
      b[l] += gy[i + l] * (x[i + l] - m);
    }
  float s0 = 0, s1 = 0;
  for (; i < n; ++i) s0 += gy[i], s1 += gy[i] * (x[i] - m);
  for (int l = 0; l < 16; ++l) s0 += a[l], s1 += b[l];
  sg = s0, sgx = s1;
}

// 16-bit (or f32) values seen as f32: f32 is read in place, bf16 and f16 are widened exactly
// into a buffer (cpu::load_f32, the conversions of ops::cast), so the arithmetic below is the
// f32 kernel's on the same values and a 16-bit input gives bitwise the widened result.
inline const float* f32_view(DType dt, const void* p, int64_t off, int64_t n, float* buf) {
  if (dt == DType::F32) return static_cast<const float*>(p) + off;
  cpu::load_f32(dt, n, static_cast<const char*>(p) + size_t(off) * dtype_size(dt), buf);
  return buf;
}
// Where a result of n values at element offset off goes: in place for f32, else a buffer that
// store_out then rounds once into dt.
inline float* f32_out(DType dt, void* p, int64_t off, float* buf) {
  return dt == DType::F32 ? static_cast<float*>(p) + off : buf;
}
inline void store_out(DType dt, void* p, int64_t off, int64_t n, const float* buf) {
  if (dt != DType::F32) cpu::store_f32(dt, n, buf, static_cast<char*>(p) + size_t(off) * dtype_size(dt));
}
// A per-thread scratch row of n floats, for 16-bit rows only (f32 rows are read in place).
inline std::vector<float> scratch_row(DType dt, int64_t n) {
  return std::vector<float>(dt == DType::F32 ? 0 : static_cast<size_t>(n));
}

// NCHW batch norm; x and y of dtype dt (f32, bf16 or f16), everything else f32.
void batch_norm2d_cpu(int64_t N, int64_t C, int64_t HW, DType dt, const void* x, const float* w, const float* b,
                      bool training, const float* rmean, const float* rvar, double eps, void* y, float* mean,
                      float* rstd, float* var_out) {
#pragma omp parallel if (N * C * HW > (1 << 15))
  {
    std::vector<float> xb = scratch_row(dt, HW), yb = scratch_row(dt, HW);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      double m, v;
      if (training) {
        const double M = double(N * HW);
        double s = 0;
        for (int64_t n = 0; n < N; ++n) s += double(row_sum(f32_view(dt, x, (n * C + c) * HW, HW, xb.data()), HW));
        m = s / M;
        double q = 0;
        for (int64_t n = 0; n < N; ++n)
          q += double(row_sq_dev(f32_view(dt, x, (n * C + c) * HW, HW, xb.data()), HW, float(m)));
        v = q / M;
      } else {
        m = double(rmean[c]);
        v = double(rvar[c]);
      }
      const double r = 1.0 / std::sqrt(v + eps);
      mean[c] = float(m);
      rstd[c] = float(r);
      var_out[c] = float(v);
      const float scale = float(r * double(w[c])), shift = float((b ? double(b[c]) : 0.0) - m * r * double(w[c]));
      for (int64_t n = 0; n < N; ++n) {
        const int64_t off = (n * C + c) * HW;
        const float* xr = f32_view(dt, x, off, HW, xb.data());
        float* yr = f32_out(dt, y, off, yb.data());
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) yr[i] = xr[i] * scale + shift;
        store_out(dt, y, off, HW, yr);
      }
    }
  }
}

// NCHW backward; gy of dtype dg, x and gx of dtype dx, the rest f32.
void batch_norm2d_backward_cpu(int64_t N, int64_t C, int64_t HW, DType dg, const void* gy, DType dx, const void* x,
                               const float* w, const float* mean, const float* rstd, bool training, void* gx,
                               float* gw, float* gb) {
  const double M = double(N * HW);
#pragma omp parallel if (N * C * HW > (1 << 15))
  {
    std::vector<float> gbuf = scratch_row(dg, HW), xb = scratch_row(dx, HW), ob = scratch_row(dx, HW);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      const float m = mean[c];
      const double r = double(rstd[c]), wc = double(w[c]);
      double sg = 0, sgxm = 0;  // sum gy, sum gy (x - m)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t off = (n * C + c) * HW;
        float a, bsum;
        row_grad_sums(f32_view(dg, gy, off, HW, gbuf.data()), f32_view(dx, x, off, HW, xb.data()), HW, m, a, bsum);
        sg += double(a), sgxm += double(bsum);
      }
      const double sgx = sgxm * r;  // sum gy * xhat
      gw[c] = float(sgx);
      gb[c] = float(sg);
      // training: gx = w r (gy - sg/M - xhat sgx/M) = k1 gy + k2 (x - m) + k3; eval: gx = w r gy
      const float k1 = float(wc * r);
      const float k2 = training ? float(-wc * r * r * sgx / M) : 0.f;
      const float k3 = training ? float(-wc * r * sg / M) : 0.f;
      for (int64_t n = 0; n < N; ++n) {
        const int64_t off = (n * C + c) * HW;
        const float* g = f32_view(dg, gy, off, HW, gbuf.data());
        const float* xr = f32_view(dx, x, off, HW, xb.data());
        float* o = f32_out(dx, gx, off, ob.data());
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) o[i] = k1 * g[i] + k2 * (xr[i] - m) + k3;
        store_out(dx, gx, off, HW, o);
      }
    }
  }
}

// Channels-last batch norm: x is M = N H W rows of C channels. Per-channel sums run over fixed
// blocks of kRowBlock rows (one double per channel per block, vectorised along the row), then
// the blocks are added in order: the same order for any thread count.
constexpr int64_t kRowBlock = 64;
// 16-bit rows are widened kChunk channels at a time (a stack buffer; each channel's arithmetic
// is independent of the chunking).
constexpr int64_t kChunk = 256;

// out[k] = sum over the M rows of what add_row(r, acc) adds into acc[0, K), in a fixed order.
template <class RowFn>
void column_sums_blocked(int64_t M, int64_t K, double* out, RowFn&& add_row) {
  const int64_t nb = (M + kRowBlock - 1) / kRowBlock;
  const WorkspaceBuffer buf(size_t(nb * K) * sizeof(double));
  double* part = buf.as<double>();
#pragma omp parallel for schedule(static) if (M * K > (1 << 15))
  for (int64_t blk = 0; blk < nb; ++blk) {
    double* acc = part + blk * K;
    for (int64_t k = 0; k < K; ++k) acc[k] = 0;
    const int64_t r1 = std::min(M, (blk + 1) * kRowBlock);
    for (int64_t r = blk * kRowBlock; r < r1; ++r) add_row(r, acc);
  }
  for (int64_t k = 0; k < K; ++k) out[k] = 0;
  for (int64_t blk = 0; blk < nb; ++blk) {
    const double* acc = part + blk * K;
#pragma omp simd
    for (int64_t k = 0; k < K; ++k) out[k] += acc[k];
  }
}

// f(c0, n, ...) on the channel chunks [c0, c0 + n) of row r (C channels per row).
template <class F>
inline void for_chunks(int64_t C, F&& f) {
  for (int64_t c0 = 0; c0 < C; c0 += kChunk) f(c0, std::min(kChunk, C - c0));
}

// Channels-last batch norm; x and y of dtype dt, the rest f32.
void batch_norm_rows_cpu(int64_t M, int64_t C, DType dt, const void* x, const float* w, const float* b,
                         bool training, const float* rmean, const float* rvar, double eps, void* y, float* mean,
                         float* rstd, float* var_out) {
  std::vector<double> m(static_cast<size_t>(C)), v(static_cast<size_t>(C));
  std::vector<float> mf(static_cast<size_t>(C));
  if (training) {
    column_sums_blocked(M, C, m.data(), [&](int64_t r, double* acc) {
      for_chunks(C, [&](int64_t c0, int64_t n) {
        alignas(64) float buf[kChunk];
        const float* xr = f32_view(dt, x, r * C + c0, n, buf);
        double* a = acc + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) a[c] += double(xr[c]);
      });
    });
    for (int64_t c = 0; c < C; ++c) m[size_t(c)] /= double(M), mf[size_t(c)] = float(m[size_t(c)]);
    const float* mp = mf.data();
    column_sums_blocked(M, C, v.data(), [&](int64_t r, double* acc) {
      for_chunks(C, [&](int64_t c0, int64_t n) {
        alignas(64) float buf[kChunk];
        const float* xr = f32_view(dt, x, r * C + c0, n, buf);
        const float* mc = mp + c0;
        double* a = acc + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) {
          const float d = xr[c] - mc[c];
          a[c] += double(d * d);
        }
      });
    });
    for (int64_t c = 0; c < C; ++c) v[size_t(c)] /= double(M);
  } else {
    for (int64_t c = 0; c < C; ++c) m[size_t(c)] = double(rmean[c]), v[size_t(c)] = double(rvar[c]);
  }
  std::vector<float> scale(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double r = 1.0 / std::sqrt(v[size_t(c)] + eps);
    mean[c] = float(m[size_t(c)]);
    rstd[c] = float(r);
    var_out[c] = float(v[size_t(c)]);
    scale[size_t(c)] = float(r * double(w[c]));
    shift[size_t(c)] = float((b ? double(b[c]) : 0.0) - m[size_t(c)] * r * double(w[c]));
  }
  const float *sc = scale.data(), *sh = shift.data();
#pragma omp parallel for schedule(static) if (M * C > (1 << 15))
  for (int64_t r = 0; r < M; ++r) {
    for_chunks(C, [&](int64_t c0, int64_t n) {
      alignas(64) float xb[kChunk], yb[kChunk];
      const int64_t off = r * C + c0;
      const float* xr = f32_view(dt, x, off, n, xb);
      float* yr = f32_out(dt, y, off, yb);
      const float *s0 = sc + c0, *s1 = sh + c0;
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) yr[c] = xr[c] * s0[c] + s1[c];
      store_out(dt, y, off, n, yr);
    });
  }
}

// Channels-last backward; gy of dtype dg, x and gx of dtype dx, the rest f32.
void batch_norm_rows_backward_cpu(int64_t M, int64_t C, DType dg, const void* gy, DType dx, const void* x,
                                  const float* w, const float* mean, const float* rstd, bool training, void* gx,
                                  float* gw, float* gb) {
  // sums[c] = sum gy, sums[C + c] = sum gy (x - m), in one pass over gy and x
  std::vector<double> sums(static_cast<size_t>(2 * C));
  column_sums_blocked(M, 2 * C, sums.data(), [&](int64_t r, double* acc) {
    for_chunks(C, [&](int64_t c0, int64_t n) {
      alignas(64) float gbuf[kChunk], xbuf[kChunk];
      const float *g = f32_view(dg, gy, r * C + c0, n, gbuf), *xr = f32_view(dx, x, r * C + c0, n, xbuf);
      const float* mc = mean + c0;
      double *a0 = acc + c0, *a1 = acc + C + c0;
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) {
        a0[c] += double(g[c]);
        a1[c] += double(g[c] * (xr[c] - mc[c]));
      }
    });
  });
  const double *sg = sums.data(), *sgxm = sums.data() + C;
  std::vector<float> k1(static_cast<size_t>(C)), k2(static_cast<size_t>(C)), k3(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double r = double(rstd[c]), wc = double(w[c]), sgx = sgxm[c] * r;  // sum gy * xhat
    gw[c] = float(sgx);
    gb[c] = float(sg[c]);
    // training: gx = w r (gy - sg/M - xhat sgx/M) = k1 gy + k2 (x - m) + k3; eval: gx = w r gy
    k1[size_t(c)] = float(wc * r);
    k2[size_t(c)] = training ? float(-wc * r * r * sgx / double(M)) : 0.f;
    k3[size_t(c)] = training ? float(-wc * r * sg[c] / double(M)) : 0.f;
  }
  const float *ka = k1.data(), *kb = k2.data(), *kc = k3.data();
#pragma omp parallel for schedule(static) if (M * C > (1 << 15))
  for (int64_t r = 0; r < M; ++r) {
    for_chunks(C, [&](int64_t c0, int64_t n) {
      alignas(64) float gbuf[kChunk], xbuf[kChunk], obuf[kChunk];
      const int64_t off = r * C + c0;
      const float *g = f32_view(dg, gy, off, n, gbuf), *xr = f32_view(dx, x, off, n, xbuf);
      float* o = f32_out(dx, gx, off, obuf);
      const float *a = ka + c0, *bb = kb + c0, *cc = kc + c0, *mc = mean + c0;
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) o[c] = a[c] * g[c] + bb[c] * (xr[c] - mc[c]) + cc[c];
      store_out(dx, gx, off, n, o);
    });
  }
}

// Batch norm's (N, C, HW) problem: channels-last (N, H, W, C) is the NCHW problem (N H W, C, 1),
// the same bytes.
struct BnDims {
  int64_t N, C, HW;
};
BnDims bn_dims(const Tensor& x, bool channels_last) {
  if (channels_last) return {x.size(0) * x.size(1) * x.size(2), x.size(3), 1};
  return {x.size(0), x.size(1), x.size(2) * x.size(3)};
}

}  // namespace

BatchNormOut batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                          const Tensor& running_var, bool training, double momentum, double eps, bool channels_last) {
  const char* op = "batch_norm2d";
  check_nchw(x, op, "x");
  const auto [N, C, HW] = bn_dims(x, channels_last);
  check_vec(w, C, op, "w");
  if (b.defined()) check_vec(b, C, op, "b");
  BRIGADE_CHECK(running_mean.defined() == running_var.defined(), ValueError,
                "{}: give both running_mean and running_var, or neither", op);
  for (const Tensor* r : {&running_mean, &running_var})
    if (r->defined()) {
      check_vec(*r, C, op, r == &running_mean ? "running_mean" : "running_var");
      BRIGADE_CHECK(r->dtype() == DType::F32 && r->is_contiguous(), ValueError,
                    "{}: running statistics must be contiguous f32 tensors, got {}", op, r->str());
    }
  BRIGADE_CHECK(training || running_mean.defined(), ValueError,
                "{}: eval mode normalises with the running statistics, but none were given", op);
  BRIGADE_CHECK(!training || N * HW > 1, ValueError,
                "{}: training needs more than one value per channel to compute a variance, got x {}", op,
                shape_str(x.shape()));
  BRIGADE_CHECK(eps >= 0 && momentum >= 0 && momentum <= 1, ValueError,
                "{}: eps {} must be >= 0 and momentum {} in [0, 1]", op, eps, momentum);
  // The ref backend runs the oracle on widened copies; the cpu kernels read and write 16-bit
  // x and y themselves (the same f32 arithmetic on the same values: bitwise the widened result).
  if (is_half(w) || is_half(b) || (is_half(x) && !on_cpu())) {
    BatchNormOut o = batch_norm2d(on_cpu() ? x : f32_of(x), f32_of(w), f32_of(b), running_mean, running_var, training,
                                  momentum, eps, channels_last);
    o.y = round_to(o.y, x.dtype());
    return o;
  }
  const Tensor xc = x.contiguous(), wc = w.contiguous(), bc = contig(b);
  BatchNormOut o;
  o.y = Tensor::empty(x.shape(), x.dtype());  // x's shape, layout and dtype
  o.mean = Tensor::empty({C});                // (C)
  o.rstd = Tensor::empty({C});                // (C)
  Tensor var = Tensor::empty({C});            // (C) the variance used (biased, in training)
  const float* rm = training ? nullptr : running_mean.data<float>();
  const float* rv = training ? nullptr : running_var.data<float>();
  const float *wp = wc.data<float>(), *bp = fptr(bc);
  float *mp = o.mean.data<float>(), *sp = o.rstd.data<float>(), *vp = var.data<float>();
  if (on_cpu() && channels_last) {
    batch_norm_rows_cpu(N, C, x.dtype(), xc.raw_data(), wp, bp, training, rm, rv, eps, o.y.raw_data(), mp, sp, vp);
  } else if (on_cpu()) {
    batch_norm2d_cpu(N, C, HW, x.dtype(), xc.raw_data(), wp, bp, training, rm, rv, eps, o.y.raw_data(), mp, sp, vp);
  } else {
    vr::batch_norm2d<float, float>(N, C, HW, 0, C, xc.data<float>(), wp, bp, training, rm, rv, eps,
                                   o.y.data<float>(), mp, sp, vp);
  }
  if (training && running_mean.defined()) {
    const double M = double(N * HW), unbias = M / (M - 1);
    float *rmp = running_mean.data<float>(), *rvp = running_var.data<float>();
    for (int64_t c = 0; c < C; ++c) {
      rmp[c] = float((1 - momentum) * double(rmp[c]) + momentum * double(mp[c]));
      rvp[c] = float((1 - momentum) * double(rvp[c]) + momentum * double(vp[c]) * unbias);
    }
  }
  return o;
}

BatchNormGrads batch_norm2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                     const Tensor& rstd, bool training, bool channels_last) {
  const char* op = "batch_norm2d_backward";
  check_nchw(x, op, "x");
  check_nchw(gy, op, "gy");
  BRIGADE_CHECK(gy.shape() == x.shape(), ShapeError, "{}: gy {} must have x's shape {}", op, shape_str(gy.shape()),
                shape_str(x.shape()));
  const auto [N, C, HW] = bn_dims(x, channels_last);
  check_vec(w, C, op, "w");
  check_vec(mean, C, op, "mean");
  check_vec(rstd, C, op, "rstd");
  // As in the forward: 16-bit gy and x are read by the cpu kernels themselves.
  const bool widen_acts = (is_half(gy) || is_half(x)) && !on_cpu();
  if (widen_acts || is_half(w) || is_half(mean) || is_half(rstd)) {
    BatchNormGrads r = batch_norm2d_backward(widen_acts ? f32_of(gy) : gy, widen_acts ? f32_of(x) : x, f32_of(w),
                                             f32_of(mean), f32_of(rstd), training, channels_last);
    r.gx = round_to(r.gx, x.dtype());
    r.gw = round_to(r.gw, w.dtype());
    r.gb = round_to(r.gb, w.dtype());
    return r;
  }
  const Tensor gyc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous(), mc = mean.contiguous(),
               rc = rstd.contiguous();
  BatchNormGrads r;
  r.gx = Tensor::empty(x.shape(), x.dtype());  // x's shape, layout and dtype
  r.gw = Tensor::empty({C});                   // (C)
  r.gb = Tensor::empty({C});                   // (C)
  const float *wp = wc.data<float>(), *mp = mc.data<float>(), *sp = rc.data<float>();
  float *gwp = r.gw.data<float>(), *gbp = r.gb.data<float>();
  if (on_cpu() && channels_last) {
    batch_norm_rows_backward_cpu(N, C, gy.dtype(), gyc.raw_data(), x.dtype(), xc.raw_data(), wp, mp, sp, training,
                                 r.gx.raw_data(), gwp, gbp);
  } else if (on_cpu()) {
    batch_norm2d_backward_cpu(N, C, HW, gy.dtype(), gyc.raw_data(), x.dtype(), xc.raw_data(), wp, mp, sp, training,
                              r.gx.raw_data(), gwp, gbp);
  } else {
    vr::batch_norm2d_backward<float, float>(N, C, HW, 0, C, gyc.data<float>(), xc.data<float>(), wp, mp, sp,
                                            training, r.gx.data<float>(), gwp, gbp);
  }
  return r;
}

// ---------------------------------------------------------------- synchronised batch norm pieces

namespace {

// Double sums of a row in 8 lanes (fixed order: lane l takes i = l mod 8, then the lanes in
// order, then the tail), so the cpu loop vectorises and stays reproducible.
inline void row_sums_d(const float* x, int64_t n, double& s1, double& s2) {
  double a[8] = {0}, b[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
#pragma omp simd
    for (int l = 0; l < 8; ++l) {
      const double v = double(x[i + l]);
      a[l] += v;
      b[l] += v * v;
    }
  double p = 0, q = 0;
  for (int l = 0; l < 8; ++l) p += a[l], q += b[l];
  for (; i < n; ++i) p += double(x[i]), q += double(x[i]) * double(x[i]);
  s1 += p, s2 += q;
}
// sum gy and sum gy (x - m) of a row, in double lanes as above.
inline void row_grad_sums_d(const float* gy, const float* x, int64_t n, double m, double& s1, double& s2) {
  double a[8] = {0}, b[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
#pragma omp simd
    for (int l = 0; l < 8; ++l) {
      const double g = double(gy[i + l]);
      a[l] += g;
      b[l] += g * (double(x[i + l]) - m);
    }
  double p = 0, q = 0;
  for (int l = 0; l < 8; ++l) p += a[l], q += b[l];
  for (; i < n; ++i) p += double(gy[i]), q += double(gy[i]) * (double(x[i]) - m);
  s1 += p, s2 += q;
}

void check_bn_stats(const Tensor& x, const Tensor& mean, const Tensor& rstd, const char* op) {
  check_nchw(x, op, "x");
  check_vec(mean, x.size(1), op, "mean");
  check_vec(rstd, x.size(1), op, "rstd");
}

}  // namespace

ChannelSums batch_norm2d_sums(const Tensor& x0) {
  check_nchw(x0, "batch_norm2d_sums", "x");
  const Tensor x = f32_of(x0).contiguous();
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  ChannelSums r{std::vector<double>(static_cast<size_t>(C)), std::vector<double>(static_cast<size_t>(C))};
  const float* xp = x.data<float>();
  double *s1 = r.s1.data(), *s2 = r.s2.data();
  if (on_cpu()) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 15))
    for (int64_t c = 0; c < C; ++c) {
      double a = 0, b = 0;
      for (int64_t n = 0; n < N; ++n) row_sums_d(xp + (n * C + c) * HW, HW, a, b);
      s1[c] = a, s2[c] = b;
    }
  } else {
    vr::batch_norm2d_sums<float>(N, C, HW, 0, C, xp, s1, s2);
  }
  return r;
}

ChannelSums batch_norm2d_grad_sums(const Tensor& gy0, const Tensor& x0, const Tensor& mean0, const Tensor& rstd0) {
  const char* op = "batch_norm2d_grad_sums";
  check_bn_stats(x0, mean0, rstd0, op);
  check_nchw(gy0, op, "gy");
  BRIGADE_CHECK(gy0.shape() == x0.shape(), ShapeError, "{}: gy {} must have x's shape {}", op,
                shape_str(gy0.shape()), shape_str(x0.shape()));
  const Tensor gy = f32_of(gy0).contiguous(), x = f32_of(x0).contiguous(), mean = f32_of(mean0).contiguous(),
               rstd = f32_of(rstd0).contiguous();
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  ChannelSums r{std::vector<double>(static_cast<size_t>(C)), std::vector<double>(static_cast<size_t>(C))};
  const float *gp = gy.data<float>(), *xp = x.data<float>(), *mp = mean.data<float>(), *sp = rstd.data<float>();
  double *s1 = r.s1.data(), *s2 = r.s2.data();
  if (on_cpu()) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 15))
    for (int64_t c = 0; c < C; ++c) {
      double a = 0, b = 0;  // sum gy, sum gy (x - m)
      for (int64_t n = 0; n < N; ++n) row_grad_sums_d(gp + (n * C + c) * HW, xp + (n * C + c) * HW, HW, mp[c], a, b);
      s1[c] = a, s2[c] = b * double(sp[c]);
    }
  } else {
    vr::batch_norm2d_grad_sums<float, float>(N, C, HW, 0, C, gp, xp, mp, sp, s1, s2);
  }
  return r;
}

Tensor batch_norm2d_backward_input(const Tensor& gy0, const Tensor& x0, const Tensor& w0, const Tensor& mean0,
                                   const Tensor& rstd0, const ChannelSums& sums, double M) {
  const char* op = "batch_norm2d_backward_input";
  check_bn_stats(x0, mean0, rstd0, op);
  check_nchw(gy0, op, "gy");
  BRIGADE_CHECK(gy0.shape() == x0.shape(), ShapeError, "{}: gy {} must have x's shape {}", op,
                shape_str(gy0.shape()), shape_str(x0.shape()));
  const int64_t N = x0.size(0), C = x0.size(1), HW = x0.size(2) * x0.size(3);
  check_vec(w0, C, op, "w");
  BRIGADE_CHECK(int64_t(sums.s1.size()) == C && int64_t(sums.s2.size()) == C, ShapeError,
                "{}: the gradient sums must hold C = {} values each, got {} and {}", op, C, sums.s1.size(),
                sums.s2.size());
  BRIGADE_CHECK(M > 0, ValueError, "{}: the count M = {} must be positive", op, M);
  const Tensor gy = f32_of(gy0).contiguous(), x = f32_of(x0).contiguous(), w = f32_of(w0).contiguous(),
               mean = f32_of(mean0).contiguous(), rstd = f32_of(rstd0).contiguous();
  Tensor gx = Tensor::empty(x.shape());  // (N, C, H, W)
  const float *gp = gy.data<float>(), *xp = x.data<float>(), *wp = w.data<float>(), *mp = mean.data<float>(),
              *sp = rstd.data<float>();
  float* gxp = gx.data<float>();
  const double *s1 = sums.s1.data(), *s2 = sums.s2.data();
  if (on_cpu()) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 15))
    for (int64_t c = 0; c < C; ++c) {
      // gx = w r (gy - s1/M - xhat s2/M) = k1 gy + k2 (x - m) + k3
      const double r = double(sp[c]), wc = double(wp[c]);
      const float m = mp[c];
      const float k1 = float(wc * r), k2 = float(-wc * r * r * s2[c] / M), k3 = float(-wc * r * s1[c] / M);
      for (int64_t n = 0; n < N; ++n) {
        const float* g = gp + (n * C + c) * HW;
        const float* xr = xp + (n * C + c) * HW;
        float* o = gxp + (n * C + c) * HW;
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) o[i] = k1 * g[i] + k2 * (xr[i] - m) + k3;
      }
    }
  } else {
    vr::batch_norm2d_backward_input<float, float>(N, C, HW, 0, C, gp, xp, wp, mp, sp, s1, s2, M, gxp);
  }
  return round_to(gx, x0.dtype());
}

void batch_norm2d_update_running(const Tensor& running_mean, const Tensor& running_var,
                                 const std::vector<double>& mean, const std::vector<double>& var_unbiased,
                                 double momentum) {
  const char* op = "batch_norm2d_update_running";
  const int64_t C = int64_t(mean.size());
  BRIGADE_CHECK(int64_t(var_unbiased.size()) == C, ShapeError, "{}: {} means but {} variances", op, C,
                var_unbiased.size());
  for (const Tensor* r : {&running_mean, &running_var}) {
    check_vec(*r, C, op, r == &running_mean ? "running_mean" : "running_var");
    BRIGADE_CHECK(r->dtype() == DType::F32 && r->is_contiguous(), ValueError,
                  "{}: running statistics must be contiguous f32 tensors, got {}", op, r->str());
  }
  BRIGADE_CHECK(momentum >= 0 && momentum <= 1, ValueError, "{}: momentum {} must be in [0, 1]", op, momentum);
  float *rmp = running_mean.data<float>(), *rvp = running_var.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    rmp[c] = float((1 - momentum) * double(rmp[c]) + momentum * mean[size_t(c)]);
    rvp[c] = float((1 - momentum) * double(rvp[c]) + momentum * var_unbiased[size_t(c)]);
  }
}

// ---------------------------------------------------------------- pooling

namespace {

// Channels-last max-pool on the cpu: for each output pixel, the window's rows of C channels
// (16-bit ones widened kChunk at a time) are compared channel by channel in the oracle's window
// order, taking a value when it is the first, larger, or the first NaN: the oracle's "first
// maximum, NaN wins" per channel, so y and idx are bitwise the NCHW result on the same values.
void max_pool_rows_cpu(const PoolGeom& g, int64_t N, int64_t C, int64_t k, int64_t s, int64_t p, DType dt,
                       const void* x, void* y, int64_t* idx) {
  const int64_t outs = N * g.OH * g.OW;
#pragma omp parallel for schedule(static) if (outs * C > (1 << 15))
  for (int64_t o = 0; o < outs; ++o) {
    const int64_t n = o / (g.OH * g.OW), oh = (o / g.OW) % g.OH, ow = o % g.OW;
    for_chunks(C, [&](int64_t c0, int64_t nc) {
      alignas(64) float best[kChunk], buf[kChunk], yb[kChunk];
      alignas(64) int64_t bi[kChunk];
      for (int64_t c = 0; c < nc; ++c) best[c] = -std::numeric_limits<float>::infinity(), bi[c] = -1;
      for (int64_t kh = 0; kh < k; ++kh) {
        const int64_t ih = oh * s - p + kh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t kw = 0; kw < k; ++kw) {
          const int64_t iw = ow * s - p + kw;
          if (iw < 0 || iw >= g.W) continue;
          const float* v = f32_view(dt, x, ((n * g.H + ih) * g.W + iw) * C + c0, nc, buf);
          const int64_t at = ih * g.W + iw;
#pragma omp simd
          for (int64_t c = 0; c < nc; ++c) {
            const bool take = bi[c] < 0 || v[c] > best[c] || (v[c] != v[c] && best[c] == best[c]);
            best[c] = take ? v[c] : best[c];
            bi[c] = take ? at : bi[c];
          }
        }
      }
      const int64_t off = o * C + c0;
      float* yr = f32_out(dt, y, off, yb);
      for (int64_t c = 0; c < nc; ++c) yr[c] = best[c], idx[off + c] = bi[c];
      store_out(dt, y, off, nc, yr);
    });
  }
}

// Its backward: each image's gradient plane (H W C, f32) gathers gy in output order (the
// oracle's order per element), then is rounded once into gx's dtype. Images in parallel.
void max_pool_rows_backward_cpu(int64_t N, int64_t HW, int64_t OHW, int64_t C, DType dt, const void* gy,
                                const int64_t* idx, void* gx) {
#pragma omp parallel if (N * HW * C > (1 << 15))
  {
    std::vector<float> acc(dt == DType::F32 ? 0 : static_cast<size_t>(HW * C));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* a = dt == DType::F32 ? static_cast<float*>(gx) + n * HW * C : acc.data();
      std::fill(a, a + HW * C, 0.f);
      for (int64_t q = 0; q < OHW; ++q)
        for_chunks(C, [&](int64_t c0, int64_t nc) {
          alignas(64) float buf[kChunk];
          const int64_t off = (n * OHW + q) * C + c0;
          const float* g = f32_view(dt, gy, off, nc, buf);
          const int64_t* ix = idx + off;
          for (int64_t c = 0; c < nc; ++c)
            if (ix[c] >= 0) a[ix[c] * C + c0 + c] += g[c];
        });
      store_out(dt, gx, n * HW * C, HW * C, a);
    }
  }
}

}  // namespace

MaxPoolOut max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool channels_last) {
  check_nchw(x, "max_pool2d", "x");
  if (channels_last) {
    const int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
    const PoolGeom g = pool_geom({N, C, H, W}, kernel, stride, padding, "max_pool2d");
    if (!on_cpu()) {  // the NCHW oracle on permuted copies
      MaxPoolOut o = max_pool2d(nchw_view(x), kernel, stride, padding);
      return {nhwc_of(o.y), nhwc_of(o.idx)};
    }
    const Tensor xc = x.contiguous();
    MaxPoolOut o;
    o.y = Tensor::empty({N, g.OH, g.OW, C}, x.dtype());    // (N, OH, OW, C)
    o.idx = Tensor::empty({N, g.OH, g.OW, C}, DType::I64);  // (N, OH, OW, C)
    max_pool_rows_cpu(g, N, C, kernel, stride, padding, x.dtype(), xc.raw_data(), o.y.raw_data(),
                      o.idx.data<int64_t>());
    return o;
  }
  const PoolGeom g = pool_geom(x.shape(), kernel, stride, padding, "max_pool2d");
  if (is_half(x)) {
    MaxPoolOut o = max_pool2d(f32_of(x), kernel, stride, padding);
    o.y = round_to(o.y, x.dtype());
    return o;
  }
  const Tensor xc = x.contiguous();
  MaxPoolOut o;
  o.y = Tensor::empty({x.size(0), x.size(1), g.OH, g.OW});                // (N, C, OH, OW)
  o.idx = Tensor::empty({x.size(0), x.size(1), g.OH, g.OW}, DType::I64);  // (N, C, OH, OW)
  const float* xp = xc.data<float>();
  float* yp = o.y.data<float>();
  int64_t* ip = o.idx.data<int64_t>();
  const int64_t HW = g.H * g.W, OHW = g.OH * g.OW;
  for_each_plane(g.P, HW, [&](int64_t p) {
    vr::max_pool2d_plane<float>(g.H, g.W, kernel, stride, padding, g.OH, g.OW, xp + p * HW, yp + p * OHW,
                                ip + p * OHW);
  });
  return o;
}

Tensor max_pool2d_backward(const Tensor& gy, const Tensor& idx, const Shape& x_shape, bool channels_last) {
  check_nchw(gy, "max_pool2d_backward", "gy");
  BRIGADE_CHECK(idx.defined() && idx.dtype() == DType::I64 && idx.shape() == gy.shape(), ShapeError,
                "max_pool2d_backward: idx must be i64 of gy's shape {} (max_pool2d's idx), got {}",
                shape_str(gy.shape()), idx.defined() ? idx.str() : "undefined");
  const int64_t cdim = channels_last ? 3 : 1;
  BRIGADE_CHECK(x_shape.size() == 4 && x_shape[0] == gy.size(0) && x_shape[cdim] == gy.size(cdim), ShapeError,
                "max_pool2d_backward: x shape {} does not match gy {}", shape_str(x_shape), shape_str(gy.shape()));
  const int64_t HW = channels_last ? x_shape[1] * x_shape[2] : x_shape[2] * x_shape[3];
  const Tensor ic = idx.contiguous();
  const int64_t* ip = ic.data<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    BRIGADE_CHECK(ip[i] >= -1 && ip[i] < HW, ValueError, "max_pool2d_backward: index {} outside a plane of {}",
                  ip[i], HW);
  if (channels_last) {
    if (!on_cpu()) {
      const Shape xs{x_shape[0], x_shape[3], x_shape[1], x_shape[2]};
      return nhwc_of(max_pool2d_backward(nchw_view(gy), nchw_view(idx), xs));
    }
    const Tensor gyc = gy.contiguous();
    Tensor gx = Tensor::empty(x_shape, gy.dtype());  // (N, H, W, C)
    max_pool_rows_backward_cpu(x_shape[0], HW, gy.size(1) * gy.size(2), x_shape[3], gy.dtype(), gyc.raw_data(), ip,
                               gx.raw_data());
    return gx;
  }
  if (is_half(gy)) return round_to(max_pool2d_backward(f32_of(gy), idx, x_shape), gy.dtype());
  const Tensor gyc = gy.contiguous();
  Tensor gx = Tensor::empty(x_shape);  // (N, C, H, W)
  const int64_t P = x_shape[0] * x_shape[1], OHW = gy.size(2) * gy.size(3);
  const float* gp = gyc.data<float>();
  float* gxp = gx.data<float>();
  for_each_plane(P, HW, [&](int64_t p) {
    vr::max_pool2d_backward_plane<float>(HW, OHW, gp + p * OHW, ip + p * OHW, gxp + p * HW);
  });
  return gx;
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  check_nchw(x, "avg_pool2d", "x");
  const PoolGeom g = pool_geom(x.shape(), kernel, stride, padding, "avg_pool2d");
  if (is_half(x)) return round_to(avg_pool2d(f32_of(x), kernel, stride, padding), x.dtype());
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty({x.size(0), x.size(1), g.OH, g.OW});  // (N, C, OH, OW)
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  const int64_t HW = g.H * g.W, OHW = g.OH * g.OW;
  for_each_plane(g.P, HW, [&](int64_t p) {
    vr::avg_pool2d_plane<float>(g.H, g.W, kernel, stride, padding, g.OH, g.OW, xp + p * HW, yp + p * OHW);
  });
  return y;
}

Tensor avg_pool2d_backward(const Tensor& gy, const Shape& x_shape, int64_t kernel, int64_t stride, int64_t padding) {
  check_nchw(gy, "avg_pool2d_backward", "gy");
  const PoolGeom g = pool_geom(x_shape, kernel, stride, padding, "avg_pool2d_backward");
  BRIGADE_CHECK(gy.shape() == Shape({x_shape[0], x_shape[1], g.OH, g.OW}), ShapeError,
                "avg_pool2d_backward: gy {} must be the output's shape {}", shape_str(gy.shape()),
                shape_str({x_shape[0], x_shape[1], g.OH, g.OW}));
  if (is_half(gy)) return round_to(avg_pool2d_backward(f32_of(gy), x_shape, kernel, stride, padding), gy.dtype());
  const Tensor gyc = gy.contiguous();
  Tensor gx = Tensor::empty(x_shape);  // (N, C, H, W)
  const float* gp = gyc.data<float>();
  float* gxp = gx.data<float>();
  const int64_t HW = g.H * g.W, OHW = g.OH * g.OW;
  for_each_plane(g.P, HW, [&](int64_t p) {
    vr::avg_pool2d_backward_plane<float>(g.H, g.W, kernel, stride, padding, g.OH, g.OW, gp + p * OHW, gxp + p * HW);
  });
  return gx;
}

// ---------------------------------------------------------------- relu

namespace {
// ReLU on 16-bit bit patterns, bitwise the widened definition (widening is exact and the result
// is one of the input's values or +0): for bits h, inf is the dtype's +Inf pattern, h & 0x7fff
// the magnitude; x > 0 when the sign is clear and the magnitude is nonzero and not NaN.
inline bool bits_nan(uint16_t h, uint16_t inf) { return (h & 0x7fffu) > inf; }
inline bool bits_pos(uint16_t h, uint16_t inf) { return !(h & 0x8000u) && h != 0 && h <= inf; }
uint16_t inf_bits(DType dt) { return dt == DType::BF16 ? 0x7f80u : 0x7c00u; }

// y = relu(x) (NaN passes) on n 16-bit values; gx = y > 0 ? gy : 0 on n 16-bit values.
void relu16(int64_t n, uint16_t inf, const uint16_t* x, uint16_t* y) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) y[i] = (bits_pos(x[i], inf) || bits_nan(x[i], inf)) ? x[i] : uint16_t(0);
}
void relu_backward16(int64_t n, uint16_t inf, const uint16_t* gy, const uint16_t* y, uint16_t* gx) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) gx[i] = bits_pos(y[i], inf) ? gy[i] : uint16_t(0);
}
}  // namespace

Tensor relu(const Tensor& x) {
  check_float(x, "relu", "x");
  if (is_half(x) && on_cpu()) {
    const Tensor xc = x.contiguous();
    Tensor y = Tensor::empty(x.shape(), x.dtype());  // x's shape and dtype
    relu16(x.numel(), inf_bits(x.dtype()), xc.data<uint16_t>(), y.data<uint16_t>());
    return y;
  }
  if (is_half(x)) return round_to(relu(f32_of(x)), x.dtype());
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape());  // x's shape
  const int64_t n = x.numel();
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  if (on_cpu()) {
    constexpr int64_t kBlock = 1 << 14;
#pragma omp parallel for schedule(static) if (n > (1 << 15))
    for (int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
      const float* xb = xp + b * kBlock;
      float* yb = yp + b * kBlock;
      const int64_t m = std::min(kBlock, n - b * kBlock);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) yb[i] = (xb[i] > 0.f || xb[i] != xb[i]) ? xb[i] : 0.f;  // NaN passes
    }
  } else {
    vr::relu<float>(n, xp, yp);
  }
  return y;
}

Tensor relu_backward(const Tensor& gy, const Tensor& y) {
  check_float(gy, "relu_backward", "gy");
  check_float(y, "relu_backward", "y");
  BRIGADE_CHECK(gy.shape() == y.shape(), ShapeError, "relu_backward: gy {} and y {} must have the same shape",
                shape_str(gy.shape()), shape_str(y.shape()));
  if (is_half(gy) && gy.dtype() == y.dtype() && on_cpu()) {
    const Tensor gc = gy.contiguous(), yc = y.contiguous();
    Tensor gx = Tensor::empty(y.shape(), gy.dtype());  // y's shape, gy's dtype
    relu_backward16(y.numel(), inf_bits(y.dtype()), gc.data<uint16_t>(), yc.data<uint16_t>(), gx.data<uint16_t>());
    return gx;
  }
  if (is_half(gy) || is_half(y)) return round_to(relu_backward(f32_of(gy), f32_of(y)), gy.dtype());
  const Tensor gc = gy.contiguous(), yc = y.contiguous();
  Tensor gx = Tensor::empty(y.shape());  // y's shape
  const int64_t n = y.numel();
  const float *gp = gc.data<float>(), *yp = yc.data<float>();
  float* gxp = gx.data<float>();
  if (on_cpu()) {
    constexpr int64_t kBlock = 1 << 14;
#pragma omp parallel for schedule(static) if (n > (1 << 15))
    for (int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
      const float *gb = gp + b * kBlock, *yb = yp + b * kBlock;
      float* ob = gxp + b * kBlock;
      const int64_t m = std::min(kBlock, n - b * kBlock);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) ob[i] = yb[i] > 0.f ? gb[i] : 0.f;
    }
  } else {
    vr::relu_backward<float>(n, gp, yp, gxp);
  }
  return gx;
}

// ---------------------------------------------------------------- sigmoid, reciprocal

namespace {

// y = f(x) elementwise on f32 (16-bit inputs widened and the result rounded once): the cpu
// backend's loop (OpenMP over large tensors) or the reference kernel.
template <class Cpu, class Ref>
Tensor unary_f32(const Tensor& x, const char* op, Cpu cpu, Ref ref) {
  check_float(x, op, "x");
  if (is_half(x)) return round_to(unary_f32(f32_of(x), op, cpu, ref), x.dtype());
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape());  // x's shape
  const int64_t n = x.numel();
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  if (on_cpu()) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
    for (int64_t i = 0; i < n; ++i) yp[i] = cpu(xp[i]);
  } else {
    ref(n, xp, yp);
  }
  return y;
}

// gx = f(gy, y) elementwise, for backwards that read the output.
template <class Cpu, class Ref>
Tensor unary_backward_f32(const Tensor& gy, const Tensor& y, const char* op, Cpu cpu, Ref ref) {
  check_float(gy, op, "gy");
  check_float(y, op, "y");
  BRIGADE_CHECK(gy.shape() == y.shape(), ShapeError, "{}: gy {} and y {} must have the same shape", op,
                shape_str(gy.shape()), shape_str(y.shape()));
  if (is_half(gy) || is_half(y)) return round_to(unary_backward_f32(f32_of(gy), f32_of(y), op, cpu, ref), gy.dtype());
  const Tensor gc = gy.contiguous(), yc = y.contiguous();
  Tensor gx = Tensor::empty(y.shape());  // y's shape
  const int64_t n = y.numel();
  const float *gp = gc.data<float>(), *yp = yc.data<float>();
  float* gxp = gx.data<float>();
  if (on_cpu()) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 15))
    for (int64_t i = 0; i < n; ++i) gxp[i] = cpu(gp[i], yp[i]);
  } else {
    ref(n, gp, yp, gxp);
  }
  return gx;
}

}  // namespace

Tensor sigmoid(const Tensor& x) {
  return unary_f32(x, "sigmoid", [](float v) { return 1.0f / (1.0f + std::exp(-v)); }, vr::sigmoid<float>);
}

Tensor sigmoid_backward(const Tensor& gy, const Tensor& y) {
  return unary_backward_f32(gy, y, "sigmoid_backward", [](float g, float v) { return g * v * (1.0f - v); },
                            vr::sigmoid_backward<float>);
}

Tensor reciprocal(const Tensor& x) {
  return unary_f32(x, "reciprocal", [](float v) { return 1.0f / v; }, vr::reciprocal<float>);
}

Tensor reciprocal_backward(const Tensor& gy, const Tensor& y) {
  return unary_backward_f32(gy, y, "reciprocal_backward", [](float g, float v) { return -(g * v * v); },
                            vr::reciprocal_backward<float>);
}

// ---------------------------------------------------------------- spatial mean

Tensor spatial_mean(const Tensor& x, bool keepdim) {
  check_nchw(x, "spatial_mean", "x");
  if (is_half(x)) return round_to(spatial_mean(f32_of(x), keepdim), x.dtype());
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  BRIGADE_CHECK(HW > 0, ShapeError, "spatial_mean: x {} has no spatial positions", shape_str(x.shape()));
  const Tensor xc = x.contiguous();
  Tensor y = keepdim ? Tensor::empty({N, C, 1, 1}) : Tensor::empty({N, C});  // (N, C[, 1, 1])
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  // the oracle's own code, one plane per iteration: cpu and ref agree bitwise
  for_each_plane(N * C, HW, [&](int64_t p) { vr::spatial_mean<float>(1, HW, xp + p * HW, yp + p); });
  return y;
}

Tensor spatial_mean_backward(const Tensor& gy, const Shape& x_shape) {
  check_float(gy, "spatial_mean_backward", "gy");
  BRIGADE_CHECK(x_shape.size() == 4, ShapeError, "spatial_mean_backward: x must be 4-D (N, C, H, W), got {}",
                shape_str(x_shape));
  const int64_t N = x_shape[0], C = x_shape[1], HW = x_shape[2] * x_shape[3];
  BRIGADE_CHECK(gy.shape() == Shape({N, C}) || gy.shape() == Shape({N, C, 1, 1}), ShapeError,
                "spatial_mean_backward: gy must be ({}, {}) or ({}, {}, 1, 1) for x {}, got {}", N, C, N, C,
                shape_str(x_shape), shape_str(gy.shape()));
  if (is_half(gy)) return round_to(spatial_mean_backward(f32_of(gy), x_shape), gy.dtype());
  const Tensor gc = gy.contiguous();
  Tensor gx = Tensor::empty(x_shape);  // (N, C, H, W)
  const float* gp = gc.data<float>();
  float* gxp = gx.data<float>();
  for_each_plane(N * C, HW, [&](int64_t p) { vr::spatial_mean_backward<float>(1, HW, gp + p, gxp + p * HW); });
  return gx;
}

// ---------------------------------------------------------------- cross-entropy with label smoothing

namespace {

std::vector<int64_t> smoothed_targets(const Tensor& logits, const Tensor& targets, double eps, int64_t ignore_index,
                                      const char* op) {
  check_float(logits, op, "logits");
  BRIGADE_CHECK(targets.defined() && (targets.dtype() == DType::I32 || targets.dtype() == DType::I64), ShapeError,
                "{}: 'targets' holds class indices and must be i32 or i64, got {}", op,
                targets.defined() ? targets.str() : "undefined");
  BRIGADE_CHECK(logits.dim() == 2, ShapeError, "{}: logits must be (N, V), got {}", op, shape_str(logits.shape()));
  BRIGADE_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), ShapeError,
                "{}: targets must be (N) = ({}) to match logits {}, got {}", op, logits.size(0),
                shape_str(logits.shape()), shape_str(targets.shape()));
  BRIGADE_CHECK(eps >= 0 && eps <= 1, ValueError, "{}: label smoothing {} must be in [0, 1]", op, eps);
  const int64_t V = logits.size(1);
  std::vector<int64_t> t = targets.to_vector_i64();
  for (size_t i = 0; i < t.size(); ++i)
    BRIGADE_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < V), ValueError,
                  "{}: target {} at row {} is outside [0, V) with V = {} and is not ignore_index ({})", op, t[i], i,
                  V, ignore_index);
  return t;
}

}  // namespace

CrossEntropyOut cross_entropy_smoothed(const Tensor& logits, const Tensor& targets, double eps,
                                       int64_t ignore_index) {
  const char* op = "cross_entropy_smoothed";
  const std::vector<int64_t> t = smoothed_targets(logits, targets, eps, ignore_index, op);
  if (is_half(logits)) return cross_entropy_smoothed(f32_of(logits), targets, eps, ignore_index);
  const int64_t N = logits.size(0), V = logits.size(1);
  const Tensor lc = logits.contiguous();
  CrossEntropyOut o;
  o.loss = Tensor::empty({});  // ()
  o.lse = Tensor::empty({N});  // (N)
  const float* xp = lc.data<float>();
  float* lp = o.lse.data<float>();
  if (!on_cpu()) {
    vr::cross_entropy_smoothed<float>(N, V, xp, t.data(), eps, ignore_index, o.loss.data<float>(), lp);
    return o;
  }
  // Rows in parallel: max, then sum exp(x - max) and sum x in float lanes (omp simd), each row's
  // smoothed term in double; the rows' terms summed serially in row order.
  std::vector<double> row(static_cast<size_t>(N));
#pragma omp parallel for schedule(static) if (N * V > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = xp + n * V;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, xr[j]);
    float se = 0.f, sx = 0.f;
#pragma omp simd reduction(+ : se, sx)
    for (int64_t j = 0; j < V; ++j) {
      se += std::exp(xr[j] - m);
      sx += xr[j];
    }
    const double l = double(m) + std::log(double(se));
    lp[n] = float(l);
    if (t[size_t(n)] != ignore_index)
      row[size_t(n)] = (1 - eps) * (l - double(xr[t[size_t(n)]])) + eps * (l - double(sx) / double(V));
  }
  double total = 0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (t[size_t(n)] == ignore_index) continue;
    total += row[size_t(n)];
    ++count;
  }
  o.loss.data<float>()[0] = count ? float(total / double(count)) : std::numeric_limits<float>::quiet_NaN();
  return o;
}

Tensor cross_entropy_smoothed_backward(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                       double eps, int64_t ignore_index) {
  const char* op = "cross_entropy_smoothed_backward";
  const std::vector<int64_t> t = smoothed_targets(logits, targets, eps, ignore_index, op);
  const int64_t N = logits.size(0), V = logits.size(1);
  check_float(lse, op, "lse");
  BRIGADE_CHECK(lse.shape() == Shape({N}), ShapeError, "{}: lse must be ({}), got {}", op, N, shape_str(lse.shape()));
  if (is_half(logits) || is_half(lse))
    return round_to(cross_entropy_smoothed_backward(gloss, f32_of(logits), targets, f32_of(lse), eps, ignore_index),
                    logits.dtype());
  const Tensor lc = logits.contiguous(), sc = lse.contiguous();
  Tensor g = Tensor::empty({N, V});  // (N, V)
  const float *xp = lc.data<float>(), *sp = sc.data<float>();
  float* gp = g.data<float>();
  if (!on_cpu()) {
    vr::cross_entropy_smoothed_backward<float>(N, V, gloss, xp, t.data(), sp, eps, ignore_index, gp);
    return g;
  }
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += t[size_t(n)] != ignore_index;
  // forward: row loss = (1 - eps)(lse - x[t]) + eps (lse - mean_v x[v])
  //   -> d/dx[v] = softmax[v] - (1 - eps) [v == t] - eps / V, times gloss / count
#pragma omp parallel for schedule(static) if (N * V > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    float* gr = gp + n * V;
    const int64_t tn = t[size_t(n)];
    if (tn == ignore_index || count == 0) {
      std::fill(gr, gr + V, 0.f);
      continue;
    }
    const float* xr = xp + n * V;
    const float gs = float(gloss / double(count)), l = sp[n], off = float(eps / double(V));
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) gr[j] = gs * (std::exp(xr[j] - l) - off);
    gr[tn] -= gs * float(1 - eps);
  }
  return g;
}

}  // namespace brigade::ops
