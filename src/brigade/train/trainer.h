// The one training loop, for every model (task.h says what a model family contributes).
//
// It owns the step: micro-steps of every accumulation policy (static, ramp, noise_scale),
// autocast, loss scaling with every rank skipping an overflowing step together, clipping by
// norm and value, the optimizer and its schedule; data parallelism with ZeRO 0-3 (one rank:
// the same code, collectives are no-ops); model parallelism through the step executor
// (executor.h: tensor and pipeline parallelism are one object, not branches here); activation
// recompute on the model's blocks; BatchNorm statistics across ranks; evaluation every
// train.eval_every steps and at the end; the progress line, metrics.jsonl, memory.json and
// loss.svg; checkpoints every train.checkpoint_every steps and at the end (bitwise resume, and
// resume at another dp size); early stopping (the best model in <out_dir>/best); non-finite and
// spiking steps (step_guard.h: stop, skip, or roll back to the last checkpoint and replay without
// that step's batch); Ctrl-C
// (SIGINT/SIGTERM: the current step finishes, a checkpoint is written, the run returns
// interrupted; no evaluation); and memory accounting. Rank 0 alone prints and writes logs; the
// stop decision and the logged loss are agreed by all ranks.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "brigade/amp/loss_scaler.h"
#include "brigade/amp/policy.h"
#include "brigade/core/allocator.h"
#include "brigade/nn/layers.h"
#include "brigade/optim/optimizer.h"
#include "brigade/optim/schedule.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/config.h"
#include "brigade/train/task.h"

namespace brigade::train {

struct TrainOptions {
  bool resume = false;   // continue from <out_dir>/checkpoint
  int64_t stop_at = -1;  // stop (and checkpoint) once this step is reached; the schedule still
                         // plans for train.steps. -1 = run to train.steps; 0 or below is an error
  bool quiet = false;    // no progress line
  bool sample = true;    // generate a text sample at the end (tasks that sample)
};

struct TrainResult {
  bool interrupted = false;  // stopped by SIGINT/SIGTERM (checkpoint saved, no evaluation)
  int64_t steps = 0;         // steps completed in total (resume included)
  double last_loss = 0.0;
  // The last evaluation of this run (evaluated = false: none yet): its sums, its metrics.jsonl
  // fields (val_loss, accuracy, ...) and the task's lines for it.
  bool evaluated = false;
  Metrics eval;
  nlohmann::json eval_fields;
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  std::string eval_line, final_line;
  ItemKind item = ItemKind::Token;
  double items_per_s = 0.0;       // median over this run's steps
  double mfu = 0.0;               // items/s * flops/item / measured GEMM peak
  double gemm_peak_gflops = 0.0;  // summed over ranks, in the GEMM dtype of the precision level; the higher of
                                  // the measurements before and after the run
  int64_t skipped_steps = 0;      // optimizer steps skipped on gradient overflow (loss scaling)
  int64_t updates_skipped = 0;    // steps skipped by train.nonfinite = "skip", a spike or a rollback's replay
                                  // (since this process's last rollback)
  int64_t rollbacks = 0;          // rollbacks to the last checkpoint in this process
  double loss_scale = 1.0;        // at the end (1 without loss scaling)
  double comm_wait_share = 0.0;   // median step: time rank 0 waited on communication / step time
  double seconds = 0.0;           // wall time of the loop (evaluations included)
  MemStats memory;
  std::string sample;
  std::string checkpoint_dir;
  bool early_stopped = false;  // train.early_stop ended the run (checkpoint saved at that step)
  int64_t best_step = 0;       // train.early_stop: step of the best val loss (0 = none)
  double best_val_loss = std::numeric_limits<double>::quiet_NaN();
  std::string best_dir;  // <out_dir>/best: the model at best_step ("" without early_stop)
};

// Trains the recipe's model (its registry row builds the task). Collective under mpirun.
TrainResult train(const Recipe& recipe, const TrainOptions& opts);
// parallel.deterministic: the same recipe with every micro-step one atom (train.batch_size =
// parallel.atom_rows, train.accumulation = this rank's atoms), which the trainer and the task then
// use; the global batch is unchanged. The recipe as given when deterministic mode is off, and
// idempotent. A task for train(recipe, opts, task) must be made from this recipe.
Recipe deterministic_split(const Recipe& recipe);
// Trains a task the caller built (a model outside the zoo: examples/); the recipe supplies
// everything else. The task must have been made for this recipe.
TrainResult train(const Recipe& recipe, const TrainOptions& opts, Task& task);

// `brigade eval --ckpt DIR`: the checkpoint's recipe and weights, evaluated as the run's final
// evaluation (the whole test set; val windows for the text tasks) on one process. `threads` > 0
// sets the OpenMP threads (else run.threads). CheckpointError for a missing or mismatched folder.
struct EvalReport {
  Metrics metrics;
  nlohmann::json fields;
  std::string line;  // the task's eval_line
  std::string model_type;
};
EvalReport evaluate_checkpoint(const std::string& ckpt_dir, int threads = 0);

// The recipe's optimizer over the data-parallel plan's optimizer parameters (whole
// parameters, or this rank's ZeRO shards; LAMB then reduces its norms over dp's group).
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimConfig& o, const nn::NamedTensors& params,
                                                 const parallel::DataParallel& dp);

