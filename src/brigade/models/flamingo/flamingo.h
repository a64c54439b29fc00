// Flamingo (Alayrac et al. 2022, "Flamingo: a Visual Language Model for Few-Shot Learning") as
// single-device model code: a frozen CLIP vision tower, a Perceiver resampler, gated
// cross-attention blocks inserted before the layers of a frozen GPT-2 language model, and two
// new tokens whose embedding rows train while the rest of the vocabulary stays frozen. The
// layout follows Hugging Face's IDEFICS (IdeficsModel) and the masking OpenFlamingo
// (Awadalla et al. 2023); trained by the Flamingo task (train/tasks/flamingo.cpp, model.type "flamingo").
//
// Parameter names (Brigade <- IDEFICS / OpenFlamingo):
//   vision_model.*                 HF CLIPModel's vision tower, exactly as models::CLIP names it
//                                  (IDEFICS model.vision_model.*; OpenFlamingo vision_encoder.*, open_clip
//                                  names), frozen. post_layernorm is kept (so a CLIP checkpoint loads
//                                  by name) but unused, as in IDEFICS.
//   perceiver_resampler.latents (L, Dv)                          IDEFICS same; OpenFlamingo perceiver.latents
//   perceiver_resampler.blocks.{i}.0.{context_layer_norm, latents_layer_norm}.{weight,bias}
//                                                                 OF perceiver.layers.{i}.0.{norm_media, norm_latents}
//   perceiver_resampler.blocks.{i}.0.{q_proj, k_proj, v_proj, output_proj}.weight (no biases)
//                                                                 OF ...0.to_q, [k; v] = ...0.to_kv (rows), ...0.to_out
//   perceiver_resampler.blocks.{i}.1.{ln.{weight,bias}, fc.weight, c_proj.weight}
//                                                                 OF ...1.{0 (LayerNorm), 1, 3}
//   perceiver_resampler.layer_norm.{weight,bias}                  OF perceiver.norm
//   gated_cross_attn_layers.{j}.input_layernorm.{weight,bias}     OF ...gated_cross_attn_layer.attn.norm
//   gated_cross_attn_layers.{j}.cross_attn.{q_proj, k_proj, v_proj, o_proj}.weight (no biases)
//                                                                 OF attn.to_q, [k; v] = attn.to_kv, attn.to_out
//   gated_cross_attn_layers.{j}.alpha_cross_attn (1)              OF attn_gate
//   gated_cross_attn_layers.{j}.post_attention_layernorm.{weight,bias}  OF ff.0
//   gated_cross_attn_layers.{j}.mlp.{fc, c_proj}.weight (no biases)     OF ff.1, ff.3
//   gated_cross_attn_layers.{j}.alpha_dense (1)                   OF ff_gate
//   transformer.*                  GPT-2's names (models::GPT), frozen, so a GPT checkpoint loads by name
//   transformer.wte.additional_embedding.weight (2, C)            IDEFICS embed_tokens.additional_embedding
// IDEFICS's LM is LLaMA, so its gated layers use RMSNorm and a SwiGLU MLP (gate/up/down_proj);
// on GPT-2 we use OpenFlamingo's LayerNorm + fc / GELU / c_proj feed-forward under IDEFICS's
// other names (mlp.fc / mlp.c_proj as in IDEFICS's perceiver MLP).
//
// Structure (shapes: N images, S = 1 + P visual tokens, Dv vision width, L latents, B T C as
// everywhere, M = most images in one sequence, V the LM's vocabulary):
//   visual tokens: the vision tower's last encoder layer output for all 1 + P tokens (CLS
//     included), without post_layernorm: HF's last_hidden_state, what IDEFICS resamples.
//     (OpenFlamingo takes open_clip's patch tokens only, after ln_post.) Run without recording:
//     the tower is frozen and images need no gradient.
//   resampler: latents = repeat(latents, N); per block: latents += attn(ctx, latents) with
//     ctx = context_layer_norm(visual), lat = latents_layer_norm(latents),
//     q = q_proj(lat), k/v = k_proj/v_proj(cat(ctx, lat)) (IDEFICS), softmax(q k^T / sqrt(hd)) v,
//     output_proj; latents += mlp(latents) = c_proj(act(fc(ln(latents)))); then layer_norm.
//     (N, S, Dv) -> (N, L, Dv). No media position or frame embeddings (IDEFICS has none).
//   LM: GPT-2's embeddings (token + position), then for LM layer i: if i % n == 0 the gated
//     block j = i / n first (IDEFICS's placement: before layers 0, n, 2n, ...; ceil(L / n)
//     blocks, IDEFICS's L / n when n divides L), then transformer.h.{i}; ln_f; the head.
//   gated block: x = x + tanh(alpha_cross_attn) * xattn(input_layernorm(x), media);
//                x = x + tanh(alpha_dense) * mlp(post_attention_layernorm(x)).
//     The gates start at 0, so a fresh model computes exactly the LM (x + 0 * y == x).
//   media mask (OpenFlamingo): images belong to the `<image>` tokens of `ids` in row-major
//     order; text_time[b, t] = number of `<image>` tokens in ids[b, 0..t] (inclusive: the
//     `<image>` token itself sees its image). A token attends to the L latents of image
//     text_time (only_attend_immediate_media) or of images 1..text_time (otherwise). A token
//     with text_time 0 (before any image) attends to nothing: its cross-attention output is 0
//     in both modes (IDEFICS's cross_attention_gate; OpenFlamingo zeroes it only in the
//     immediate mode and lets such tokens attend uniformly otherwise, which we do not copy).
//     The dense half of the gated block applies to every token, as in both.
//   new tokens: `<|endofchunk|>` = V and `<image>` = V + 1 (OpenFlamingo adds them in this
//     order). The embedding is IDEFICS's DecoupledEmbedding: transformer.wte.weight (V, C)
//     frozen, additional_embedding (2, C) trainable for ids >= V. GPT-2's head is tied to
//     wte, so the head is tied likewise (IDEFICS's DecoupledLinear with tied weights):
//     logits = [x wte^T | x additional^T], (B, T, V + 2), the extra rows train through both.
// Frozen parameters (vision_model.*, transformer.* but the additional embedding) have
// requires_grad false (nn/lora.h's mechanism): no gradient, no optimizer state; they are
// ordinary MemTag::Params tensors, so memory accounting counts them.
// Blocks (nn::Block, reached by plans through nn::find_blocks): the vision layers, the resampler
// blocks, the gated blocks, the LM blocks, listed in that (registration) order; the forward
// interleaves the gated and LM blocks, which a ZeRO-3 prefetch order would have to follow.
//
// The attentions here are compositions of fn::matmul / softmax (their q and k lengths differ
// and the media mask is per query), not the tiled attention op; a fused masked cross-attention
// kernel would be the fast version. No dropout.
// Parity: tests/reference/flamingo_ref.py (plain PyTorch, same names) and
// tests/models/test_flamingo.cpp.
#pragma once
#include <string>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/models/clip/clip.h"
#include "brigade/models/gpt/gpt.h"

