// Derivative rules of layer norm, RMSNorm, batch norm (plain and synchronised) and CLIP's
// l2_normalize (a composition).
#include <algorithm>
#include <cmath>

#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct LayerNormBackward : rules::NormNode {
  const char* name() const override { return "LayerNormBackward"; }
  // forward: y = (x - mean) * rstd * w + b
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::LayerNormGrads r = ops::layer_norm_backward(g, x, w, mean, rstd);
    return {r.gx, r.gw, r.gb};
  }
};

struct RMSNormBackward : Node {
  Tensor x, w, rstd;
  const char* name() const override { return "RMSNormBackward"; }
  // forward: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::RMSNormGrads r = ops::rms_norm_backward(g, x, w, rstd);
    return {wants(*this, 0) ? r.gx : Tensor(), wants(*this, 1) ? r.gw : Tensor()};
  }
  void release() override { x = w = rstd = Tensor(); }
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

}  // namespace

Tensor layer_norm(const Tensor& x0, const Tensor& w0, const Tensor& b0, double eps) {
  const DType dt = policy_dtype(amp::Op::LayerNorm, {&x0, &w0, &b0});
  const Tensor x = cast(x0, dt), w = cast(w0, dt), b = cast(b0, dt);
  ops::LayerNormOut r = ops::layer_norm(x, w, b, eps);
  auto n = std::make_shared<LayerNormBackward>();
  if (needs_grad({x, w, b})) n->save(x, w, r.mean, r.rstd);
  return record(r.y, n, {x, w, b});
}

Tensor rms_norm(const Tensor& x0, const Tensor& w0, double eps) {
  const DType dt = policy_dtype(amp::Op::LayerNorm, {&x0, &w0});
  const Tensor x = fn::cast(x0, dt), w = fn::cast(w0, dt);
  ops::RMSNormOut r = ops::rms_norm(x, w, eps);
  auto n = std::make_shared<RMSNormBackward>();
  if (needs_grad({x, w})) {
    n->x = x;
    n->w = w;
    n->rstd = r.rstd;
  }
  return record(r.y, n, {x, w});
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

Tensor l2_normalize(const Tensor& x) {
  BRIGADE_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) > 0, ShapeError,
                "l2_normalize: x must have a non-empty last dim, got {}", shape_str(x.shape()));
  const int64_t C = x.size(x.dim() - 1);
  const Tensor ones = Tensor::ones({C}, x.dtype());  // (C), constant
  return mul_scalar(rms_norm(x, ones, 0.0), 1.0 / std::sqrt(double(C)));
}

}  // namespace brigade::fn