// Per-block recompute modes of the recipe's [memory] policy for a model with `blocks` blocks
// (models::plan_recompute's rules; "budget" needs the GPT activation estimate).
std::vector<nn::Recompute> recompute_plan(const Recipe& r, size_t blocks);
// Sets them on the task's model (nn::find_blocks); returns them.
std::vector<nn::Recompute> apply_recompute(const Recipe& r, Task& task);

// One optimizer step once the step's gradients are complete (after dp.finish_gradients()):
// loss-scaler unscaling with the Inf/NaN verdict max-reduced over `ctrl` (every rank skips
// an overflowing step together, leaving weights and optimizer state untouched); otherwise,
// at O3 the gradients rounded to the low dtype, clipping by global norm then by value
// (t.grad_clip, t.clip_value), opt.step(lr), `after_update` on the optimizer's parameters (a
// task's hook, before they are shared), and dp.after_optimizer_step() (at O3 after rounding
// the weights and optimizer state). Collective over dp's group and `ctrl`. `clip`, when given,
// replaces dp.clip_grad_norm: it returns the global norm and clips (model parallelism's norm
// over the whole mesh). `accept`, when given, sees the global norm before the optimizer runs;
// false leaves weights and optimizer state untouched, as an overflow does (the trainer's
// non-finite and spike decisions, step_guard.h).
struct GradientStep {
  bool skipped = false;                                         // by the loss scaler (overflow)
  bool rejected = false;                                        // by `accept`
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // before clipping; NaN when skipped
};
GradientStep apply_gradients(parallel::DataParallel& dp, optim::Optimizer& opt, amp::LossScaler& scaler,
                             const amp::Policy& policy, const TrainConfig& t, double lr, dist::ProcessGroup& ctrl,
                             const std::function<double(double)>& clip = {},
                             const std::function<void(const nn::NamedTensors&)>& after_update = {},
                             const std::function<bool(double)>& accept = {});
// O3: rounds this rank's optimizer parameters and optimizer state to `low` (no fp32 master
// copy), then dp.after_optimizer_step() so every rank's full weights follow.
void round_state_to_low(parallel::DataParallel& dp, optim::Optimizer& opt, DType low);

// "1h02m" / "3m05s" / "42s" ("?" for a negative or non-finite time), for progress lines.
std::string fmt_duration(double seconds);
// The recipe's [schedule] over train.steps from optim.lr.
optim::Schedule make_schedule(const Recipe& r);
// Ctrl-C / SIGTERM: while a StopSignalGuard lives, the first signal only sets
// stop_requested() (the loop finishes its step, checkpoints and stops); a second one kills as
// usual (SA_RESETHAND). The destructor restores the previous handlers.
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};
bool stop_requested();

// --resume keeps metrics.jsonl consistent: drops the records past `step` (and early-stop
// records, and a torn last line). A missing file is left alone.
void truncate_metrics(const std::string& path, int64_t step);

// The recipe's precision section as an autocast policy and loss-scaler options
// ("auto" loss scaling: dynamic for fp16 at O1..O3, none otherwise).
amp::Policy precision_policy(const PrecisionConfig& p);
amp::LossScalerOptions loss_scaler_options(const PrecisionConfig& p);

// GEMM ceiling of this process in dtype dt: best of 12 runs of a 1024^3 matmul (GFLOP/s).
double measure_gemm_peak_gflops(DType dt = DType::F32);

// Loads `path` (safetensors) into `state` strictly: every tensor by name and shape, nothing
// extra. CheckpointError naming the file and the tensor otherwise.
void load_state(const std::string& path, const nn::NamedTensors& state);

}  // namespace brigade::train
