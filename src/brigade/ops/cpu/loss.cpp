// Loss kernels: the fused log-softmax + cross-entropy and its backward (oracle: ops/ref/loss.h),
// f32 and native 16-bit. One row per iteration of a static `omp for`; the loss sums rows
// serially in row order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/vec_math.h"

namespace brigade::ops::cpu {

namespace {
inline float logsumexp_row(int64_t V, const float* xr) {
  const float m = row_max(V, xr);
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < V; ++j) s += fast_exp(xr[j] - m);
  return m + std::log(s);
}

// g * softmax(xr) - g * onehot(t), from the row's lse l.
inline void cross_entropy_backward_row(int64_t V, const float* xr, float g, float l, int64_t t, float* gr) {
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) gr[j] = g * fast_exp(xr[j] - l);
  gr[t] -= g;
}
}  // namespace

// ---------------------------------------------------------------- fused log-softmax + cross-entropy

int64_t cross_entropy(int64_t N, int64_t V, const float* logits, const int64_t* targets, int64_t ignore_index,
                      float* loss, float* lse) {
  // One pass for the max, one for sum(exp); nothing of size V is written.
#pragma omp parallel for schedule(static) if (N * V > kRowParallelMin)
  for (int64_t n = 0; n < N; ++n) lse[n] = logsumexp_row(V, logits + n * V);
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
#pragma omp parallel for schedule(static) if (N * V > kRowParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* gr = glogits + n * V;
    if (targets[n] == ignore_index || count == 0) {
      std::fill(gr, gr + V, 0.f);
      continue;
    }
    cross_entropy_backward_row(V, logits + n * V, float(gloss / double(count)), lse[n], targets[n], gr);
  }
}

int64_t cross_entropy16(int64_t N, int64_t V, const Strided& logits, const int64_t* targets, int64_t ignore_index,
                        float* loss, float* lse) {
#pragma omp parallel if (N * V > kRowParallelMin)
  {
    std::vector<float> xr(static_cast<size_t>(V));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      gather_f32(logits, n * V, V, xr.data());
      lse[n] = logsumexp_row(V, xr.data());
    }
  }
  double total = 0.0;  // serial, in row order
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) continue;
    float xt;
    gather_f32(logits, n * V + targets[n], 1, &xt);
    total += double(lse[n]) - double(xt);
    ++count;
  }
  *loss = count ? float(total / double(count)) : std::numeric_limits<float>::quiet_NaN();
  return count;
}

void cross_entropy_backward16(int64_t N, int64_t V, double gloss, const Strided& logits, const int64_t* targets,
                              const float* lse, int64_t ignore_index, DType ot, void* glogits) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != ignore_index;
  const size_t eo = dtype_size(ot);
#pragma omp parallel if (N * V > kRowParallelMin)
  {
    std::vector<float> buf(static_cast<size_t>(2 * V));
    float* xr = buf.data();
    float* gr = xr + V;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      if (targets[n] == ignore_index || count == 0) {
        std::fill(gr, gr + V, 0.f);
      } else {
        gather_f32(logits, n * V, V, xr);
        cross_entropy_backward_row(V, xr, float(gloss / double(count)), lse[n], targets[n], gr);
      }
      store_f32(ot, V, gr, static_cast<char*>(glogits) + size_t(n * V) * eo);
    }
  }
}

}  // namespace brigade::ops::cpu
