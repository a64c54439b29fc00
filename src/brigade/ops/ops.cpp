// Op front-end (see ops.h): argument checks with user-facing messages, output
// allocation, broadcasting, and dispatch to ops/ref (scalar oracle) or ops/cpu
// (optimised). No arithmetic happens here beyond index bookkeeping and the serial
// draw of dropout masks; the kernels see only raw pointers + sizes + strides.
// 16-bit inputs: every floating op first checks its arguments. On the cpu backend, ops
// whose floating inputs are one 16-bit dtype then run native 16-bit kernels (native16 below;
// cpu/kernels.h): pieces, rows or heads widened into per-thread f32 buffers, the f32
// kernel's arithmetic, each output rounded once as it is stored; bitwise what the widened
// path gives. Everything else (the Ref backend, mixed dtypes, the f16 GEMMs, sum_squares,
// the native kernels switched off by the cpu::Native16Scope test hook) takes the widened
// path (via_f32): the op's own f32 path on the inputs widened exactly to f32 (ops::cast
// copies), the outputs rounded once to the dtypes of the contract in ops.h. Never widened
// either: cast itself; on the cpu backend, matmul / linear / linear_backward with bf16
// operands (oneDNN bf16 GEMMs, gemm16_available) and the embedding forward (a bit copy of
// 16-bit rows).
#include "brigade/ops/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "brigade/core/error.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/ref/kernels.h"