namespace brigade::models {

struct FlamingoConfig {
  CLIPVisionConfig vision;                       // the frozen vision tower
  std::string vision_hidden_act = "quick_gelu";  // its activation: "quick_gelu" or "gelu" (CLIPConfig::hidden_act)
  GPTConfig lm;                                  // the frozen language model (lm.dropout must be 0)
  // Perceiver resampler (IDEFICS's defaults: depth 6, 16 heads of 96, 64 latents, MLP 4 Dv).
  int64_t resampler_depth = 6;
  int64_t resampler_n_heads = 16;
  int64_t resampler_head_dim = 96;
  int64_t resampler_n_latents = 64;
  int64_t resampler_ff_mult = 4;  // MLP width = ff_mult * Dv
  // Gated cross-attention (OpenFlamingo's defaults: 8 heads of 64, FF 4 C).
  int64_t cross_attn_every_n_layers = 1;  // IDEFICS's cross_layer_interval
  int64_t cross_attn_heads = 8;
  int64_t cross_attn_head_dim = 64;
  int64_t cross_attn_ff_mult = 4;  // MLP width = ff_mult * C
  bool only_attend_immediate_media = true;
  std::string ff_act = "gelu";   // both feed-forwards: "gelu" (exact, OpenFlamingo) or "relu" (IDEFICS's perceiver)
  double layer_norm_eps = 1e-5;  // the resampler's and gated blocks' LayerNorms (torch's default)
  double initializer_range = 0.02;

