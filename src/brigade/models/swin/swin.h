// Swin Transformer (Liu et al. 2021) as single-device model code with the parameter names and
// layouts of Hugging Face's SwinForImageClassification, so its safetensors load by name:
//   swin.embeddings.patch_embeddings.projection.{weight (D, C, p, p), bias (D)}
//   swin.embeddings.norm.{weight, bias}
//   swin.encoder.layers.{i}.blocks.{j}.layernorm_before.{weight, bias}
//   swin.encoder.layers.{i}.blocks.{j}.attention.self.relative_position_bias_table ((2ws-1)^2, NH)
//   swin.encoder.layers.{i}.blocks.{j}.attention.self.{query, key, value}.{weight, bias}
//   swin.encoder.layers.{i}.blocks.{j}.attention.output.dense.{weight, bias}
//   swin.encoder.layers.{i}.blocks.{j}.layernorm_after.{weight, bias}
//   swin.encoder.layers.{i}.blocks.{j}.intermediate.dense.{weight, bias}
//   swin.encoder.layers.{i}.blocks.{j}.output.dense.{weight, bias}
//   swin.encoder.layers.{i}.downsample.{reduction.weight (2C, 4C), norm.{weight, bias} (4C)}
//     (every stage but the last)
//   swin.layernorm.{weight, bias}, classifier.{weight, bias}
// HF's buffer relative_position_index is recomputed (ops::relative_position_index), not saved.
// Stage i works at resolution r_i = (image/patch) / 2^i with D_i = embed_dim * 2^i channels and
// num_heads[i] heads; block j of a stage shifts its windows by window_size/2 when j is odd,
// except (as HF's set_shift_and_window_size) where r_i <= window_size: then the window is the
// whole r_i x r_i grid and nothing shifts. Pre-LN blocks, exact (erf) GELU MLP of
// int(mlp_ratio * D_i), shifted-window attention with HF's -100.0 mask, patch merging
// (gather x0 x1 x2 x3, LayerNorm(4C), Linear(4C -> 2C, no bias)), final LayerNorm, mean
// over tokens, classifier. LayerNorm eps 1e-5 (HF's default). No dropout / drop path (HF's
// defaults are 0). Unlike HF, no padding: a window size that does not divide a stage's
// resolution is a ConfigError.
// Parity: tests/reference/swin_ref.py (plain PyTorch, same names), tests/models/test_swin.cpp.
#pragma once
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/nn/layers.h"

namespace brigade::models {

struct SwinConfig {
  int64_t image_size = 224;
  int64_t patch_size = 4;
  int64_t num_channels = 3;
  int64_t embed_dim = 96;
  std::vector<int64_t> depths = {2, 2, 6, 2};
  std::vector<int64_t> num_heads = {3, 6, 12, 24};
  int64_t window_size = 7;
  double mlp_ratio = 4.0;
  int64_t num_labels = 1000;
  double layer_norm_eps = 1e-5;
  double initializer_range = 0.02;
  int64_t num_stages() const { return int64_t(depths.size()); }
  int64_t resolution(int64_t stage) const { return (image_size / patch_size) >> stage; }
  int64_t dim(int64_t stage) const { return embed_dim << stage; }
  // The window of a stage: window_size, or the whole grid when the grid is not larger.
  int64_t stage_window(int64_t stage) const { return std::min(window_size, resolution(stage)); }
  int64_t stage_shift(int64_t stage) const { return resolution(stage) <= window_size ? 0 : window_size / 2; }
  int64_t num_features() const { return dim(num_stages() - 1); }
  void validate() const;  // ConfigError naming the field
};

// HF's SwinSelfAttention: relative_position_bias_table, query, key, value.
class SwinSelfAttention : public nn::Module {
 public:
  SwinSelfAttention(int64_t dim, int64_t n_head, int64_t ws);
  // windows (B*nW, N, D), mask (nW, N, N) or undefined -> context (B*nW, N, D).
  Tensor forward(const Tensor& windows, const Tensor& mask) const;
  Tensor relative_position_bias_table;  // ((2ws-1)^2, NH)
  Tensor relative_position_index;       // (N*N) i64, not a parameter
  std::shared_ptr<nn::Linear> query, key, value;
  int64_t n_head, window;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

// One Swin block (HF's SwinLayer) at a fixed resolution, window and shift. An nn::Block: plans
// (ZeRO-3, activation recompute) reach it from outside; a stage's patch merging stays outside
// any block. The body reads two constants built at construction (no gradient, fine to capture
// in a recompute): the shifted-window mask below and the attention's relative_position_index.
// No dropout: nothing to replay.
class SwinLayer : public nn::Block {
 public:
  SwinLayer(const SwinConfig& c, int64_t dim, int64_t n_head, int64_t resolution, int64_t window, int64_t shift);
  Tensor forward(const Tensor& x) const;  // (B, r*r, D) -> (B, r*r, D), through Block::run
  std::shared_ptr<nn::LayerNorm> layernorm_before, layernorm_after;
  std::shared_ptr<nn::Submodules> attention, attention_output, intermediate, output;
  std::shared_ptr<SwinSelfAttention> self_attention;  // attention.self
  std::shared_ptr<nn::Linear> attention_dense, intermediate_dense, output_dense;
  int64_t resolution, window, shift;
  Tensor attn_mask;  // (nW, N, N) of 0 / -100 when shift > 0, else undefined