namespace brigade::ops {

namespace {
thread_local Backend t_backend = Backend::Cpu;
}  // namespace

Backend current_backend() { return t_backend; }
void set_backend(Backend b) { t_backend = b; }

// Call kernel `fn` of the active backend with the same arguments (f32 everywhere).
#define BRIGADE_DISPATCH(fn, ...) \
  (t_backend == Backend::Cpu ? cpu::fn(__VA_ARGS__) : ref::fn<float>(__VA_ARGS__))

namespace {

using ref::BinaryOp;
using ref::UnaryOp;

void check_defined(const Tensor& t, const char* op, const char* name) {
  BRIGADE_CHECK(t.defined(), ValueError, "{}: argument '{}' is an undefined tensor; pass a tensor created by a "
                "factory or another op", op, name);
}

void check_float(const Tensor& t, const char* op, const char* name) {
  check_defined(t, op, name);
  BRIGADE_CHECK(is_floating(t.dtype()), ShapeError,
                "{}: '{}' is {} but must be a floating tensor (f32, bf16 or f16); convert it with ops::cast", op,
                name, t.str());
}

// ---- the 16-bit route (see the file comment)

bool is_half(const Tensor& t) { return t.defined() && (t.dtype() == DType::BF16 || t.dtype() == DType::F16); }
Tensor f32_of(const Tensor& t) { return is_half(t) ? cast(t, DType::F32) : t; }
Tensor round_to(const Tensor& t, DType dt) { return t.defined() && t.dtype() != dt ? cast(t, dt) : t; }
// Output dtype of an op of two floating operands: theirs when equal, else f32.
DType same_or_f32(const Tensor& a, const Tensor& b) { return a.dtype() == b.dtype() ? a.dtype() : DType::F32; }

// The output tensors of each op result type, in declaration order.
std::vector<Tensor*> outputs_of(Tensor& t) { return {&t}; }
std::vector<Tensor*> outputs_of(LinearGrads& g) { return {&g.gx, &g.gw, &g.gb}; }
std::vector<Tensor*> outputs_of(LayerNormOut& o) { return {&o.y, &o.mean, &o.rstd}; }
std::vector<Tensor*> outputs_of(LayerNormGrads& g) { return {&g.gx, &g.gw, &g.gb}; }
std::vector<Tensor*> outputs_of(AttentionOut& o) { return {&o.out, &o.lse}; }
std::vector<Tensor*> outputs_of(AttentionGrads& g) { return {&g.gq, &g.gk, &g.gv}; }
std::vector<Tensor*> outputs_of(CrossEntropyOut& o) { return {&o.loss, &o.lse}; }

// When any of `in` is bf16/f16: runs `op` (the calling op itself, which then takes its f32
// path) on the inputs widened exactly to f32 and rounds its outputs once to `out` (one dtype
// per output, in declaration order; undefined outputs stay undefined). Returns nullopt when
// every input is f32 or undefined, so the f32 path runs untouched.
template <class F, class... T>
auto via_f32(std::initializer_list<DType> out, F&& op, const T&... in) -> std::optional<decltype(op(in...))> {
  if (!(is_half(in) || ...)) return std::nullopt;
  auto r = op(f32_of(in)...);
  std::vector<Tensor*> outs = outputs_of(r);
  BRIGADE_ASSERT(outs.size() == out.size(), "via_f32: {} output dtypes for {} outputs", out.size(), outs.size());
  size_t k = 0;
  for (DType dt : out) {
    *outs[k] = round_to(*outs[k], dt);
    ++k;
  }
  return r;
}

// The native 16-bit cpu kernels take these tensors: cpu backend, the test hook on
// (cpu::native16_enabled), and all of them of one 16-bit dtype.
bool native16(std::initializer_list<const Tensor*> ts) {
  if (t_backend != Backend::Cpu || !cpu::native16_enabled()) return false;
  const DType dt = (*ts.begin())->dtype();
  if (dt != DType::BF16 && dt != DType::F16) return false;
  for (const Tensor* t : ts)
    if (t->dtype() != dt) return false;
  return true;
}
// A tensor as the native kernels read it: its own shape and strides, or (broadcast operands)
// the op's shape with the strides that read it over that shape.
cpu::Strided strided(const Tensor& t) {
  return {t.dtype(), t.raw_data(), int(t.dim()), t.shape().data(), t.strides().data()};
}
cpu::Strided strided(const Tensor& t, const Shape& shape, const Shape& st) {
  return {t.dtype(), t.raw_data(), int(shape.size()), shape.data(), st.data()};
}
// f32 contents of a small side input (a layer-norm weight or bias: (C)).
Tensor f32_contiguous(const Tensor& t) { return t.dtype() == DType::F32 ? t.contiguous() : cast(t, DType::F32); }

// The bf16 GEMM fast path of the cpu backend applies to these operands (all one 16-bit dtype).
bool gemm16(std::initializer_list<const Tensor*> ops) {
  if (t_backend != Backend::Cpu) return false;
  const DType dt = (*ops.begin())->dtype();
  for (const Tensor* t : ops)
    if (t->dtype() != dt) return false;
  return (dt == DType::BF16 || dt == DType::F16) && cpu::gemm16_available(dt);
}

void check_ids(const Tensor& t, const char* op, const char* name) {
  check_defined(t, op, name);
  BRIGADE_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64, ShapeError,
                "{}: '{}' holds indices and must be i32 or i64, got {}", op, name, t.str());
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  BRIGADE_CHECK(a.shape() == b.shape(), ShapeError, "{}: '{}' has shape {} but '{}' has shape {}; they must match",
                op, an, shape_str(a.shape()), bn, shape_str(b.shape()));
}

// Strides that read `t` over the (broadcast) shape `out`: dims are right-aligned,
// missing leading dims and size-1 dims that broadcast get stride 0.
Shape broadcast_strides(const Tensor& t, const Shape& out) {
  Shape st(out.size(), 0);
  const size_t lead = out.size() - size_t(t.dim());
  for (size_t i = 0; i < size_t(t.dim()); ++i)
    st[lead + i] = (t.shape()[i] == 1 && out[lead + i] != 1) ? 0 : t.strides()[i];
  return st;
}

Shape broadcast_named(const Shape& a, const Shape& b, const char* op) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t da = i < nd - a.size() ? 1 : a[i - (nd - a.size())];
    const int64_t db = i < nd - b.size() ? 1 : b[i - (nd - b.size())];
    BRIGADE_CHECK(da == db || da == 1 || db == 1, ShapeError,
                  "{}: shapes {} and {} do not broadcast: dimension {} (from the right) is {} vs {}; sizes must "
                  "match or one of them must be 1", op, shape_str(a), shape_str(b), int64_t(nd - i), da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t wrap_dim(int64_t d, int64_t nd, const char* op) {
  const int64_t r = d < 0 ? d + nd : d;
  BRIGADE_CHECK(r >= 0 && r < std::max<int64_t>(nd, 1), ShapeError,
                "{}: dimension {} is out of range for a tensor with {} dimensions (valid: [{}, {}])", op, d, nd,
                -std::max<int64_t>(nd, 1), std::max<int64_t>(nd, 1) - 1);
  return r;
}

// A writable destination must not alias itself (expanded views have stride 0).
void check_writable(const Tensor& t, const char* op) {
  for (int64_t i = 0; i < t.dim(); ++i)
    BRIGADE_CHECK(t.shape()[size_t(i)] <= 1 || t.strides()[size_t(i)] != 0, ValueError,
                  "{}: the destination {} is an expanded (stride 0) view and cannot be written in place; "
                  "write into a contiguous tensor (e.g. .clone()) instead", op, t.str());
}

std::vector<int64_t> ids_vector(const Tensor& ids) { return ids.to_vector_i64(); }

Tensor binary_op(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  check_float(a, name, "a");
  check_float(b, name, "b");
  if (native16({&a, &b})) {
    const Shape out = broadcast_named(a.shape(), b.shape(), name);
    Tensor y = Tensor::empty(out, a.dtype());  // broadcast(a, b)
    const Shape sa = broadcast_strides(a, out), sb = broadcast_strides(b, out);
    cpu::binary16(op, strided(a, out, sa), strided(b, out, sb), a.dtype(), y.raw_data());
    return y;
  }
  if (auto r = via_f32({same_or_f32(a, b)}, [&](const Tensor& x, const Tensor& y) { return binary_op(op, name, x, y); },
                       a, b))
    return *r;
  const Shape out = broadcast_named(a.shape(), b.shape(), name);
  Tensor y = Tensor::empty(out);  // broadcast(a, b)
  const Shape sa = broadcast_strides(a, out), sb = broadcast_strides(b, out);
  BRIGADE_DISPATCH(binary, op, int(out.size()), out.data(), a.data<float>(), sa.data(), b.data<float>(), sb.data(),
                   y.data<float>());
  return y;
}

Tensor unary_op(UnaryOp op, double s, const char* name, const Tensor& a) {
  check_float(a, name, "a");
  if (native16({&a})) {
    Tensor y = Tensor::empty(a.shape(), a.dtype());  // same as a
    cpu::unary16(op, s, strided(a), a.dtype(), y.raw_data());
    return y;
  }
  if (auto r = via_f32({a.dtype()}, [&](const Tensor& x) { return unary_op(op, s, name, x); }, a)) return *r;
  Tensor y = Tensor::empty(a.shape());  // same as a
  BRIGADE_DISPATCH(unary, op, s, int(a.dim()), a.shape().data(), a.data<float>(), a.strides().data(),
                   y.data<float>());
  return y;
}

}  // namespace

// ---------------------------------------------------------------- elementwise

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Add, "add", a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Sub, "sub", a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Mul, "mul", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Div, "div", a, b); }
Tensor add_scalar(const Tensor& a, double s) { return unary_op(UnaryOp::AddScalar, s, "add_scalar", a); }
Tensor mul_scalar(const Tensor& a, double s) { return unary_op(UnaryOp::MulScalar, s, "mul_scalar", a); }
Tensor neg(const Tensor& a) { return unary_op(UnaryOp::Neg, 0.0, "neg", a); }
Tensor exp(const Tensor& a) { return unary_op(UnaryOp::Exp, 0.0, "exp", a); }
Tensor log(const Tensor& a) { return unary_op(UnaryOp::Log, 0.0, "log", a); }
Tensor tanh(const Tensor& a) { return unary_op(UnaryOp::Tanh, 0.0, "tanh", a); }
Tensor sqrt(const Tensor& a) { return unary_op(UnaryOp::Sqrt, 0.0, "sqrt", a); }

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  check_float(dst, "add_", "dst");
  check_float(src, "add_", "src");
  const Shape out = broadcast_named(dst.shape(), src.shape(), "add_");
  BRIGADE_CHECK(out == dst.shape(), ShapeError,
                "add_: src {} must broadcast to dst {} (the result would be {}, which does not fit in dst)",
                shape_str(src.shape()), shape_str(dst.shape()), shape_str(out));
  check_writable(dst, "add_");
  if ((is_half(dst) || is_half(src)) && t_backend == Backend::Cpu && cpu::native16_enabled()) {
    // dst and src of any floating dtypes: widened piece by piece, dst rounded once on store.
    const Shape ss = broadcast_strides(src, out);
    cpu::axpy16(strided(dst), strided(src, out, ss), alpha);
    return;
  }
  if (is_half(dst)) {  // update an f32 copy, store it back rounded once
    Tensor t = cast(dst, DType::F32);
    add_(t, src, alpha);
    Tensor(dst).copy_(cast(t, dst.dtype()));  // a handle on the same storage
    return;
  }
  if (is_half(src)) return add_(dst, cast(src, DType::F32), alpha);
  const Shape ss = broadcast_strides(src, out);
  BRIGADE_DISPATCH(axpy, int(out.size()), out.data(), dst.data<float>(), dst.strides().data(), src.data<float>(),
                   ss.data(), alpha);
}

