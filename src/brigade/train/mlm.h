// Masked-language-model pre-training for model.type = "bert" (issue 8): `brigade train` on the
// prepared text corpus (data.dir: tokenizer.model, train.bin, val.bin, prepared on first use
// exactly like the GPT trainer) and `brigade eval --ckpt DIR`.
//
// Vocabulary: the tokenizer has model.vocab_size pieces (unk 0, bos 1, eos 2 = newline) and no
// mask piece, so the model's embedding and decoder have model.vocab_size + 1 rows and the extra
// id model.vocab_size is [MASK] (mlm_mask_id). unk, bos and eos are never chosen for masking;
// the 10% random replacements draw from all model.vocab_size + 1 ids, [MASK] included, as Hugging
// Face's DataCollatorForLanguageModeling does (data/ext_mlm.h).
//
// One process (parallel.dp = 1), fp32 (precision O0), no accumulation. Step s: B = batch_size
// windows of seq_len tokens at the GPT trainer's training offsets (data::BatchSampler::get_batch
// with run.seed, the next-token targets unused), masked by data::mask_tokens with
// data.mlm_probability from a generator seeded by (run.seed, s); loss = mean cross-entropy over
// the masked positions (BERT::mlm_loss's computation, logits computed once so the masked accuracy
// of the same forward is reported); backward; the recipe's optimizer, [schedule] lr and clipping
// through apply_gradients (trainer.h), as the other loops. No padding, token types 0. Dropout
// draws from the model's generator seeded with run.seed + 1; init from run.seed.
//
// Evaluation (every train.eval_every steps and at the end): eval_batches batches of B windows of
// val.bin at the sampler's evenly spaced eval offsets, masked from fixed generators that depend
// on the batch index only (not on run.seed or the step), so every evaluation, of any run with the
// same data, B, T, eval_batches and mlm_probability, scores the same masked positions. val_loss =
// summed cross-entropy / masked positions (token-weighted over the batches), mlm_accuracy = argmax
// hits / masked positions. The same positions give the trivial baselines: the unigram model of
// train.bin (loss, and the accuracy of always predicting its most frequent maskable token).
//
// Outputs in run.out_dir: metrics.jsonl ({step, loss, train_accuracy, lr, tokens_per_s,
// grad_norm} every log_every steps; {step, val_loss, mlm_accuracy, masked_tokens} at each
// evaluation), checkpoint/ (model.safetensors under BertForMaskedLM names, optimizer.safetensors,
// state.json, recipe.toml, tokenizer.model) written at the end only, and loss.svg. Ctrl-C /
// SIGTERM ends the current step, writes the checkpoint (no final evaluation) and returns
// interrupted (the CLI exits 130). --resume, --dry-run and train.checkpoint_every are not
// supported for bert (ConfigError / ignored: only the final checkpoint is written).
#pragma once
#include <cstdint>
#include <string>

#include "brigade/models/bert/bert.h"
#include "brigade/train/config.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

// The BERT of a recipe's [model] (vocab = model.vocab_size + 1 for [MASK]; intermediate_size 0 =
// 4 n_embd; max_position_embeddings = block_size; hidden_dropout = dropout).
models::BERTConfig bert_config(const ModelConfig& m);
// The [MASK] id: model.vocab_size (one past the tokenizer's pieces).
inline int64_t mlm_mask_id(const ModelConfig& m) { return m.vocab_size; }

struct MlmEval {
  double loss = 0.0;             // summed cross-entropy over masked positions / masked_tokens
  double accuracy = 0.0;         // argmax == label over the masked positions
  int64_t correct = 0, masked_tokens = 0;
};

struct MlmResult {
  bool interrupted = false;      // SIGINT/SIGTERM: stopped after a step (checkpoint saved, no final eval)
  int64_t steps = 0;
  int64_t parameters = 0;
  double last_loss = 0.0;        // last training step's batch loss
  MlmEval final_eval;            // the final evaluation (loss -1 when interrupted before one)
  // Trivial baselines on the same masked val positions: the unigram distribution of train.bin
  // (its cross-entropy; and the accuracy of always predicting its most frequent maskable token).
  double unigram_loss = 0.0, unigram_accuracy = 0.0;
  double initial_loss = 0.0;     // ln(model vocab): a uniform prediction
  double tokens_per_s = 0.0;     // median over the logged steps
  double seconds = 0.0;          // wall time of the training loop (evaluations included)
  std::string checkpoint_dir;
};

// Trains the recipe (see the file comment). ConfigError for a non-bert recipe, --resume,
// --dry-run, train.accumulation != 1, seq_len > block_size; ConfigError when the prepared data's
// vocabulary differs from model.vocab_size; DataError for a val.bin shorter than seq_len + 1.
MlmResult run_mlm(const Recipe& recipe, const TrainOptions& opts);

// Loads a checkpoint written by run_mlm (its recipe.toml and model.safetensors, strictly by name
// and shape) and evaluates it exactly as run_mlm's final evaluation does, on the val.bin of the
// recipe's data.dir (relative paths from the current directory), so with the same thread count it
// reproduces the run's final numbers bit for bit. `threads` > 0 sets the OpenMP threads (else
// run.threads). CheckpointError for a missing directory, a non-bert checkpoint or a data.dir
// whose tokenizer differs from the checkpoint's tokenizer.model.
MlmEval evaluate_mlm_checkpoint(const std::string& ckpt_dir, int threads = 0);

// `brigade train` for model.type = "bert": trains, prints the final line, returns the exit code
// (130 when interrupted).
int train_bert_cli(const Recipe& r, const TrainOptions& opts);
// `brigade eval --ckpt DIR` for a bert checkpoint: prints the result, returns the exit code.
int eval_bert_cli(const std::string& ckpt_dir, int threads);

}  // namespace brigade::train
