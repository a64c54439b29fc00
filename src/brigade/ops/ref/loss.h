// Scalar oracle of the losses (ops/loss.h): fused log-softmax + cross-entropy, plain and with
// label smoothing.
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// Fused log-softmax + cross-entropy (torch.nn.functional.cross_entropy, reduction='mean'):
//   lse[n] = log sum_v exp(logits[n, v]); loss = sum_{n: t != ignore} (lse[n] - logits[n, t[n]]) / count.
// Returns count; loss is NaN when count == 0 (as torch). lse is written for every row.
template <typename S>
int64_t cross_entropy(int64_t N, int64_t V, const S* logits, const int64_t* targets, int64_t ignore_index, S* loss,
                      S* lse) {
  S total = S(0);
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = logits + n * V;
    S m = -std::numeric_limits<S>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, xr[j]);
    S s = S(0);
    for (int64_t j = 0; j < V; ++j) s += std::exp(xr[j] - m);
    lse[n] = m + std::log(s);
    if (targets[n] == ignore_index) continue;
    total += lse[n] - xr[targets[n]];
    ++count;
  }
  *loss = count ? total / S(count) : std::numeric_limits<S>::quiet_NaN();
  return count;
}
// Backward of the loss above: glogits[n, :] = gloss * (exp(logits - lse[n]) - onehot(t[n])) / count,
// zero rows where t[n] == ignore_index (and everywhere when count == 0).
template <typename S>
void cross_entropy_backward(int64_t N, int64_t V, double gloss, const S* logits, const int64_t* targets, const S* lse,
                            int64_t ignore_index, S* glogits) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != ignore_index;
  for (int64_t n = 0; n < N; ++n) {
    const bool skip = targets[n] == ignore_index || count == 0;
    const S g = skip ? S(0) : S(gloss) / S(count);
    for (int64_t j = 0; j < V; ++j) {
      const S p = skip ? S(0) : std::exp(logits[n * V + j] - lse[n]);
      glogits[n * V + j] = g * (p - (j == targets[n] ? S(1) : S(0)));
    }
  }
}

// Cross-entropy with label smoothing (see ops::cross_entropy_smoothed), in double:
//   lse[n] = log sum_v exp(x[n, v]); row loss = (1 - eps)(lse - x[t]) + eps (lse - sum_v x[n, v] / V).
// Returns count; loss NaN when count == 0. lse is written for every row.
template <typename T>
int64_t cross_entropy_smoothed(int64_t N, int64_t V, const T* logits, const int64_t* targets, double eps,
                               int64_t ignore_index, T* loss, T* lse) {
  double total = 0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = logits + n * V;
    double m = -std::numeric_limits<double>::infinity(), sx = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(xr[j])), sx += double(xr[j]);
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(xr[j]) - m);
    const double l = m + std::log(s);
    lse[n] = T(l);
    if (targets[n] == ignore_index) continue;
    total += (1 - eps) * (l - double(xr[targets[n]])) + eps * (l - sx / double(V));
    ++count;
  }
  *loss = count ? T(total / double(count)) : std::numeric_limits<T>::quiet_NaN();
  return count;
}
// glogits[n, v] = gloss (exp(x - lse[n]) - (1 - eps) [v == t] - eps / V) / count; zero rows where ignored.
template <typename T>
void cross_entropy_smoothed_backward(int64_t N, int64_t V, double gloss, const T* logits, const int64_t* targets,
                                     const T* lse, double eps, int64_t ignore_index, T* glogits) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != ignore_index;
  for (int64_t n = 0; n < N; ++n) {
    const bool skip = targets[n] == ignore_index || count == 0;
    const double g = skip ? 0.0 : gloss / double(count);
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(double(logits[n * V + j]) - double(lse[n]));
      glogits[n * V + j] = skip ? T(0) : T(g * (p - (j == targets[n] ? 1 - eps : 0.0) - eps / double(V)));
    }
  }
}

}  // namespace brigade::ops::ref