void mul_scalar_(const Tensor& dst, double s) {
  check_float(dst, "mul_scalar_", "dst");
  check_writable(dst, "mul_scalar_");
  if (native16({&dst})) {
    cpu::scale16(strided(dst), s);
    return;
  }
  if (is_half(dst)) {
    Tensor t = cast(dst, DType::F32);
    mul_scalar_(t, s);
    Tensor(dst).copy_(cast(t, dst.dtype()));  // a handle on the same storage
    return;
  }
  BRIGADE_DISPATCH(scale, int(dst.dim()), dst.shape().data(), dst.data<float>(), dst.strides().data(), s);
}

Shape broadcast_shapes(const Shape& a, const Shape& b) { return broadcast_named(a, b, "broadcast_shapes"); }

Tensor sum_to(const Tensor& g, const Shape& shape) {
  check_float(g, "sum_to", "g");
  const Shape& gs = g.shape();
  BRIGADE_CHECK(shape.size() <= gs.size() && broadcast_named(shape, gs, "sum_to") == gs, ShapeError,
                "sum_to: target shape {} does not broadcast to the gradient's shape {}; sum_to only undoes "
                "broadcasting", shape_str(shape), shape_str(gs));
  const bool n16 = native16({&g});
  if (!n16)
    if (auto r = via_f32({g.dtype()}, [&](const Tensor& x) { return sum_to(x, shape); }, g)) return *r;
  Tensor y = Tensor::empty(shape, g.dtype());  // shape
  const Shape cs = contiguous_strides(shape);
  Shape so(gs.size(), 0);
  const size_t lead = gs.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) so[lead + i] = (shape[i] == 1 && gs[lead + i] != 1) ? 0 : cs[i];
  if (n16) {
    cpu::reduce_sum16(strided(g), so.data(), y.numel(), g.dtype(), y.raw_data());
    return y;
  }
  BRIGADE_DISPATCH(reduce_sum, int(gs.size()), gs.data(), g.data<float>(), g.strides().data(), y.data<float>(),
                   so.data(), y.numel());
  return y;
}

// ---------------------------------------------------------------- reductions

namespace {
// Reduced-dims mask for sum/mean; an empty dims list reduces every dim (as torch.sum(x, dim=[])).
std::vector<bool> reduce_mask(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  std::vector<bool> red(size_t(a.dim()), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, a.dim(), op);
    if (a.dim() == 0) continue;
    BRIGADE_CHECK(!red[size_t(w)], ShapeError, "{}: dimension {} appears twice in dims", op, d);
    red[size_t(w)] = true;
  }
  return red;
}

// sum over the dims marked in red, stored in dtype ot: the f32 kernel (ot f32, a f32) or the
// native 16-bit one (a 16-bit; ot a's dtype, or f32 for mean).
Tensor sum_dims(const Tensor& a, const std::vector<bool>& red, bool keepdim, DType ot) {
  Shape out_keep, out;
  for (size_t i = 0; i < red.size(); ++i) {
    out_keep.push_back(red[i] ? 1 : a.shape()[i]);
    if (!red[i]) out.push_back(a.shape()[i]);
  }
  Tensor y = Tensor::empty(keepdim ? out_keep : out, ot);  // a's shape without (or with size 1 at) the reduced dims
  Shape so = contiguous_strides(out_keep);
  for (size_t i = 0; i < red.size(); ++i)
    if (red[i]) so[i] = 0;
  if (is_half(a)) {
    cpu::reduce_sum16(strided(a), so.data(), y.numel(), ot, y.raw_data());
    return y;
  }
  BRIGADE_DISPATCH(reduce_sum, int(a.dim()), a.shape().data(), a.data<float>(), a.strides().data(), y.data<float>(),
                   so.data(), y.numel());
  return y;
}
}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  check_float(a, "sum", "a");
  const std::vector<bool> red = reduce_mask(a, dims, "sum");
  if (native16({&a})) return sum_dims(a, red, keepdim, a.dtype());
  if (auto r = via_f32({a.dtype()}, [&](const Tensor& x) { return sum(x, dims, keepdim); }, a)) return *r;
  return sum_dims(a, red, keepdim, DType::F32);
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  check_float(a, "mean", "a");
  // 16-bit: sum and scale in f32, one rounding at the end.
  if (native16({&a})) {
    Tensor s = sum_dims(a, reduce_mask(a, dims, "mean"), keepdim, DType::F32);  // the native sums, kept in f32
    const int64_t count = s.numel() ? a.numel() / s.numel() : 0;
    mul_scalar_(s, 1.0 / double(count));
    return cast(s, a.dtype());
  }
  if (auto r = via_f32({a.dtype()}, [&](const Tensor& x) { return mean(x, dims, keepdim); }, a)) return *r;
  Tensor s = sum(a, dims, keepdim);
  const int64_t count = s.numel() ? a.numel() / s.numel() : 0;
  mul_scalar_(s, 1.0 / double(count));
  return s;
}

Tensor sum_all(const Tensor& a) { return sum(a, {}, false); }

