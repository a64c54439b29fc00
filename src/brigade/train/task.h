// What a model family contributes to training: a Task. The one trainer (trainer.h) owns the
// step (micro-steps, autocast, loss scaling, clipping, optimizer, schedule), data parallelism
// and ZeRO, evaluation cadence, logs, checkpoints, resume, early stopping and Ctrl-C; a task
// owns the model, the data and what its numbers mean:
//   - the model, built from the recipe (registry.h makes each model type's task);
//   - batches as a pure function of (seed, step, micro-step, micro-steps, rank, world): the
//     step's global batch is the same rows however it is split over ranks and micro-steps;
//   - the loss of a micro-batch: the mean over its `count` items (tokens, masked tokens,
//     images, pairs); the trainer weights it by count / (global count / (micro-steps x ranks))
//     so the step's gradient is the gradient of the global batch's mean;
//   - additive metrics (sums and counts, Metrics), so a mean over ranks is exact: training
//     extras (masked accuracy, ...) and evaluation (periodic: a subset; final: everything);
//   - FLOPs per item (MFU), the item kind, an after-step hook, text sampling where it applies;
//   - optionally its forward in stages (embed, blocks, head) for pipeline parallelism.
// Activation recompute applies to the model's nn::Blocks (nn::find_blocks); the parameter units
// of data parallelism are the same blocks (Task::units).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/core/tensor.h"
#include "brigade/dist/process_group.h"
#include "brigade/nn/module.h"
#include "brigade/nn/tp_plan.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/config.h"

namespace brigade::train {

// What one training item is: throughput, logs and MFU count these.
enum class ItemKind { Token, Image, Pair };
const char* item_name(ItemKind k);       // "tokens", "images", "pairs"
const char* item_rate_key(ItemKind k);   // metrics.jsonl: "tokens_per_s", "images_per_s", "pairs_per_s"
const char* item_rate_unit(ItemKind k);  // progress line: "tok/s", "img/s", "pairs/s"
const char* items_seen_key(ItemKind k);  // "tokens_seen", "images_seen", "pairs_seen"

// Where this process stands in data parallelism: replica `rank` of `world` (a replica is the
// tp x pp ranks that read the same rows), and the data-parallel group, for tasks whose loss
// couples rows across ranks (a contrastive loss gathers embeddings).
struct Shard {
  int rank = 0, world = 1;
  dist::ProcessGroup* group = nullptr;
};

// Named sums that add over micro-steps, ranks and evaluation chunks.
class Metrics {
 public:
  void add(const std::string& key, double v) { sums_[key] += v; }
  double get(const std::string& key) const;  // 0 when absent
  bool has(const std::string& key) const { return sums_.count(key) > 0; }
  void merge(const Metrics& o);
  // Sums `keys` over the group (every rank passes the same keys; absent ones count 0).
  void allreduce(dist::ProcessGroup& g, const std::vector<std::string>& keys);
  const std::map<std::string, double>& sums() const { return sums_; }

