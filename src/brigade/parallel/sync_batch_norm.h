// Synchronised batch norm for data parallelism (torch.nn.SyncBatchNorm), as a plan applied
// from outside: a fn::BatchNormSync reducer over a dist::ProcessGroup (the data-parallel
// group), installed on every nn::BatchNorm2d of a model with nn::set_batch_norm_sync. The
// maths (global statistics, gradients, the weight/bias gradient convention) is
// fn::sync_batch_norm2d's (autograd/functions.h); this file only moves the sums.
// Not here: the choice to use it (a recipe option of the training loop).
#pragma once
#include <cstdint>
#include <memory>

#include "brigade/autograd/functions.h"
#include "brigade/dist/process_group.h"
#include "brigade/nn/module.h"
#include "brigade/parallel/comm_queue.h"

namespace brigade::parallel {

// Sums over `group` with its double allreduce (the library algorithm; deterministic for a
// fixed size and world). MPI threading: a group is used by one thread at a time. While
// DataParallel overlaps gradient buckets with the backward on its communication thread, the
// batch norms' backward allreduces run on the main thread in the middle of it, so either give
// them `queue` (the same CommQueue the buckets use: each allreduce is submitted there and
// waited for, in order with the buckets; it then waits for the buckets queued before it) or
// a group of their own (ProcessGroup::split) under MPI_THREAD_MULTIPLE. A one-rank group
// makes no MPI call.
class GroupBatchNormSync final : public fn::BatchNormSync {
 public:
  explicit GroupBatchNormSync(std::shared_ptr<dist::ProcessGroup> group, CommQueue* queue = nullptr);
  void allreduce_sum(double* data, int64_t n) const override;
  const dist::ProcessGroup& group() const { return *group_; }

 private:
  std::shared_ptr<dist::ProcessGroup> group_;
  CommQueue* queue_;
};

// Makes every BatchNorm2d of `model` take its training statistics over `group`; returns how
// many layers it found (0: the model has no batch norm, nothing to do).
int64_t sync_batch_norms(nn::Module& model, std::shared_ptr<dist::ProcessGroup> group, CommQueue* queue = nullptr);

}  // namespace brigade::parallel