 private:
  Tensor body(const Tensor& x) const;
};

// HF's SwinPatchMerging: (B, r*r, C) -> (B, (r/2)^2, 2C).
class SwinPatchMerging : public nn::Module {
 public:
  SwinPatchMerging(int64_t dim, int64_t resolution, double eps);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<nn::Linear> reduction;  // (2C, 4C), no bias
  std::shared_ptr<nn::LayerNorm> norm;    // 4C
  int64_t resolution;
};

class SwinStage : public nn::Module {
 public:
  SwinStage(const SwinConfig& c, int64_t stage);
  Tensor forward(const Tensor& x) const;  // (B, r*r, D) -> (B, r*r, D) or merged (B, (r/2)^2, 2D)
  std::shared_ptr<nn::ModuleList<SwinLayer>> blocks;
  std::shared_ptr<SwinPatchMerging> downsample;  // null in the last stage
};

class SwinEmbeddings : public nn::Module {
 public:
  explicit SwinEmbeddings(const SwinConfig& c);
  Tensor forward(const Tensor& images) const;        // (N, C, H, W) -> (N, P, D)
  std::shared_ptr<nn::Submodules> patch_embeddings;  // holds "projection"
  std::shared_ptr<nn::PatchEmbedding> projection;
  std::shared_ptr<nn::LayerNorm> norm;
  int64_t image_size;
};

class SwinModel : public nn::Module {
 public:
  explicit SwinModel(const SwinConfig& c);
  std::shared_ptr<SwinEmbeddings> embeddings;
  std::shared_ptr<nn::Submodules> encoder;  // holds "layers"
  std::shared_ptr<nn::ModuleList<SwinStage>> layers;
  std::shared_ptr<nn::LayerNorm> layernorm;
};

class Swin : public nn::Module {
 public:
  explicit Swin(const SwinConfig& c);
  // Initialisation (documented, HF's _init_weights, not bitwise): in registration order every
  // linear and patch-projection weight ~ normal(0, initializer_range) from `gen`; biases 0;
  // LayerNorm weight 1, bias 0; relative_position_bias_table 0 (HF zero-initialises it; the
  // original Swin draws trunc_normal(0.02)).
  void init_weights(Generator& gen);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> logits (N, num_labels)
  // Mean cross-entropy (0-d) of forward(images) against labels (N) i32/i64 in [0, num_labels).
  Tensor loss(const Tensor& images, const Tensor& labels) const;
  // Model FLOPs of one training step per image (3x forward, 2 per multiply-add): patch
  // projection P*C*p*p*D; per block at L tokens and dim d: L*(4 d^2 + 2 d M) GEMMs plus the
  // windowed attention's two products 2 L N d (N = window tokens); patch merging L*2 d^2
  // (its 4d -> 2d reduction over L/4 tokens); the classifier.
  double flops_per_image() const;
  const SwinConfig& config() const { return cfg_; }
  std::shared_ptr<SwinModel> swin;
  std::shared_ptr<nn::Linear> classifier;

 private:
  SwinConfig cfg_;
};

}  // namespace brigade::models
