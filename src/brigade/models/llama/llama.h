// LLaMA (Touvron et al. 2023) as single-device model code, with Hugging Face parameter
// names and layouts (transformers' LlamaForCausalLM): pre-norm decoder layers with RMSNorm,
// rotary position embeddings on q and k, grouped-query attention (n_kv_head kv heads shared
// by n_head / n_kv_head query heads each), a SwiGLU MLP, no biases, and an LM head that is
// its own lm_head or (tie_word_embeddings, as Llama 3.2 1B/3B) tied to embed_tokens. RoPE may
// scale its frequencies (rope_scaling: linear, or Llama 3.1's llama3; ops/position.h).
//
//   model.embed_tokens.weight                         (V, C)
//   model.layers.{i}.self_attn.q_proj.weight          (NH * HS, C)     torch Linear (out, in)
//   model.layers.{i}.self_attn.k_proj.weight          (NKV * HS, C)
//   model.layers.{i}.self_attn.v_proj.weight          (NKV * HS, C)
//   model.layers.{i}.self_attn.o_proj.weight          (C, NH * HS)
//   model.layers.{i}.mlp.gate_proj.weight             (I, C)
//   model.layers.{i}.mlp.up_proj.weight               (I, C)
//   model.layers.{i}.mlp.down_proj.weight             (C, I)
//   model.layers.{i}.input_layernorm.weight           (C)
//   model.layers.{i}.post_attention_layernorm.weight  (C)
//   model.norm.weight                                 (C)
//   lm_head.weight                                    (V, C)     absent when tied
// (C = hidden_size, I = intermediate_size, HS = C / NH; registration order as in HF.)
//
// Layer: h = x + o_proj(gqa(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))), n = input_layernorm(x);
//        y = h + down_proj(silu(gate_proj(m)) * up_proj(m)), m = post_attention_layernorm(h).
// Model: logits = lm_head(norm(layers(embed_tokens(ids)))); no dropout (LLaMA trains without).
// Tied: logits = norm(...) @ embed_tokens.weight^T through Embedding::attend / lm_loss (as GPT-2's
// wte): one parameter, so one gradient (the lookup's and the head's summed), one optimizer state.
// Every op goes through fn:: (autograd/functions.h), so autocast policies
// apply as for GPT. Not parallel-aware, no activation recompute plan, no KV cache: those are
// plans applied from outside, as for GPT.
#pragma once
#include <memory>

#include "brigade/core/rng.h"
#include "brigade/models/causal_lm.h"
#include "brigade/nn/layers.h"
#include "brigade/nn/tp_plan.h"
#include "brigade/ops/ops.h"

namespace brigade::models {

struct LLaMAConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t n_layer = 32;
  int64_t n_head = 32;
  int64_t n_kv_head = 32;       // must divide n_head; == n_head is multi-head attention
  int64_t max_position = 2048;  // longest sequence forward accepts
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double init_std = 0.02;
  // The rotary frequencies' scaling (ops::RopeSpec: none, linear, llama3) and its parameters
  // (factor: linear and llama3; the other three: llama3 only). rope_theta is the base either way.
  ops::RopeScaling rope_scaling = ops::RopeScaling::None;
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  double rope_original_max_positions = 8192;
  bool tie_word_embeddings = false;  // lm_head is embed_tokens (no lm_head.weight)
  ops::RopeSpec rope() const {
    return {.theta = rope_theta,
            .scaling = rope_scaling,
            .factor = rope_factor,
            .low_freq_factor = rope_low_freq_factor,
            .high_freq_factor = rope_high_freq_factor,
            .original_max_positions = rope_original_max_positions};
  }
};

// HF LlamaRMSNorm: y = x / sqrt(mean(x^2) + eps) * weight; weight = 1 at construction.
class RMSNorm : public nn::Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) const;  // (..., C) -> (..., C)
  Tensor weight;
  double eps;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

// Causal grouped-query self-attention with rotary embeddings ("self_attn"). Under tensor
// parallelism (nn::HeadParallel) a rank computes n_head / tp query heads and n_kv_head / tp kv
// heads: rank r's query heads are exactly those its kv heads serve, so GQA needs no exchange.
class LlamaAttention : public nn::Module, public nn::HeadParallel {
 public:
  explicit LlamaAttention(const LLaMAConfig& c);
  Tensor forward(const Tensor& x) const;           // (B, T, C) -> (B, T, C)
  void check_heads(int64_t parts) const override;  // parts must divide n_head and n_kv_head
  void divide_heads(int64_t parts) override;
  std::shared_ptr<nn::Linear> q_proj, k_proj, v_proj, o_proj;
  int64_t n_head, n_kv_head, head_dim;  // the heads this layer computes
  ops::RopeSpec rope;
};

