// GPT-2 (Radford et al. 2019) as single-device model code, with Hugging Face
// parameter names and layout (Conv1D weights stored (in, out)) and the LM head
// tied to the token embedding. Initialisation reproduces the PyTorch reference
// in tests/reference bit for bit when given the same seed.
// Not parallel-aware: parallelism and precision are applied by a plan from outside.
#pragma once
#include <string>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/models/causal_lm.h"
#include "brigade/nn/layers.h"

namespace brigade::models {

struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  double layer_norm_eps = 1e-5;
  double init_std = 0.02;
};

class GPTTransformer : public nn::Module {
 public:
  GPTTransformer(const GPTConfig& c, Generator* gen);
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
};

class GPT : public CausalLM {
 public:
  explicit GPT(const GPTConfig& c);
  // Torch-identical init from `gen` (see tests/reference/gpt2_reference.py for the order).
  void init_weights(Generator& gen);
  const char* arch() const override { return "gpt"; }
  Tensor forward(const Tensor& ids) const override;                      // ids (B, T) -> logits (B, T, V)
  Tensor forward_flat(const Tensor& ids) const;                          // ids (B, T) -> logits (B*T, V)
  Tensor loss(const Tensor& ids, const Tensor& targets) const override;  // mean cross-entropy, 0-d
  // The forward in pieces, for plans that cut the model into pipeline stages:
  // loss(ids, targets) == head_loss(run_blocks(embed(ids), 0, n_layer), targets).
  Tensor embed(const Tensor& ids) const override;                                 // ids (B, T) -> (B, T, C)
  Tensor run_blocks(const Tensor& x, int64_t begin, int64_t end) const override;  // blocks [begin, end): (B, T, C)
  // The head runs through the token embedding (wte->attend / wte->lm_loss), so a plan that
  // shards the vocabulary (tp_plan() below) computes the loss without full
  // logits; on such a model head_logits, forward and forward_flat are a ValueError.
  Tensor head_logits(const Tensor& x) const;                                // ln_f + tied head: (B, T, C) -> (B*T, V)
  Tensor head_loss(const Tensor& x, const Tensor& targets) const override;  // ln_f, head, mean cross-entropy: 0-d
  int64_t hidden_size() const override { return cfg_.n_embd; }
  std::vector<std::string> tied_parameters() const override { return {"transformer.wte.weight"}; }
  // The tensor-parallel plan (nn/tp_plan.h, Megatron-LM): wte vocabulary-parallel (lookup and
  // the tied head), attn.c_attn column-parallel by heads of q, k and v (groups 3), mlp.c_fc
  // column-parallel, attn.c_proj and mlp.c_proj row-parallel, each attention's heads divided;
  // wpe, the LayerNorms and the row-parallel biases replicated.
  static nn::TpPlan tp_plan();
  // Model FLOPs per token of one training step (forward + backward): 6N + 12 L T C with
  // N = all parameters (the tied head makes wte a GEMM operand), as in PaLM's MFU appendix.
  double flops_per_token(int64_t T) const override;
  const GPTConfig& config() const { return cfg_; }
  Generator& dropout_generator() override { return gen_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_seq_len() const override { return cfg_.block_size; }
  std::vector<std::pair<std::string, nn::Module*>> blocks() override;  // "transformer.h.<i>"
  // Per-block activation recompute (one entry per block; from plan_recompute below).
  void set_recompute(const std::vector<nn::Recompute>& modes) override;
  std::vector<nn::Recompute> recompute_modes() const override;
  std::shared_ptr<GPTTransformer> transformer;

 private:
  Tensor head_features(const Tensor& x, const char* where) const;  // ln_f, flattened: (B, T, C) -> (B*T, C)
  GPTConfig cfg_;
  Generator gen_;  // dropout masks
};

// ---- Activation recompute plan (docs/memory.md "Activation recompute").
// A policy becomes one nn::Recompute per block; GPT::set_recompute applies it.
struct RecomputePolicy {
  std::string mode = "none";  // "none" | "full" | "selective" | "every_k" | "budget"
  int64_t every_k = 2;        // every_k: full recompute of blocks 0, k, 2k, ...
  int64_t budget_bytes = 0;   // budget: bound on the step's peak activation bytes
};

// Peak of live activation bytes (MemTag::Activations, as the allocator counts them,
// rounded blocks) of one training step: forward, loss and backward of a batch of B rows
// of T tokens, with the batch's token tensors included. Equal to a measured dry step to
// the byte (tests/train/test_memory_plan.cpp pins it).
// `modes` has one entry per block.
int64_t estimate_activation_peak(const GPTConfig& c, int64_t B, int64_t T, const std::vector<nn::Recompute>& modes);
// Extra forward FLOPs the backward spends recomputing, for one step.
double recompute_flops(const GPTConfig& c, int64_t B, int64_t T, const std::vector<nn::Recompute>& modes);
// The per-block modes of a policy. "budget" picks, among all mixes of none /
// selective / full blocks, the one with the fewest recompute FLOPs whose estimated
// peak fits the budget (recomputed blocks first: they are the last to be backpropagated,
// when the most activations are still held); ConfigError when even full recompute of
// every block does not fit.
std::vector<nn::Recompute> plan_recompute(const GPTConfig& c, int64_t B, int64_t T, const RecomputePolicy& p);
const char* recompute_name(nn::Recompute r);  // "none" | "full" | "selective"

}  // namespace brigade::models
