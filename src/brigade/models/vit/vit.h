// Vision Transformer (Dosovitskiy et al. 2021) as single-device model code with the
// parameter names and layouts of Hugging Face's ViTForImageClassification, so its
// safetensors load by name: vit.embeddings.{cls_token (1, 1, D), position_embeddings
// (1, 1 + P, D), patch_embeddings.projection.{weight (D, C, p, p), bias}},
// vit.encoder.layer.{i}.{layernorm_before, attention.attention.{query,key,value},
// attention.output.dense, layernorm_after, intermediate.dense, output.dense}.{weight,bias},
// vit.layernorm.{weight,bias}, classifier.{weight,bias}.
// Pre-LayerNorm encoder (x += attn(ln_before(x)); x += mlp(ln_after(x))), exact (erf) GELU,
// LayerNorm eps 1e-12 by default, bidirectional attention (no mask: every image has all its
// patches), classification from the final-LayerNorm CLS token. P = (image/patch)^2.
// Dropout (hidden_dropout, where HF applies hidden_dropout_prob: after the embeddings and
// after each of the two residual branches' projections) draws from the model's generator;
// attention-probability dropout is not implemented (HF's default is 0).
// Parity: tests/reference/encoder_ref.py (plain PyTorch, same names) and
// tests/models/test_vit.cpp.
#pragma once
#include "brigade/core/rng.h"
#include "brigade/nn/layers.h"
#include "brigade/nn/tp_plan.h"

namespace brigade::models {

struct ViTConfig {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t num_channels = 3;
  int64_t hidden_size = 768;       // D
  int64_t num_hidden_layers = 12;  // L
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;  // MLP width
  int64_t num_labels = 1000;
  double layer_norm_eps = 1e-12;
  double hidden_dropout = 0.0;
  double initializer_range = 0.02;
  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  void validate() const;  // ConfigError naming the field
};

class ViTEmbeddings : public nn::Module {
 public:
  ViTEmbeddings(const ViTConfig& c, Generator* gen);
  Tensor forward(const Tensor& images) const;        // (N, C, H, W) -> (N, 1 + P, D)
  Tensor cls_token, position_embeddings;             // (1, 1, D), (1, 1 + P, D)
  std::shared_ptr<nn::Submodules> patch_embeddings;  // holds "projection"
  std::shared_ptr<nn::PatchEmbedding> projection;
  std::shared_ptr<nn::Dropout> dropout;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

// One pre-LN encoder layer: attention.attention (q, k, v), attention.output.dense,
// intermediate.dense, output.dense, layernorm_before, layernorm_after. An nn::Block: plans
// (ZeRO-3, activation recompute) reach it from outside; its dropout draws from the model's
// generator, which a recompute replays.
class ViTLayer : public nn::Block {
 public:
  ViTLayer(const ViTConfig& c, Generator* gen);
  Tensor forward(const Tensor& x) const;  // (N, S, D) -> (N, S, D), S = 1 + P; through Block::run
  std::shared_ptr<nn::Submodules> attention, attention_output, intermediate, output;
  std::shared_ptr<nn::EncoderSelfAttention> self_attention;  // attention.attention
  std::shared_ptr<nn::Linear> attention_dense, intermediate_dense, output_dense;
  std::shared_ptr<nn::LayerNorm> layernorm_before, layernorm_after;
  std::shared_ptr<nn::Dropout> dropout;

 private:
  Tensor body(const Tensor& x) const;
  Generator* gen_;  // the dropout generator (its state is replayed by a recompute)
};

class ViTModel : public nn::Module {
 public:
  ViTModel(const ViTConfig& c, Generator* gen);
  std::shared_ptr<ViTEmbeddings> embeddings;
  std::shared_ptr<nn::Submodules> encoder;  // holds "layer"
  std::shared_ptr<nn::ModuleList<ViTLayer>> layer;
  std::shared_ptr<nn::LayerNorm> layernorm;
};

class ViT : public nn::Module {
 public:
  explicit ViT(const ViTConfig& c);
  // Initialisation (documented, not bitwise HF): in registration order, every linear and
  // patch-projection weight, cls_token and position_embeddings ~ normal(0, initializer_range)
  // from `gen`; biases 0; LayerNorm weight 1, bias 0. HF draws trunc_normal_(std=0.02,
  // a=-2, b=2): the bounds are absolute (100 sigma), so the distribution is the same normal.
  void init_weights(Generator& gen);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> logits (N, num_labels)
  // The forward in pieces, for pipeline stages: forward(images) == head(run_blocks(embed(images), 0, L)).
  Tensor embed(const Tensor& images) const;                              // (N, C, H, W) -> (N, S, D)
  Tensor run_blocks(const Tensor& x, int64_t begin, int64_t end) const;  // layers [begin, end): (N, S, D)
  Tensor head(const Tensor& x) const;  // final LayerNorm, CLS token, classifier: (N, S, D) -> (N, num_labels)
  // The tensor-parallel plan (nn/tp_plan.h): in every encoder layer attention.attention.{query,
  // key, value} and intermediate.dense column-parallel, attention.output.dense and output.dense
  // row-parallel, the heads divided. The embeddings, the LayerNorms, the row-parallel biases and
  // the classifier are replicated: every rank computes them alike.
  static nn::TpPlan tp_plan();
  // Mean cross-entropy (0-d) of forward(images) against labels (N) i32/i64 in [0, num_labels).
  Tensor loss(const Tensor& images, const Tensor& labels) const;
  // Model FLOPs of one training step per image (forward + backward = 3x forward): the GEMMs
  // (2 per multiply-add: patch projection P*C*p*p*D, per layer S*(4 D^2 + 2 D F), the
  // classifier D*num_labels) plus attention's two S x S x D products per layer (4 S^2 D).
  double flops_per_image() const;
  const ViTConfig& config() const { return cfg_; }
  Generator& dropout_generator() { return gen_; }
  std::shared_ptr<ViTModel> vit;
  std::shared_ptr<nn::Linear> classifier;

 private:
  ViTConfig cfg_;
  Generator gen_;  // dropout masks
};

}  // namespace brigade::models