  int64_t end_of_chunk_token_id() const { return lm.vocab_size; }  // <|endofchunk|>
  int64_t image_token_id() const { return lm.vocab_size + 1; }     // <image>
  static constexpr int64_t kNumAdditionalTokens = 2;
  int64_t vocab_size() const { return lm.vocab_size + kNumAdditionalTokens; }  // logits' width
  int64_t num_cross_attn_layers() const {
    return (lm.n_layer + cross_attn_every_n_layers - 1) / cross_attn_every_n_layers;
  }
  void validate() const;  // ConfigError naming the field
};

// IDEFICS's DecoupledEmbedding on GPT-2's tied embedding: weight (V, C) (frozen by Flamingo)
// plus additional_embedding (A, C) for ids V .. V + A - 1. forward and attend replace (hide)
// nn::Embedding's: ids may reach V + A, logits are V + A wide.
class DecoupledEmbedding : public nn::Embedding {
 public:
  DecoupledEmbedding(int64_t V, int64_t A, int64_t C);
  // ids (...) in [0, V + A) -> (..., C): weight[id] for id < V, additional[id - V] otherwise
  // (two lookups combined with 0/1 masks, exact; for ids < V bitwise nn::Embedding's lookup).
  Tensor forward(const Tensor& ids) const;
  // x (N, C) -> (N, V + A) = [x weight^T | x additional^T]; the first V columns are bitwise
  // nn::Embedding::attend's.
  Tensor attend(const Tensor& x) const;
  std::shared_ptr<nn::Embedding> additional_embedding;
  int64_t num_embeddings;  // V
};

// GPT-2's "transformer" (models::GPTTransformer's names and layers) with a DecoupledEmbedding
// as wte. Dropout is refused by the config (lm.dropout 0); `gen` is the blocks' (unused) dropout
// generator, owned by the model.
class FlamingoLM : public nn::Module {
 public:
  FlamingoLM(const GPTConfig& c, Generator* gen);
  std::shared_ptr<DecoupledEmbedding> wte;
  std::shared_ptr<nn::Embedding> wpe;
  std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
};

// IDEFICS's IdeficsPerceiverAttention (qk_layer_norms off): see the structure above.
class PerceiverAttention : public nn::Module {
 public:
  PerceiverAttention(int64_t D, int64_t n_heads, int64_t head_dim, double eps);
  // context (N, S, D), latents (N, L, D) -> (N, L, D) (the residual is added by the block)
  Tensor forward(const Tensor& context, const Tensor& latents) const;
  std::shared_ptr<nn::LayerNorm> context_layer_norm, latents_layer_norm;
  std::shared_ptr<nn::Linear> q_proj, k_proj, v_proj, output_proj;
  int64_t n_heads, head_dim;
};

// Feed-forward without biases: c_proj(act(fc(ln(x)))) (IDEFICS's IdeficsMLP names, OpenFlamingo's
// FeedForward); `ln` is optional (the gated block normalises outside, post_attention_layernorm).
class FlamingoMLP : public nn::Module {
 public:
  FlamingoMLP(int64_t D, int64_t M, bool relu, bool with_ln, double eps);
  Tensor forward(const Tensor& x) const;  // (..., D) -> (..., D)
  std::shared_ptr<nn::LayerNorm> ln;      // null without with_ln
  std::shared_ptr<nn::Linear> fc, c_proj;
  bool relu;
};

// One resampler layer, an nn::Block (ZeRO-3 and recompute reach it from outside): children
// "0" (attention) and "1" (MLP), IDEFICS's blocks.{i}.{0,1}.
class PerceiverBlock : public nn::Block {
 public:
  PerceiverBlock(int64_t D, int64_t n_heads, int64_t head_dim, int64_t M, bool relu, double eps);
  // latents + attn, then + mlp: (N, S, D), (N, L, D) -> (N, L, D), through Block::run
  Tensor forward(const Tensor& context, const Tensor& latents) const;
  std::shared_ptr<PerceiverAttention> attn;
  std::shared_ptr<FlamingoMLP> mlp;
};

class PerceiverResampler : public nn::Module {
 public:
  PerceiverResampler(const FlamingoConfig& c);
  Tensor forward(const Tensor& visual) const;  // (N, S, Dv) -> (N, L, Dv)
  Tensor latents;                              // (L, Dv)
  std::shared_ptr<nn::ModuleList<PerceiverBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> layer_norm;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

// Which media a batch's tokens see, built from the `<image>` tokens of ids (B, T) on the host
// (constants, never differentiated). M = the most images in one sequence (slot m of sequence b
// is its (m+1)-th image).
struct MediaMask {
  int64_t B = 0, T = 0, M = 0, num_images = 0;
  std::vector<int64_t> text_time;  // (B*T): `<image>` tokens in ids[b, 0..t]
  std::vector<uint8_t> allowed;    // (B*T*M): token (b, t) attends to slot m
  // Builds it; only_immediate: slot text_time - 1 only, else slots 0 .. text_time - 1.
  static MediaMask build(const Tensor& ids, int64_t image_token_id, bool only_immediate);
  // (B*M, N) one-hot: row b*M + m picks image (index of sequence b's (m+1)-th image), zero rows
  // for empty slots. The media gather is a matmul with it (exact: one product by 1, zeros added).
  Tensor select_matrix() const;
  // (B, 1, T, M*L) additive attention mask: 0 where allowed, -inf elsewhere; tokens that see no
  // media get an all-0 row (their output is zeroed by has_media, so no row is all -inf).
  Tensor additive(int64_t L) const;
  Tensor has_media() const;  // (B, T, 1) f32 0 / 1: text_time >= 1
};

// IDEFICS's IdeficsAttention as cross-attention (no biases): q from the text (C), k and v from
// the media latents (Dv), heads x head_dim inner width, o_proj back to C. k and v run as one GEMM
// on the rows [k_proj.weight; v_proj.weight] (OpenFlamingo's to_kv), reading the weights
// directly: a LinearShard or LoRA adapter on k_proj / v_proj would not be applied.
class MaskedCrossAttention : public nn::Module {
 public:
  MaskedCrossAttention(int64_t C, int64_t Dv, int64_t heads, int64_t head_dim);
  // x (B, T, C) (normalised), media (B, M*L, Dv), additive mask (B, 1, T, M*L), has_media
  // (B, T, 1) -> (B, T, C), zero for tokens without media.
  Tensor forward(const Tensor& x, const Tensor& media, const Tensor& additive, const Tensor& has_media) const;
  std::shared_ptr<nn::Linear> q_proj, k_proj, v_proj, o_proj;
  int64_t heads, head_dim;
};

// IDEFICS's IdeficsGatedCrossAttentionLayer (see the structure above), an nn::Block.
class GatedCrossAttentionBlock : public nn::Block {
 public:
  GatedCrossAttentionBlock(const FlamingoConfig& c);
  // x (B, T, C); media undefined (a batch without images: the cross-attention half is exactly 0
  // and is skipped) or (B, M*L, Dv) with its masks -> (B, T, C), through Block::run
  Tensor forward(const Tensor& x, const Tensor& media, const Tensor& additive, const Tensor& has_media) const;
  std::shared_ptr<nn::LayerNorm> input_layernorm;
  std::shared_ptr<MaskedCrossAttention> cross_attn;
  Tensor alpha_cross_attn;  // (1), tanh-gated; 0 at init
  std::shared_ptr<nn::LayerNorm> post_attention_layernorm;
  std::shared_ptr<FlamingoMLP> mlp;
  Tensor alpha_dense;  // (1), tanh-gated; 0 at init

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;

