// Checkpoint directories of a training run: everything needed to resume exactly or to sample.
//   model.safetensors      weights by Hugging Face name (loads into HF/PyTorch GPT-2)
//   optimizer.safetensors  optimizer state by "<state>.<param name>" (ZeRO: flat shards, ckpt/checkpoint_dir.h)
//   state.json             step, tokens seen, RNG state, last val loss, early-stopping state, format version
//   recipe.toml            the full recipe (every key) the run used
//   tokenizer.model        the tokenizer the data was encoded with (data/text/text_tokenizer.h: a Hugging Face
//                          tokenizer's files and brigade_tokenizer.json instead, when the run used one)
// Saved atomically, repaired after an interrupted save, and a failed save explained, as
// ckpt/checkpoint_dir.h describes.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "brigade/ckpt/checkpoint_dir.h"
#include "brigade/nn/module.h"
#include "brigade/optim/optimizer.h"
#include "brigade/train/config.h"
#include "brigade/train/early_stop.h"

namespace brigade::train {

using ckpt::begin_checkpoint;
using ckpt::checkpoint_is_sharded;
using ckpt::commit_checkpoint;
using ckpt::FlatLayoutEntry;
using ckpt::open_checkpoint;
using ckpt::read_optimizer_flat;
using ckpt::recover_checkpoint;
using ckpt::write_optimizer_index;
using ckpt::write_optimizer_shard;

struct TrainState {
  int64_t step = 0;  // optimizer steps completed
  int64_t tokens_seen = 0;
  std::string rng_state;                                            // model (dropout) generator
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN (null in state.json): none yet
  EarlyStopState early_stop;       // train.early_stop: best so far and evaluations since (absent = none yet)
  std::string accumulation_state;  // adaptive accumulation (AccumulationPolicy::state); "" = none
  std::string scaler_state;        // loss scaler (amp::LossScaler::state); "" = none
  std::string guard_state;         // non-finite / spike decisions (StepGuard::state); "" = none
  int64_t optimizer_steps = -1;    // updates the optimizer made (< step when loss scaling skipped some);
                                   // -1 (absent in older checkpoints) = step
};

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer* opt,
                     const TrainState& state, const Recipe& recipe, const std::string& tokenizer_dir);
// The files of a save between begin_checkpoint and commit_checkpoint (multi-process saves: rank 0);
// `params`: the model's parameters by name (model.named_parameters(), or copies gathered from shards).
// `tokenizer_dir`: the folder whose tokenizer is copied in ("" for none).
void write_checkpoint_files(const std::string& tmp, const nn::NamedTensors& params, const optim::Optimizer* opt,
                            const TrainState& state, const Recipe& recipe, const std::string& tokenizer_dir);

bool checkpoint_exists(const std::string& dir);  // repairs an interrupted swap first
// Recipe stored in the checkpoint (the run's own, defaults filled in). Both go through
// open_checkpoint() (reporting a repair on stderr).
Recipe checkpoint_recipe(const std::string& dir);
TrainState checkpoint_state(const std::string& dir);
// Strict: every parameter must be present with its shape; extra tensors are an
// error except a tied "lm_head.weight".
void load_model_weights(const std::string& safetensors_path, const nn::Module& model);
void load_optimizer_state(const std::string& dir, optim::Optimizer& opt, int64_t steps);

}  // namespace brigade::train