// SwiGLU MLP ("mlp"): down_proj(silu(gate_proj(x)) * up_proj(x)).
class LlamaMLP : public nn::Module {
 public:
  explicit LlamaMLP(const LLaMAConfig& c);
  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)
  std::shared_ptr<nn::Linear> gate_proj, up_proj, down_proj;
};

// Pre-norm decoder layer ("model.layers.{i}").
// Pre-RMSNorm decoder layer. Like nn::TransformerBlock it runs the plans' forward hooks
// (ZeRO-3 gathers the layer around its forward) and, when `recompute` says so, its body
// through fn::checkpoint (no dropout: nothing to replay).
class LlamaDecoderLayer : public nn::Block {
 public:
  explicit LlamaDecoderLayer(const LLaMAConfig& c);
  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C), through Block::run
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMLP> mlp;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;

 private:
  Tensor body(const Tensor& x) const;
};

// The decoder stack ("model").
class LlamaModel : public nn::Module {
 public:
  explicit LlamaModel(const LLaMAConfig& c);
  std::shared_ptr<nn::Embedding> embed_tokens;
  std::shared_ptr<nn::ModuleList<LlamaDecoderLayer>> layers;
  std::shared_ptr<RMSNorm> norm;
};

class LLaMA : public CausalLM {
 public:
  explicit LLaMA(const LLaMAConfig& c);  // ConfigError on inconsistent sizes
  // normal(0, init_std) for embed_tokens, every projection and lm_head (if untied), in registration
  // order; ones for every RMSNorm weight. Not torch-identical to HF's init (which draws the
  // same distribution in a different order); parity tests load weights instead.
  void init_weights(Generator& gen);
  const char* arch() const override { return "llama"; }
  Tensor forward(const Tensor& ids) const override;                      // ids (B, T) -> logits (B, T, V)
  Tensor forward_flat(const Tensor& ids) const;                          // ids (B, T) -> logits (B*T, V)
  Tensor loss(const Tensor& ids, const Tensor& targets) const override;  // mean cross-entropy, 0-d
  // The forward in pieces, for pipeline stages (as GPT's):
  // loss(ids, targets) == head_loss(run_blocks(embed(ids), 0, n_layer), targets).
  Tensor embed(const Tensor& ids) const override;                                 // ids (B, T) -> (B, T, C)
  Tensor run_blocks(const Tensor& x, int64_t begin, int64_t end) const override;  // layers [begin, end)
  // norm, lm_head and the mean cross-entropy, through lm_head->lm_loss (so a vocabulary-sharded
  // head computes it without the full logits; forward / forward_flat then refuse).
  Tensor head_loss(const Tensor& x, const Tensor& targets) const override;  // 0-d
  int64_t hidden_size() const override { return cfg_.hidden_size; }
  // The tensor-parallel plan (nn/tp_plan.h): embed_tokens vocabulary-parallel, lm_head a
  // vocabulary-parallel head (tied: the embedding's shard serves the head too, as GPT-2's wte),
  // q/k/v/gate/up column-parallel, o/down row-parallel, each attention's query and kv heads
  // divided; the RMSNorms replicated.
  static nn::TpPlan tp_plan(bool tied_head = false);
  // {"model.embed_tokens.weight"} when the head is tied (pipeline stages sum its two gradients).
  std::vector<std::string> tied_parameters() const override;
  // Model FLOPs per token of one training step (forward + backward), PaLM's MFU count:
  // 6 N + 12 L T C, with N = all parameters except an untied embed_tokens (a lookup, not a GEMM;
  // the lm_head is counted, and a tied embed_tokens is the head's GEMM operand), and 12 L T C for the attention scores
  // and values (GQA shares k and v heads but every query head still runs its own T x T products).
  double flops_per_token(int64_t T) const override;
  const LLaMAConfig& config() const { return cfg_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_seq_len() const override { return cfg_.max_position; }
  Generator& dropout_generator() override { return gen_; }             // LLaMA has no dropout; kept for the interface
  std::vector<std::pair<std::string, nn::Module*>> blocks() override;  // "model.layers.<i>"
  void set_recompute(const std::vector<nn::Recompute>& modes) override;
  std::vector<nn::Recompute> recompute_modes() const override;
  std::shared_ptr<LlamaModel> model;
  std::shared_ptr<nn::Linear> lm_head;  // null when tied (tie_word_embeddings)

 private:
  LLaMAConfig cfg_;
  Generator gen_;
};

}  // namespace brigade::models
