// Position kernels: RoPE on contiguous heads, Swin's 2-D roll as row copies.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/ref/position.h"

namespace brigade::ops::cpu {

void rope(int64_t BH, int64_t T, int64_t HS, const RopeSpec& spec, int64_t pos0, double sign, const float* x,
          float* y) {
  const int64_t h = HS / 2;
  std::vector<float> ct(size_t(T * h)), st(size_t(T * h));
  ref::rope_table<float>(T, HS, spec, pos0, ct.data(), st.data());
  const float sg = float(sign);
#pragma omp parallel for schedule(static) if (BH * T * HS >= (int64_t(1) << 14))
  for (int64_t r = 0; r < BH * T; ++r) {
    const int64_t t = r % T;
    const float* xr = x + r * HS;
    float* yr = y + r * HS;
    const float* c = ct.data() + t * h;
    const float* s = st.data() + t * h;
#pragma omp simd
    for (int64_t i = 0; i < h; ++i) {
      const float si = sg * s[i], x1 = xr[i], x2 = xr[i + h];
      yr[i] = x1 * c[i] - x2 * si;
      yr[i + h] = x2 * c[i] + x1 * si;
    }
  }
}

// One (b, h) row of the output per iteration: two contiguous chunks of the source row.
void roll2d(int64_t B, int64_t H, int64_t W, int64_t C, int64_t sh, int64_t sw, size_t esize, const char* x,
            char* out) {
  const int64_t rows = B * H;
  const int64_t s = ref::wrap(sw, W);
  const size_t px = size_t(C) * esize;  // bytes of one pixel
#pragma omp parallel for schedule(static) if (rows * W * C > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / H, h = r % H;
    const char* src = x + size_t((b * H + h) * W) * px;
    char* dst = out + size_t((b * H + ref::wrap(h + sh, H)) * W) * px;
    // dst[(w + s) mod W] = src[w]: dst[s .. W) = src[0 .. W - s), dst[0 .. s) = src[W - s .. W)
    std::memcpy(dst + size_t(s) * px, src, size_t(W - s) * px);
    if (s > 0) std::memcpy(dst, src + size_t(W - s) * px, size_t(s) * px);
  }
}

}  // namespace brigade::ops::cpu
