// Position front-ends (ops/position.h): RoPE and Swin's roll and relative-position index.
#include "brigade/ops/position.h"

#include <vector>

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

// ---------------------------------------------------------------- RoPE

const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::None: return "none";
    case RopeScaling::Linear: return "linear";
    case RopeScaling::Llama3: return "llama3";
  }
  return "?";
}

void check_rope_spec(const RopeSpec& r, const char* op) {
  BRIGADE_CHECK(r.theta > 0.0, ValueError, "{}: theta must be > 0, got {}", op, r.theta);
  if (r.scaling == RopeScaling::None) return;
  const char* name = rope_scaling_name(r.scaling);
  BRIGADE_CHECK(r.factor > 0.0 && std::isfinite(r.factor), ValueError,
                "{}: the {} RoPE scaling's factor must be > 0, got {}", op, name, r.factor);
  if (r.scaling != RopeScaling::Llama3) return;
  BRIGADE_CHECK(r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor && std::isfinite(r.high_freq_factor),
                ValueError, "{}: the llama3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
                op, r.low_freq_factor, r.high_freq_factor);
  BRIGADE_CHECK(r.original_max_positions > 0.0 && std::isfinite(r.original_max_positions), ValueError,
                "{}: the llama3 RoPE scaling's original_max_positions must be > 0, got {}", op,
                r.original_max_positions);
}

namespace {
Tensor rope_impl(const Tensor& x, const RopeSpec& spec, int64_t pos0, double sign, const char* op) {
  check_float(x, op, "x");
  check_heads(x, op, "x");
  const int64_t B = x.size(0), NH = x.size(1), T = x.size(2), HS = x.size(3);
  BRIGADE_CHECK(HS % 2 == 0, ShapeError, "{}: the head size HS = {} of x {} must be even (RoPE rotates pairs)", op, HS,
                shape_str(x.shape()));
  check_rope_spec(spec, op);
  BRIGADE_CHECK(pos0 >= 0, ValueError, "{}: the first position pos0 must be >= 0, got {}", op, pos0);
  if (any_not_f32({&x})) return round_to(rope_impl(f32_of(x), spec, pos0, sign, op), x.dtype());
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty({B, NH, T, HS});  // (B, NH, T, HS)
  BRIGADE_DISPATCH(rope, B * NH, T, HS, spec, pos0, sign, xc.data<float>(), y.data<float>());
  return y;
}
}  // namespace

Tensor rope(const Tensor& x, const RopeSpec& spec, int64_t pos0) { return rope_impl(x, spec, pos0, 1.0, "rope"); }
Tensor rope_backward(const Tensor& gy, const RopeSpec& spec, int64_t pos0) {
  return rope_impl(gy, spec, pos0, -1.0, "rope_backward");
}
Tensor rope(const Tensor& x, double theta, int64_t pos0) { return rope(x, RopeSpec{.theta = theta}, pos0); }
Tensor rope_backward(const Tensor& gy, double theta, int64_t pos0) {
  return rope_backward(gy, RopeSpec{.theta = theta}, pos0);
}

Tensor roll2d(const Tensor& x, int64_t shift_h, int64_t shift_w) {
  BRIGADE_CHECK(x.defined(), ValueError, "roll2d: 'x' is an undefined tensor");
  BRIGADE_CHECK(is_floating(x.dtype()), ShapeError, "roll2d: 'x' must be f32, bf16 or f16, got {}", x.str());
  BRIGADE_CHECK(x.dim() == 4 && x.size(1) > 0 && x.size(2) > 0, ShapeError,
                "roll2d: x must be (B, H, W, C) with H, W > 0, got {}", shape_str(x.shape()));
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype());  // (B, H, W, C)
  if (!on_cpu() && x.dtype() == DType::F32) {
    ref::roll2d<float>(B, H, W, C, shift_h, shift_w, xc.data<float>(), y.data<float>());
  } else if (!on_cpu()) {  // 16-bit: a permutation of 2-byte values
    ref::roll2d<uint16_t>(B, H, W, C, shift_h, shift_w, static_cast<const uint16_t*>(xc.raw_data()),
                          static_cast<uint16_t*>(y.raw_data()));
  } else {
    cpu::roll2d(B, H, W, C, shift_h, shift_w, dtype_size(x.dtype()), static_cast<const char*>(xc.raw_data()),
                static_cast<char*>(y.raw_data()));
  }
  return y;
}

Tensor relative_position_index(int64_t ws) {
  BRIGADE_CHECK(ws > 0, ValueError, "relative_position_index: window size must be positive, got {}", ws);
  const int64_t N = ws * ws;
  std::vector<int64_t> idx(size_t(N * N));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j)
      idx[size_t(i * N + j)] = (i / ws - j / ws + ws - 1) * (2 * ws - 1) + (i % ws - j % ws + ws - 1);
  return Tensor::from_vector_i64(idx, {N * N});
}

}  // namespace brigade::ops
