// Data parallelism with ZeRO sharding, applied to single-device model code from
// outside (the model never knows). One object per training run; every rank of
// the data-parallel group builds it with the same model and options.
//
// Flat layout. Parameters are laid out in one flat fp32 index space, unit after
// unit, each parameter 64-byte aligned; the space is padded to dp x S elements
// and rank r owns the shard [r S, (r+1) S). The layout does not depend on dp
// beyond the padding, so a checkpoint's flat optimizer state can be re-cut for
// another dp size.
//
// Stages (Rajbhandari et al. 2020):
//   zero 0  DDP: params and grads live in flat buffers (every param and grad a
//           view); gradient buckets (reverse parameter order, >= bucket_bytes)
//           are allreduced as soon as all their gradients are ready, on the
//           communication thread, overlapping the rest of the backward; every rank
//           runs the full optimizer.
//   zero 1  as 0, but the optimizer holds state only for this rank's shard, and
//           buckets are reduce-scattered (each rank needs only its shard of the sum:
//           the same bytes as an allreduce once the parameter allgather is counted);
//           after the update the shards are allgathered into the flat parameters.
//           Gradients stay full-size, so accumulation needs no communication.
//   zero 2  no full gradient buffer: a bucket's gradients are copied out, freed,
//           and reduce-scattered so each rank keeps only its gradient shard.
//   zero 3  no full parameters either: each unit's parameters live in a storage
//           that is materialized (allgathered from the shards) just before the
//           unit's forward, with the next unit prefetched, and freed after; in the
//           backward a hook on the unit's output gathers it again (prefetching the
//           unit before it) and it is freed once its gradients are reduce-scattered.
//           Buckets are the units. Units without a module (embeddings, final norm,
//           tied head) stay gathered for the whole step.
// Gradients are averaged: summed over ranks and micro-steps, then scaled by
// 1/(dp x accumulation), matching one process that sees the whole global batch.
// Accumulation micro-steps do not communicate under zero 0/1 (gradients add up
// locally, one allreduce at the last micro-step); under zero 2/3 every micro-step
// reduce-scatters into the gradient shard (the full gradient is never kept).
//
// Deterministic mode (options.deterministic; docs/distributed.md "Deterministic mode"): every
// micro-step is one fixed-size atom of the global batch, and the result must not depend on how
// the atoms are spread over ranks and micro-steps. Floating-point addition is not associative,
// so the gradients are summed in one canonical binary tree over the atoms' global order: a rank
// holds a contiguous, power-of-two-sized block of atoms (an aligned subtree), sums its atoms'
// gradients pairwise as they come (a binary counter: level l holds the sum of the last 2^l
// atoms), and the ranks' subtree sums are combined by the binomial-tree allreduce, whose order
// ((r0 + r1) + (r2 + r3)) + ... is the same tree one level up. A bucket's atom gradient goes into
// the tree when it is ready (ZeRO-0/1: taken out of the flat buffer, which is zeroed for the next
// atom; ZeRO-2/3: the staging buffer, which is then freed as usual), so every stage gives the same
// sum. Costs: log2(atoms per rank) + 1 full-size gradient buffers per rank, one synchronous tree
// allreduce at the step's end (no overlap), and the full gradient on every rank whatever the stage
// (the parameter and optimizer-state sharding of ZeRO-1/3 is kept). The global norm sums fixed
// blocks of the flat gradient in a fixed order (deterministic_norm; shards are cut on block
// boundaries), so clipping agrees too.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"
#include "brigade/dist/process_group.h"
#include "brigade/nn/module.h"
#include "brigade/parallel/comm_queue.h"

