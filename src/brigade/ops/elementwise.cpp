// Elementwise front-ends (ops/elementwise.h): broadcasting, the in-place updates, GELU.
#include "brigade/ops/elementwise.h"

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

namespace {

using ref::BinaryOp;
using ref::UnaryOp;

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
  if (auto r = via_f32(
          {same_or_f32(a, b)}, [&](const Tensor& x, const Tensor& y) { return binary_op(op, name, x, y); }, a, b))
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
  if (auto r = via_f32(
          {a.dtype()}, [&](const Tensor& x) { return unary_op(op, s, name, x); }, a))
    return *r;
  Tensor y = Tensor::empty(a.shape());  // same as a
  BRIGADE_DISPATCH(unary, op, s, int(a.dim()), a.shape().data(), a.data<float>(), a.strides().data(), y.data<float>());
  return y;
}

// The f32 path's tail of the ops with contiguous kernels (GELU, SiLU): y (shape) =
// kernel(n, the inputs' contiguous f32 values..., y).
template <class K, class... T>
Tensor map_contiguous(K kernel, const Shape& shape, const T&... in) {
  Tensor y = Tensor::empty(shape);  // shape
  kernel(y.numel(), fptr(in.contiguous())..., y.data<float>());
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
  if ((is_half(dst) || is_half(src)) && on_cpu() && cpu::native16_enabled()) {
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
                "broadcasting",
                shape_str(shape), shape_str(gs));
  const bool n16 = native16({&g});
  if (!n16)
    if (auto r = via_f32(
            {g.dtype()}, [&](const Tensor& x) { return sum_to(x, shape); }, g))
      return *r;
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

// ---------------------------------------------------------------- gelu / softmax

Tensor gelu(const Tensor& x) {
  check_float(x, "gelu", "x");
  if (native16({&x})) {
    Tensor y = Tensor::empty(x.shape(), x.dtype());  // same as x
    cpu::gelu16(strided(x), x.dtype(), y.raw_data());
    return y;
  }
  if (auto r = via_f32(
          {x.dtype()}, [](const Tensor& x_) { return gelu(x_); }, x))
    return *r;
  return map_contiguous([](auto... a) { BRIGADE_DISPATCH(gelu, a...); }, x.shape(), x);
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
  if (auto r = via_f32(
          {x.dtype()}, [](const Tensor& g_, const Tensor& x_) { return gelu_backward(g_, x_); }, gy, x))
    return *r;
  return map_contiguous([](auto... a) { BRIGADE_DISPATCH(gelu_backward, a...); }, x.shape(), gy, x);
}

// ---------------------------------------------------------------- GELU (exact, erf)

Tensor gelu_erf(const Tensor& x) {
  check_float(x, "gelu_erf", "x");
  if (is_half(x)) return round_to(gelu_erf(f32_of(x)), x.dtype());
  return map_contiguous([](auto... a) { BRIGADE_DISPATCH(gelu_erf, a...); }, x.shape(), x);
}

Tensor gelu_erf_backward(const Tensor& gy, const Tensor& x) {
  check_float(gy, "gelu_erf_backward", "gy");
  check_float(x, "gelu_erf_backward", "x");
  check_same_shape(gy, x, "gelu_erf_backward", "gy", "x");
  if (is_half(gy) || is_half(x)) return round_to(gelu_erf_backward(f32_of(gy), f32_of(x)), x.dtype());
  return map_contiguous([](auto... a) { BRIGADE_DISPATCH(gelu_erf_backward, a...); }, x.shape(), gy, x);
}

// ---------------------------------------------------------------- SiLU

Tensor silu(const Tensor& x) {
  check_float(x, "silu", "x");
  if (any_not_f32({&x})) return round_to(silu(f32_of(x)), x.dtype());
  return map_contiguous([](auto... a) { BRIGADE_DISPATCH(silu, a...); }, x.shape(), x);
}

Tensor silu_backward(const Tensor& gy, const Tensor& x) {
  check_float(gy, "silu_backward", "gy");
  check_float(x, "silu_backward", "x");
  check_same_shape(gy, x, "silu_backward", "gy", "x");
  if (any_not_f32({&gy, &x})) return round_to(silu_backward(f32_of(gy), f32_of(x)), x.dtype());
  return map_contiguous([](auto... a) { BRIGADE_DISPATCH(silu_backward, a...); }, x.shape(), gy, x);
}

// ---------------------------------------------------------------- relu

Tensor relu(const Tensor& x) {
  check_float(x, "relu", "x");
  if (is_half(x) && on_cpu()) {
    const Tensor xc = x.contiguous();
    Tensor y = Tensor::empty(x.shape(), x.dtype());  // x's shape and dtype
    cpu::relu16(x.numel(), cpu::inf_bits(x.dtype()), xc.data<uint16_t>(), y.data<uint16_t>());
    return y;
  }
  if (is_half(x)) return round_to(relu(f32_of(x)), x.dtype());
  Tensor y = Tensor::empty(x.shape());  // x's shape
  if (on_cpu()) {
    cpu::relu(strided(x), y.data<float>());
  } else {
    const Tensor xc = x.contiguous();
    ref::relu<float>(x.numel(), xc.data<float>(), y.data<float>());
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
    cpu::relu_backward16(y.numel(), cpu::inf_bits(y.dtype()), gc.data<uint16_t>(), yc.data<uint16_t>(),
                         gx.data<uint16_t>());
    return gx;
  }
  if (is_half(gy) || is_half(y)) return round_to(relu_backward(f32_of(gy), f32_of(y)), gy.dtype());
  Tensor gx = Tensor::empty(y.shape());  // y's shape
  if (on_cpu()) {
    cpu::relu_backward(strided(gy), strided(y), gx.data<float>());
  } else {
    const Tensor gc = gy.contiguous(), yc = y.contiguous();
    ref::relu_backward<float>(y.numel(), gc.data<float>(), yc.data<float>(), gx.data<float>());
  }
  return gx;
}

Tensor add_relu(const Tensor& a, const Tensor& b) {
  check_float(a, "add_relu", "a");
  check_float(b, "add_relu", "b");
  BRIGADE_CHECK(a.shape() == b.shape(), ShapeError,
                "add_relu: a {} and b {} must have the same shape (for a broadcast, call add, then relu)",
                shape_str(a.shape()), shape_str(b.shape()));
  if (native16({&a, &b}) || (on_cpu() && !any_not_f32({&a, &b}))) {  // strided reads, any one dtype
    Tensor y = Tensor::empty(a.shape(), a.dtype());                  // a's shape and dtype
    cpu::add_relu(strided(a), strided(b), a.dtype(), y.raw_data());
    return y;
  }
  if (auto r = via_f32(
          {same_or_f32(a, b)}, [](const Tensor& x, const Tensor& y) { return add_relu(x, y); }, a, b))
    return *r;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  Tensor y = Tensor::empty(a.shape());  // a's shape
  ref::add_relu<float>(a.numel(), ac.data<float>(), bc.data<float>(), y.data<float>());
  return y;
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
  return unary_f32(
      x, "sigmoid", [](float v) { return 1.0f / (1.0f + std::exp(-v)); }, ref::sigmoid<float>);
}

Tensor sigmoid_backward(const Tensor& gy, const Tensor& y) {
  return unary_backward_f32(
      gy, y, "sigmoid_backward", [](float g, float v) { return g * v * (1.0f - v); }, ref::sigmoid_backward<float>);
}

Tensor reciprocal(const Tensor& x) {
  return unary_f32(
      x, "reciprocal", [](float v) { return 1.0f / v; }, ref::reciprocal<float>);
}

Tensor reciprocal_backward(const Tensor& gy, const Tensor& y) {
  return unary_backward_f32(
      gy, y, "reciprocal_backward", [](float g, float v) { return -(g * v * v); }, ref::reciprocal_backward<float>);
}

}  // namespace brigade::ops
