// Inline float math that GCC auto-vectorises inside `#pragma omp simd` loops
// (glibc's expf has no SIMD variant without -ffast-math). Not a general libm:
// fast_exp is Cephes expf (Moshier; ~1 ulp on [-87, 88], 0 below), used by the
// softmax / cross-entropy / attention / GELU kernels in ops/cpu.
#pragma once
#include <cstdint>
#include <cstring>

namespace brigade::ops::cpu {

#pragma omp declare simd notinbranch
inline float fast_exp(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  const float t = xc * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
  float r = xc - n * 0.693359375f;                  // Cody-Waite: ln2 = C1 + C2
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = (int32_t(n) + 127) << 23;
  float s;
  std::memcpy(&s, &e, 4);
  return x < -87.3f ? 0.0f : y * s;
}

// tanh(u) = 1 - 2 / (exp(2u) + 1); |u| > 9 saturates to +-1 within f32.
#pragma omp declare simd notinbranch
inline float fast_tanh(float u) {
  const float uc = u < -9.0f ? -9.0f : (u > 9.0f ? 9.0f : u);
  return 1.0f - 2.0f / (fast_exp(2.0f * uc) + 1.0f);
}

}  // namespace brigade::ops::cpu
