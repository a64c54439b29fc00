// Position ops: rotary position embedding (RoPE) and Swin's cyclic 2-D roll with its
// relative-position index.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// ---------------- rotary position embedding (Su et al. 2021), Hugging Face LLaMA convention:
// x (B, NH, T, HS), HS even, h = HS / 2; for position p = pos0 + t and i < h,
//   inv_freq[i] = scaled(theta^(-2i / HS)), a = p * inv_freq[i],
//   y[i]     = x[i] cos a - x[i + h] sin a
//   y[i + h] = x[i + h] cos a + x[i] sin a
// (y = x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1), cos/sin = cat(c, c)).
// The frequencies and angles are computed in double and their cos/sin rounded to the kernel's
// scalar type.
//
// The scalings of the inverse frequencies (transformers' modeling_rope_utils.py, whose
// attention factor is 1 for both, so cos/sin are not rescaled):
//   None    inv_freq unchanged (the original RoPE).
//   Linear  inv_freq / factor: positions interpolated by 1 / factor (Chen et al. 2023,
//           "Extending Context Window ... via Positional Interpolation").
//   Llama3  by wavelength w = 2 pi / inv_freq (Meta's Llama 3.1 scaling), with
//           L = original_max_positions, lo = low_freq_factor, hi = high_freq_factor:
//             w < L / hi           unchanged (high frequencies)
//             w > L / lo           inv_freq / factor (low frequencies)
//             otherwise            (1 - s) inv_freq / factor + s inv_freq, s = (L / w - lo) / (hi - lo).
enum class RopeScaling : uint8_t { None, Linear, Llama3 };
const char* rope_scaling_name(RopeScaling s);  // "none", "linear", "llama3"
struct RopeSpec {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::None;
  double factor = 1.0;                   // Linear, Llama3: > 0
  double low_freq_factor = 1.0;          // Llama3: > 0
  double high_freq_factor = 4.0;         // Llama3: > low_freq_factor
  double original_max_positions = 8192;  // Llama3: the pre-training context length, > 0
  bool operator==(const RopeSpec&) const = default;
};
// ValueError naming the bad field unless theta > 0 and the scaling's fields are usable.
void check_rope_spec(const RopeSpec& spec, const char* op);

Tensor rope(const Tensor& x, const RopeSpec& spec, int64_t pos0 = 0);
// The backward is the inverse (transposed) rotation: gx = rope with angle -a applied to gy.
Tensor rope_backward(const Tensor& gy, const RopeSpec& spec, int64_t pos0 = 0);
// Unscaled RoPE with base theta: rope(x, RopeSpec{theta}).
Tensor rope(const Tensor& x, double theta, int64_t pos0 = 0);
Tensor rope_backward(const Tensor& gy, double theta, int64_t pos0 = 0);

// x (B, H, W, C) any floating dtype -> same shape and dtype; shifts taken modulo H and W.
Tensor roll2d(const Tensor& x, int64_t shift_h, int64_t shift_w);

// (ws*ws * ws*ws) i64, flattened row-major over (i, j).
Tensor relative_position_index(int64_t ws);

}  // namespace brigade::ops