int64_t attention_workspace_per_thread(int64_t T, int64_t HS) { return cpu::attention_workspace_per_thread(T, HS); }
int64_t sum_squares_workspace(int64_t n) { return cpu::sum_squares_workspace(n); }

double sum_squares(const Tensor& a) {
  check_float(a, "sum_squares", "a");
  if (is_half(a)) return sum_squares(cast(a, DType::F32));
  return t_backend == Backend::Cpu
             ? cpu::sum_squares(int(a.dim()), a.shape().data(), a.data<float>(), a.strides().data())
             : ref::sum_squares<float>(int(a.dim()), a.shape().data(), a.data<float>(), a.strides().data());
}

// ---------------------------------------------------------------- matmul / linear

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  check_float(a, "matmul", "a");
  check_float(b, "matmul", "b");
  BRIGADE_CHECK(a.dim() >= 2 && b.dim() >= 2, ShapeError,
                "matmul: both operands need at least 2 dims, got a {} and b {}; unsqueeze 1-D vectors first",
                shape_str(a.shape()), shape_str(b.shape()));
  const int64_t na = a.dim(), nb = b.dim();
  const int64_t M = trans_a ? a.size(-1) : a.size(-2), K = trans_a ? a.size(-2) : a.size(-1);
  const int64_t K2 = trans_b ? b.size(-1) : b.size(-2), N = trans_b ? b.size(-2) : b.size(-1);
  BRIGADE_CHECK(K == K2, ShapeError,
                "matmul: inner dimensions differ: a {}{} gives K = {} but b {}{} gives K = {}", shape_str(a.shape()),
                trans_a ? " (transposed)" : "", K, shape_str(b.shape()), trans_b ? " (transposed)" : "", K2);
  const Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  const Shape bshape = broadcast_named(ab, bb, "matmul (batch dims)");
  // Batch strides of a/b over bshape (0 where broadcast): view the batch part as its own tensor.
  auto batch_strides = [&](const Tensor& t, const Shape& tb) {
    Shape st(bshape.size(), 0);
    const size_t lead = bshape.size() - tb.size();
    for (size_t i = 0; i < tb.size(); ++i) st[lead + i] = (tb[i] == 1 && bshape[lead + i] != 1) ? 0 : t.strides()[i];
    return st;
  };
  const Shape abst = batch_strides(a, ab), bbst = batch_strides(b, bb);
  const int64_t sam = trans_a ? a.stride(na - 1) : a.stride(na - 2), sak = trans_a ? a.stride(na - 2) : a.stride(na - 1);
  const int64_t sbk = trans_b ? b.stride(nb - 1) : b.stride(nb - 2), sbn = trans_b ? b.stride(nb - 2) : b.stride(nb - 1);
  Shape out = bshape;
  out.push_back(M);
  out.push_back(N);
  if (gemm16({&a, &b})) {  // oneDNN 16-bit GEMM, f32 accumulation, rounded once
    Tensor c = Tensor::empty(out, a.dtype());  // (..., M, N)
    cpu::matmul16(a.dtype(), a.dtype(), int(bshape.size()), bshape.data(), a.data<uint16_t>(), abst.data(), sam, sak,
                  b.data<uint16_t>(), bbst.data(), sbk, sbn, c.raw_data(), M, N, K);
    return c;
  }
  if (auto r = via_f32({same_or_f32(a, b)},
                       [&](const Tensor& x, const Tensor& y) { return matmul(x, y, trans_a, trans_b); }, a, b))
    return *r;
  Tensor c = Tensor::empty(out);  // (..., M, N)
  BRIGADE_DISPATCH(matmul, int(bshape.size()), bshape.data(), a.data<float>(), abst.data(), sam, sak,
                   b.data<float>(), bbst.data(), sbk, sbn, c.data<float>(), M, N, K);
  return c;
}

namespace {
struct LinearDims {
  int64_t N, IN, OUT, swo, swi;
  Tensor x2;  // x viewed (N, IN)
};
LinearDims linear_dims(const Tensor& x, const Tensor& w, WeightLayout layout, const char* op) {
  check_float(x, op, "x");
  check_float(w, op, "w");
  BRIGADE_CHECK(w.dim() == 2, ShapeError, "{}: the weight must be 2-D ({}), got {}", op,
                layout == WeightLayout::OutIn ? "(out, in)" : "(in, out)", shape_str(w.shape()));
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "{}: x must have at least 1 dim, got a 0-d tensor", op);
  LinearDims d;
  const bool oi = layout == WeightLayout::OutIn;
  d.OUT = oi ? w.size(0) : w.size(1);
  d.IN = oi ? w.size(1) : w.size(0);
  d.swo = oi ? w.stride(0) : w.stride(1);
  d.swi = oi ? w.stride(1) : w.stride(0);
  BRIGADE_CHECK(x.size(-1) == d.IN, ShapeError,
                "{}: x {} has {} input features but the weight {} ({} layout) expects {}; check the layer sizes "
                "and the WeightLayout", op, shape_str(x.shape()), x.size(-1), shape_str(w.shape()),
                oi ? "OutIn (out, in)" : "InOut (in, out)", d.IN);
  d.N = d.IN ? x.numel() / d.IN : 0;
  d.x2 = x.reshape({d.N, d.IN});  // (N, IN), a view when the strides allow it
  return d;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout) {
  LinearDims d = linear_dims(x, w, layout, "linear");
  Tensor bc;
  if (bias.defined()) {
    check_float(bias, "linear", "bias");
    BRIGADE_CHECK(bias.dim() == 1 && bias.size(0) == d.OUT, ShapeError,
                  "linear: bias must be ({}) to match {} output features, got {}", d.OUT, d.OUT,
                  shape_str(bias.shape()));
    bc = bias.contiguous();
  }
  Shape out = x.shape();
  out.back() = d.OUT;
  if (gemm16({&x, &w}) && d.N > 0 && d.IN > 0 && d.OUT > 0) {  // oneDNN 16-bit GEMM + bias, rounded once
    if (bc.defined() && bc.dtype() != DType::F32 && bc.dtype() != x.dtype()) bc = cast(bc, DType::F32);
    Tensor y = Tensor::empty(out, x.dtype());  // (..., OUT)
    cpu::linear16(x.dtype(), x.dtype(), d.N, d.IN, d.OUT, d.x2.data<uint16_t>(), d.x2.stride(0), d.x2.stride(1),
                  w.data<uint16_t>(), d.swo, d.swi, bc.defined() ? bc.raw_data() : nullptr,
                  bc.defined() ? bc.dtype() : DType::F32, y.raw_data());
    return y;
  }
  if (auto r = via_f32({same_or_f32(x, w)},
                       [&](const Tensor& a, const Tensor& b, const Tensor& c) { return linear(a, b, c, layout); },
                       x, w, bias))
    return *r;
  Tensor y = Tensor::empty(out);  // (..., OUT)
  BRIGADE_DISPATCH(linear, d.N, d.IN, d.OUT, d.x2.data<float>(), d.x2.stride(0), d.x2.stride(1), w.data<float>(),
                   d.swo, d.swi, bc.defined() ? bc.data<float>() : nullptr, y.data<float>());
  return y;
}

