// Scalar oracle of the embedding lookup (ops/embedding.h).
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// Embedding (torch.nn.functional.embedding): y (N, C) = weight[ids] ; weight(v, c)
// at w[swv*v + swc*c]. Ids are already range-checked by the front-end.
template <typename S>
void embedding(int64_t N, int64_t C, const S* w, int64_t swv, int64_t swc, const int64_t* ids, S* y) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = w[ids[n] * swv + c * swc];
}
// Backward of `y[n, c] = w[ids[n], c]`: gw (V, C) = scatter-add of gy rows, in order of n.
template <typename S>
void embedding_backward(int64_t N, int64_t C, int64_t V, const S* gy, const int64_t* ids, S* gw) {
  for (int64_t i = 0; i < V * C; ++i) gw[i] = S(0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) gw[ids[n] * C + c] += gy[n * C + c];
}

}  // namespace brigade::ops::ref
