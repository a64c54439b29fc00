// Vision layers (torch.nn names and parameter layout): Conv2d (weight (O, C, KH, KW),
// optional bias (O)), BatchNorm2d (weight, bias (C) and the buffers running_mean,
// running_var, num_batches_tracked), MaxPool2d, AvgPool2d, AdaptiveAvgPool2d(1).
// nn::Module knows only parameters, so BatchNorm2d keeps its buffers as members and
// exposes them through named_buffers(); a model that owns BatchNorm2d layers collects
// them with its own names (models/resnet does). Buffers are plain f32 / i64 tensors that
// never require grad; the training forward updates them in place. Initialisation as
// torch: Conv2d weights are zero here (the model initialises them), BatchNorm2d weight 1,
// bias 0, running_mean 0, running_var 1.
#pragma once
#include <memory>
#include <string>

#include "brigade/autograd/functions.h"
#include "brigade/nn/module.h"

namespace brigade::nn {

class Conv2d : public Module {
 public:
  // `padding` on every side, groups 1 (bitwise the constructor below with
  // ops::Conv2dParams::symmetric(stride, padding)).
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, bool bias = false);
  // Any geometry: stride, zero padding per side (torch's ZeroPad2d before a "valid" conv) and
  // groups (which divide in and out; groups == in == out is depthwise). ConfigError otherwise.
  Conv2d(int64_t in, int64_t out, int64_t kernel, const ops::Conv2dParams& p, bool bias);
  Tensor forward(const Tensor& x) const;  // (N, in, H, W) -> (N, out, OH, OW); params.channels_last: NHWC
  int64_t in_channels, out_channels, kernel;
  int64_t stride, padding;     // the symmetric constructor's; `params` holds the geometry either way
  ops::Conv2dParams params;
  Tensor weight, bias;  // (out, in / groups, kernel, kernel), (out) or undefined

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  // Training mode (is_training()): batch statistics, buffers updated and
  // num_batches_tracked incremented; eval: running statistics. Under activation recompute
  // (a checkpointed block re-run in the backward, autograd::recomputing()) the buffers are
  // not touched: they move exactly once per real forward.
  // With `sync` set, training mode takes its batch statistics over the reducer's whole group
  // (fn::sync_batch_norm2d: torch.nn.SyncBatchNorm); eval mode is unchanged.
  Tensor forward(const Tensor& x) const;  // (N, C, H, W) -> (N, C, H, W); channels_last: (N, H, W, C)
  // running_mean (C) f32, running_var (C) f32, num_batches_tracked 0-d i64 (torch's names).
  NamedTensors named_buffers(const std::string& prefix = "") const;
  int64_t channels;
  double eps, momentum;
  bool channels_last = false;  // inputs are (N, H, W, C) (ops::batch_norm2d's channels-last form)
  Tensor weight, bias;
  Tensor running_mean, running_var, num_batches_tracked;
  // Set by a plan (data parallelism's synchronised batch norm, parallel/sync_batch_norm.h);
  // null: this rank's rows only, the single-device layer.
  std::shared_ptr<const fn::BatchNormSync> sync;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

// Differentiable views between the layouts: (N, C, H, W) -> (N, H, W, C) and back (no copy; the
// next op that needs contiguous memory copies).
inline Tensor to_channels_last(const Tensor& x) { return fn::transpose(fn::transpose(x, 1, 2), 2, 3); }
inline Tensor to_channels_first(const Tensor& x) { return fn::transpose(fn::transpose(x, 2, 3), 1, 2); }

// Inside this scope (thread-local, nests) a BatchNorm2d in training mode still normalises with
// its batch's statistics but leaves running_mean, running_var and num_batches_tracked alone. For
// a forward that is run a second time for its gradient (the contrastive task's embedding pass
// before the gradient pass), so the running statistics move once per batch, as without it.
class FrozenBatchNormStats {
 public:
  FrozenBatchNormStats();
  ~FrozenBatchNormStats();
  FrozenBatchNormStats(const FrozenBatchNormStats&) = delete;
  FrozenBatchNormStats& operator=(const FrozenBatchNormStats&) = delete;
  static bool active();

 private:
  bool prev_;
};

// The buffers of every BatchNorm2d at or below `root`, named by the layer's path
// ("<path>.running_mean", "<path>.running_var", "<path>.num_batches_tracked"), in module order:
// the live tensors (copy_ into them to load a checkpoint).
NamedTensors batch_norm_buffers(const Module& root);

// Sets `sync` on every BatchNorm2d at or below `root` (null: back to per-rank statistics);
// returns how many layers it set. For plans: nn knows the reducer only as an interface.
int64_t set_batch_norm_sync(Module& root, const std::shared_ptr<const fn::BatchNormSync>& sync);

class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : kernel(kernel), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) const { return fn::max_pool2d(x, kernel, stride, padding, channels_last); }
  int64_t kernel, stride, padding;
  bool channels_last = false;  // inputs are (N, H, W, C)
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : kernel(kernel), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) const { return fn::avg_pool2d(x, kernel, stride, padding); }
  int64_t kernel, stride, padding;
};

// AdaptiveAvgPool2d with output size 1 (the only size ResNet needs): (N, C, H, W) -> (N, C, 1, 1).
class AdaptiveAvgPool2d : public Module {
 public:
  Tensor forward(const Tensor& x) const { return fn::adaptive_avg_pool2d(x); }
};

}  // namespace brigade::nn
