// Convolution-family kernels (oracle: ops/ref/conv.h): oneDNN convolutions on plain NCHW / OIHW
// (grouped: GOIHW) memory, or NHWC activations with the weights reordered to the layout the
// primitive picks; primitives cached per geometry, dtype and layout, scratchpads from the caching
// allocator; bf16 with groups 1 where oneDNN has a non-reference kernel. Depthwise convolutions
// (groups == C == O, NCHW) run the direct kernel below: oneDNN 2.6's im2col GEMM is slower, most
// of all in the weight gradient (docs/architecture.md, "Depthwise convolutions"). Also the
// channels-last max-pool and patch copies.
#include <fmt/format.h>
#include <dnnl.hpp>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/cpu/workspace.h"
#include "brigade/ops/ref/conv.h"

namespace brigade::ops::cpu {

namespace {

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
ConvMds conv_mds(const ref::ConvGeom& g, memory::data_type t = memory::data_type::f32, bool cl = false) {
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

// The cached primitives of one geometry and element type (with bias in the forward and weight
// backward when `bias`); the backward primitives are created on first use. Caller holds
// g_conv_mu.
ConvPrims& conv_prims_locked(const ref::ConvGeom& g, bool bias, bool want_bwd_d, bool want_bwd_w,
                             memory::data_type t = memory::data_type::f32, bool cl = false) {
  const std::string key =
      fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}", g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.stride,
                  g.pt, g.pb, g.pl, g.pr, g.groups, bias ? 1 : 0, int(t), cl ? "nhwc" : "nchw");
  auto it = conv_cache().find(key);
  const ConvMds m = conv_mds(g, t, cl);
  if (it == conv_cache().end()) {
    ConvPrims p;
    auto d =
        bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                               m.src, m.wei, m.bias, m.dst, m.strides, m.pad_l, m.pad_r)
             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                               m.src, m.wei, m.dst, m.strides, m.pad_l, m.pad_r);
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
    auto d = bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, m.src, m.gwei, m.bias,
                                                             m.dst, m.strides, m.pad_l, m.pad_r)
                  : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, m.src, m.gwei, m.dst,
                                                             m.strides, m.pad_l, m.pad_r);
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
size_t reorder_bytes(const memory::desc& want, const memory::desc& user) { return want == user ? 0 : want.get_size(); }

// x, w, y hold elements of type t (f32 or bf16); b is f32 or null. cl: NHWC x and y.
void onednn_conv2d(const ref::ConvGeom& g, const void* x, const void* w, const float* b, void* y,
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
void onednn_conv2d_backward(const ref::ConvGeom& g, const void* gy, const void* x, const void* w, void* gx, float* gw,
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
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(m.src, x)},
                                         {DNNL_ARG_DIFF_DST, mem(m.dst, gy)},
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
      const ref::ConvGeom g{2, 8, 8, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8};
      const ConvMds m = conv_mds(g, memory::data_type::bf16);
      dnnl::convolution_forward::primitive_desc f(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, m.src,
                                          m.wei, m.dst, m.strides, m.pad_l, m.pad_r),
          engine());
      dnnl::convolution_backward_data::primitive_desc d(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, m.src, m.wei, m.dst, m.strides,
                                                m.pad_l, m.pad_r),
          engine(), f);
      dnnl::convolution_backward_weights::primitive_desc w(
          dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, m.src, m.gwei, m.dst, m.strides,
                                                   m.pad_l, m.pad_r),
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

}  // namespace

// ---------------------------------------------------------------- direct depthwise convolution
// groups == C == O on plain NCHW memory. oneDNN 2.6's depthwise jit kernels need blocked or
// NHWC layouts; for NCHW it runs im2col + a GEMM per channel (x64:gemm:jit), which loses to
// these loops (docs/architecture.md, "Depthwise convolutions"). Each (n, c) plane is independent: the forward and the
// data gradient run one plane per OpenMP iteration, accumulating each output row in float over (kh, kw) in order (bias
// first), vectorised along the row; the weight and bias gradients run one channel per iteration, a float sum per (n,
// kh, kw) plane added in double over n in order. Every element has one fixed summation order: bitwise reproducible
// whatever the thread count.

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
  explicit ColRanges(const ref::ConvGeom& g) : lo(size_t(g.KW)), hi(size_t(g.KW)) {
    for (int64_t kw = 0; kw < g.KW; ++kw) valid_cols(g.W, g.OW, g.stride, g.pl, kw, lo[size_t(kw)], hi[size_t(kw)]);
  }
};