LinearGrads linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, WeightLayout layout, bool need_gx,
                            bool need_gw, bool need_gb) {
  LinearDims d = linear_dims(x, w, layout, "linear_backward");
  check_float(gy, "linear_backward", "gy");
  Shape ys = x.shape();
  ys.back() = d.OUT;
  BRIGADE_CHECK(gy.shape() == ys, ShapeError, "linear_backward: gy has shape {} but the output of linear was {}",
                shape_str(gy.shape()), shape_str(ys));
  const bool oi = layout == WeightLayout::OutIn;
  if (gemm16({&gy, &x, &w}) && d.N > 0 && d.IN > 0 && d.OUT > 0) {  // oneDNN 16-bit GEMMs, rounded once
    const DType dt = x.dtype();
    Tensor gyc = gy.contiguous();
    LinearGrads g;
    if (need_gx) g.gx = Tensor::empty(x.shape(), dt);  // (..., IN)
    if (need_gw) g.gw = Tensor::empty(w.shape(), dt);  // (OUT, IN) or (IN, OUT)
    cpu::linear_backward16(dt, d.N, d.IN, d.OUT, gyc.data<uint16_t>(), d.x2.data<uint16_t>(), d.x2.stride(0),
                           d.x2.stride(1), w.data<uint16_t>(), d.swo, d.swi,
                           need_gx ? g.gx.data<uint16_t>() : nullptr, need_gw ? g.gw.data<uint16_t>() : nullptr,
                           oi ? d.IN : 1, oi ? 1 : d.OUT);
    if (need_gb) {  // column sums of gy in f32, rounded once
      Tensor gyf = cast(gyc, DType::F32), gbf = Tensor::empty({d.OUT});  // (N, OUT), (OUT)
      cpu::column_sum(d.N, d.OUT, gyf.data<float>(), gbf.data<float>());
      g.gb = cast(gbf, dt);  // (OUT)
    }
    return g;
  }
  if (auto r = via_f32({x.dtype(), w.dtype(), gy.dtype()},
                       [&](const Tensor& gy_, const Tensor& x_, const Tensor& w_) {
                         return linear_backward(gy_, x_, w_, layout, need_gx, need_gw, need_gb);
                       },
                       gy, x, w))
    return *r;
  Tensor gyc = gy.contiguous();
  LinearGrads g;
  if (need_gx) g.gx = Tensor::empty(x.shape());  // (..., IN)
  if (need_gw) g.gw = Tensor::empty(w.shape());  // (OUT, IN) or (IN, OUT)
  if (need_gb) g.gb = Tensor::empty({d.OUT});    // (OUT)
  BRIGADE_DISPATCH(linear_backward, d.N, d.IN, d.OUT, gyc.data<float>(), d.x2.data<float>(), d.x2.stride(0),
                   d.x2.stride(1), w.data<float>(), d.swo, d.swi, need_gx ? g.gx.data<float>() : nullptr,
                   need_gw ? g.gw.data<float>() : nullptr, oi ? d.IN : 1, oi ? 1 : d.OUT,
                   need_gb ? g.gb.data<float>() : nullptr);
  return g;
}

// ---------------------------------------------------------------- embedding

