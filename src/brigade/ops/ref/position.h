// Scalar oracle of the position ops (ops/position.h): rotary embedding and the 2-D roll.
#pragma once
#include "brigade/ops/position.h"
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// RoPE's inverse frequency of pair i < HS/2 under `spec` (see ops::RopeSpec above), in double.
// The unscaled value is 1 / theta^(2i/HS), exactly as the unscaled table always computed it.
inline double rope_inv_freq(const RopeSpec& spec, int64_t i, int64_t HS) {
  const double inv_freq = 1.0 / std::pow(spec.theta, double(2 * i) / double(HS));
  switch (spec.scaling) {
    case RopeScaling::None: return inv_freq;
    case RopeScaling::Linear: return inv_freq / spec.factor;
    case RopeScaling::Llama3: {
      const double kPi = 3.14159265358979323846;
      const double L = spec.original_max_positions, lo = spec.low_freq_factor, hi = spec.high_freq_factor;
      const double wavelen = 2.0 * kPi / inv_freq;
      if (wavelen < L / hi) return inv_freq;                 // high frequency: kept
      if (wavelen > L / lo) return inv_freq / spec.factor;   // low frequency: interpolated
      const double smooth = (L / wavelen - lo) / (hi - lo);  // in [0, 1] between the two
      return (1.0 - smooth) * inv_freq / spec.factor + smooth * inv_freq;
    }
  }
  return inv_freq;
}

// cos / sin of the RoPE angles, (T, HS/2) each: a = (pos0 + t) * rope_inv_freq(spec, i, HS), in double.
template <typename S>
void rope_table(int64_t T, int64_t HS, const RopeSpec& spec, int64_t pos0, S* cos_t, S* sin_t) {
  const int64_t h = HS / 2;
  std::vector<double> inv(static_cast<size_t>(h));
  for (int64_t i = 0; i < h; ++i) inv[size_t(i)] = rope_inv_freq(spec, i, HS);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < h; ++i) {
      const double a = double(pos0 + t) * inv[size_t(i)];
      cos_t[t * h + i] = S(std::cos(a));
      sin_t[t * h + i] = S(std::sin(a));
    }
}
// RoPE on BH = B*NH contiguous (T, HS) problems; sign = +1 rotates by +a (forward),
// -1 by -a (backward).
template <typename S>
void rope(int64_t BH, int64_t T, int64_t HS, const RopeSpec& spec, int64_t pos0, double sign, const S* x, S* y) {
  const int64_t h = HS / 2;
  std::vector<S> ct(size_t(T * h)), st(size_t(T * h));
  rope_table<S>(T, HS, spec, pos0, ct.data(), st.data());
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t t = 0; t < T; ++t) {
      const S* xr = x + (bh * T + t) * HS;
      S* yr = y + (bh * T + t) * HS;
      for (int64_t i = 0; i < h; ++i) {
        const S c = ct[size_t(t * h + i)], s = S(sign) * st[size_t(t * h + i)];
        const S x1 = xr[i], x2 = xr[i + h];
        yr[i] = x1 * c - x2 * s;
        yr[i + h] = x2 * c + x1 * s;
      }
    }
}

inline int64_t wrap(int64_t i, int64_t n) { return ((i % n) + n) % n; }

// out[b, (h + sh) mod H, (w + sw) mod W, c] = x[b, h, w, c]; contiguous (B, H, W, C).
template <class S>
void roll2d(int64_t B, int64_t H, int64_t W, int64_t C, int64_t sh, int64_t sw, const S* x, S* out) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w)
        for (int64_t c = 0; c < C; ++c)
          out[((b * H + wrap(h + sh, H)) * W + wrap(w + sw, W)) * C + c] = x[((b * H + h) * W + w) * C + c];
}

}  // namespace brigade::ops::ref
