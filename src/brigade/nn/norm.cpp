// BatchNorm2d and its buffers (nn/norm.h).
#include "brigade/nn/norm.h"

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"
#include "brigade/nn/conv.h"

namespace brigade::nn {

BatchNorm2d::BatchNorm2d(int64_t channels, double eps, double momentum)
    : channels(channels), eps(eps), momentum(momentum) {
  BRIGADE_CHECK(channels >= 1, ConfigError, "BatchNorm2d({}): channels must be >= 1", channels);
  weight = register_parameter("weight", {channels});
  weight.fill_(1.0);
  bias = register_parameter("bias", {channels});
  running_mean = Tensor::zeros({channels});  // (C)
  running_var = Tensor::ones({channels});    // (C)
  num_batches_tracked = Tensor::zeros({}, DType::I64);
}

namespace {
thread_local bool g_frozen_stats = false;
}

FrozenBatchNormStats::FrozenBatchNormStats() : prev_(g_frozen_stats) { g_frozen_stats = true; }
FrozenBatchNormStats::~FrozenBatchNormStats() { g_frozen_stats = prev_; }
bool FrozenBatchNormStats::active() { return g_frozen_stats; }

namespace {
// Synchronised batch norm has an NCHW form only: a channels-last (N, H, W, C) input goes through
// it as an NCHW view, and the result comes back as a channels-last view (copied by its consumer).
Tensor sync_bn(const Tensor& x, const BatchNorm2d& bn, const Tensor& rm, const Tensor& rv) {
  if (!bn.channels_last) return fn::sync_batch_norm2d(x, bn.weight, bn.bias, rm, rv, bn.momentum, bn.eps, bn.sync);
  const Tensor y =
      fn::sync_batch_norm2d(to_channels_first(x), bn.weight, bn.bias, rm, rv, bn.momentum, bn.eps, bn.sync);
  return to_channels_last(y);
}
}  // namespace

Tensor BatchNorm2d::forward(const Tensor& x) const {
  const bool training = is_training();
  if (training && g_frozen_stats) {  // batch statistics, buffers untouched
    if (sync) return sync_bn(x, *this, Tensor(), Tensor());
    return fn::batch_norm2d(x, weight, bias, Tensor(), Tensor(), true, momentum, eps, channels_last);
  }
  // once per real forward: not again when a checkpointed block re-runs it in the backward
  if (training && !autograd::recomputing()) num_batches_tracked.data<int64_t>()[0] += 1;
  if (training && sync) return sync_bn(x, *this, running_mean, running_var);
  return fn::batch_norm2d(x, weight, bias, running_mean, running_var, training, momentum, eps, channels_last);
}

NamedTensors batch_norm_buffers(const Module& root) {
  NamedTensors out;
  for (auto& [name, m] : root.named_modules())
    if (auto* bn = dynamic_cast<const BatchNorm2d*>(m))
      for (auto& b : bn->named_buffers(name + ".")) out.push_back(b);
  return out;
}

int64_t set_batch_norm_sync(Module& root, const std::shared_ptr<const fn::BatchNormSync>& sync) {
  int64_t n = 0;
  auto set = [&](Module* m) {
    if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) {
      bn->sync = sync;
      ++n;
    }
  };
  set(&root);
  for (auto& [name, m] : root.named_modules()) set(m);
  return n;
}

NamedTensors BatchNorm2d::named_buffers(const std::string& prefix) const {
  return {{prefix + "running_mean", running_mean},
          {prefix + "running_var", running_var},
          {prefix + "num_batches_tracked", num_batches_tracked}};
}

void BatchNorm2d::parameter_replaced(const std::string& name, const Tensor& t) {
  (name == "weight" ? weight : bias) = t;
}

LayerNorm::LayerNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", {dim});
  weight.fill_(1.0);
  bias = register_parameter("bias", {dim});
}
Tensor LayerNorm::forward(const Tensor& x) const { return fn::layer_norm(x, weight, bias, eps); }
void LayerNorm::parameter_replaced(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }

}  // namespace brigade::nn
