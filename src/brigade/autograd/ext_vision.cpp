// Derivative rules of the vision functions (see ext_vision.h). Each Node saves what its
// op's backward reads (relu saves its output detached, per the engine's convention) and
// releases it after running.
#include "brigade/autograd/ext_vision.h"

#include <memory>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/ops/ext_vision.h"

namespace brigade::fn {

using autograd::Node;
using autograd::needs_grad;
using autograd::record;

namespace {

bool wants(const Node& n, size_t i) { return i < n.next.size() && n.next[i] != nullptr; }

// The policy's compute dtype for an op of kind `op` over the defined floating inputs.
DType policy_dtype(amp::Op op, std::initializer_list<const Tensor*> inputs) {
  DType ds[3] = {DType::F32, DType::F32, DType::F32};
  size_t k = 0;
  for (const Tensor* t : inputs)
    if (t->defined() && is_floating(t->dtype()) && k < 3) ds[k++] = t->dtype();
  switch (k) {
    case 0: return amp::compute_dtype(op, {});
    case 1: return amp::compute_dtype(op, {ds[0]});
    case 2: return amp::compute_dtype(op, {ds[0], ds[1]});
    default: return amp::compute_dtype(op, {ds[0], ds[1], ds[2]});
  }
}
Tensor as_dtype(const Tensor& t, DType dt) { return t.defined() && t.dtype() != dt ? fn::cast(t, dt) : t; }

struct Conv2dBackward : Node {
  Tensor x, w;
  int64_t stride = 1, padding = 0;
  bool has_bias = false;
  const char* name() const override { return "Conv2dBackward"; }
  // forward: y = conv2d(x, w) + bias
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::Conv2dGrads r = ops::conv2d_backward(g, x, w, stride, padding, wants(*this, 0), wants(*this, 1),
                                              has_bias && wants(*this, 2));
    std::vector<Tensor> out{r.gx, r.gw};
    if (has_bias) out.push_back(r.gb);
    return out;
  }
  void release() override { x = w = Tensor(); }
};

struct BatchNorm2dBackward : Node {
  Tensor x, w, mean, rstd;
  bool training = true;
  const char* name() const override { return "BatchNorm2dBackward"; }
  // forward: y = (x - mean) * rstd * w + b   (mean, rstd: batch statistics in training)
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::BatchNormGrads r = ops::batch_norm2d_backward(g, x, w, mean, rstd, training);
    return {wants(*this, 0) ? r.gx : Tensor(), r.gw, r.gb};
  }
  void release() override { x = w = mean = rstd = Tensor(); }
};

struct MaxPool2dBackward : Node {
  Tensor idx;
  Shape x_shape;
  const char* name() const override { return "MaxPool2dBackward"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::max_pool2d_backward(g, idx, x_shape)}; }
  void release() override { idx = Tensor(); }
};

struct AvgPool2dBackward : Node {
  Shape x_shape;
  int64_t kernel = 1, stride = 1, padding = 0;
  const char* name() const override { return "AvgPool2dBackward"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {ops::avg_pool2d_backward(g, x_shape, kernel, stride, padding)};
  }
};

struct GlobalAvgPoolBackward : Node {
  Shape x_shape;
  const char* name() const override { return "GlobalAvgPoolBackward"; }
  // forward: y[n, c] = mean over (H, W) of x[n, c]   -> gx = g / (H W) broadcast over (H, W)
  std::vector<Tensor> backward(const Tensor& g) override {
    const double inv = 1.0 / double(x_shape[2] * x_shape[3]);
    Tensor gx = ops::add(Tensor::zeros(x_shape, g.dtype()), g);  // (N, C, H, W)
    return {ops::mul_scalar(gx, inv)};
  }
};

struct ReluBackward : Node {
  Tensor y;  // the output, detached
  const char* name() const override { return "ReluBackward"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::relu_backward(g, y)}; }
  void release() override { y = Tensor(); }
};

}  // namespace

