// The four tasks the model zoo trains through (task.h has the interface):
//   CausalLMTask            GPT, LLaMA: next-token cross-entropy on a prepared text corpus
//   MaskedLMTask            BERT: masked-token cross-entropy (80/10/10 masking) on the same data
//   ImageClassificationTask ViT, ResNet, Swin, or any user model: cross-entropy on Fashion-MNIST
//   ContrastiveTask         CLIP: symmetric InfoNCE over image-caption pairs, zero-shot evaluation
// Each can be built from a user's own model too (examples/ trains a CNN that is not in the zoo
// through ImageClassificationTask), so the trainer's modules are reusable without editing the engine.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "brigade/data/ext_captions.h"
#include "brigade/data/ext_fashion_mnist.h"
#include "brigade/data/prepare.h"
#include "brigade/data/sampler.h"
#include "brigade/data/token_file.h"
#include "brigade/data/tokenizer.h"
#include "brigade/models/bert/bert.h"
#include "brigade/models/causal_lm.h"
#include "brigade/models/clip/clip.h"
#include "brigade/train/task.h"

namespace brigade::train {

// One unit "model" in parameter order below ZeRO-3, the block units at ZeRO-3 (Task::units).
std::vector<parallel::ParamUnit> single_unit_below_zero3(nn::Module& model, int zero);

// ---------------------------------------------------------------- causal language modelling

// What `brigade prepare` (and a text task's first run) builds for a recipe: corpus, data dir,
// vocabulary, val split.
data::PrepareOptions prepare_options(const Recipe& r);
// The causal LM of a recipe's [model] (model.type "gpt" or "llama"), uninitialised (zero
// weights): for loading a checkpoint.
std::unique_ptr<models::CausalLM> make_causal_lm(const ModelConfig& m);

// Training batch: rows of the sampler's windows (data::BatchSampler: offsets from (seed, step,
// global row)), targets shifted by one. Evaluation: train.eval_batches batches of the global
// batch's rows (batch_size x accumulation x dp) of evenly spaced val windows, the mean of the
// batch means: the same windows however the batch is split. Sampling at the end: [sample].
class CausalLMTask : public Task {
 public:
  CausalLMTask(const Recipe& r, std::unique_ptr<models::CausalLM> model);
  nn::Module& model() override { return *model_; }
  models::CausalLM& lm() { return *model_; }
  Generator* dropout_generator() override { return &model_->dropout_generator(); }
  std::string describe() override;
  void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) override;
  ItemKind item_kind() const override { return ItemKind::Token; }
  int64_t items_per_row() const override { return r_.train.seq_len; }
  double flops_per_item() const override { return model_->flops_per_token(r_.train.seq_len); }
  std::string data_summary() override;
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override;
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override;
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override;
  void score(const Batch& b, Metrics& m) override;
  std::vector<std::string> eval_metric_keys() const override { return {"loss_sum", "batches"}; }
  nlohmann::json eval_fields(const Metrics& m) const override;
  std::string eval_line(const Metrics& m) const override;
  std::string final_line(const Metrics& m) const override;
  const Stages* stages() override;
  bool can_sample() const override { return true; }
  std::string sample(const nn::NamedTensors* full) override;
  std::string tokenizer_path() const override;
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override;
  int64_t eval_rows() const override;

 private:
  Recipe r_;
  std::unique_ptr<models::CausalLM> model_;
  std::optional<data::Tokenizer> tok_;
  std::optional<data::TokenDataset> train_, val_;
  // the samplers of one split (micro_steps x world parts), rebuilt when the split changes
  std::vector<data::BatchSampler> samplers_;
  int64_t split_micro_ = 0, split_world_ = 0, split_rank_ = -1;
  Tensor x_, y_;  // (B, T) I64, refilled by every batch
  std::optional<Stages> stages_;
};

// ---------------------------------------------------------------- masked language modelling

