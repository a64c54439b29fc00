// Image classification from a recipe: `brigade train` for model.type = "vit" | "resnet18" |
// "resnet50" | "swin" on data.corpus = "fashion-mnist", and `brigade eval --ckpt DIR`.
// One process (parallel.dp = 1): the model (initialised from run.seed), the recipe's optimizer
// via make_optimizer over a one-rank parallel::DataParallel, the [schedule] lr, clipping and the
// step through apply_gradients (trainer.h). Step s trains on batch (s mod E) of epoch s / E of a
// ShuffledBatchSampler over the 60000 training images (E = 60000 / batch_size, the last partial
// batch dropped); with data.augment each image is randomly cropped (pad 2) and flipped, drawn
// from a generator seeded by (run.seed, step). Progress line: step, epoch, loss, lr, images/s,
// ETA. metrics.jsonl: {step, loss, lr, images_per_s} every train.log_every steps and
// {step, val_loss, accuracy} at every evaluation on the TEST set (periodic ones on its first
// eval_batches x batch_size images, the final one on all 10000). The end: <out_dir>/checkpoint
// (model.safetensors with parameters and buffers under Hugging Face / torchvision names,
// optimizer.safetensors, state.json, recipe.toml) and <out_dir>/loss.svg.
#pragma once
#include <cstdint>
#include <string>

#include "brigade/train/config.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

// model.type is "vit", "resnet18", "resnet50" or "swin" (clip trains in train/clip_train.h).
bool is_vision_model(const std::string& type);

struct ClassifyResult {
  bool interrupted = false;      // SIGINT/SIGTERM: stopped after a step (evaluated, checkpoint saved)
  int64_t steps = 0;
  double last_loss = 0.0;        // last training step's batch loss
  double test_loss = -1.0;       // final evaluation on the whole test set
  double test_accuracy = -1.0;   // fraction in [0, 1]
  int64_t test_correct = 0, test_total = 0;
  double images_per_s = 0.0;     // median over the logged steps
  double seconds = 0.0;          // wall time of the training loop (evaluations included)
  std::string checkpoint_dir;
};

// Trains the recipe (see the file comment). ConfigError for parallel.dp != 1. --stop-at N ends
// the run at step N with the final evaluation and the checkpoint; --resume continues from
// <out_dir>/checkpoint (parameters, BatchNorm buffers, optimizer, dropout and loss-scaler state,
// the step; metrics.jsonl is cut back to that step) and, at the same thread count, ends with the
// same weights and numbers as an uninterrupted run. CheckpointError when the checkpoint is
// missing or holds a different model.
ClassifyResult run_classification(const Recipe& recipe, const TrainOptions& opts);

struct EvalResult {
  double loss = 0.0;             // mean cross-entropy
  double accuracy = 0.0;         // correct / total
  int64_t correct = 0, total = 0;
};
// Loads a checkpoint written by run_classification (its recipe.toml and model.safetensors,
// strictly: every parameter and buffer by name and shape) and evaluates it on the whole
// Fashion-MNIST test set. `threads` > 0 sets the OpenMP threads (else run.threads).
// CheckpointError for a language-model checkpoint or a missing directory.
EvalResult evaluate_checkpoint(const std::string& ckpt_dir, int threads = 0);

// The folder of the Fashion-MNIST IDX files for a recipe: data.dir, or the Debian folder
// (/usr/share/datasets/fashion-mnist) when data.dir is left at its default ("data/kjv").
std::string fashion_mnist_dir(const Recipe& r);

}  // namespace brigade::train
