// Derivative rules of the vision functions (see ext_vision.h). Each Node saves what its
// op's backward reads (relu saves its output detached, per the engine's convention) and
// releases it after running.
#include "brigade/autograd/ext_vision.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/autograd/rules.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

using autograd::Node;
using autograd::needs_grad;
using autograd::record;
using rules::policy_dtype;
using rules::wants;

namespace {

struct Conv2dBackward : Node {
  Tensor x, w;
  ops::Conv2dParams p;
  bool has_bias = false;
  const char* name() const override { return "Conv2dBackward"; }
  // forward: y = conv2d(x, w) + bias
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::Conv2dGrads r =
        ops::conv2d_backward(g, x, w, p, wants(*this, 0), wants(*this, 1), has_bias && wants(*this, 2));
    std::vector<Tensor> out{r.gx, r.gw};
    if (has_bias) out.push_back(r.gb);
    return out;
  }
  void release() override { x = w = Tensor(); }
};

struct BatchNorm2dBackward : rules::NormNode {
  bool training = true, channels_last = false;
  const char* name() const override { return "BatchNorm2dBackward"; }
  // forward: y = (x - mean) * rstd * w + b   (mean, rstd: batch statistics in training)
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::BatchNormGrads r = ops::batch_norm2d_backward(g, x, w, mean, rstd, training, channels_last);
    return {wants(*this, 0) ? r.gx : Tensor(), r.gw, r.gb};
  }
};

struct SyncBatchNorm2dBackward : rules::NormNode {
  std::shared_ptr<const BatchNormSync> sync;
  double M = 0;  // the global count per channel
  bool has_bias = false;
  const char* name() const override { return "SyncBatchNorm2dBackward"; }
  // forward: y = (x - mean) * rstd * w + b   (mean, rstd: statistics of the global batch)
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::ChannelSums s = ops::batch_norm2d_grad_sums(g, x, mean, rstd);
    const int64_t C = int64_t(s.s1.size());
    // the local parts: gw = sum gy xhat, gb = sum gy over this rank's rows
    std::vector<float> gwv(s.s2.begin(), s.s2.end()), gbv(s.s1.begin(), s.s1.end());
    Tensor gw = Tensor::from_vector(gwv, {C}).to(w.dtype());  // (C)
    Tensor gb = Tensor::from_vector(gbv, {C}).to(w.dtype());  // (C)
    // every rank sums the gradient sums, whether or not it needs gx (collectives match)
    std::vector<double> buf(static_cast<size_t>(2 * C));
    std::copy(s.s1.begin(), s.s1.end(), buf.begin());
    std::copy(s.s2.begin(), s.s2.end(), buf.begin() + C);
    sync->allreduce_sum(buf.data(), 2 * C);
    std::copy(buf.begin(), buf.begin() + C, s.s1.begin());
    std::copy(buf.begin() + C, buf.end(), s.s2.begin());
    Tensor gx = wants(*this, 0) ? ops::batch_norm2d_backward_input(g, x, w, mean, rstd, s, M) : Tensor();
    return {gx, gw, has_bias ? gb : Tensor()};
  }
  void release() override {
    NormNode::release();
    sync.reset();
  }
};

struct MaxPool2dBackward : Node {
  Tensor idx;
  Shape x_shape;
  bool channels_last = false;
  const char* name() const override { return "MaxPool2dBackward"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {ops::max_pool2d_backward(g, idx, x_shape, channels_last)};
  }
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

struct SpatialMeanBackward : Node {
  Shape x_shape;
  const char* name() const override { return "SpatialMeanBackward"; }
  // forward: y[n, c] = mean over (H, W) of x[n, c]
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::spatial_mean_backward(g, x_shape)}; }
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

}  // namespace

Tensor conv2d(const Tensor& x0, const Tensor& w0, const Tensor& b0, int64_t stride, int64_t padding) {
  return fn::conv2d(x0, w0, b0, ops::Conv2dParams::symmetric(stride, padding));
}

Tensor conv2d(const Tensor& x0, const Tensor& w0, const Tensor& b0, const ops::Conv2dParams& p) {
  const DType dt = policy_dtype(amp::Op::Conv, {&x0, &w0});
  const Tensor x = cast(x0, dt), w = cast(w0, dt), bias = cast(b0, dt);
  std::vector<Tensor> inputs{x, w};
  if (bias.defined()) inputs.push_back(bias);
  auto n = std::make_shared<Conv2dBackward>();
  if (needs_grad(inputs)) {
    n->x = x;
    n->w = w;
    n->p = p;
    n->has_bias = bias.defined();
  }
  // a GEMM: a selective recompute keeps its output (fn::gemm_output)
  return record(gemm_output([&] { return ops::conv2d(x, w, bias, p); }), n, inputs);
}

Tensor batch_norm2d(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& running_mean,
                    const Tensor& running_var, bool training, double momentum, double eps, bool channels_last) {
  // Rule::Mixed (O2): no casts, the kernel reads a 16-bit x beside fp32 w and b
  const bool mixed = rules::policy_mixed(amp::Op::BatchNorm);
  const DType dt = policy_dtype(amp::Op::BatchNorm, {&x0, &w0, &b0});
  const Tensor x = mixed ? x0 : cast(x0, dt), w = mixed ? w0 : cast(w0, dt), b = mixed ? b0 : cast(b0, dt);
  // A recompute (fn::checkpoint re-running the block in the backward) normalises with the
  // batch statistics again but must not move the running statistics a second time.
  // (Eval reads them; training only writes them.)
  const bool drop = training && autograd::recomputing();
  ops::BatchNormOut r = ops::batch_norm2d(x, w, b, drop ? Tensor() : running_mean, drop ? Tensor() : running_var,
                                          training, momentum, eps, channels_last);
  auto n = std::make_shared<BatchNorm2dBackward>();
  if (needs_grad({x, w, b})) {
    n->save(x, w, r.mean, r.rstd);
    n->training = training;
    n->channels_last = channels_last;
  }
  return record(r.y, n, {x, w, b});
}

