// Contrastive image-caption training (CLIP, Radford et al. 2021) for model.type = "clip" on
// data.corpus = "fashion-mnist" (issue 8): `brigade train` and `brigade eval --ckpt DIR`.
//
// Model (clip_config): models::CLIP with the image tower from model.image_size, patch_size,
// in_channels, n_layer, n_head, n_embd, intermediate_size (0 = 4 n_embd), layer_norm_eps, and the
// text tower from model.text_layers / text_heads / text_width (0 = the image tower's n_layer /
// n_head / n_embd), MLP 4 x text_width, vocabulary and context length from data::CaptionTokenizer
// (vocab_size(), max_length()); projection_dim (0 = n_embd); initializer_range = model.init_std;
// hidden_act "quick_gelu" (x * sigmoid(1.702 x), what OpenAI's CLIP uses); logit_scale starts
// at ln(1/0.07). Initialised by CLIP::init_weights from run.seed.
//
// One process (parallel.dp = 1, precision O0; config.cpp refuses the rest): the recipe's optimizer
// via make_optimizer over a one-rank parallel::DataParallel, the [schedule] lr, clipping and the
// step through apply_gradients (trainer.h), as the image-classifier loop (classify.h). Step s
// takes batch (s mod E) of epoch s / E of a ShuffledBatchSampler over the 60000 training images
// (E = 60000 / batch_size, the last partial batch dropped), augmented (data.augment: crop + flip)
// from a generator seeded by (run.seed, step); image i of the batch pairs with caption i, its
// class in a template drawn by data::make_caption_pairs seeded by (run.seed, step). The loss is
// CLIP's symmetric InfoNCE over the B x B logits. Several images of a batch share a class and
// often the very same caption, so the loss also pushes apart pairs that actually match (false
// negatives) and cannot go to 0 (with 10 classes its floor is about ln(B / 10)); that is CLIP's
// standard objective, kept as is. After every optimizer step logit_scale is clamped to
// [0, ln 100] (a temperature of at most 100), as CLIP does.
//
// Zero-shot evaluation (evaluate_zero_shot): the 10 prompts "a photo of a {class}" are encoded
// once; each test image is predicted as the class of highest cosine similarity (ties: lowest
// class id, as CLIP::zero_shot_predict); accuracy over the first `limit` test images (periodic
// evaluations: train.eval_batches x batch_size; the final one: all 10000). Alongside it, the
// contrastive loss on test pairs: the test images in chunks of 500, each with captions from
// make_caption_pairs seeded by (run.seed, chunk), averaged over images. A diagnostic: through the
// false negatives above it depends on the chunk sizes (a prefix that is not a multiple of 500 ends
// in a smaller chunk, with a lower loss), so compare it only between evaluations of equal size.
//
// Outputs: progress line (step, epoch, loss, lr, images/s, ETA); <out_dir>/metrics.jsonl with
// {step, loss, lr, images_per_s, epoch, grad_norm, logit_scale} every train.log_every steps and
// {step, val_loss (the test-pair contrastive loss), zero_shot_accuracy, test_images} at every
// evaluation; <out_dir>/checkpoint (model.safetensors under Hugging Face CLIPModel names,
// optimizer.safetensors, state.json, recipe.toml); <out_dir>/loss.svg. Ctrl-C / SIGTERM ends the
// current step, evaluates on the whole test set, checkpoints and exits 130. No --resume yet.
#pragma once
#include <cstdint>
#include <string>

#include "brigade/data/ext_captions.h"
#include "brigade/data/ext_fashion_mnist.h"
#include "brigade/models/clip/clip.h"
#include "brigade/train/config.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

// The CLIP configuration of a recipe's [model] (see above), for the caption tokenizer `tok`.
models::CLIPConfig clip_config(const ModelConfig& m, const data::CaptionTokenizer& tok);

struct ClipEvalResult {
  double accuracy = 0.0;         // zero-shot: correct / total over the 10 class prompts
  int64_t correct = 0, total = 0;
  double loss = 0.0;             // contrastive loss on test pairs (chunks of 500, see above)
};

// Zero-shot accuracy and test-pair loss of `model` on the first `limit` images of `test_set`
// (eval mode, no autograd); `caption_seed` seeds the test captions (the run's run.seed).
ClipEvalResult evaluate_zero_shot(models::CLIP& model, const data::CaptionTokenizer& tok,
                                  const data::FashionMnist& test_set, int64_t limit, uint64_t caption_seed);

struct ClipResult {
  bool interrupted = false;      // SIGINT/SIGTERM: stopped after a step (evaluated, checkpoint saved)
  int64_t steps = 0;
  int64_t num_parameters = 0;
  double last_loss = 0.0;        // last training step's batch loss
  double logit_scale = 0.0;      // at the end (ln of the temperature's inverse)
  double test_loss = -1.0;       // final evaluation on the whole test set: test-pair contrastive loss
  double zero_shot_accuracy = -1.0;  // fraction in [0, 1]
  int64_t test_correct = 0, test_total = 0;
  double images_per_s = 0.0;     // median over the logged steps
  double seconds = 0.0;          // wall time of the training loop (evaluations included)
  std::string checkpoint_dir;
};

// Trains the recipe (see the file comment). ConfigError for model.type != "clip", for
// data.corpus != "fashion-mnist", parallel.dp != 1, --resume and --dry-run.
ClipResult run_clip(const Recipe& recipe, const TrainOptions& opts);

// Loads a checkpoint written by run_clip (its recipe.toml and model.safetensors, strictly: every
// parameter by name and shape, nothing extra) and evaluates it on the whole Fashion-MNIST test
// set, exactly as the run's final evaluation. `threads` > 0 sets the OpenMP threads (else
// run.threads). CheckpointError for a missing directory, another model type or a mismatch.
ClipEvalResult evaluate_clip_checkpoint(const std::string& ckpt_dir, int threads = 0);

// `brigade train` for model.type = "clip": trains, prints the final line, returns the exit code
// (130 after Ctrl-C).
int train_clip_cli(const Recipe& r, const TrainOptions& opts);
// `brigade eval --ckpt DIR` for a clip checkpoint: prints the zero-shot accuracy, returns 0.
int eval_clip_cli(const std::string& ckpt_dir, int threads);

}  // namespace brigade::train