 private:
  std::map<std::string, double> sums_;
};

// One micro-batch: the tensors the task's loss reads (every one with `rows` as its leading
// dimension, so a pipeline can cut it into micro-batches), and how many items the loss averages.
struct Batch {
  std::map<std::string, Tensor> t;
  int64_t rows = 0;
  int64_t count = 0;
  const Tensor& at(const std::string& key) const;  // InternalError naming the key when absent
  Batch narrow(int64_t lo, int64_t n) const;       // rows [lo, lo + n) of every tensor; count = n (equal-count tasks)
};

// A micro-batch's loss: `loss` (0-d f32, recorded) is the mean over the batch's items; the
// task may add training extras to the Metrics passed alongside.
struct Loss {
  Tensor loss;
  // What the step reports for this micro-batch when `loss` is not the objective's value itself
  // (a surrogate whose gradient is the objective's); unset: loss.item().
  std::optional<double> value = std::nullopt;
};

// The forward in three pieces, for model parallelism (train/model_parallel.h): the first stage
// embeds, every stage runs its blocks [lo, hi), the last runs the head: in training the loss (the
// micro-batch mean, adding the task's training extras as loss() does), in evaluation the scoring
// (adding what score() adds). hidden(rows) is the shape passed between stages.
// Where the parameters live under a pipeline: the model's nn::Blocks (nn::find_blocks, num_blocks
// of them, in forward order) on their stages; the parameters registered before the first block on
// the first stage (embed reads them), those after the last block on the last stage (the head);
// `tied` ones (the head reads them too: a head tied to the token embedding) on both, their
// gradients summed between the two.
struct Stages {
  int64_t num_blocks = 0;
  std::function<Tensor(const Batch&)> embed;
  std::function<Tensor(const Tensor&, int64_t lo, int64_t hi, const Batch&)> blocks;
  std::function<Tensor(const Tensor&, const Batch&, Metrics& train)> head;
  std::function<void(const Tensor&, const Batch&, Metrics& eval)> score;
  std::function<Shape(int64_t rows)> hidden;
  std::vector<std::string> tied;  // full parameter names
  // The items of a micro-batch cut by Batch::narrow, when rows hold different numbers of them
  // (masked tokens): a pipeline weights each micro-batch's mean loss by its share. Unset: every
  // row holds the same number.
  std::function<int64_t(const Batch&)> count;
  // The model's tensor-parallel plan (nn/tp_plan.h), for parallel.tp > 1; empty: none.
  nn::TpPlan tp_plan;
  // Evaluation runs in fp32 at every precision level (the image task's score()).
  bool score_in_fp32 = false;
};

class Task {
 public:
  virtual ~Task() = default;

  // ---- the model
  virtual nn::Module& model() = 0;
  // What the checkpoint's model.safetensors holds: the parameters (Hugging Face names), then
  // buffers (BatchNorm running statistics) where the model has them.
  virtual nn::NamedTensors state_dict() { return model().named_parameters(); }
  // Tensors outside the parameters that training changes (BatchNorm running statistics): kept
  // equal on every data-parallel rank by the trainer (rank 0's, as torch's DDP broadcasts).
  virtual nn::NamedTensors buffers() { return {}; }
  virtual Generator* dropout_generator() { return nullptr; }
  // How data parallelism groups the parameters (the flat layout, gradient buckets, ZeRO-3's
  // gather units; executor.h model_units): everything outside the blocks, then one unit per
  // nn::Block. Below ZeRO-3 a task may keep one unit in parameter order instead (the layout only
  // orders buckets and the gradient norm's summation there): the image, masked-LM and
  // contrastive tasks do, so their numbers are bitwise those of their first loops.
  virtual std::vector<parallel::ParamUnit> units(int zero);
  // One line: "GPT 4 layers, 256 dims, ..., 4.24M parameters".
  virtual std::string describe() = 0;