// BERT (vocab = model.vocab_size + 1: the extra id is [MASK]). The step's global batch is drawn
// and masked whole on every rank (the sampler's rows, masked from a generator seeded by
// (run.seed, step)), then each micro-batch takes its rows, so masks do not depend on the split.
// The loss is the mean over the global batch's masked tokens (micro-batches hold different
// counts: the trainer weights them). Evaluation: eval_batches batches of the global batch's
// val windows, masked from generators fixed by the batch index; summed cross-entropy / masked
// tokens, and argmax hits. Baselines (unigram loss, most-frequent accuracy) on the same positions.
class MaskedLMTask : public Task {
 public:
  MaskedLMTask(const Recipe& r, std::unique_ptr<models::BERT> model);
  nn::Module& model() override { return *model_; }
  std::vector<parallel::ParamUnit> units(int zero) override { return single_unit_below_zero3(*model_, zero); }
  models::BERT& bert() { return *model_; }
  Generator* dropout_generator() override { return &model_->dropout_generator(); }
  std::string describe() override;
  void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) override;
  ItemKind item_kind() const override { return ItemKind::Token; }
  int64_t items_per_row() const override { return r_.train.seq_len; }
  double flops_per_item() const override { return model_->flops_per_token(r_.train.seq_len); }
  std::string data_summary() override;
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override;
  bool needs_whole_step() const override { return true; }  // masked tokens per micro-batch differ
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override;
  std::vector<std::string> train_metric_keys() const override { return {"train_correct", "train_masked"}; }
  nlohmann::json train_fields(const Metrics& m, int64_t step) const override;
  std::string train_progress(const Metrics& m, int64_t step) const override;
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override;
  void score(const Batch& b, Metrics& m) override;
  std::vector<std::string> eval_metric_keys() const override { return {"loss_sum", "correct", "masked"}; }
  nlohmann::json eval_fields(const Metrics& m) const override;
  std::string eval_line(const Metrics& m) const override;
  std::string final_line(const Metrics& m) const override;
  const Stages* stages() override;
  std::string tokenizer_path() const override;
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override;
  int64_t eval_rows() const override;

  // The trivial baselines on the evaluation's masked positions (after open_data).
  double unigram_loss() const { return unigram_loss_; }
  double unigram_accuracy() const { return unigram_accuracy_; }

 private:
  Batch masked_rows(const Tensor& ids, uint64_t mask_seed, int64_t lo, int64_t n) const;
  Recipe r_;
  std::unique_ptr<models::BERT> model_;
  std::optional<data::TokenDataset> train_, val_;
  int64_t cached_step_ = -1, cached_global_ = 0;
  Batch cached_;  // the step's masked global batch
  double unigram_loss_ = 0.0, unigram_accuracy_ = 0.0;
  std::optional<Stages> stages_;
};

// ---------------------------------------------------------------- image classification

// What the image task trains: any module with forward(images) -> logits.
struct ImageClassifier {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> forward;  // (N, 1, 28, 28) f32 -> (N, classes)
  double flops_per_image = 0.0;                   // one training step (forward + backward)
  Generator* dropout = nullptr;                   // the stream its dropout draws from, if any
  nn::NamedTensors buffers;                       // BatchNorm running statistics, if any
  std::string description;                        // for the "model:" line
  std::optional<Stages> stages;                   // its forward in pieces (model parallelism; ViT's: registry.cpp)
};

// What an evaluation batch of images adds from its logits (N, classes): the summed cross-entropy
// ("loss_sum"), the argmax hits ("correct") and the images ("images"). ImageClassificationTask's
// score() and a classifier's Stages::score (its last pipeline stage) both use it.
void add_image_scores(const Tensor& logits, const Batch& b, Metrics& m);

