// Checkpoint directories: everything needed to resume exactly or to sample.
//   model.safetensors      weights by Hugging Face name (loads into HF/PyTorch GPT-2)
//   optimizer.safetensors  optimizer state by "<state>.<param name>"
//   state.json             step, tokens seen, RNG state, last val loss, early-stopping state, format version
//   recipe.toml            the full recipe (every key) the run used
//   tokenizer.model        the SentencePiece model the data was encoded with
// Written into "<dir>.tmp" (every file fsynced), then swapped in by two renames
// (<dir> -> <dir>.old, <dir>.tmp -> <dir>); a crash between them leaves <dir>.old
// (and the new <dir>.tmp), which recover_checkpoint() and open_checkpoint() move back.
// So a crash never leaves a half-written or missing checkpoint. A save that fails
// while writing <dir>.tmp (a full disk) removes it and says how many bytes the save
// needed and how many were free; the previous <dir> is untouched. Errors name the
// directory and the file.
// Test hook: BRIGADE_CKPT_FAIL_AFTER_BYTES=N makes a save fail as a full disk would
// once the files it has written into <dir>.tmp hold more than N bytes (the file that
// crosses N is cut at N).
#pragma once
#include <cstdint>
#include <limits>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "brigade/nn/module.h"
#include "brigade/optim/optimizer.h"
#include "brigade/train/config.h"
#include "brigade/train/early_stop.h"

namespace brigade::train {

struct TrainState {
  int64_t step = 0;             // optimizer steps completed
  int64_t tokens_seen = 0;
  std::string rng_state;        // model (dropout) generator
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN (null in state.json): none yet
  EarlyStopState early_stop;    // train.early_stop: best so far and evaluations since (absent = none yet)
  std::string accumulation_state;  // adaptive accumulation (AccumulationPolicy::state); "" = none
  std::string scaler_state;     // loss scaler (amp::LossScaler::state); "" = none
  int64_t optimizer_steps = -1; // updates the optimizer made (< step when loss scaling skipped some);
                                // -1 (absent in older checkpoints) = step
};

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer* opt,
                     const TrainState& state, const Recipe& recipe, const std::string& tokenizer_path);
// save_checkpoint in three steps, for multi-process saves (rank 0 runs begin and
// commit; every rank may write its files into the returned temporary folder in between):
std::string begin_checkpoint(const std::string& dir);  // -> "<dir>.tmp", empty and fresh
// `params`: the model's parameters by name (model.named_parameters(), or copies gathered from shards).
void write_checkpoint_files(const std::string& tmp, const nn::NamedTensors& params, const optim::Optimizer* opt,
                            const TrainState& state, const Recipe& recipe, const std::string& tokenizer_path);
void commit_checkpoint(const std::string& dir);        // the atomic swap

// ZeRO checkpoints: the optimizer state as flat shards of the parameter space,
//   optimizer-<rank>-of-<dp>.safetensors  one tensor per state ("exp_avg", ...) holding
//                                         flat elements [lo, hi) (metadata lo, hi)
//   optimizer.index.json                  dp, numel, the layout (name, offset, numel)
//                                         and every shard's file and range
// so a run saved at one dp size resumes at another: each rank reads the ranges it
// now owns from whichever files hold them.
struct FlatLayoutEntry {
  std::string name;
  int64_t offset = 0, numel = 0;
};
void write_optimizer_shard(const std::string& tmp, int rank, int dp, int64_t lo, int64_t hi,
                           const std::map<std::string, Tensor>& flat_state);
void write_optimizer_index(const std::string& tmp, int dp, int64_t numel, const std::vector<FlatLayoutEntry>& layout,
                           const std::vector<std::pair<int64_t, int64_t>>& shard_ranges,
                           const std::vector<std::string>& state_names);
// State `name` -> flat elements [lo, hi) (gaps between parameters are zero), from either
// format: the shards above, or optimizer.safetensors ("<state>.<param>") re-cut by `layout`.
std::map<std::string, Tensor> read_optimizer_flat(const std::string& dir, const std::vector<FlatLayoutEntry>& layout,
                                                  int64_t lo, int64_t hi);
bool checkpoint_is_sharded(const std::string& dir);
bool checkpoint_exists(const std::string& dir);  // repairs an interrupted swap first
// If <dir> is missing but <dir>.old holds a checkpoint, moves it back and removes that
// save's <dir>.tmp, silently (open_checkpoint() is the same repair, said aloud).
void recover_checkpoint(const std::string& dir);
// What every reader of a checkpoint directory (generate, eval, resume) calls first:
// repairs a save interrupted between its two renames (<dir> missing, <dir>.old holding
// a checkpoint: moves <dir>.old back and removes the unfinished <dir>.tmp), telling
// the user in one line through `say` (empty: stderr), and returns the directory
// (trailing '/' removed). Throws CheckpointError naming the folder and what to pass
// when there is no checkpoint there (no folder, nothing to restore; or no recipe.toml).
// A <dir>.tmp beside an existing <dir> is left alone (it may be a save in progress).
std::string open_checkpoint(const std::string& dir, const std::function<void(const std::string&)>& say = {});
// Recipe stored in the checkpoint (the run's own, defaults filled in). Both go through
// open_checkpoint() (reporting a repair on stderr).
Recipe checkpoint_recipe(const std::string& dir);
TrainState checkpoint_state(const std::string& dir);
// Strict: every parameter must be present with its shape; extra tensors are an
// error except a tied "lm_head.weight".
void load_model_weights(const std::string& safetensors_path, const nn::Module& model);
void load_optimizer_state(const std::string& dir, optim::Optimizer& opt, int64_t steps);

}  // namespace brigade::train
