// Tensor and pipeline parallelism for any task that gives its forward in Stages (task.h: GPT and
// LLaMA through CausalLMTask, BERT through MaskedLMTask, ViT through ImageClassificationTask;
// docs/model-parallel.md): the plan the trainer applies when parallel.tp or parallel.pp is above 1.
//
// The job's processes form a mesh dp x tp x pp (dist::DeviceMesh; tp fastest). Every
// rank first builds the whole single-device model, initialised as one process would (so
// every parameter starts bitwise as in a one-process run), then:
//   1. tensor parallel (parallel.tp): parallel::apply_tensor_parallel applies the model's plan
//      (Stages::tp_plan, declared next to the model: GPT::tp_plan(), ...) over the tp group
//      (Megatron column / row parallel linears, divided attention heads; vocabulary-parallel
//      embedding and cross-entropy, vocabulary padded to a multiple of tp);
//   2. pipeline (parallel.pp): the model's blocks are cut into pp x v stages (by estimated cost,
//      or parallel.stage_layers); stage s is chunk s / pp of pp rank s % pp; the first stage also
//      embeds (the parameters registered before the first block), the last also runs the head
//      (those after the last block). Tied parameters (Stages::tied: GPT's wte, BERT's
//      word_embeddings) live on both. Each rank keeps only the parameters of its stages; the
//      others are freed;
//   3. data parallel: DataParallel over the dp group, ZeRO-0 or 1, on this rank's
//      parameters, communicating once the step's backward work is done.
// A tied parameter's two gradients are summed between the first and the last stage (first +
// last, sent back, so both copies stay bitwise equal).
//
// One train_batch runs the schedule (parallel/pipeline.h) over parallel.microbatches
// micro-batches of batch_size / microbatches rows: the loss is their mean, weighted by each
// micro-batch's share of the batch's items when they differ (Stages::count: BERT's masked
// tokens), as one process computes it over the whole batch. The global gradient norm counts
// tp-replicated parameters and tied ones once. Checkpoints hold the whole model by Hugging
// Face name (gathered on world rank 0), so `brigade generate`, `brigade eval` and one-process
// runs read them; the optimizer state is saved per rank and resumes on the same mesh.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/dist/process_group.h"
#include "brigade/optim/optimizer.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/parallel/pipeline.h"
#include "brigade/parallel/tensor_parallel.h"
#include "brigade/train/config.h"
#include "brigade/train/task.h"

namespace brigade::train {

class ModelParallel {
 public:
  // Collective over `world`. task.model() is the whole model as the registry made it (weights
  // loaded, when resuming); it is sharded and trimmed in place. `stages` are the task's. `say`
  // prints on rank 0.
  ModelParallel(const Recipe& r, Task& task, const Stages& stages, std::shared_ptr<dist::ProcessGroup> world,
                const std::function<void(const std::string&)>& say);

  const dist::DeviceMesh& mesh() const { return *mesh_; }
  std::shared_ptr<dist::ProcessGroup> dp_group() const { return dp_group_; }
  // This rank's parameters, as one data-parallel unit.
  std::vector<parallel::ParamUnit> units() const;
  // The micro-batch loss reaches the trainer from one rank per dp replica (last stage, tp rank 0).
  bool reports_loss() const { return reports_loss_; }

  // Forward and backward of one batch (B rows) through the pipeline, the loss of each
  // micro-batch scaled by loss_scale x its share (1 / microbatches, or its items / the batch's
  // when Stages::count says they differ) before its backward; the last stage adds the task's
  // training extras to `train`. Returns the batch's mean loss on the reporting rank, 0 elsewhere.
  double train_batch(const Batch& b, double loss_scale, const amp::Policy& policy, Metrics& train);
  // The forward only, the last stage scoring each micro-batch into `eval` (the task's metrics).
  // Any number of rows: they are cut into microbatches as evenly as possible.
  void eval_batch(const Batch& b, const amp::Policy& policy, Metrics& eval);
  // Sums the tied parameters' gradients between the first and the last stage (pp > 1).
  void sync_tied_gradients();
  // Global L2 norm of the gradients over the whole mesh (before clipping), clipping this
  // rank's optimizer gradients when above max_norm (> 0). Collective over `ctrl` (all ranks).
  double clip_grad_norm(parallel::DataParallel& dp, double max_norm, dist::ProcessGroup& ctrl) const;
  // Every parameter, whole and by its Hugging Face name, on world rank 0 (empty elsewhere).
  // Collective.
  nn::NamedTensors gather_full();

  // ---- the pipeline's measurements
  const parallel::PipePlan& plan() const { return exec_->plan(); }
  const std::vector<int64_t>& stage_bounds() const { return bounds_; }
  // The last train_batch's measured step on every pp rank (collective over the pp group):
  // events, measured bubble, and what the simulator predicts from the measured stage times.
  struct PipeReport {
    std::vector<parallel::PipeEvent> events;
    double measured_bubble = 0.0, predicted_bubble = 0.0;
    std::vector<int> peak_in_flight;  // per pp rank, measured
  };
  PipeReport report();
  std::string describe() const;  // one line: mesh, stages, schedule

 private:
  // Where a parameter outside the blocks lives: read by embed (first stage) or by the head (last).
  static constexpr int64_t kEmbed = -1, kHead = -2;
  Recipe r_;
  nn::Module& model_;
  const Stages& stages_;
  std::unique_ptr<dist::DeviceMesh> mesh_;
  std::shared_ptr<dist::ProcessGroup> world_, dp_group_, tp_group_, pp_group_;
  parallel::TpLayout layout_;                               // every parameter's tensor-parallel split
  std::vector<std::pair<std::string, Shape>> full_shapes_;  // every parameter of the whole model, in order
  std::map<std::string, int64_t> place_;                    // block index, kEmbed or kHead
  std::vector<std::string> tied_;                           // in the model's order
  std::vector<int64_t> bounds_;                             // stage s: blocks [bounds_[s], bounds_[s+1])
  std::unique_ptr<parallel::PipelineExecutor> exec_;
  nn::NamedTensors local_;  // this rank's parameters
  bool first_ = false, last_ = false, reports_loss_ = false;
  parallel::PipeStepResult last_step_;
  std::string choice_table_;

  // One chunk per local stage: the task's embed / blocks / head (or score, when `eval`) on
  // micro-batch mb = rows [rows[mb], rows[mb + 1]) of b, its loss times weight[mb] (when given).
  std::vector<parallel::PipeChunk> chunks(const Batch& b, const std::vector<int64_t>& rows,
                                          const std::vector<double>& weight, const amp::Policy& policy, Metrics* train,
                                          Metrics* eval);
  bool tied(const std::string& name) const;
  int owner_pp(const std::string& name) const;  // the pp rank that holds a parameter (the first for tied ones)
};

// Writes / reads this rank's optimizer state of a model-parallel run:
// <tmp>/optimizer-mp-<rank>-of-<world>.safetensors ("<state>.<param>", this rank's shapes),
// with the mesh in its metadata; reading checks that the mesh is the same.
void write_mp_optimizer(const std::string& tmp, const ModelParallel& mp, const optim::Optimizer& opt);
void read_mp_optimizer(const std::string& dir, const ModelParallel& mp, optim::Optimizer& opt, int64_t steps);

}  // namespace brigade::train
