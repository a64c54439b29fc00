// CLIP (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
// Supervision") as single-device model code with the parameter names and layouts of Hugging
// Face's CLIPModel, so its safetensors load by name:
//   text_model.embeddings.{token_embedding.weight (V, Dt), position_embedding.weight (T, Dt)}
//   text_model.encoder.layers.{i}.{self_attn.{k_proj,v_proj,q_proj,out_proj}, layer_norm1,
//       mlp.{fc1,fc2}, layer_norm2}.{weight,bias}
//   text_model.final_layer_norm.{weight,bias}
//   vision_model.embeddings.{class_embedding (Dv), patch_embedding.weight (Dv, C, p, p) (no bias),
//       position_embedding.weight (1 + P, Dv)}
//   vision_model.pre_layrnorm (sic, HF's spelling), vision_model.encoder.layers.{i}... (as text),
//   vision_model.post_layernorm
//   visual_projection.weight (E, Dv), text_projection.weight (E, Dt) (no biases), logit_scale (0-d).
// Both towers are pre-LN encoders (x += attn(ln1(x)); x += mlp(ln2(x))) with quick_gelu
// (x * sigmoid(1.702 x); hidden_act "gelu" selects exact GELU) and LayerNorm eps 1e-5. The text
// tower is causal (HF's causal mask) and learned-position; the vision tower is bidirectional
// with a CLS token, pre_layrnorm after the embeddings and post_layernorm on the CLS output.
//
// Text pooling rule: the feature of sequence b is taken at position lengths[b] - 1, i.e. the
// last non-padding token, which data/image/captions.h makes the end-of-text token. (That token
// is also the tokenizer's largest id, so HF's legacy argmax(input_ids) rule picks the same
// position.) Because the attention is causal, padding after the end token never changes the
// pooled feature, so no key mask is needed.
//
// No dropout (HF's CLIP default attention_dropout is 0 and it has no hidden dropout).
// Parity: tests/reference/clip_ref.py (plain PyTorch, same names) and
// tests/models/test_clip.cpp.
#pragma once
#include <cmath>
#include <string>

#include "brigade/core/rng.h"
#include "brigade/models/dual_encoder.h"
#include "brigade/nn/layers.h"

namespace brigade::models {

struct CLIPTextConfig {
  int64_t vocab_size = 49408;
  int64_t max_position_embeddings = 77;  // T: the longest sequence
  int64_t hidden_size = 512;             // Dt
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t intermediate_size = 2048;
  double layer_norm_eps = 1e-5;
};

struct CLIPVisionConfig {
  int64_t image_size = 224;
  int64_t patch_size = 32;
  int64_t num_channels = 3;
  int64_t hidden_size = 768;  // Dv
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  double layer_norm_eps = 1e-5;
  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

struct CLIPConfig {  // defaults: openai/clip-vit-base-patch32
  CLIPTextConfig text;
  CLIPVisionConfig vision;
  int64_t projection_dim = 512;                          // E
  std::string hidden_act = "quick_gelu";                 // or "gelu" (exact, erf)
  double logit_scale_init_value = std::log(1.0 / 0.07);  // ln(1/0.07) = 2.6593
  double initializer_range = 0.02;
  void validate() const;  // ConfigError naming the field
};

// HF CLIPAttention: separate q/k/v/out projections with biases (D, D), heads split,
// scale 1/sqrt(HS), causal or not.
class CLIPAttention : public nn::Module {
 public:
  CLIPAttention(int64_t D, int64_t n_head);
  Tensor forward(const Tensor& x, bool causal) const;  // (B, T, D) -> (B, T, D)
  std::shared_ptr<nn::Linear> k_proj, v_proj, q_proj, out_proj;
  int64_t n_head;
};

class CLIPMLP : public nn::Module {
 public:
  CLIPMLP(int64_t D, int64_t M, bool quick_gelu);
  Tensor forward(const Tensor& x) const;  // fc2(act(fc1(x)))
  std::shared_ptr<nn::Linear> fc1, fc2;
  bool quick_gelu;
};

// One pre-LN encoder layer of either tower, an nn::Block: plans (ZeRO-3, activation recompute)
// reach it from outside. No dropout: nothing to replay.
class CLIPEncoderLayer : public nn::Block {
 public:
  CLIPEncoderLayer(int64_t D, int64_t n_head, int64_t M, double eps, bool quick_gelu);
  Tensor forward(const Tensor& x, bool causal) const;  // (B, T, D) -> (B, T, D), through Block::run
  std::shared_ptr<CLIPAttention> self_attn;
  std::shared_ptr<nn::LayerNorm> layer_norm1;
  std::shared_ptr<CLIPMLP> mlp;
  std::shared_ptr<nn::LayerNorm> layer_norm2;

