// Checkpoint directories: everything needed to resume exactly or to sample.
//   model.safetensors      weights by Hugging Face name (loads into HF/PyTorch GPT-2)
//   optimizer.safetensors  optimizer state by "<state>.<param name>"
//   state.json             step, tokens seen, RNG state, last val loss, format version
//   recipe.toml            the full recipe (every key) the run used
//   tokenizer.model        the SentencePiece model the data was encoded with
// Written into "<dir>.tmp" (every file fsynced), then swapped in by two renames
// (<dir> -> <dir>.old, <dir>.tmp -> <dir>); a crash between them leaves <dir>.old,
// which recover_checkpoint() moves back. So a crash never leaves a half-written
// or missing checkpoint. Errors name the directory and the file.
#pragma once
#include <cstdint>
#include <string>

#include "brigade/nn/module.h"
#include "brigade/optim/optimizer.h"
#include "brigade/train/config.h"

namespace brigade::train {

struct TrainState {
  int64_t step = 0;             // optimizer steps completed
  int64_t tokens_seen = 0;
  std::string rng_state;        // model (dropout) generator
  double last_val_loss = -1.0;
};

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer* opt,
                     const TrainState& state, const Recipe& recipe, const std::string& tokenizer_path);
bool checkpoint_exists(const std::string& dir);  // repairs an interrupted swap first
// If <dir> is missing but <dir>.old holds a checkpoint, moves it back.
void recover_checkpoint(const std::string& dir);
// Recipe stored in the checkpoint (the run's own, defaults filled in).
Recipe checkpoint_recipe(const std::string& dir);
TrainState checkpoint_state(const std::string& dir);
// Strict: every parameter must be present with its shape; extra tensors are an
// error except a tied "lm_head.weight".
void load_model_weights(const std::string& safetensors_path, const nn::Module& model);
void load_optimizer_state(const std::string& dir, optim::Optimizer& opt, int64_t steps);

}  // namespace brigade::train
