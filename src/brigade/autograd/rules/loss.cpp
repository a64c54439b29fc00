// Derivative rules of the cross-entropies.
#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct CrossEntropyBackward : Node {
  Tensor logits, targets, lse;
  int64_t ignore_index = -100;
  const char* name() const override { return "CrossEntropyBackward"; }
  // forward: loss = mean_i (lse_i - logits[i, target_i]) over targets != ignore_index
  std::vector<Tensor> backward(const Tensor& g) override {
    // the saved logits are released here anyway: hand them over, so the gradient is written
    // over them when nothing else holds them (no second (N, V) buffer)
    return {ops::cross_entropy_backward_(g.item(), std::move(logits), targets, lse, ignore_index)};
  }
  void release() override { logits = targets = lse = Tensor(); }
};

struct CrossEntropySmoothedBackward : Node {
  Tensor logits, targets, lse;
  double eps = 0;
  int64_t ignore_index = -100;
  const char* name() const override { return "CrossEntropySmoothedBackward"; }
  // forward: loss = mean over kept rows of (1 - eps)(lse - x[t]) + eps (lse - mean_v x[v])
  std::vector<Tensor> backward(const Tensor& g) override {
    return {ops::cross_entropy_smoothed_backward(g.item(), logits, targets, lse, eps, ignore_index)};
  }
  void release() override { logits = targets = lse = Tensor(); }
};

}  // namespace

Tensor cross_entropy(const Tensor& logits0, const Tensor& targets, int64_t ignore_index) {
  const Tensor logits = cast(logits0, policy_dtype(amp::Op::CrossEntropy, {&logits0}));
  ops::CrossEntropyOut r = ops::cross_entropy(logits, targets, ignore_index);
  auto n = std::make_shared<CrossEntropyBackward>();
  if (needs_grad({logits})) {
    n->logits = logits;
    n->targets = targets;
    n->lse = r.lse;
    n->ignore_index = ignore_index;
  }
  return record(r.loss, n, {logits});
}

Tensor cross_entropy_smoothed(const Tensor& logits0, const Tensor& targets, double eps, int64_t ignore_index) {
  const Tensor logits = cast(logits0, policy_dtype(amp::Op::CrossEntropy, {&logits0}));
  ops::CrossEntropyOut o = ops::cross_entropy_smoothed(logits, targets, eps, ignore_index);  // loss ()
  auto n = std::make_shared<CrossEntropySmoothedBackward>();
  if (needs_grad({logits})) {
    n->logits = logits;
    n->targets = targets;
    n->lse = o.lse;
    n->eps = eps;
    n->ignore_index = ignore_index;
  }
  return record(o.loss, n, {logits});
}

}  // namespace brigade::fn
