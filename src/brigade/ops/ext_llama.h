// Raw ops for LLaMA-style models (Touvron et al. 2023), no autograd: RMSNorm, rotary
// position embedding (RoPE), SiLU and the key/value head expansion of grouped-query
// attention. Each has (a) a front-end here (checks, output allocation, dispatch),
// (b) a scalar reference kernel in namespace ops::ref::llama below, templated on the scalar type
// so the op harness can run it in double, and (c) an optimised cpu kernel (ext_llama.cpp,
// OpenMP with static schedules: deterministic for a given thread count; the reductions of
// RMSNorm run in a fixed order independent of the thread count).
//
// Dtypes follow the contract in ops.h: f32, bf16 and f16 inputs, f32 compute, each output
// rounded once. A 16-bit or mixed-dtype call takes the widened path on both backends (the
// inputs converted exactly to f32 copies with ops::cast, the f32 kernel, each output rounded
// once), so the 16-bit result is bitwise the f32 result rounded. Output dtypes:
//   rms_norm: y x's dtype; rstd always f32.  rms_norm_backward: gx x's, gw w's.
//   rope / rope_backward: x's (gy's).  silu: x's.  silu_backward: x's.
//   repeat_kv: x's (a bit copy of the rows, no rounding, identical on both backends).
//   repeat_kv_backward: gy's (the group sum in f32, in head order, rounded once).
// Inputs may be strided views; outputs are fresh contiguous tensors.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// ---------------- RMSNorm over the last dim (Zhang & Sennrich 2019; HF LlamaRMSNorm):
//   rstd = 1 / sqrt(mean_c(x^2) + eps); y = x * rstd * w.   x (..., C), w (C).
struct RMSNormOut { Tensor y, rstd; };  // rstd: (N) with N = numel / C, f32
RMSNormOut rms_norm(const Tensor& x, const Tensor& w, double eps);
struct RMSNormGrads { Tensor gx, gw; };
RMSNormGrads rms_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& rstd);

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

// ---------------- SiLU / swish (Elfwing et al. 2017): y = x * sigmoid(x). SwiGLU is
// silu(gate) * up, composed from silu and mul.
Tensor silu(const Tensor& x);
// gx = gy * s * (1 + x (1 - s)), s = sigmoid(x).
Tensor silu_backward(const Tensor& gy, const Tensor& x);

// ---------------- grouped-query attention's head expansion (HF repeat_kv):
// x (B, NKV, T, HS) -> (B, NKV * n_rep, T, HS), query head j reads kv head j / n_rep.
Tensor repeat_kv(const Tensor& x, int64_t n_rep);
// Its backward: gy (B, NKV * n_rep, T, HS) -> (B, NKV, T, HS), the sum over each group of
// n_rep heads (in head order).
Tensor repeat_kv_backward(const Tensor& gy, int64_t n_rep);

}  // namespace brigade::ops

namespace brigade::ops::ref::llama {

// RMSNorm over rows of x (N, C), contiguous: rstd[n] = 1/sqrt(sum_c x^2 / C + eps);
// y = x * rstd * w. Sums run over c in order.
template <typename S>
void rms_norm(int64_t N, int64_t C, const S* x, const S* w, double eps, S* y, S* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S ss = S(0);
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const S rs = S(1) / std::sqrt(ss / S(C) + S(eps));
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = xr[c] * rs * w[c];
    rstd[n] = rs;
  }
}
// Backward of `y = x * rstd * w` with xhat = x * rstd:
//   gw = sum_n gy * xhat; g = gy * w; gx = rstd * (g - xhat * mean_c(g * xhat)).
template <typename S>
void rms_norm_backward(int64_t N, int64_t C, const S* gy, const S* x, const S* w, const S* rstd, S* gx, S* gw) {
  for (int64_t c = 0; c < C; ++c) gw[c] = S(0);
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    const S* gr = gy + n * C;
    S mgx = S(0);
    for (int64_t c = 0; c < C; ++c) {
      const S xh = xr[c] * rstd[n];
      mgx += gr[c] * w[c] * xh;
      gw[c] += gr[c] * xh;
    }
    mgx /= S(C);
    for (int64_t c = 0; c < C; ++c) {
      const S xh = xr[c] * rstd[n];
      gx[n * C + c] = rstd[n] * (gr[c] * w[c] - xh * mgx);
    }
  }
}

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
      if (wavelen < L / hi) return inv_freq;                   // high frequency: kept
      if (wavelen > L / lo) return inv_freq / spec.factor;     // low frequency: interpolated
      const double smooth = (L / wavelen - lo) / (hi - lo);    // in [0, 1] between the two
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

// SiLU: y = x / (1 + exp(-x)).
template <typename S>
void silu(int64_t n, const S* x, S* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (S(1) + std::exp(-x[i]));
}
// gx = gy * s * (1 + x (1 - s)), s = 1 / (1 + exp(-x)).
template <typename S>
void silu_backward(int64_t n, const S* gy, const S* x, S* gx) {
  for (int64_t i = 0; i < n; ++i) {
    const S s = S(1) / (S(1) + std::exp(-x[i]));
    gx[i] = gy[i] * s * (S(1) + x[i] * (S(1) - s));
  }
}

// repeat_kv on contiguous x (B, NKV, T*HS rows): y (B, NKV*n_rep, T*HS).
template <typename S>
void repeat_kv(int64_t B, int64_t NKV, int64_t n_rep, int64_t THS, const S* x, S* y) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < NKV * n_rep; ++j)
      for (int64_t e = 0; e < THS; ++e) y[(b * NKV * n_rep + j) * THS + e] = x[(b * NKV + j / n_rep) * THS + e];
}
// Its backward: gx[b, kv] = sum_{r < n_rep} gy[b, kv * n_rep + r], in order of r.
template <typename S>
void repeat_kv_backward(int64_t B, int64_t NKV, int64_t n_rep, int64_t THS, const S* gy, S* gx) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kv = 0; kv < NKV; ++kv)
      for (int64_t e = 0; e < THS; ++e) {
        S acc = S(0);
        for (int64_t r = 0; r < n_rep; ++r) acc += gy[((b * NKV + kv) * n_rep + r) * THS + e];
        gx[(b * NKV + kv) * THS + e] = acc;
      }
}

}  // namespace brigade::ops::ref::llama