namespace brigade::parallel {

// Parameters gathered and released together under ZeRO-3, in forward order.
struct ParamUnit {
  std::string name;              // e.g. "transformer.h.3"
  nn::NamedTensors params;       // full names
  nn::Module* module = nullptr;  // its forward hooks gather/release the unit; null = gathered for the whole step
};

struct DataParallelOptions {
  int zero = 0;
  dist::AllreduceAlgo algo = dist::AllreduceAlgo::Mpi;
  int64_t bucket_bytes = int64_t(4) << 20;
  bool overlap = true;       // communicate during the backward (communication thread)
  int64_t accumulation = 1;  // micro-steps per optimizer step
  // false: no gradient hooks; every bucket is communicated in finish_gradients(), after the
  // whole step's backward work (pipeline schedules, whose weight gradients may come late and
  // out of micro-step order, and the tied embedding's cross-stage sum). ZeRO 0 and 1 only.
  bool communicate_in_backward = true;
  // Gradients summed in a canonical tree over the micro-steps' atoms (see above): the same bits for
  // every dp size, ZeRO stage and split of the step into micro-steps of equal rows. Needs
  // communicate_in_backward and a power-of-two accumulation.
  bool deterministic = false;
};

// One flat range of a parameter: [flat_begin, flat_end) of the flat space.
struct FlatEntry {
  std::string name;
  int64_t offset = 0, numel = 0;
  bool decay = false;  // weight decay applies (the parameter is a matrix)
};

class DataParallel {
 public:
  DataParallel(std::vector<ParamUnit> units, std::shared_ptr<dist::ProcessGroup> group, DataParallelOptions o);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int zero() const { return o_.zero; }
  int rank() const { return pg_->rank(); }
  int size() const { return pg_->size(); }
  dist::ProcessGroup& group() const { return *pg_; }

  // ---- the step protocol:
  //   begin_step(); for each micro-step m: { begin_micro_step(m); forward; backward; }
  //   finish_gradients(); clip_grad_norm(); optimizer.step(); after_optimizer_step();
  void begin_step();
  // Micro-steps of the next step (adaptive accumulation changes it between steps).
  void set_accumulation(int64_t micro_steps);
  // ZeRO 0/1, between micro-steps (before the last one communicates): the squared L2
  // norm of this rank's local accumulated gradient, unscaled. For the noise-scale estimate.
  double local_grad_sq() const;
  void begin_micro_step(int64_t micro);
  void finish_gradients();
  double clip_grad_norm(double max_norm);  // global L2 norm over all ranks' gradients, before clipping
  double grad_norm();                      // the same norm, gradients left as they are
  void after_optimizer_step();

  // What the optimizer updates, each with its gradient set: the model's parameters
  // (zero 0) or views of this rank's shard named after their parameter (zero >= 1).
  const nn::NamedTensors& optimizer_params() const { return opt_params_; }
  // Whether a (shard of a) parameter gets weight decay: the full parameter is a matrix.
  bool decays(const std::string& name) const;

  // ---- outside the step (evaluation, checkpoints, sampling). ZeRO-3 only, no-ops otherwise;
  // collective: every rank calls them together.
  void gather_persistent();  // the units without a module (eval then gathers the rest via hooks)
  void release_persistent();
  void gather_all();  // every unit, kept until release_all()
  void release_all();
  // Calls fn(unit parameters) for each unit in turn, gathered (ZeRO-3: one unit at a time,
  // released after fn returns; otherwise all parameters at once). For checkpoints.
  void for_each_unit_gathered(const std::function<void(const nn::NamedTensors&)>& fn);

  // ---- flat layout, for sharded checkpoints
  const std::vector<FlatEntry>& layout() const { return layout_; }
  int64_t flat_numel() const { return numel_; }  // end of the last parameter (no padding)
  int64_t shard_begin() const { return lo_; }
  int64_t shard_end() const { return std::min(hi_, numel_); }
  // Rank r's shard, clipped to the parameters: [r S, min((r+1) S, flat_numel)).
  std::pair<int64_t, int64_t> shard_range(int r) const {
    return {std::min(int64_t(r) * S_, numel_), std::min(int64_t(r + 1) * S_, numel_)};
  }
  // Optimizer state names ("exp_avg", ...) -> this rank's shard of the flat state,
  // [shard_begin, shard_end); zero >= 1 only.
  std::map<std::string, Tensor> shard_state(const nn::NamedTensors& state) const;
  // The reverse: fills the optimizer's per-view state from flat shard tensors.
  void load_shard_state(const std::map<std::string, Tensor>& flat, const nn::NamedTensors& state) const;