  // ---- what is trained on
  // Prepares (rank 0 of `ctrl`, e.g. tokenizing a corpus on first use) and opens the data;
  // collective over ctrl. `bench` and `--dry-run` never call it (they read no data).
  virtual void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) = 0;
  virtual ItemKind item_kind() const = 0;
  virtual int64_t items_per_row() const { return 1; }  // T for sequence tasks
  virtual double flops_per_item() const = 0;           // one training step (forward + backward)
  // One line about the data ("977872 train / 51465 val tokens"), after it is opened.
  virtual std::string data_summary() = 0;
  // Micro-batch `micro` of `micro_steps` of `step` on replica shard.rank: batch_size rows,
  // rows [(micro x world + rank) x B, +B) of the step's global batch of B x micro_steps x world.
  virtual Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) = 0;
  // Whether the trainer must draw every micro-batch of a step before running the first: a task
  // whose micro-batches hold different item counts (their weights need the global count) or
  // whose loss couples the whole global batch (begin_step). Otherwise each is drawn as it runs.
  virtual bool needs_whole_step() const { return false; }
  // Whether a micro-batch's loss depends on its own rows only (false: a contrastive loss over
  // the whole global batch), which deterministic mode's atoms need.
  virtual bool rows_independent() const { return true; }
  // Before the micro-steps of a step, with all of them drawn (the contrastive task computes the
  // global batch's embedding gradients here when the batch is split). Collective over s.group.
  virtual void begin_step(std::vector<Batch>& micro, const Shard& s) {
    (void)micro;
    (void)s;
  }
  // The micro-batch's mean loss, under the trainer's autocast. `micro` indexes begin_step's list.
  virtual Loss loss(const Batch& b, int64_t micro, Metrics& train_metrics) = 0;
  // After every optimizer update (not on a skipped step), before the updated weights are
  // shared with the other ranks: `master` is what the optimizer updated, by parameter name (whole
  // parameters, or this rank's ZeRO shard views of them). CLIP clamps its logit scale here.
  virtual void after_update(const nn::NamedTensors& master) { (void)master; }
  // Keys of the training extras loss() adds (reduced over ranks each step), and the fields they
  // make in metrics.jsonl / the progress line (e.g. train_accuracy from correct / masked).
  virtual std::vector<std::string> train_metric_keys() const { return {}; }
  virtual nlohmann::json train_fields(const Metrics& m, int64_t step) const {
    (void)m;
    (void)step;
    return nlohmann::json::object();
  }
  virtual std::string train_progress(const Metrics& m, int64_t step) const {
    (void)m;
    (void)step;
    return "";
  }

  // ---- evaluation: additive metrics over this replica's part; `final` = the run's last
  // evaluation (the whole test set where periodic ones take a subset). `score` runs the forward
  // of one batch and adds its metrics (the trainer passes a pipeline's when the model is cut).
  using Scorer = std::function<void(const Batch&, Metrics&)>;
  virtual Metrics evaluate(bool final, const Shard& s, const Scorer& score) = 0;
  // The default scorer: the loss and metrics of one batch on this process's whole model.
  virtual void score(const Batch& b, Metrics& m) = 0;
  virtual std::vector<std::string> eval_metric_keys() const = 0;
  // {val_loss, accuracy, ...} for metrics.jsonl; val_loss is what early stopping watches.
  virtual nlohmann::json eval_fields(const Metrics& m) const = 0;
  virtual std::string eval_line(const Metrics& m) const = 0;  // "val loss 4.2582" / "test accuracy ..."
  // The final line `brigade train` prints on stdout (and `brigade eval` for a checkpoint).
  virtual std::string final_line(const Metrics& m) const = 0;

  // ---- optional pieces
  virtual const Stages* stages() { return nullptr; }  // pipeline parallelism
  virtual bool can_sample() const { return false; }
  // Before training: refuses a sample setting that would only fail after the run (sample.prompt
  // with characters the tokenizer lacks). Needs open_data.
  virtual void check_sample() const {}
  // Text from the model (rank 0): its own weights (gathered), or `full` (a whole model's
  // parameters by name, when model parallelism holds only a shard here).
  virtual std::string sample(const nn::NamedTensors* full) {
    (void)full;
    return "";
  }
  virtual std::string tokenizer_dir() const { return ""; }  // the folder whose tokenizer checkpoints copy
  // `brigade bench` and the measured dry step of `--dry-run`: a synthetic batch of the recipe's
  // micro-batch shape (`rows` rows; -1 = train.batch_size), random content, no data read.
  virtual Batch synthetic_batch(uint64_t seed, int64_t rows = -1) = 0;
  // The rows of the largest evaluation batch score() sees, and what it needs set up first (the
  // contrastive task encodes its class prompts): for the dry step's evaluation measurement.
  virtual int64_t eval_rows() const = 0;
  virtual void prepare_eval() {}

  // What make_task's fine-tuning did (train/finetune.h), one line for the log; "" = nothing.
  std::string finetune_line;
};

}  // namespace brigade::train