// Fashion-MNIST (data.dir, or Debian's folder when data.dir is left at its default). The step's
// global batch is batch (s mod E) of epoch s / E of a shuffled permutation (E = 60000 / global
// batch, the last partial batch dropped), augmented (data.augment) from a generator seeded by
// (run.seed, step) over the global batch in order; each micro-batch takes its rows. Evaluation
// on the TEST set in chunks of 500 (split over ranks, sums exact): periodic ones on its first
// eval_batches x global batch images, the final one on all 10000.
class ImageClassificationTask : public Task {
 public:
  ImageClassificationTask(const Recipe& r, ImageClassifier c);
  nn::Module& model() override { return *c_.module; }
  std::vector<parallel::ParamUnit> units(int zero) override { return single_unit_below_zero3(*c_.module, zero); }
  nn::NamedTensors state_dict() override;
  nn::NamedTensors buffers() override { return c_.buffers; }
  Generator* dropout_generator() override { return c_.dropout; }
  std::string describe() override;
  void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) override;
  ItemKind item_kind() const override { return ItemKind::Image; }
  double flops_per_item() const override { return c_.flops_per_image; }
  std::string data_summary() override;
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override;
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override;
  std::vector<std::string> train_metric_keys() const override { return {}; }
  nlohmann::json train_fields(const Metrics& m, int64_t step) const override;
  std::string train_progress(const Metrics& m, int64_t step) const override;
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override;
  void score(const Batch& b, Metrics& m) override;
  std::vector<std::string> eval_metric_keys() const override { return {"loss_sum", "correct", "images"}; }
  nlohmann::json eval_fields(const Metrics& m) const override;
  std::string eval_line(const Metrics& m) const override;
  std::string final_line(const Metrics& m) const override;
  const Stages* stages() override { return c_.stages ? &*c_.stages : nullptr; }
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override;
  int64_t eval_rows() const override;

 private:
  int64_t epoch_of(int64_t step) const;
  Recipe r_;
  ImageClassifier c_;
  std::optional<data::FashionMnist> train_set_, test_set_;
  int64_t cached_step_ = -1, cached_global_ = 0;
  data::FashionMnist::Batch cached_;
};

// The Fashion-MNIST folder of a recipe: data.dir, or Debian's when data.dir is left at its
// default ("data/kjv").
std::string fashion_mnist_dir(const Recipe& r);

// ---------------------------------------------------------------- contrastive image-text

// CLIP on Fashion-MNIST image-caption pairs (caption i describes image i's class in a template
// drawn from (run.seed, step)). Images as the classifier's global batch. The loss is CLIP's
// symmetric InfoNCE over the whole global batch: when the batch is split (accumulation or data
// parallelism) begin_step embeds every micro-batch without a graph, gathers the embeddings of
// all ranks, computes the global loss and its gradient with respect to every embedding and the
// logit scale, and each micro-step backpropagates its share through a re-run of its towers
// (GradCache, Gao et al. 2021); unsplit, the loss is computed directly (the same numbers).
// After each step logit_scale is clamped to [0, ln 100]. Evaluation: zero-shot accuracy over the
// 10 class prompts, and the contrastive loss of test pairs in chunks of 500.
class ContrastiveTask : public Task {
 public:
  ContrastiveTask(const Recipe& r, std::unique_ptr<models::CLIP> model);
  nn::Module& model() override { return *model_; }
  std::vector<parallel::ParamUnit> units(int zero) override { return single_unit_below_zero3(*model_, zero); }
  models::CLIP& clip() { return *model_; }
  std::string describe() override;
  void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) override;
  ItemKind item_kind() const override { return ItemKind::Pair; }
  double flops_per_item() const override { return model_->flops_per_pair(); }
  std::string data_summary() override;
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override;
  bool needs_whole_step() const override { return true; }  // the loss couples the whole global batch
  void begin_step(std::vector<Batch>& micro, const Shard& s) override;
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override;
  void after_update(const nn::NamedTensors& master) override;
  nlohmann::json train_fields(const Metrics& m, int64_t step) const override;
  std::string train_progress(const Metrics& m, int64_t step) const override;
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override;
  void score(const Batch& b, Metrics& m) override;
  std::vector<std::string> eval_metric_keys() const override { return {"loss_sum", "correct", "images"}; }
  nlohmann::json eval_fields(const Metrics& m) const override;
  std::string eval_line(const Metrics& m) const override;
  std::string final_line(const Metrics& m) const override;
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override;
  int64_t eval_rows() const override;
  void prepare_eval() override;  // the 10 class prompts' embeddings

 private:
  Recipe r_;
  std::unique_ptr<models::CLIP> model_;
  data::CaptionTokenizer tok_;
  std::optional<data::FashionMnist> train_set_, test_set_;
  int64_t cached_step_ = -1, cached_global_ = 0;
  Batch cached_;
  // GradCache state of the current step (split batches only)
  bool cached_grads_ = false;
  std::vector<Tensor> img_grad_, txt_grad_;  // per micro-batch: d loss / d embedding, (B, E)
  double scale_grad_ = 0.0, global_loss_ = 0.0;
  int64_t split_ = 1;                        // micro-steps x world of the current step
  Tensor class_embeds_;                      // eval: the 10 prompts' embeddings
};

}  // namespace brigade::train