Tensor conv2d(const Tensor& x0, const Tensor& w0, const Tensor& b0, int64_t stride, int64_t padding) {
  const DType dt = policy_dtype(amp::Op::Conv, {&x0, &w0});
  const Tensor x = as_dtype(x0, dt), w = as_dtype(w0, dt), bias = as_dtype(b0, dt);
  std::vector<Tensor> inputs{x, w};
  if (bias.defined()) inputs.push_back(bias);
  auto n = std::make_shared<Conv2dBackward>();
  if (needs_grad(inputs)) {
    n->x = x;
    n->w = w;
    n->stride = stride;
    n->padding = padding;
    n->has_bias = bias.defined();
  }
  // a GEMM: a selective recompute keeps its output (fn::gemm_output)
  return record(gemm_output([&] { return ops::conv2d(x, w, bias, stride, padding); }), n, inputs);
}

Tensor batch_norm2d(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& running_mean,
                    const Tensor& running_var, bool training, double momentum, double eps) {
  const DType dt = policy_dtype(amp::Op::BatchNorm, {&x0, &w0, &b0});
  const Tensor x = as_dtype(x0, dt), w = as_dtype(w0, dt), b = as_dtype(b0, dt);
  // A recompute (fn::checkpoint re-running the block in the backward) normalises with the
  // batch statistics again but must not move the running statistics a second time.
  // (Eval reads them; training only writes them.)
  const bool drop = training && autograd::recomputing();
  ops::BatchNormOut r = ops::batch_norm2d(x, w, b, drop ? Tensor() : running_mean, drop ? Tensor() : running_var,
                                          training, momentum, eps);
  auto n = std::make_shared<BatchNorm2dBackward>();
  if (needs_grad({x, w, b})) {
    n->x = x;
    n->w = w;
    n->mean = r.mean;
    n->rstd = r.rstd;
    n->training = training;
  }
  return record(r.y, n, {x, w, b});
}

Tensor max_pool2d(const Tensor& x0, int64_t kernel, int64_t stride, int64_t padding) {
  const Tensor x = as_dtype(x0, policy_dtype(amp::Op::Pool, {&x0}));
  ops::MaxPoolOut r = ops::max_pool2d(x, kernel, stride, padding);
  auto n = std::make_shared<MaxPool2dBackward>();
  if (needs_grad({x})) {
    n->idx = r.idx;
    n->x_shape = x.shape();
  }
  return record(r.y, n, {x});
}

Tensor avg_pool2d(const Tensor& x0, int64_t kernel, int64_t stride, int64_t padding) {
  const Tensor x = as_dtype(x0, policy_dtype(amp::Op::Pool, {&x0}));
  auto n = std::make_shared<AvgPool2dBackward>();
  n->x_shape = x.shape();
  n->kernel = kernel;
  n->stride = stride;
  n->padding = padding;
  return record(ops::avg_pool2d(x, kernel, stride, padding), n, {x});
}

Tensor adaptive_avg_pool2d(const Tensor& x0) {
  BRIGADE_CHECK(x0.defined() && x0.dim() == 4, ShapeError,
                "adaptive_avg_pool2d: x must be 4-D (N, C, H, W), got {}", x0.defined() ? x0.str() : "undefined");
  const Tensor x = as_dtype(x0, policy_dtype(amp::Op::Reduction, {&x0}));
  auto n = std::make_shared<GlobalAvgPoolBackward>();
  n->x_shape = x.shape();
  Tensor y = ops::mean(x, {2, 3}, true);  // (N, C, 1, 1)
  return record(y, n, {x});
}

Tensor relu(const Tensor& x0) {
  const Tensor x = as_dtype(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::relu(x);  // x's shape
  auto n = std::make_shared<ReluBackward>();
  if (needs_grad({x})) n->y = y.detach();
  return record(y, n, {x});
}

}  // namespace brigade::fn