void depthwise_conv2d(const ref::ConvGeom& g, const float* x, const float* w, const float* b, float* y) {
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

void depthwise_conv2d_backward_data(const ref::ConvGeom& g, const float* gy, const float* w, float* gx) {
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
void depthwise_conv2d_backward_weights(const ref::ConvGeom& g, const float* gy, const float* x, float* gw, float* gb) {
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

// Channels-last max-pool on the cpu: for each output pixel, the window's rows of C channels
// (16-bit ones widened kWidenChunk at a time) are compared channel by channel in the oracle's window
// order, taking a value when it is the first, larger, or the first NaN: the oracle's "first
// maximum, NaN wins" per channel, so y and idx are bitwise the NCHW result on the same values.
void max_pool_rows(int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t N, int64_t C, int64_t k, int64_t s, int64_t p,
                   DType dt, const void* x, void* y, int64_t* idx) {
  const int64_t outs = N * OH * OW;
#pragma omp parallel for schedule(static) if (outs * C > (1 << 15))
  for (int64_t o = 0; o < outs; ++o) {
    const int64_t n = o / (OH * OW), oh = (o / OW) % OH, ow = o % OW;
    for_chunks(C, [&](int64_t c0, int64_t nc) {
      alignas(64) float best[kWidenChunk], buf[kWidenChunk], yb[kWidenChunk];
      alignas(64) int64_t bi[kWidenChunk];
      for (int64_t c = 0; c < nc; ++c) best[c] = -std::numeric_limits<float>::infinity(), bi[c] = -1;
      for (int64_t kh = 0; kh < k; ++kh) {
        const int64_t ih = oh * s - p + kh;
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < k; ++kw) {
          const int64_t iw = ow * s - p + kw;
          if (iw < 0 || iw >= W) continue;
          const float* v = f32_view(dt, x, ((n * H + ih) * W + iw) * C + c0, nc, buf);
          const int64_t at = ih * W + iw;
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
void max_pool_rows_backward(int64_t N, int64_t HW, int64_t OHW, int64_t C, DType dt, const void* gy, const int64_t* idx,
                            void* gx) {
#pragma omp parallel if (N * HW * C > (1 << 15))
  {
    std::vector<float> acc(dt == DType::F32 ? 0 : static_cast<size_t>(HW * C));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* a = dt == DType::F32 ? static_cast<float*>(gx) + n * HW * C : acc.data();
      std::fill(a, a + HW * C, 0.f);
      for (int64_t q = 0; q < OHW; ++q)
        for_chunks(C, [&](int64_t c0, int64_t nc) {
          alignas(64) float buf[kWidenChunk];
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

namespace {

// One (image, patch) per iteration: C*p runs of p contiguous values. kToPatches: src is the
// image (N, C, H, W) and dst the patches (N, P, C*p*p); otherwise the inverse.
template <bool kToPatches>
void patch_copy(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const float* src, float* dst) {
  const int64_t PW = W / p, P = (H / p) * PW, F = C * p * p;
#pragma omp parallel for schedule(static) if (N * P * F > (1 << 16))
  for (int64_t r = 0; r < N * P; ++r) {
    const int64_t n = r / P, pi = r % P, h0 = (pi / PW) * p, w0 = (pi % PW) * p;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < p; ++i) {
        const int64_t prow = r * F + (c * p + i) * p, irow = ((n * C + c) * H + h0 + i) * W + w0;
        if constexpr (kToPatches)
          std::copy(src + irow, src + irow + p, dst + prow);
        else
          std::copy(src + prow, src + prow + p, dst + irow);
      }
  }
}

}  // namespace

void patchify(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const float* x, float* y) {
  patch_copy<true>(N, C, H, W, p, x, y);
}
void patchify_backward(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const float* g, float* gx) {
  patch_copy<false>(N, C, H, W, p, g, gx);
}

void conv2d(const ref::ConvGeom& g, const void* x, const void* w, const float* b, void* y, DType t,
            bool channels_last) {
  onednn_conv2d(g, x, w, b, y, t == DType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32,
                channels_last);
}
void conv2d_backward(const ref::ConvGeom& g, const void* gy, const void* x, const void* w, void* gx, float* gw,
                     float* gb, DType t, bool channels_last) {
  onednn_conv2d_backward(g, gy, x, w, gx, gw, gb,
                         t == DType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32,
                         channels_last);
}
bool conv2d_bf16_available() { return bf16_conv_available(); }
std::string last_conv2d_impl() {
  std::lock_guard<std::mutex> lock(g_conv_mu);
  return g_last_conv_impl;
}
void set_last_conv2d_impl(const char* impl) {
  std::lock_guard<std::mutex> lock(g_conv_mu);
  g_last_conv_impl = impl;
}

}  // namespace brigade::ops::cpu
