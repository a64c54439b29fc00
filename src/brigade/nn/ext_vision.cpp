// Vision layers; see ext_vision.h. Derivative rules live in autograd/ext_vision.cpp.
#include "brigade/nn/ext_vision.h"

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"

namespace brigade::nn {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool has_bias)
    : in_channels(in), out_channels(out), kernel(kernel), stride(stride), padding(padding) {
  BRIGADE_CHECK(in >= 1 && out >= 1 && kernel >= 1 && stride >= 1 && padding >= 0, ConfigError,
                "Conv2d({}, {}, kernel={}, stride={}, padding={}): channels, kernel and stride must be >= 1, "
                "padding >= 0",
                in, out, kernel, stride, padding);
  weight = register_parameter("weight", {out, in, kernel, kernel});
  if (has_bias) bias = register_parameter("bias", {out});
}
Tensor Conv2d::forward(const Tensor& x) const { return fn::conv2d(x, weight, bias, stride, padding); }
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

Tensor BatchNorm2d::forward(const Tensor& x) const {
  const bool training = is_training();
  // once per real forward: not again when a checkpointed block re-runs it in the backward
  if (training && !autograd::recomputing()) num_batches_tracked.data<int64_t>()[0] += 1;
  if (training && sync) return fn::sync_batch_norm2d(x, weight, bias, running_mean, running_var, momentum, eps, sync);
  return fn::batch_norm2d(x, weight, bias, running_mean, running_var, training, momentum, eps);
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
