// Vision layers; see ext_vision.h. Derivative rules live in autograd/ext_vision.cpp.
#include "brigade/nn/ext_vision.h"

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"

namespace brigade::nn {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool has_bias)
    : Conv2d(in, out, kernel, ops::Conv2dParams::symmetric(stride, padding), has_bias) {}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, const ops::Conv2dParams& p, bool has_bias)
    : in_channels(in), out_channels(out), kernel(kernel), stride(p.stride), padding(p.pad_top), params(p) {
  BRIGADE_CHECK(in >= 1 && out >= 1 && kernel >= 1 && p.stride >= 1 && p.pad_top >= 0 && p.pad_bottom >= 0 &&
                    p.pad_left >= 0 && p.pad_right >= 0 && p.groups >= 1 && in % p.groups == 0 &&
                    out % p.groups == 0,
                ConfigError,
                "Conv2d({}, {}, kernel={}, stride={}, padding (top {}, bottom {}, left {}, right {}), groups={}): "
                "channels, kernel, stride and groups must be >= 1, padding >= 0, and groups must divide both "
                "channel counts",
                in, out, kernel, p.stride, p.pad_top, p.pad_bottom, p.pad_left, p.pad_right, p.groups);
  weight = register_parameter("weight", {out, in / p.groups, kernel, kernel});
  if (has_bias) bias = register_parameter("bias", {out});
}
Tensor Conv2d::forward(const Tensor& x) const { return fn::conv2d(x, weight, bias, params); }
void Conv2d::parameter_replaced(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }

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

}  // namespace brigade::nn