Tensor sync_batch_norm2d(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& running_mean,
                         const Tensor& running_var, double momentum, double eps,
                         const std::shared_ptr<const BatchNormSync>& sync) {
  BRIGADE_CHECK(sync != nullptr, ValueError, "sync_batch_norm2d: no reducer given (use batch_norm2d without one)");
  BRIGADE_CHECK(x0.defined() && x0.dim() == 4, ShapeError, "sync_batch_norm2d: x must be 4-D (N, C, H, W), got {}",
                x0.defined() ? x0.str() : "undefined");
  const bool mixed = rules::policy_mixed(amp::Op::BatchNorm);  // as in batch_norm2d
  const DType dt = policy_dtype(amp::Op::BatchNorm, {&x0, &w0, &b0});
  const Tensor x = mixed ? x0 : cast(x0, dt), w = mixed ? w0 : cast(w0, dt), b = mixed ? b0 : cast(b0, dt);
  const int64_t C = x.size(1);
  // forward: [count, sum x (C), sum x^2 (C)] of this rank, summed over the group
  const ops::ChannelSums s = ops::batch_norm2d_sums(x);
  std::vector<double> buf(static_cast<size_t>(2 * C + 1));
  buf[0] = double(x.size(0) * x.size(2) * x.size(3));
  std::copy(s.s1.begin(), s.s1.end(), buf.begin() + 1);
  std::copy(s.s2.begin(), s.s2.end(), buf.begin() + 1 + C);
  sync->allreduce_sum(buf.data(), 2 * C + 1);
  const double M = buf[0];
  BRIGADE_CHECK(M > 1, ValueError,
                "sync_batch_norm2d: the group's batch has {} value(s) per channel; a variance needs more than one", M);
  const size_t Cs = static_cast<size_t>(C);
  std::vector<double> mean(Cs), var(Cs), var_unbiased(Cs);
  std::vector<float> mean_f(Cs), var_f(Cs);
  for (size_t c = 0; c < Cs; ++c) {
    mean[c] = buf[1 + c] / M;
    var[c] = std::max(buf[1 + Cs + c] / M - mean[c] * mean[c], 0.0);  // biased; >= 0 against rounding
    var_unbiased[c] = var[c] * M / (M - 1);
    mean_f[c] = float(mean[c]);
    var_f[c] = float(var[c]);
  }
  // normalise with the global statistics: batch_norm2d's eval form, whose "running" statistics
  // are the global mean and biased variance (its own running statistics are not touched)
  ops::BatchNormOut r = ops::batch_norm2d(x, w, b, Tensor::from_vector(mean_f, {C}), Tensor::from_vector(var_f, {C}),
                                          /*training=*/false, 0.0, eps);
  if (running_mean.defined() && !autograd::recomputing())
    ops::batch_norm2d_update_running(running_mean, running_var, mean, var_unbiased, momentum);
  auto n = std::make_shared<SyncBatchNorm2dBackward>();
  if (needs_grad({x, w, b})) {
    n->save(x, w, r.mean, r.rstd);
    n->sync = sync;
    n->M = M;
    n->has_bias = b.defined();
  }
  return record(r.y, n, {x, w, b});
}

Tensor max_pool2d(const Tensor& x0, int64_t kernel, int64_t stride, int64_t padding, bool channels_last) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Pool, {&x0}));
  ops::MaxPoolOut r = ops::max_pool2d(x, kernel, stride, padding, channels_last);
  auto n = std::make_shared<MaxPool2dBackward>();
  if (needs_grad({x})) {
    n->idx = r.idx;
    n->x_shape = x.shape();
    n->channels_last = channels_last;
  }
  return record(r.y, n, {x});
}

Tensor avg_pool2d(const Tensor& x0, int64_t kernel, int64_t stride, int64_t padding) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Pool, {&x0}));
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
  const Tensor x = cast(x0, policy_dtype(amp::Op::Reduction, {&x0}));
  auto n = std::make_shared<GlobalAvgPoolBackward>();
  n->x_shape = x.shape();
  Tensor y = ops::mean(x, {2, 3}, true);  // (N, C, 1, 1)
  return record(y, n, {x});
}

// The node keeps the output, detached.
Tensor relu(const Tensor& x0) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::relu(x);  // x's shape
  return rules::record_saving<ops::relu_backward>("ReluBackward", y, x, y.detach());
}

// The node keeps the output, detached.
Tensor sigmoid(const Tensor& x0) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::sigmoid(x);  // x's shape
  return rules::record_saving<ops::sigmoid_backward>("SigmoidBackward", y, x, y.detach());
}

// The node keeps the output, detached.
Tensor reciprocal(const Tensor& x0) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::reciprocal(x);  // x's shape
  return rules::record_saving<ops::reciprocal_backward>("ReciprocalBackward", y, x, y.detach());
}

Tensor spatial_mean(const Tensor& x0, bool keepdim) {
  BRIGADE_CHECK(x0.defined() && x0.dim() == 4, ShapeError, "spatial_mean: x must be 4-D (N, C, H, W), got {}",
                x0.defined() ? x0.str() : "undefined");
  const Tensor x = cast(x0, policy_dtype(amp::Op::Reduction, {&x0}));
  auto n = std::make_shared<SpatialMeanBackward>();
  n->x_shape = x.shape();
  return record(ops::spatial_mean(x, keepdim), n, {x});  // (N, C) or (N, C, 1, 1)
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
