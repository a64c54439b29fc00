// LayerNorm (torch.nn.LayerNorm over the last dim) and BatchNorm2d (torch.nn.BatchNorm2d: weight, bias (C) and the
// buffers running_mean, running_var, num_batches_tracked) and what plans and tasks do with its buffers. nn::Module
// knows only parameters, so BatchNorm2d keeps its buffers as members and exposes them through named_buffers(); a model
// that owns BatchNorm2d layers collects them with its own names (models/resnet does). Buffers are plain f32 / i64
// tensors that never require grad; the training forward updates them in place. Initialisation as torch: weight 1, bias
// 0, running_mean 0, running_var 1.
#pragma once
#include <memory>
#include <string>

#include "brigade/autograd/functions.h"
#include "brigade/nn/module.h"

namespace brigade::nn {

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

// torch.nn.LayerNorm over the last dim; weight = 1, bias = 0 at construction.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace brigade::nn
