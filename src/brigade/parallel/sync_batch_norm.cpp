// Synchronised batch norm's reducer over a process group; see sync_batch_norm.h.
#include "brigade/parallel/sync_batch_norm.h"

#include "brigade/core/error.h"
#include "brigade/nn/conv.h"
#include "brigade/nn/norm.h"

namespace brigade::parallel {

GroupBatchNormSync::GroupBatchNormSync(std::shared_ptr<dist::ProcessGroup> group, CommQueue* queue)
    : group_(std::move(group)), queue_(queue) {
  BRIGADE_CHECK(group_ != nullptr, ValueError, "GroupBatchNormSync: no process group given");
}

void GroupBatchNormSync::allreduce_sum(double* data, int64_t n) const {
  if (group_->size() == 1 || n == 0) return;
  if (queue_ && queue_->threaded()) {
    queue_->wait(queue_->submit([g = group_, data, n] { g->allreduce(data, n); }));
    return;
  }
  group_->allreduce(data, n);
}

int64_t sync_batch_norms(nn::Module& model, std::shared_ptr<dist::ProcessGroup> group, CommQueue* queue) {
  return nn::set_batch_norm_sync(model, std::make_shared<GroupBatchNormSync>(std::move(group), queue));
}

}  // namespace brigade::parallel