namespace {
std::vector<int64_t> checked_ids(const Tensor& ids, int64_t V, const char* op) {
  check_ids(ids, op, "ids");
  std::vector<int64_t> v = ids_vector(ids);
  for (size_t i = 0; i < v.size(); ++i)
    BRIGADE_CHECK(v[i] >= 0 && v[i] < V, ValueError,
                  "{}: id {} at flat position {} is outside [0, V) with V = {}; check the tokenizer's vocabulary "
                  "size against the model's vocab_size", op, v[i], i, V);
  return v;
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  check_float(weight, "embedding", "weight");
  BRIGADE_CHECK(weight.dim() == 2, ShapeError, "embedding: weight must be (V, C), got {}", shape_str(weight.shape()));
  const int64_t V = weight.size(0), C = weight.size(1);
  const std::vector<int64_t> v = checked_ids(ids, V, "embedding");
  Shape out = ids.shape();
  out.push_back(C);
  if (is_half(weight) && t_backend == Backend::Cpu) {  // a bit copy of 16-bit rows (no rounding involved)
    Tensor y = Tensor::empty(out, weight.dtype());  // (..., C)
    cpu::embedding16(int64_t(v.size()), C, weight.data<uint16_t>(), weight.stride(0), weight.stride(1), v.data(),
                     y.data<uint16_t>());
    return y;
  }
  if (auto r = via_f32({weight.dtype()}, [&](const Tensor& w) { return embedding(w, ids); }, weight)) return *r;
  Tensor y = Tensor::empty(out);  // (..., C)
  BRIGADE_DISPATCH(embedding, int64_t(v.size()), C, weight.data<float>(), weight.stride(0), weight.stride(1),
                   v.data(), y.data<float>());
  return y;
}

Tensor embedding_backward(const Tensor& gy, const Tensor& ids, int64_t V) {
  check_float(gy, "embedding_backward", "gy");
  BRIGADE_CHECK(V > 0, ValueError, "embedding_backward: V must be positive, got {}", V);
  const std::vector<int64_t> v = checked_ids(ids, V, "embedding_backward");
  BRIGADE_CHECK(gy.dim() == ids.dim() + 1 && Shape(gy.shape().begin(), gy.shape().end() - 1) == ids.shape(),
                ShapeError, "embedding_backward: gy {} must be ids.shape + (C) with ids {}", shape_str(gy.shape()),
                shape_str(ids.shape()));
  const int64_t C = gy.size(-1);
  if (native16({&gy})) {
    Tensor gw = Tensor::empty({V, C}, gy.dtype());  // (V, C)
    cpu::embedding_backward16(int64_t(v.size()), C, V, strided(gy), v.data(), gy.dtype(), gw.raw_data());
    return gw;
  }
  if (auto r = via_f32({gy.dtype()}, [&](const Tensor& g) { return embedding_backward(g, ids, V); }, gy)) return *r;
  Tensor gyc = gy.contiguous();
  Tensor gw = Tensor::empty({V, C});  // (V, C)
  BRIGADE_DISPATCH(embedding_backward, int64_t(v.size()), C, V, gyc.data<float>(), v.data(), gw.data<float>());
  return gw;
}

// ---------------------------------------------------------------- layer norm

namespace {
void check_vec(const Tensor& t, int64_t C, const char* op, const char* name, const Tensor& x) {
  check_float(t, op, name);
  BRIGADE_CHECK(t.dim() == 1 && t.size(0) == C, ShapeError,
                "{}: '{}' must be ({}) to match the last dim of x {}, got {}", op, name, C, shape_str(x.shape()),
                shape_str(t.shape()));
}
}  // namespace

LayerNormOut layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  check_float(x, "layer_norm", "x");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "layer_norm: x must have at least 1 dim");
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  check_vec(w, C, "layer_norm", "w", x);
  Tensor bc = b.defined() ? b : Tensor::zeros({C});  // (C); an undefined bias means no bias
  check_vec(bc, C, "layer_norm", "b", x);
  BRIGADE_CHECK(eps >= 0, ValueError, "layer_norm: eps must be >= 0, got {}", eps);
  if (native16({&x})) {  // w and b: any floating dtype, widened ((C) each)
    const Tensor wf = f32_contiguous(w), bf = f32_contiguous(bc);
    LayerNormOut o;
    o.y = Tensor::empty(x.shape(), x.dtype());  // (..., C)
    o.mean = Tensor::empty({N});                // (N)
    o.rstd = Tensor::empty({N});                // (N)
    cpu::layer_norm16(N, C, strided(x), wf.data<float>(), bf.data<float>(), eps, x.dtype(), o.y.raw_data(),
                      o.mean.data<float>(), o.rstd.data<float>());
    return o;
  }
  if (auto r = via_f32({x.dtype(), DType::F32, DType::F32},
                       [&](const Tensor& x_, const Tensor& w_, const Tensor& b_) {
                         return layer_norm(x_, w_, b_, eps);
                       },
                       x, w, b))
    return *r;
  Tensor xc = x.contiguous(), wc = w.contiguous();
  bc = bc.contiguous();
  LayerNormOut o;
  o.y = Tensor::empty(x.shape());  // (..., C)
  o.mean = Tensor::empty({N});     // (N)
  o.rstd = Tensor::empty({N});     // (N)
  BRIGADE_DISPATCH(layer_norm, N, C, xc.data<float>(), wc.data<float>(), bc.data<float>(), eps, o.y.data<float>(),
                   o.mean.data<float>(), o.rstd.data<float>());
  return o;
}

LayerNormGrads layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                   const Tensor& rstd) {
  check_float(x, "layer_norm_backward", "x");
  check_float(gy, "layer_norm_backward", "gy");
  check_same_shape(gy, x, "layer_norm_backward", "gy", "x");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "layer_norm_backward: x must have at least 1 dim");
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  check_vec(w, C, "layer_norm_backward", "w", x);
  check_vec(mean, N, "layer_norm_backward", "mean", x);
  check_vec(rstd, N, "layer_norm_backward", "rstd", x);
  if (native16({&gy, &x}) && mean.dtype() == DType::F32 && rstd.dtype() == DType::F32) {  // w: any floating dtype
    const Tensor wf = f32_contiguous(w), mc = mean.contiguous(), rc = rstd.contiguous();
    LayerNormGrads g;
    g.gx = Tensor::empty(x.shape(), x.dtype());  // (..., C)
    g.gw = Tensor::empty({C});                   // (C)
    g.gb = Tensor::empty({C});                   // (C)
    cpu::layer_norm_backward16(N, C, strided(gy), strided(x), wf.data<float>(), mc.data<float>(), rc.data<float>(),
                               x.dtype(), g.gx.raw_data(), g.gw.data<float>(), g.gb.data<float>());
    g.gw = round_to(g.gw, w.dtype());
    g.gb = round_to(g.gb, w.dtype());
    return g;
  }
  if (auto r = via_f32({x.dtype(), w.dtype(), w.dtype()},
                       [](const Tensor& gy_, const Tensor& x_, const Tensor& w_, const Tensor& m_, const Tensor& r_) {
                         return layer_norm_backward(gy_, x_, w_, m_, r_);
                       },
                       gy, x, w, mean, rstd))
    return *r;
  Tensor gyc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous(), mc = mean.contiguous(),
         rc = rstd.contiguous();
  LayerNormGrads g;
  g.gx = Tensor::empty(x.shape());  // (..., C)
  g.gw = Tensor::empty({C});        // (C)
  g.gb = Tensor::empty({C});        // (C)
  BRIGADE_DISPATCH(layer_norm_backward, N, C, gyc.data<float>(), xc.data<float>(), wc.data<float>(),
                   mc.data<float>(), rc.data<float>(), g.gx.data<float>(), g.gw.data<float>(), g.gb.data<float>());
  return g;
}

// ---------------------------------------------------------------- gelu / softmax

Tensor gelu(const Tensor& x) {
  check_float(x, "gelu", "x");
  if (native16({&x})) {
    Tensor y = Tensor::empty(x.shape(), x.dtype());  // same as x
    cpu::gelu16(strided(x), x.dtype(), y.raw_data());
    return y;
  }
  if (auto r = via_f32({x.dtype()}, [](const Tensor& x_) { return gelu(x_); }, x)) return *r;
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape());  // same as x
  BRIGADE_DISPATCH(gelu, x.numel(), xc.data<float>(), y.data<float>());
  return y;
}