  // The queue the gradient buckets are communicated on, for other collectives of the backward
  // that must run in order with them (synchronised batch norm).
  CommQueue* comm_queue() const { return queue_.get(); }

  // ---- measurements (since the last reset)
  double comm_wait_seconds() const { return queue_->wait_seconds() + direct_s_; }
  // CPU and wall seconds of the queued collectives themselves (gradient buckets, ZeRO-3 gathers).
  double comm_task_cpu_seconds() const { return queue_->task_cpu_seconds(); }
  double comm_task_wall_seconds() const { return queue_->task_wall_seconds(); }
  // The most gradient / gather collectives queued at once (at most kMaxInFlight bucket
  // collectives, plus ZeRO-3's prefetched gathers).
  int64_t comm_peak_queued() const { return queue_->peak_pending(); }
  static constexpr size_t max_buckets_in_flight() { return kMaxInFlight; }
  int64_t bytes_sent() const { return pg_->bytes_sent(); }
  void reset_stats();

 private:
  struct Unit {
    std::string name;
    nn::Module* module = nullptr;
    std::vector<size_t> params;        // indices into params_
    int64_t begin = 0, end = 0;        // flat range
    std::shared_ptr<Storage> storage;  // ZeRO-3: the gathered parameters
    enum State { Released, Pending, Gathered } state = Gathered;
    int64_t ticket = 0;
  };
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    int64_t begin = 0, end = 0;  // flat range (contiguous)
    int unit = -1;               // ZeRO-3: the unit it belongs to
    int ready = 0;               // gradients ready in this micro-step
    bool fired = false;
    Tensor buffer;  // ZeRO-2/3: (end - begin) gradients, armed just in time
  };

  void on_grad_ready(size_t bucket);
  void fire_bucket(size_t b);
  void fire_deterministic(size_t b);
  Tensor hand_off(size_t b);
  void submit_bounded(std::function<void()> task);            // queue a bucket's collective, <= kMaxInFlight
  void wait_in_flight(size_t keep);                           // wait for the oldest until `keep` remain
  void tree_add(const float* src, int64_t begin, int64_t n);  // this micro-step's atom, flat range
  float* tree_level(size_t l);
  double deterministic_norm();
  void arm_bucket(size_t b);
  void prefetch(size_t u);
  void ensure_gathered(size_t u);
  void release_unit(size_t u);
  std::vector<int64_t> counts_in(int64_t begin, int64_t end) const;  // per-rank overlap with the shards

  std::shared_ptr<dist::ProcessGroup> pg_;
  DataParallelOptions o_;
  nn::NamedTensors params_;
  std::vector<FlatEntry> layout_;
  std::vector<Unit> units_;
  std::vector<Bucket> buckets_;
  std::vector<int> unit_of_param_;
  std::map<std::string, bool> decay_;
  int64_t numel_ = 0, padded_ = 0, S_ = 0, lo_ = 0, hi_ = 0;
  std::shared_ptr<Storage> flat_params_, flat_grads_, param_shard_, grad_shard_;
  nn::NamedTensors opt_params_;
  std::vector<std::pair<int64_t, int64_t>> opt_ranges_;  // flat range of each optimizer param
  std::unique_ptr<CommQueue> queue_;
  bool last_micro_ = true, keep_all_ = false;
  // tickets of the bucket collectives in flight (every stage); a new bucket waits until at most
  // kMaxInFlight-1 are pending (submit_bounded in data_parallel.cpp says why)
  std::deque<int64_t> in_flight_;
  static constexpr size_t kMaxInFlight = 2;
  double direct_s_ = 0.0;
  // deterministic mode: level l of the binary counter over this step's atoms (padded_ floats each,
  // allocated on first use and kept) and the micro-step being accumulated
  std::vector<std::shared_ptr<Storage>> tree_;
  int64_t micro_ = 0;
};

}  // namespace brigade::parallel
