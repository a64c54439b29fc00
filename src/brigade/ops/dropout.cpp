// Dropout front-end (ops/dropout.h): draws the inverted-dropout mask serially from the
// Generator in element order, then applies it with the active backend's kernel.
// In its own file so that binaries which never call dropout do not need rng.cpp.
#include <algorithm>

#include "brigade/ops/detail.h"
#include "brigade/ops/dropout.h"

namespace brigade::ops {

using namespace detail;

namespace {
// The native 16-bit cpu kernels apply (see ops.h).
bool native16_on() { return on_cpu() && cpu::native16_enabled(); }
}  // namespace

// 16-bit x (see ops.h): the mask is drawn in f32 exactly as for f32 x, then rounded to x's
// dtype; y = x * (the rounded mask) in f32, rounded once, so dropout_backward(x, mask) == y.
// On the cpu backend the 16-bit mask is drawn straight into x's dtype (the same values) and
// y comes from the native 16-bit multiply.
DropoutOut dropout(const Tensor& x, double p, Generator& gen) {
  check_float(x, "dropout", "x");
  BRIGADE_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: p must be in [0, 1], got {}", p);
  if (is_half(x) && native16_on()) {
    const DType dt = x.dtype();
    auto bits = [dt](float f) { return dt == DType::BF16 ? float_to_bf16(f) : float_to_f16(f); };
    DropoutOut o;
    o.mask = Tensor::empty(x.shape(), dt);  // same as x
    o.y = Tensor::empty(x.shape(), dt);     // same as x
    uint16_t* m = o.mask.data<uint16_t>();
    const int64_t n = x.numel();
    if (p == 0.0) {
      std::fill(m, m + n, bits(1.0f));
    } else {
      const float keep = float(1.0 - p), inv = p < 1.0 ? float(1.0 / (1.0 - p)) : 0.0f;
      const uint16_t on = bits(inv), off = bits(0.0f);
      for (int64_t i = 0; i < n; ++i) m[i] = gen.uniform_float() < keep ? on : off;
    }
    cpu::binary16(ref::BinaryOp::Mul, strided(x), strided(o.mask), dt, o.y.raw_data());
    return o;
  }
  Tensor xc = x.dtype() == DType::F32 ? x.contiguous() : cast(x, DType::F32);  // f32, contiguous
  DropoutOut o;
  o.mask = Tensor::empty(x.shape());  // same as x
  o.y = Tensor::empty(x.shape());     // same as x
  float* m = o.mask.data<float>();
  const int64_t n = x.numel();
  if (p == 0.0) {
    std::fill(m, m + n, 1.0f);
  } else {
    // Drawn serially in element order so the mask depends only on the generator state.
    const float keep = float(1.0 - p), inv = p < 1.0 ? float(1.0 / (1.0 - p)) : 0.0f;
    for (int64_t i = 0; i < n; ++i) m[i] = gen.uniform_float() < keep ? inv : 0.0f;
  }
  if (x.dtype() == DType::F32) {
    BRIGADE_DISPATCH(dropout_apply, n, xc.data<float>(), m, o.y.data<float>());
    return o;
  }
  o.mask = cast(o.mask, x.dtype());
  const Tensor mf = cast(o.mask, DType::F32);
  BRIGADE_DISPATCH(dropout_apply, n, xc.data<float>(), mf.data<float>(), o.y.data<float>());
  o.y = cast(o.y, x.dtype());
  return o;
}

Tensor dropout_backward(const Tensor& gy, const Tensor& mask) {
  check_float(gy, "dropout_backward", "gy");
  check_float(mask, "dropout_backward", "mask");
  check_same_shape(gy, mask, "dropout_backward", "gy", "mask");
  if (is_half(mask) && native16_on()) {                   // gy: any floating dtype; gx in the mask's
    Tensor gx = Tensor::empty(gy.shape(), mask.dtype());  // same as gy
    cpu::binary16(ref::BinaryOp::Mul, strided(gy), strided(mask), mask.dtype(), gx.raw_data());
    return gx;
  }
  const bool f32 = gy.dtype() == DType::F32 && mask.dtype() == DType::F32;
  Tensor gc = f32 ? gy.contiguous() : f32_of(gy).contiguous(), mc = f32 ? mask.contiguous() : f32_of(mask).contiguous();
  Tensor gx = Tensor::empty(gy.shape());  // same as gy
  BRIGADE_DISPATCH(dropout_apply, gy.numel(), gc.data<float>(), mc.data<float>(), gx.data<float>());
  return f32 ? gx : (mask.dtype() == DType::F32 ? gx : cast(gx, mask.dtype()));
}

}  // namespace brigade::ops
