// Losses: fused log-softmax + cross-entropy, plain and with label smoothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// ---------------- fused log-softmax + cross-entropy (torch.nn.functional.cross_entropy,
// reduction='mean' over targets != ignore_index). logits (N, V); targets (N) i32/i64.
struct CrossEntropyOut {
  Tensor loss, lse;
};  // loss: 0-d; lse: (N)
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// glogits (N, V) = gloss * (softmax(logits) - onehot(target)) / count
Tensor cross_entropy_backward(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index = -100);
// The same gradient, written over `logits` when this call holds the only reference to them
// (Tensor::sole_owner), they are contiguous and the cpu backend runs (f32 or a native 16-bit
// dtype): no second (N, V) buffer, which for a 50k vocabulary is the step's largest. Otherwise
// as cross_entropy_backward. The autograd rule passes its saved logits here.
Tensor cross_entropy_backward_(double gloss, Tensor logits, const Tensor& targets, const Tensor& lse,
                               int64_t ignore_index = -100);

// ---------------- cross-entropy with label smoothing (torch's F.cross_entropy(logits,
// target, ignore_index, label_smoothing=eps), reduction 'mean'): over the rows whose target
// is not ignore_index (count of them),
//   loss = (1 - eps) mean(lse - logits[t]) + eps mean(lse - mean_v logits[v])
// i.e. (1 - eps) nll + eps times the mean over classes of -log p. logits (N, V), targets (N)
// i32/i64; eps in [0, 1]. loss 0-d, NaN when count == 0 (as torch); lse (N) for the backward.
// glogits = gloss (softmax - (1 - eps) onehot(t) - eps / V) / count, zero rows where ignored.
CrossEntropyOut cross_entropy_smoothed(const Tensor& logits, const Tensor& targets, double eps,
                                       int64_t ignore_index = -100);
Tensor cross_entropy_smoothed_backward(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                       double eps, int64_t ignore_index = -100);

}  // namespace brigade::ops
