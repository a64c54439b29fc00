// The training loop behind `brigade train`: builds the model and optimizer from
// a recipe, draws batches, steps, evaluates, logs (progress line + metrics.jsonl),
// checkpoints, resumes exactly, and finally samples text. Ctrl-C (or SIGTERM)
// finishes the current step, checkpoints and returns with interrupted = true. Under mpirun the
// same loop runs on every rank with data parallelism and ZeRO (parallel.*; docs/distributed.md):
// rank 0 alone prints and writes logs; the stop decision and the logged loss are agreed by all.
// With train.early_stop the run also stops once val loss has not improved for train.patience
// evaluations, keeping the best model in <out_dir>/best (early_stop.h). Every run ends by
// drawing <out_dir>/loss.svg (train and val loss against step) from its metrics.jsonl.
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
#include "brigade/data/prepare.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"
#include "brigade/optim/optimizer.h"
#include "brigade/optim/schedule.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/config.h"

namespace brigade::train {

struct TrainOptions {
  bool resume = false;      // continue from <out_dir>/checkpoint
  int64_t stop_at = -1;     // stop (and checkpoint) once this step is reached; the schedule still
                            // plans for train.steps. -1 = run to train.steps
  bool quiet = false;       // no progress line
  bool sample = true;       // generate a text sample at the end
  bool dry_run = false;     // `--dry-run`: print the predicted memory per category (memory_plan.h) and
                            // exit without training, reading data or creating run.out_dir (the CLI's job)
};

struct TrainResult {
  bool interrupted = false;     // stopped by SIGINT/SIGTERM (checkpoint saved)
  int64_t steps = 0;            // steps completed in total (resume included)
  double last_loss = 0.0;
  double val_loss = -1.0;       // last evaluation (-1 if none)
  double tokens_per_s = 0.0;    // median over this run's steps
  double mfu = 0.0;             // tokens/s * flops/token / measured GEMM peak
  double gemm_peak_gflops = 0.0;   // summed over ranks, in the GEMM dtype of the precision level
  int64_t skipped_steps = 0;       // optimizer steps skipped on gradient overflow (loss scaling)
  double loss_scale = 1.0;         // at the end (1 without loss scaling)
  double comm_wait_share = 0.0;    // median step: time rank 0 waited on communication / step time
  MemStats memory;
  std::string sample;
  std::string checkpoint_dir;
  bool early_stopped = false;   // train.early_stop ended the run (checkpoint saved at that step)
  int64_t best_step = 0;        // train.early_stop: step of the best val loss (0 = none)
  double best_val_loss = -1.0;
  std::string best_dir;         // <out_dir>/best: the model at best_step ("" without early_stop)
};

TrainResult run_training(const Recipe& recipe, const TrainOptions& opts);

// The model section of a recipe as the GPT / LLaMA model's own config.
models::GPTConfig gpt_config(const ModelConfig& m);
models::LLaMAConfig llama_config(const ModelConfig& m);
// The model.type's model, uninitialised (zero weights): for loading a checkpoint.
std::unique_ptr<models::CausalLM> make_model(const ModelConfig& m);
// How data parallelism groups a model's parameters (ZeRO-3 gather units, flat-layout order):
// one unit for everything outside the blocks (embeddings, final norm, head; gathered for
// the whole step), then one unit per block of CausalLM::blocks().
std::vector<parallel::ParamUnit> model_units(models::CausalLM& m);
// What `brigade prepare` builds for a recipe (corpus, data dir, vocab, val split).
data::PrepareOptions prepare_options(const Recipe& r);

// Measured fp32 GEMM throughput (GFLOP/s) on the current thread count: the MFU ceiling.
// The recipe's optimizer over the data-parallel plan's optimizer parameters (whole
// parameters, or this rank's ZeRO shards; LAMB then reduces its norms over dp's group).
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimConfig& o, const nn::NamedTensors& params,
                                                const parallel::DataParallel& dp);

// The recipe's model (model.type): built from [model], initialised from run.seed (GPT:
// torch-identically), the
// dropout stream seeded with run.seed + 1, and the [memory] recompute plan applied for
// micro-batches of train.batch_size x train.seq_len.
std::unique_ptr<models::CausalLM> build_model(const Recipe& r);

// One optimizer step once the step's gradients are complete (after dp.finish_gradients()):
// loss-scaler unscaling with the Inf/NaN verdict max-reduced over `ctrl` (every rank skips
// an overflowing step together, leaving weights and optimizer state untouched); otherwise,
// at O3 the gradients rounded to the low dtype, clipping by global norm then by value
// (t.grad_clip, t.clip_value), opt.step(lr) and dp.after_optimizer_step() (at O3 after
// rounding the weights and optimizer state). Collective over dp's group and `ctrl`. `clip`,
// when given, replaces dp.clip_grad_norm: it returns the global norm and clips (model
// parallelism's norm over the whole mesh).
struct GradientStep {
  bool skipped = false;
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // before clipping; NaN when skipped
};
GradientStep apply_gradients(parallel::DataParallel& dp, optim::Optimizer& opt, amp::LossScaler& scaler,
                             const amp::Policy& policy, const TrainConfig& t, double lr, dist::ProcessGroup& ctrl,
                             const std::function<double(double)>& clip = {});
// O3: rounds this rank's optimizer parameters and optimizer state to `low` (no fp32 master
// copy), then dp.after_optimizer_step() so every rank's full weights follow.
void round_state_to_low(parallel::DataParallel& dp, optim::Optimizer& opt, DType low);

// Helpers every training loop shares (run_training, run_classification, run_clip, run_mlm):
// "1h02m" / "3m05s" / "42s" ("?" for a negative or non-finite time), for progress lines;
std::string fmt_duration(double seconds);
// the recipe's [schedule] over train.steps from optim.lr;
optim::Schedule make_schedule(const Recipe& r);
// and Ctrl-C / SIGTERM: while a StopSignalGuard lives, the first signal only sets
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
// <svg_path> drawn from the run's metrics.jsonl; a failure is a warning through `say`, not an
// error (the run's checkpoint and metrics are already written).
void write_run_plot(const std::string& metrics_path, const std::string& svg_path, const std::string& title,
                    const std::function<void(const std::string&)>& say);
// For `brigade eval --ckpt DIR`: the recipe saved in the checkpoint folder (CheckpointError
// naming the folder and `example`, a typical path, when it does not exist), with the OpenMP
// threads set to `threads` when > 0, else to the recipe's run.threads when > 0.
Recipe eval_checkpoint_recipe(const std::string& ckpt_dir, const std::string& example, int threads);

// --resume keeps metrics.jsonl consistent: drops the records past `step` (and early-stop
// records, and a torn last line). A missing file is left alone.
void truncate_metrics(const std::string& path, int64_t step);

// The recipe's precision section as an autocast policy and loss-scaler options
// ("auto" loss scaling: dynamic for fp16 at O1..O3, none otherwise).
amp::Policy precision_policy(const PrecisionConfig& p);
amp::LossScalerOptions loss_scaler_options(const PrecisionConfig& p);

// GEMM ceiling of this process in dtype dt: best of 12 runs of a 1024^3 matmul (GFLOP/s).
double measure_gemm_peak_gflops(DType dt = DType::F32);

}  // namespace brigade::train
