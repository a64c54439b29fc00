// The six tasks the model zoo trains through (task.h has the interface), each made from a model:
//   causal_lm_task            GPT, LLaMA: next-token cross-entropy on a prepared text corpus
//   sft_task                  GPT, LLaMA: the same on JSONL samples, the loss on completions only
//   masked_lm_task            BERT: masked-token cross-entropy (80/10/10 masking) on the same data
//   image_classification_task ViT, ResNet, Swin, or any user model: cross-entropy on Fashion-MNIST
//   contrastive_task          CLIP, ALIGN: a contrastive loss over image-caption pairs, zero-shot evaluation
//   flamingo_task             Flamingo: captioning in interleaved image-text sequences, rank classification
// A user's own model trains through them too (examples/custom_cnn builds an image-classification
// task around a CNN that is not in the zoo), so the trainer's modules are reusable without editing
// the engine.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "brigade/data/text/prepare.h"
#include "brigade/models/bert/bert.h"
#include "brigade/models/causal_lm.h"
#include "brigade/models/clip/clip.h"
#include "brigade/models/flamingo/flamingo.h"
#include "brigade/train/task.h"

namespace brigade::train {

// One unit "model" in parameter order below ZeRO-3, the block units at ZeRO-3 (Task::units).
std::vector<parallel::ParamUnit> single_unit_below_zero3(nn::Module& model, int zero);

// What `brigade prepare` (and a text task's first run) builds for a recipe: corpus, data dir,
// vocabulary, val split.
data::PrepareOptions prepare_options(const Recipe& r);
// The causal LM of a recipe's [model] (model.type "gpt" or "llama"), uninitialised (zero
// weights): for loading a checkpoint.
std::unique_ptr<models::CausalLM> make_causal_lm(const ModelConfig& m);
// The Fashion-MNIST folder of a recipe: data.dir, or Debian's when data.dir is left at its
// default ("data/kjv").
std::string fashion_mnist_dir(const Recipe& r);

// Training batch: rows of the sampler's windows (data::BatchSampler: offsets from (seed, step,
// global row)), targets shifted by one. Evaluation: train.eval_batches batches of the global
// batch's rows (batch_size x accumulation x dp) of evenly spaced val windows, the mean of the
// batch means: the same windows however the batch is split. Sampling at the end: [sample].
std::unique_ptr<Task> causal_lm_task(const Recipe& r, std::unique_ptr<models::CausalLM> model);
// What both causal-LM tasks share: the model's one-line description, and the synthetic batch of
// `bench` / `--dry-run` (random ids, every next id a target; rows -1 = train.batch_size).
std::string causal_lm_description(const Recipe& r, const models::CausalLM& model);
Batch causal_lm_synthetic_batch(const Recipe& r, uint64_t seed, int64_t rows);

// Supervised fine-tuning (data.format = "jsonl", data/text/sft.h): one sample per row, its first
// seq_len + 1 tokens, the rest padding; targets only on trained tokens (completions, assistant
// turns; train.loss_on = "all": every token), so the loss is the mean over the micro-batch's
// trained tokens (the trainer weights micro-batches by their counts). No packing: a row holds one
// sample, so no attention crosses samples. Training rows: the samples in a seeded shuffle per
// epoch. Evaluation: the val split (the file's last data.val_fraction of samples; periodic ones its
// first train.eval_batches global batches' worth), its summed
// loss over trained tokens and its exact matches (every trained token the argmax given the
// ones before: what greedy decoding from the prompt returns).
std::unique_ptr<Task> sft_task(const Recipe& r, std::unique_ptr<models::CausalLM> model);

// BERT (vocab = model.vocab_size + 1: the extra id is [MASK]). The step's global batch is drawn
// and masked whole on every rank (the sampler's rows, masked from a generator seeded by
// (run.seed, step)), then each micro-batch takes its rows, so masks do not depend on the split.
// The loss is the mean over the global batch's masked tokens (micro-batches hold different
// counts: the trainer weights them). Evaluation: eval_batches batches of the global batch's
// val windows, masked from generators fixed by the batch index; summed cross-entropy / masked
// tokens, and argmax hits. Baselines (unigram loss, most-frequent accuracy) on the same positions.
// Its final line holds the trivial baselines on the evaluation's masked positions (uniform,
// the unigram distribution of train.bin, always answering its most frequent maskable token).
std::unique_ptr<Task> masked_lm_task(const Recipe& r, std::unique_ptr<models::BERT> model);

// What the image task trains: any module with forward(images) -> logits.
struct ImageClassifier {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> forward;  // (N, 1, 28, 28) f32 -> (N, classes)
  double flops_per_image = 0.0;                  // one training step (forward + backward)
  Generator* dropout = nullptr;                  // the stream its dropout draws from, if any
  nn::NamedTensors buffers;                      // BatchNorm running statistics, if any
  std::string description;                       // for the "model:" line
  std::optional<Stages> stages;                  // its forward in pieces (model parallelism; ViT's: registry.cpp)
};

// Fashion-MNIST (data.dir, or Debian's folder when data.dir is left at its default). The step's
// global batch is batch (s mod E) of epoch s / E of a shuffled permutation (E = 60000 / global
// batch, the last partial batch dropped), augmented (data.augment) from a generator seeded by
// (run.seed, step) over the global batch in order; each micro-batch takes its rows. Evaluation
// on the TEST set in chunks of 500 (split over ranks, sums exact): periodic ones on its first
// eval_batches x global batch images, the final one on all 10000.
std::unique_ptr<Task> image_classification_task(const Recipe& r, ImageClassifier c);
// What an evaluation batch of images adds from its logits (N, classes): the summed cross-entropy
// ("loss_sum"), the argmax hits ("correct") and the images ("images"). ImageClassificationTask's
// score() and a classifier's Stages::score (its last pipeline stage) both use it.
void add_image_scores(const Tensor& logits, const Batch& b, Metrics& m);
// The rows of `scores` (N, K; any float dtype) whose argmax (ties: the lowest index) is the row's
// label in `labels` (N, int64).
int64_t argmax_hits(const Tensor& scores, const Tensor& labels);

// A dual encoder (CLIP, ALIGN) on Fashion-MNIST image-caption pairs (caption i describes image
// i's class in a template drawn from (run.seed, step)). Images as the classifier's global batch.
// The loss is the model's (CLIP's symmetric InfoNCE, ALIGN's label-smoothed one) over the whole
// global batch: when the batch is split (accumulation or data parallelism) begin_step embeds
// every micro-batch without a graph (BatchNorm statistics frozen: they move in the gradient
// pass), gathers the embeddings of all ranks, computes the global loss and its gradient with
// respect to every embedding and the scale, and each micro-step backpropagates its share through
// a re-run of its towers (GradCache, Gao et al. 2021); unsplit, the loss is computed directly
// (the same numbers). After each step the scale is clamped to the model's range (clamp_scale).
// Evaluation: zero-shot accuracy over the 10 class prompts, the contrastive loss of test pairs
// in chunks of 500, and class-level retrieval recall@1/5/10 within each chunk (image -> text:
// one of the K most similar captions is of the image's class; text -> image likewise).
std::unique_ptr<Task> contrastive_task(const Recipe& r, std::unique_ptr<models::DualEncoder> model);

// Flamingo (model.type "flamingo") on interleaved Fashion-MNIST sequences, its language model's
// tokenizer (model.lm_from's). A training row is k demonstration chunks (k uniform in 0..3, drawn
// from (run.seed, step, global row), their images uniform over the training split) and a query
// chunk (the image of the classifier's global batch row), each `<image>{class phrase}<|endofchunk|>`
// with the phrase data::class_phrase's ("ankle boot"); every phrase token and `<|endofchunk|>` is a
// target, `<image>` and padding are not (ignore -100). The loss is the mean over the micro-batch's
// targets (micro-batches hold different counts: the trainer weights them).
// Evaluation, on the TEST images (periodic: the first eval_batches x global batch; final: all
// 10,000), split over ranks: rank classification, the class whose `{phrase}<|endofchunk|>` has the
// highest log-likelihood after the query's `<image>` (ties: the lowest class): 0-shot; 4-shot (four
// demonstration chunks of training images drawn from (run.seed, query index) before it); and two
// controls by the same code, 0-shot with every gate forced to 0 (the frozen LM) and with the query
// images shuffled (a seeded permutation of the evaluated images). val_loss: the correct caption's
// mean loss per token, 0-shot.
std::unique_ptr<Task> flamingo_task(const Recipe& r, std::unique_ptr<models::Flamingo> model);
// Copies the frozen towers' weights into `model`: vision_model.* from model.vision_from's
// model.safetensors, transformer.* (but the new tokens' rows) from model.lm_from's; ConfigError
// naming the key for a missing tensor or a shape that differs.
void load_flamingo_towers(const Recipe& r, models::Flamingo& model);

}  // namespace brigade::train