Tensor gelu_backward(const Tensor& gy, const Tensor& x) {
  check_float(gy, "gelu_backward", "gy");
  check_float(x, "gelu_backward", "x");
  check_same_shape(gy, x, "gelu_backward", "gy", "x");
  if (native16({&gy, &x})) {
    Tensor gx = Tensor::empty(x.shape(), x.dtype());  // same as x
    cpu::gelu_backward16(strided(gy), strided(x), x.dtype(), gx.raw_data());
    return gx;
  }
  if (auto r = via_f32({x.dtype()}, [](const Tensor& g_, const Tensor& x_) { return gelu_backward(g_, x_); }, gy, x))
    return *r;
  Tensor gyc = gy.contiguous(), xc = x.contiguous();
  Tensor gx = Tensor::empty(x.shape());  // same as x
  BRIGADE_DISPATCH(gelu_backward, x.numel(), gyc.data<float>(), xc.data<float>(), gx.data<float>());
  return gx;
}

Tensor softmax(const Tensor& x) {
  check_float(x, "softmax", "x");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "softmax: x must have at least 1 dim, got a 0-d tensor");
  if (native16({&x})) {
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    Tensor y = Tensor::empty(x.shape(), x.dtype());  // (..., C)
    cpu::softmax16(N, C, strided(x), x.dtype(), y.raw_data());
    return y;
  }
  if (auto r = via_f32({x.dtype()}, [](const Tensor& x_) { return softmax(x_); }, x)) return *r;
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape());  // (..., C)
  BRIGADE_DISPATCH(softmax, N, C, xc.data<float>(), y.data<float>());
  return y;
}

Tensor softmax_backward(const Tensor& gy, const Tensor& y) {
  check_float(gy, "softmax_backward", "gy");
  check_float(y, "softmax_backward", "y");
  check_same_shape(gy, y, "softmax_backward", "gy", "y");
  BRIGADE_CHECK(y.dim() >= 1, ShapeError, "softmax_backward: y must have at least 1 dim");
  if (native16({&gy, &y})) {
    const int64_t C = y.size(-1), N = C ? y.numel() / C : 0;
    Tensor gx = Tensor::empty(y.shape(), y.dtype());  // (..., C)
    cpu::softmax_backward16(N, C, strided(gy), strided(y), y.dtype(), gx.raw_data());
    return gx;
  }
  if (auto r = via_f32({y.dtype()}, [](const Tensor& g_, const Tensor& y_) { return softmax_backward(g_, y_); }, gy, y))
    return *r;
  const int64_t C = y.size(-1), N = C ? y.numel() / C : 0;
  Tensor gyc = gy.contiguous(), yc = y.contiguous();
  Tensor gx = Tensor::empty(y.shape());  // (..., C)
  BRIGADE_DISPATCH(softmax_backward, N, C, gyc.data<float>(), yc.data<float>(), gx.data<float>());
  return gx;
}

// ---------------------------------------------------------------- attention

namespace {
void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  check_float(q, op, "q");
  check_float(k, op, "k");
  check_float(v, op, "v");
  BRIGADE_CHECK(q.dim() == 4, ShapeError, "{}: q must be (B, NH, T, HS), got {}", op, shape_str(q.shape()));
  check_same_shape(k, q, op, "k", "q");
  check_same_shape(v, q, op, "v", "q");
}
}  // namespace

AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  check_qkv(q, k, v, "attention");
  if (native16({&q, &k, &v})) {
    const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
    AttentionOut o;
    o.out = Tensor::empty({B, NH, T, HS}, q.dtype());  // (B, NH, T, HS)
    o.lse = Tensor::empty({B, NH, T});                 // (B, NH, T)
    cpu::attention16(B * NH, T, HS, strided(q), strided(k), strided(v), causal, scale, q.dtype(), o.out.raw_data(),
                     o.lse.data<float>());
    return o;
  }
  if (auto r = via_f32({q.dtype(), DType::F32},
                       [&](const Tensor& q_, const Tensor& k_, const Tensor& v_) {
                         return attention(q_, k_, v_, causal, scale);
                       },
                       q, k, v))
    return *r;
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  AttentionOut o;
  o.out = Tensor::empty({B, NH, T, HS});  // (B, NH, T, HS)
  o.lse = Tensor::empty({B, NH, T});      // (B, NH, T)
  BRIGADE_DISPATCH(attention, B * NH, T, HS, qc.data<float>(), kc.data<float>(), vc.data<float>(), causal, scale,
                   o.out.data<float>(), o.lse.data<float>());
  return o;
}

AttentionGrads AttentionGrads::empty(const Shape& s, DType dt) {
  return {Tensor::empty(s, dt), Tensor::empty(s, dt), Tensor::empty(s, dt)};
}

AttentionGrads attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, bool causal, double scale) {
  check_qkv(q, k, v, "attention_backward");
  check_float(gout, "attention_backward", "gout");
  check_float(out, "attention_backward", "out");
  check_float(lse, "attention_backward", "lse");
  check_same_shape(gout, q, "attention_backward", "gout", "q");
  check_same_shape(out, q, "attention_backward", "out", "q");
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  BRIGADE_CHECK(lse.shape() == Shape({B, NH, T}), ShapeError,
                "attention_backward: lse must be (B, NH, T) = {}, got {}", shape_str({B, NH, T}),
                shape_str(lse.shape()));
  if (native16({&gout, &q, &k, &v, &out}) && lse.dtype() == DType::F32) {
    const Tensor lc = lse.contiguous();
    AttentionGrads g = AttentionGrads::empty(q.shape(), q.dtype());  // each (B, NH, T, HS)
    cpu::attention_backward16(B * NH, T, HS, strided(gout), strided(q), strided(k), strided(v), strided(out),
                              lc.data<float>(), causal, scale, q.dtype(), g.gq.raw_data(), g.gk.raw_data(),
                              g.gv.raw_data());
    return g;
  }
  if (auto r = via_f32({q.dtype(), k.dtype(), v.dtype()},
                       [&](const Tensor& g_, const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& o_,
                           const Tensor& l_) { return attention_backward(g_, q_, k_, v_, o_, l_, causal, scale); },
                       gout, q, k, v, out, lse))
    return *r;
  Tensor gc = gout.contiguous(), qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(),
         oc = out.contiguous(), lc = lse.contiguous();
  AttentionGrads g = AttentionGrads::empty(q.shape());  // each (B, NH, T, HS)
  BRIGADE_DISPATCH(attention_backward, B * NH, T, HS, gc.data<float>(), qc.data<float>(), kc.data<float>(),
                   vc.data<float>(), oc.data<float>(), lc.data<float>(), causal, scale, g.gq.data<float>(),
                   g.gk.data<float>(), g.gv.data<float>());
  return g;
}

