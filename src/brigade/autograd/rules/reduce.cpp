// Derivative rules of the reductions.
#include <algorithm>

#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct SumAllBackward : Node {
  Shape in_shape;
  double scale = 1.0;
  const char* name() const override { return "SumAllBackward"; }
  // forward: out = sum(a) * scale
  std::vector<Tensor> backward(const Tensor& g) override {
    return {Tensor::full(in_shape, g.item() * scale, g.dtype())};
  }
};

}  // namespace

Tensor sum_all(const Tensor& a0) {
  const Tensor a = cast(a0, policy_dtype(amp::Op::Reduction, {&a0}));
  auto n = std::make_shared<SumAllBackward>();
  n->in_shape = a.shape();
  return record(ops::sum_all(a), n, {a});
}

Tensor mean_all(const Tensor& a0) {
  const Tensor a = cast(a0, policy_dtype(amp::Op::Reduction, {&a0}));
  auto n = std::make_shared<SumAllBackward>();
  n->in_shape = a.shape();
  n->scale = 1.0 / double(std::max<int64_t>(a.numel(), 1));
  return record(ops::mul_scalar(ops::sum_all(a), n->scale), n, {a});
}

// forward: y = exp(x - max) / sum(exp(x - max)); the node keeps y
Tensor softmax(const Tensor& x0) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Softmax, {&x0}));
  Tensor y = ops::softmax(x);
  return rules::record_saving<ops::softmax_backward>("SoftmaxBackward", y, x, y.detach());
}

namespace {

struct SpatialMeanBackward : Node {
  Shape x_shape;
  const char* name() const override { return "SpatialMeanBackward"; }
  // forward: y[n, c] = mean over (H, W) of x[n, c]
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::spatial_mean_backward(g, x_shape)}; }
};

}  // namespace

Tensor spatial_mean(const Tensor& x0, bool keepdim) {
  BRIGADE_CHECK(x0.defined() && x0.dim() == 4, ShapeError, "spatial_mean: x must be 4-D (N, C, H, W), got {}",
                x0.defined() ? x0.str() : "undefined");
  const Tensor x = cast(x0, policy_dtype(amp::Op::Reduction, {&x0}));
  auto n = std::make_shared<SpatialMeanBackward>();
  n->x_shape = x.shape();
  return record(ops::spatial_mean(x, keepdim), n, {x});  // (N, C) or (N, C, 1, 1)
}

}  // namespace brigade::fn
