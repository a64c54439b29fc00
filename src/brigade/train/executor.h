// How the trainer runs a task's forward and backward: on this process's whole model
// (LocalExecutor), or cut by tensor and pipeline parallelism over a dp x tp x pp mesh
// (ModelParallelExecutor, model_parallel.h). The trainer's loop is the same for both: it asks
// the executor for the data-parallel units and group, runs micro-steps through it, lets it
// finish gradients that cross stages and compute the global norm, and scores evaluation batches
// through it. Model parallelism is thereby one object behind this interface, not branches in
// the loop.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/dist/process_group.h"
#include "brigade/optim/optimizer.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/task.h"

namespace brigade::train {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // This rank's parameters, as data-parallel units (ZeRO-3 gathers each around its forward).
  virtual std::vector<parallel::ParamUnit> units(int zero) = 0;
  // The group data parallelism reduces gradients over, and this process's replica in it.
  virtual std::shared_ptr<dist::ProcessGroup> dp_group() = 0;
  virtual Shard shard() = 0;
  // false: gradients are communicated after the whole step's backward (pipelines).
  virtual bool communicate_in_backward() const { return true; }
  // Forward and backward of one micro-batch; the loss is multiplied by `factor` (loss scale x
  // the micro-batch's weight) before its backward. `after_forward` runs between the two (the
  // fault-injection hook). Returns the micro-batch's reported loss (0 on ranks that do not
  // report it: one rank per replica reports).
  virtual double train_micro(Task& task, const Batch& b, int64_t micro, double factor, double weight,
                             const amp::Policy& policy, Metrics& train_metrics,
                             const std::function<void()>& after_forward) = 0;
  // After the step's micro-steps, before data parallelism finishes the gradients.
  virtual void finish_backward() {}
  // The global gradient norm and clipping when this executor needs its own (a mesh-wide norm);
  // empty: DataParallel's.
  virtual std::function<double(double)> clip(parallel::DataParallel& dp, dist::ProcessGroup& ctrl) {
    (void)dp;
    (void)ctrl;
    return {};
  }
  // Scores one evaluation batch under `policy` into the metrics (nothing on non-reporting ranks).
  virtual Task::Scorer scorer(Task& task, const amp::Policy& policy) = 0;
  // Whether this rank's metrics count in the job's sums (one rank per replica).
  virtual bool reports() const { return true; }
  // Every parameter, whole and by name, on world rank 0 (model parallelism); empty: the task's
  // own model holds them (gathered by DataParallel).
  virtual bool holds_shards() const { return false; }
  virtual nn::NamedTensors gather_full() { return {}; }
  virtual std::string describe() const { return ""; }
  // Checkpoints of a model-parallel run keep the optimizer state per rank of the mesh.
  virtual void write_optimizer(const std::string& tmp, const optim::Optimizer& opt) const {
    (void)tmp;
    (void)opt;
  }
  virtual void read_optimizer(const std::string& dir, optim::Optimizer& opt, int64_t steps) const {
    (void)dir;
    (void)opt;
    (void)steps;
  }
  // After training: a model-parallel run writes its pipeline report (pipeline.json/svg).
  virtual void report(const std::string& out_dir, const std::string& run_name,
                      const std::function<void(const std::string&)>& say) {
    (void)out_dir;
    (void)run_name;
    (void)say;
  }
};

// One process's whole model (data parallelism, if any, applied on top by the trainer).
std::unique_ptr<StepExecutor> make_local_executor(Task& task, std::shared_ptr<dist::ProcessGroup> world);
// Tensor and pipeline parallelism over the world's dp x tp x pp mesh (model_parallel.h).
std::unique_ptr<StepExecutor> make_model_parallel_executor(const Recipe& r, Task& task,
                                                           std::shared_ptr<dist::ProcessGroup> world,
                                                           const std::function<void(const std::string&)>& say);

// The model's units for data parallelism: one unit for everything outside its blocks
// (embeddings, final norm, head; gathered for the whole step), then one unit per nn::Block
// (nn::find_blocks), in forward order. Trainable parameters only: a frozen one (requires_grad
// false, as LoRA leaves the base) belongs to no unit, and a unit left empty is dropped.
std::vector<parallel::ParamUnit> model_units(const nn::Module& model);

}  // namespace brigade::train