 private:
  Tensor body(const Tensor& x, const Tensor& media, const Tensor& additive, const Tensor& has_media) const;
};

class Flamingo : public nn::Module {
 public:
  explicit Flamingo(const FlamingoConfig& c);
  // A fresh model's weights, drawn in named_parameters order from `gen` (not any published
  // init: the frozen parts are meant to come from CLIP and GPT-2 checkpoints, loaded by name):
  // LayerNorm weights 1, biases 0, the gates 0, resampler latents normal(0, 1) (IDEFICS's
  // torch.randn), everything else normal(0, initializer_range).
  void init_weights(Generator& gen);

  // images (N, C, H, W), one per `<image>` token of ids (row-major order; N may be 0 with an
  // undefined images tensor when ids hold none), ids (B, T) in [0, V + 2) with T <= block_size
  // -> logits (B, T, V + 2).
  Tensor forward(const Tensor& images, const Tensor& ids) const;
  // Mean cross-entropy of forward's logits against targets (B, T) aligned with them (the next
  // token, as GPT::loss takes them), ignore_index -100 (e.g. the `<image>` positions), 0-d.
  Tensor loss(const Tensor& images, const Tensor& ids, const Tensor& targets) const;
  // forward's final LayerNorm output (B*T, C), before the head, with the media latents given
  // (media_latents' output, one (L, Dv) per `<image>` token of ids in row-major order; undefined
  // when ids hold none): an evaluation that scores several texts against one image resamples it
  // once, and turns only the positions it needs into logits (transformer->wte->attend).
  Tensor hidden_from_latents(const Tensor& latents, const Tensor& ids) const;
  // The pieces: visual tokens (frozen tower, not recorded) and resampled latents.
  Tensor visual_tokens(const Tensor& images) const;  // (N, C, H, W) -> (N, 1 + P, Dv)
  Tensor media_latents(const Tensor& images) const;  // (N, C, H, W) -> (N, L, Dv)
  // The extended LM alone (no gated blocks): what forward computes with every gate at 0.
  Tensor lm_logits(const Tensor& ids) const;  // (B, T) -> (B, T, V + 2)