// ---------------------------------------------------------------- cross-entropy

namespace {
std::vector<int64_t> checked_targets(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                     const char* op) {
  check_float(logits, op, "logits");
  check_ids(targets, op, "targets");
  BRIGADE_CHECK(logits.dim() == 2, ShapeError, "{}: logits must be (N, V), got {}; flatten (B, T, V) to (B*T, V)",
                op, shape_str(logits.shape()));
  BRIGADE_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), ShapeError,
                "{}: targets must be (N) = ({}) to match logits {}, got {}", op, logits.size(0),
                shape_str(logits.shape()), shape_str(targets.shape()));
  const int64_t V = logits.size(1);
  std::vector<int64_t> t = ids_vector(targets);
  for (size_t i = 0; i < t.size(); ++i)
    BRIGADE_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < V), ValueError,
                  "{}: target {} at row {} is outside [0, V) with V = {} and is not ignore_index ({})", op, t[i], i,
                  V, ignore_index);
  return t;
}
}  // namespace

CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const std::vector<int64_t> t = checked_targets(logits, targets, ignore_index, "cross_entropy");
  if (native16({&logits})) {
    const int64_t N = logits.size(0), V = logits.size(1);
    CrossEntropyOut o;
    o.loss = Tensor::empty({});  // ()
    o.lse = Tensor::empty({N});  // (N)
    cpu::cross_entropy16(N, V, strided(logits), t.data(), ignore_index, o.loss.data<float>(), o.lse.data<float>());
    return o;
  }
  if (auto r = via_f32({DType::F32, DType::F32},
                       [&](const Tensor& l_) { return cross_entropy(l_, targets, ignore_index); }, logits))
    return *r;
  const int64_t N = logits.size(0), V = logits.size(1);
  Tensor lc = logits.contiguous();
  CrossEntropyOut o;
  o.loss = Tensor::empty({});  // ()
  o.lse = Tensor::empty({N});  // (N)
  BRIGADE_DISPATCH(cross_entropy, N, V, lc.data<float>(), t.data(), ignore_index, o.loss.data<float>(),
                   o.lse.data<float>());
  return o;
}

namespace {
// The gradient into a new tensor, or, with in_place (the cpu backend, contiguous f32 or
// native 16-bit logits), over the logits: each row is read before it is written (the cpu
// kernels work per element, or on a row widened into a buffer).
Tensor cross_entropy_backward_impl(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                   int64_t ignore_index, bool in_place) {
  const std::vector<int64_t> t = checked_targets(logits, targets, ignore_index, "cross_entropy_backward");
  const int64_t N = logits.size(0), V = logits.size(1);
  check_float(lse, "cross_entropy_backward", "lse");
  BRIGADE_CHECK(lse.shape() == Shape({N}), ShapeError, "cross_entropy_backward: lse must be ({}), got {}", N,
                shape_str(lse.shape()));
  if (native16({&logits}) && lse.dtype() == DType::F32) {
    const Tensor sc = lse.contiguous();
    Tensor g = in_place ? logits : Tensor::empty({N, V}, logits.dtype());  // (N, V)
    cpu::cross_entropy_backward16(N, V, gloss, strided(logits), t.data(), sc.data<float>(), ignore_index,
                                  logits.dtype(), g.raw_data());
    return g;
  }
  if (auto r = via_f32({logits.dtype()},
                       [&](const Tensor& l_, const Tensor& s_) {
                         return cross_entropy_backward(gloss, l_, targets, s_, ignore_index);
                       },
                       logits, lse))
    return *r;
  Tensor lc = logits.contiguous(), sc = lse.contiguous();
  Tensor g = in_place ? logits : Tensor::empty({N, V});  // (N, V)
  BRIGADE_DISPATCH(cross_entropy_backward, N, V, gloss, lc.data<float>(), t.data(), sc.data<float>(), ignore_index,
                   g.data<float>());
  return g;
}
}  // namespace

Tensor cross_entropy_backward(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index) {
  return cross_entropy_backward_impl(gloss, logits, targets, lse, ignore_index, false);
}

Tensor cross_entropy_backward_(double gloss, Tensor logits, const Tensor& targets, const Tensor& lse,
                               int64_t ignore_index) {
  const bool in_place = t_backend == Backend::Cpu && logits.defined() && logits.dim() == 2 &&
                        logits.is_contiguous() && logits.sole_owner() && lse.dtype() == DType::F32 &&
                        (logits.dtype() == DType::F32 || native16({&logits}));
  return cross_entropy_backward_impl(gloss, logits, targets, lse, ignore_index, in_place);
}

// ---------------------------------------------------------------- cast

Tensor cast(const Tensor& x, DType dt) {
  check_float(x, "cast", "x");
  BRIGADE_CHECK(is_floating(dt), ShapeError, "cast: the target dtype is {}, but cast converts between floating "
                "dtypes (f32, bf16, f16); use Tensor::to for integers", dtype_name(dt));
  Tensor y = Tensor::empty(x.shape(), dt);  // same as x
  if (x.numel() == 0) return y;
  if (t_backend == Backend::Cpu)
    cpu::cast(x.dtype(), dt, int(x.dim()), x.shape().data(), x.raw_data(), x.strides().data(), y.raw_data());
  else
    ref::cast(x.dtype(), dt, int(x.dim()), x.shape().data(), x.raw_data(), x.strides().data(), y.raw_data());
  return y;
}

}  // namespace brigade::ops