 private:
  Tensor body(const Tensor& x, bool causal) const;
};

class CLIPTextTransformer : public nn::Module {
 public:
  CLIPTextTransformer(const CLIPTextConfig& c, bool quick_gelu);
  // ids (M, T') i32/i64 with T' <= max_position_embeddings, lengths (M) i32/i64 in [1, T'] ->
  // pooled (M, Dt): final_layer_norm output at position lengths[b] - 1.
  Tensor forward(const Tensor& ids, const Tensor& lengths) const;
  std::shared_ptr<nn::Submodules> embeddings;  // token_embedding, position_embedding
  std::shared_ptr<nn::Embedding> token_embedding, position_embedding;
  std::shared_ptr<nn::Submodules> encoder;  // holds "layers"
  std::shared_ptr<nn::ModuleList<CLIPEncoderLayer>> layers;
  std::shared_ptr<nn::LayerNorm> final_layer_norm;
};

// HF's patch_embedding: torch.nn.Conv2d(C, D, kernel p, stride p, bias=False), computed as
// patchify + a linear layer on the weight viewed (D, C*p*p); patches in row-major order.
class CLIPPatchEmbedding : public nn::Module {
 public:
  CLIPPatchEmbedding(int64_t C, int64_t D, int64_t p);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> (N, P, D)
  Tensor weight;                               // (D, C, p, p)
  int64_t channels, dim, patch;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

// class_embedding (D), patch_embedding (a Conv2d without bias: patchify + linear on the weight
// viewed (D, C*p*p)), position_embedding (1 + P, D).
class CLIPVisionEmbeddings : public nn::Module {
 public:
  CLIPVisionEmbeddings(const CLIPVisionConfig& c);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> (N, 1 + P, D)
  Tensor class_embedding;
  std::shared_ptr<CLIPPatchEmbedding> patch_embedding;
  std::shared_ptr<nn::Embedding> position_embedding;  // (1 + P, D)

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

class CLIPVisionTransformer : public nn::Module {
 public:
  CLIPVisionTransformer(const CLIPVisionConfig& c, bool quick_gelu);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> pooled (N, Dv): post_layernorm(CLS)
  std::shared_ptr<CLIPVisionEmbeddings> embeddings;
  std::shared_ptr<nn::LayerNorm> pre_layrnorm;
  std::shared_ptr<nn::Submodules> encoder;
  std::shared_ptr<nn::ModuleList<CLIPEncoderLayer>> layers;
  std::shared_ptr<nn::LayerNorm> post_layernorm;
};

class CLIP : public DualEncoder {
 public:
  explicit CLIP(const CLIPConfig& c);
  // Initialisation (documented; HF CLIPPreTrainedModel's stds with factor 1, drawn in
  // named_parameters order from `gen`, so tests/reference/clip_ref.py init_weights reproduces it
  // bit for bit): biases 0; LayerNorm weights 1; logit_scale = logit_scale_init_value; the rest
  // normal(0, std) with std = initializer_range for token / position / patch embeddings,
  // Dv^-0.5 for class_embedding, D^-0.5 (2 L)^-0.5 for q/k/v_proj and fc2, D^-0.5 for out_proj,
  // (2 D)^-0.5 for fc1, D_tower^-0.5 for visual_projection / text_projection (D, L of the tower).
  void init_weights(Generator& gen);

  // (N, C, H, W) -> (N, E), each row of unit L2 norm.
  Tensor encode_image(const Tensor& images) const override;
  // ids (M, T') and lengths (M) (pooling rule above) -> (M, E), each row of unit L2 norm.
  Tensor encode_text(const Tensor& ids, const Tensor& lengths) const override;
  // exp(logit_scale) * image_embeds @ text_embeds^T: (N, M), HF's logits_per_image
  // (logits(images, ids, lengths) composes the towers and this, DualEncoder).
  Tensor logits_from_embeds(const Tensor& image_embeds, const Tensor& text_embeds) const override;
  Tensor logits_with_scale(const Tensor& image_embeds, const Tensor& text_embeds, const Tensor& scale) const override;
  // Symmetric InfoNCE over a batch of N matching (image i, caption i) pairs (N == M):
  // (CE(logits_per_image, arange N) + CE(logits_per_text, arange N)) / 2, 0-d.
  Tensor contrastive_loss_from_logits(const Tensor& logits_per_image) const override;
  Tensor& scale_parameter() override { return logit_scale; }
  const Tensor& scale_parameter() const override { return logit_scale; }
  std::string scale_name() const override { return "logit_scale"; }
  // [0, ln 100]: logits at most 100 x the cosine similarity (CLIP's clamp), at least 1 x.
  double clamp_scale(double s) const override { return s > kMaxLogitScale ? kMaxLogitScale : (s < 0.0 ? 0.0 : s); }
  int64_t embed_dim() const override { return cfg_.projection_dim; }
  std::string describe() const override;
  static inline const double kMaxLogitScale = std::log(100.0);
  // Zero-shot classification: argmax over K classes of image_embeds @ class_text_embeds^T
  // (class_text_embeds (K, E), e.g. encode_text of one prompt per class); returns (N) i64.
  // Runs without recording; ties pick the lowest class id.
  Tensor zero_shot_predict(const Tensor& images, const Tensor& class_text_embeds) const;

  // Model FLOPs of one training step per (image, caption) pair, forward + backward = 3x forward,
  // 2 per multiply-add: vision GEMMs (patch projection P*C*p*p*Dv, per layer S*(4 Dv^2 + 2 Dv Mv),
  // projection Dv*E) + attention (2 S^2 Dv per layer), the same for text with T =
  // max_position_embeddings (causal attention counted in full) and projection Dt*E; the N x N
  // logits are left out (they depend on the batch).
  double flops_per_pair() const override;
  const CLIPConfig& config() const { return cfg_; }

  std::shared_ptr<CLIPTextTransformer> text_model;
  std::shared_ptr<CLIPVisionTransformer> vision_model;
  std::shared_ptr<nn::Linear> visual_projection, text_projection;
  Tensor logit_scale;  // 0-d

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;

 private:
  CLIPConfig cfg_;
};

}  // namespace brigade::models
