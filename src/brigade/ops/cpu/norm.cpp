// Optimised f32 row kernels: layer norm fwd/bwd, softmax fwd/bwd and the fused
// log-softmax + cross-entropy (maths in ops/ref/kernels.h). One row per iteration
// of a static `omp for`; row sums use `omp simd` reductions (fixed split), and the
// column sums of the layer-norm weight grads go through fixed row blocks, so the
// results do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/cpu/vec_math.h"

namespace brigade::ops::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;

inline float row_max(int64_t C, const float* x) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t c = 0; c < C; ++c) m = std::max(m, x[c]);
  return m;
}
}  // namespace

// ---------------------------------------------------------------- layer norm (Ba et al. 2016)

void layer_norm(int64_t N, int64_t C, const float* x, const float* w, const float* b, double eps, float* y,
                float* mean, float* rstd) {
  const float epsf = float(eps);
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float* yr = y + n * C;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += xr[c];
    const float m = s / float(C);
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    const float rs = 1.0f / std::sqrt(v / float(C) + epsf);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
    mean[n] = m;
    rstd[n] = rs;
  }
}

void layer_norm_backward(int64_t N, int64_t C, const float* gy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* gx, float* gw, float* gb) {
  // Backward of `y = (x - mean) * rstd * w + b` (see ref): rows are independent for gx;
  // gw/gb partial sums per fixed block of kRows rows, then summed over blocks in order.
  constexpr int64_t kRows = 32;
  const int64_t nb = (N + kRows - 1) / kRows;
  std::vector<float> part(static_cast<size_t>(nb * 2 * C));  // (nb, 2, C): gw, gb partials
#pragma omp parallel if (N * C > kParallelMin)
  {
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nb; ++blk) {
      float* pw = part.data() + blk * 2 * C;
      float* pb = pw + C;
      std::fill(pw, pw + 2 * C, 0.f);
      for (int64_t n = blk * kRows; n < std::min(N, (blk + 1) * kRows); ++n) {
        const float* xr = x + n * C;
        const float* gr = gy + n * C;
        float* gxr = gx + n * C;
        const float m = mean[n], rs = rstd[n];
        float mg = 0.f, mgx = 0.f;
#pragma omp simd reduction(+ : mg, mgx)
        for (int64_t c = 0; c < C; ++c) {
          const float xh = (xr[c] - m) * rs;
          const float g = gr[c] * w[c];
          mg += g;
          mgx += g * xh;
          pw[c] += gr[c] * xh;
          pb[c] += gr[c];
        }
        mg /= float(C);
        mgx /= float(C);
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float xh = (xr[c] - m) * rs;
          gxr[c] = rs * (gr[c] * w[c] - mg - xh * mgx);
        }
      }
    }
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      float sw = 0.f, sb = 0.f;
      for (int64_t blk = 0; blk < nb; ++blk) {
        sw += part[size_t(blk * 2 * C + c)];
        sb += part[size_t(blk * 2 * C + C + c)];
      }
      gw[c] = sw;
      gb[c] = sb;
    }
  }
}

// ---------------------------------------------------------------- softmax (last dim)

void softmax(int64_t N, int64_t C, const float* x, float* y) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float* yr = y + n * C;
    const float m = row_max(C, xr);
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) {
      yr[c] = fast_exp(xr[c] - m);
      s += yr[c];
    }
    const float inv = 1.0f / s;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] *= inv;
  }
}

void softmax_backward(int64_t N, int64_t C, const float* gy, const float* y, float* gx) {
  // Backward of `y = softmax(x)`: gx = y * (gy - sum(gy * y)).
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* gr = gy + n * C;
    const float* yr = y + n * C;
    float d = 0.f;
#pragma omp simd reduction(+ : d)
    for (int64_t c = 0; c < C; ++c) d += gr[c] * yr[c];
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) gx[n * C + c] = yr[c] * (gr[c] - d);
  }
}

// ---------------------------------------------------------------- fused log-softmax + cross-entropy

int64_t cross_entropy(int64_t N, int64_t V, const float* logits, const int64_t* targets, int64_t ignore_index,
                      float* loss, float* lse) {
  // One pass for the max, one for sum(exp); nothing of size V is written.
#pragma omp parallel for schedule(static) if (N * V > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = logits + n * V;
    const float m = row_max(V, xr);
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; ++j) s += fast_exp(xr[j] - m);
    lse[n] = m + std::log(s);
  }
  double total = 0.0;  // serial, in row order
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) continue;
    total += double(lse[n]) - double(logits[n * V + targets[n]]);
    ++count;
  }
  *loss = count ? float(total / double(count)) : std::numeric_limits<float>::quiet_NaN();
  return count;
}

void cross_entropy_backward(int64_t N, int64_t V, double gloss, const float* logits, const int64_t* targets,
                            const float* lse, int64_t ignore_index, float* glogits) {
  // Backward of `loss = mean(lse[n] - logits[n, t[n]])`: gloss * (softmax - onehot) / count,
  // written straight into glogits.
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != ignore_index;
#pragma omp parallel for schedule(static) if (N * V > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* gr = glogits + n * V;
    if (targets[n] == ignore_index || count == 0) {
      std::fill(gr, gr + V, 0.f);
      continue;
    }
    const float* xr = logits + n * V;
    const float g = float(gloss / double(count)), l = lse[n];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) gr[j] = g * fast_exp(xr[j] - l);
    gr[targets[n]] -= g;
  }
}

}  // namespace brigade::ops::cpu