  // The evaluation control: while set, forward skips the gated blocks, i.e. computes with every
  // gate forced to 0 (bitwise forward's result with the gate parameters at 0, since x + 0 y == x).
  void set_gates_forced_zero(bool on) { gates_forced_zero_ = on; }
  bool gates_forced_zero() const { return gates_forced_zero_; }
  // Sets every alpha_cross_attn and alpha_dense to 0 (the initial state).
  void zero_gates();

  // Parameters that train: requires_grad true (resampler, gated blocks, additional embedding).
  nn::NamedTensors trainable_parameters() const;
  const FlamingoConfig& config() const { return cfg_; }

  std::shared_ptr<CLIPVisionTransformer> vision_model;
  std::shared_ptr<PerceiverResampler> perceiver_resampler;
  std::shared_ptr<nn::ModuleList<GatedCrossAttentionBlock>> gated_cross_attn_layers;
  std::shared_ptr<FlamingoLM> transformer;

 private:
  // (B*T, V + 2); with check_images, one image per <image> token is required.
  Tensor run(const Tensor& images, const Tensor& ids, bool gated, bool check_images) const;
  // run with either images or their latents (the other undefined).
  Tensor run_media(const Tensor& images, const Tensor& latents, const Tensor& ids, bool gated, bool check_images,
                   bool head = true) const;
  FlamingoConfig cfg_;
  bool gates_forced_zero_ = false;
  Generator gen_;  // the LM blocks' dropout generator (dropout is 0: never drawn from)
};

}  // namespace brigade::models
