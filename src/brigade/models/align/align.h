// ALIGN (Jia et al. 2021, "Scaling Up Visual and Vision-Language Representation Learning With
// Noisy Text Supervision") as single-device model code with the parameter and buffer names of
// Hugging Face's AlignModel, so its safetensors load by name:
//   vision_model.embeddings.{convolution.weight (C0, num_channels, 3, 3), batchnorm.*}
//   vision_model.encoder.blocks.{i}.expansion.{expand_conv.weight, expand_bn.*}  (expanding blocks)
//     .depthwise_conv.{depthwise_conv.weight (Ce, 1, k, k), depthwise_norm.*}
//     .squeeze_excite.{reduce, expand}.{weight (., ., 1, 1), bias}
//     .projection.{project_conv.weight, project_bn.*}
//   text_model.* (a BERT encoder: models/bert's BERTModel names), text_projection.{weight, bias},
//   temperature (0-d). BatchNorm "*" = weight, bias and the buffers running_mean, running_var,
//   num_batches_tracked.
// HF's AlignTextModel also holds a pooler (text_model.pooler.dense) that AlignModel never uses;
// it is left out here, and dropped when an HF checkpoint is read.
//
// Image tower: EfficientNet without its top conv. The stem pads (0, 1, 0, 1) (left, right, top,
// bottom) and runs a 3x3 stride-2 conv to round_filters(32) channels, BatchNorm, swish. Stage i
// of HF's lists (kernel_sizes, in_channels, out_channels, strides, num_block_repeats,
// expand_ratios) has ceil(depth_coefficient * num_block_repeats[i]) MBConv blocks; its channel
// counts pass through round_filters (width_coefficient, depth_divisor). Block j of a stage:
//   expansion (expand_ratio != 1): 1x1 conv (no bias) to in * expand_ratio, BatchNorm, swish;
//   depthwise_conv: k x k depthwise conv (no bias), stride strides[i] for j == 0 else 1; a
//     stride-2 conv pads HF's correct_pad (k/2 - 1, k/2) on (left, right) and (top, bottom), or
//     k/2 on every side when the block's index is listed in depthwise_padding; a stride-1 conv
//     pads "same". BatchNorm, swish;
//   squeeze_excite: the spatial mean, a 1x1 conv with bias to max(1, int(in *
//     squeeze_expansion_ratio)) channels (from the block's INPUT width, HF's rule), swish, a 1x1
//     conv with bias back, sigmoid, times the block's activations;
//   projection: 1x1 conv (no bias) to out, BatchNorm; plus the block's input when j > 0 and the
//     stride is 1 (HF: stride == 1 and not id_skip), after dropout with p = drop_connect_rate *
//     block_index / num_blocks (HF uses plain dropout there, not drop-path).
// BatchNorm momentum as HF passes it to torch: batch_norm_momentum (default 0.99, so the
// running statistics are 0.01 old + 0.99 batch) for the stem, depthwise and projection norms,
// and torch's default 0.1 for expand_bn, to which HF passes none. Eps batch_norm_eps.
// The image embedding is the global mean of the last block's output (HF's AvgPool2d(hidden_dim,
// ceil_mode=True), a global mean whenever hidden_dim >= the final feature map's side: checked),
// with no projection: its width round_filters(out_channels.back()) must equal projection_dim.
// Text tower: BERT (post-LN, exact GELU), attention over the tokens before `lengths`, feature at
// position 0 (the start token), then text_projection (with bias).
// Both embeddings are L2-normalised; logits_per_text = text @ image^T / temperature and the loss
// is the mean of both directions' cross-entropy with label smoothing 0.1 (HF's align_loss).
// HF leaves the temperature free; the contrastive task clamps it at >= 0.01 after each update
// (train/tasks/contrastive.cpp), the bound CLIP puts on its logit scale (100).
// Parity: tests/reference/align_ref.py (plain PyTorch, same names) and tests/models/test_align.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/models/bert/bert.h"
#include "brigade/models/dual_encoder.h"
#include "brigade/nn/conv.h"
#include "brigade/nn/layers.h"
#include "brigade/nn/norm.h"

namespace brigade::models {

// HF AlignVisionConfig's fields and defaults (EfficientNet-B7 at 600 px).
struct AlignVisionConfig {
  int64_t num_channels = 3;
  int64_t image_size = 600;
  double width_coefficient = 2.0;
  double depth_coefficient = 3.1;
  int64_t depth_divisor = 8;
  std::vector<int64_t> kernel_sizes = {3, 3, 5, 3, 5, 5, 3};
  std::vector<int64_t> in_channels = {32, 16, 24, 40, 80, 112, 192};
  std::vector<int64_t> out_channels = {16, 24, 40, 80, 112, 192, 320};
  std::vector<int64_t> depthwise_padding = {};  // block indices whose stride-2 conv pads symmetrically
  std::vector<int64_t> strides = {1, 2, 2, 2, 1, 2, 1};
  std::vector<int64_t> num_block_repeats = {1, 2, 2, 3, 3, 4, 1};
  std::vector<int64_t> expand_ratios = {1, 6, 6, 6, 6, 6, 6};
  double squeeze_expansion_ratio = 0.25;
  std::string hidden_act = "swish";  // the only one supported (HF's default)
  int64_t hidden_dim = 2560;         // the pooler's window (>= the final map's side: a global mean)
  std::string pooling_type = "mean";
  double initializer_range = 0.02;
  double batch_norm_eps = 1e-3;
  double batch_norm_momentum = 0.99;
  double drop_connect_rate = 0.2;

  int64_t round_filters(int64_t channels) const;  // HF's round_filters
  int64_t round_repeats(int64_t repeats) const;   // ceil(depth_coefficient * repeats)
  int64_t stem_channels() const { return round_filters(32); }
  int64_t embed_dim() const { return round_filters(out_channels.back()); }  // the pooled width
};

// One MBConv block's geometry, as HF's AlignVisionEncoder derives it.
struct AlignBlockSpec {
  int64_t in = 0, out = 0, expanded = 0, kernel = 0, stride = 1, se = 0;
  ops::Conv2dParams depthwise;  // stride, padding per side, groups = expanded
  bool expand = false, residual = false;
  double drop_rate = 0.0;
};
std::vector<AlignBlockSpec> align_blocks(const AlignVisionConfig& c);
// The side of the final feature map for `image_size` (stem and every block's depthwise conv).
int64_t align_final_side(const AlignVisionConfig& c);

struct AlignConfig {
  BERTConfig text;  // HF AlignTextConfig: BERT's fields
  AlignVisionConfig vision;
  int64_t projection_dim = 640;
  double temperature_init_value = 1.0;
  void validate() const;  // ConfigError naming the field
  // HF's AlignConfig JSON ({"text_config": {...}, "vision_config": {...}, "projection_dim",
  // "temperature_init_value", "model_type": "align"}): what checkpoints carry and the reference
  // (tests/reference/align_ref.py) reads. from_json takes the fields this model uses (missing ones
  // keep HF's defaults) and refuses a dropout it does not run: ConfigError naming the field.
  std::string to_json() const;
  static AlignConfig from_json(const std::string& text);
};

class AlignVisionEmbeddings : public nn::Module {
 public:
  explicit AlignVisionEmbeddings(const AlignVisionConfig& c);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> (N, C0, H', W')
  std::shared_ptr<nn::Conv2d> convolution;
  std::shared_ptr<nn::BatchNorm2d> batchnorm;
};

// An MBConv block, an nn::Block: plans (ZeRO-3, activation recompute) reach it from outside.
class AlignVisionBlock : public nn::Block {
 public:
  AlignVisionBlock(const AlignBlockSpec& s, const AlignVisionConfig& c, Generator* gen);
  Tensor forward(const Tensor& x) const;  // (N, in, H, W) -> (N, out, H', W'), through Block::run
  AlignBlockSpec spec;
  std::shared_ptr<nn::Submodules> expansion, depthwise_conv, squeeze_excite, projection;
  std::shared_ptr<nn::Conv2d> expand_conv, depthwise, reduce, expand_se,
      project_conv;  // expand_conv null without expansion
  std::shared_ptr<nn::BatchNorm2d> expand_bn, depthwise_norm, project_bn;
  std::shared_ptr<nn::Dropout> dropout;  // on the residual branch (residual blocks with drop_rate > 0)

 private:
  Tensor body(const Tensor& x) const;
  Generator* gen_;
};

class AlignVisionModel : public nn::Module {
 public:
  AlignVisionModel(const AlignVisionConfig& c, Generator* gen);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> pooled (N, embed_dim)
  std::shared_ptr<AlignVisionEmbeddings> embeddings;
  std::shared_ptr<nn::Submodules> encoder;  // holds "blocks"
  std::shared_ptr<nn::ModuleList<AlignVisionBlock>> blocks;
};

class ALIGN : public DualEncoder {
 public:
  explicit ALIGN(const AlignConfig& c);
  // Initialisation (HF AlignPreTrainedModel's distributions, drawn from `gen` in parameter
  // order; not HF's draw order): conv, linear and embedding weights ~ normal(0,
  // vision.initializer_range for the image tower, text.initializer_range for the text tower),
  // biases 0, BatchNorm and LayerNorm weights 1, text_projection.weight xavier-uniform,
  // temperature = temperature_init_value. Buffers: running_mean 0, running_var 1, count 0.
  void init_weights(Generator& gen);

  // (N, C, H, W) -> (N, E), unit rows. Training mode (BatchNorm batch statistics) unless
  // is_training() is false.
  Tensor encode_image(const Tensor& images) const override;
  // ids (M, T) [start, ..., end, pad...] and lengths (M): attention over the first lengths[b]
  // tokens, feature at position 0 -> (M, E), unit rows.
  Tensor encode_text(const Tensor& ids, const Tensor& lengths) const override;
  // image_embeds @ text_embeds^T / temperature: (N, M), HF's logits_per_image.
  Tensor logits_from_embeds(const Tensor& image_embeds, const Tensor& text_embeds) const override;
  Tensor logits_with_scale(const Tensor& image_embeds, const Tensor& text_embeds, const Tensor& scale) const override;
  // HF's align_loss: (CE_0.1(logits_per_text, arange) + CE_0.1(logits_per_image, arange)) / 2.
  Tensor contrastive_loss_from_logits(const Tensor& logits_per_image) const override;
  Tensor& scale_parameter() override { return temperature; }
  const Tensor& scale_parameter() const override { return temperature; }
  std::string scale_name() const override { return "temperature"; }
  double clamp_scale(double t) const override { return t < kMinTemperature ? kMinTemperature : t; }
  int64_t embed_dim() const override { return cfg_.projection_dim; }
  // Model FLOPs of one training step per pair (3x the forward's 2 per multiply-add): every
  // convolution at its output size (the depthwise ones k^2 per output element, the SE convs on
  // 1x1 maps), the BERT text tower's GEMMs and attention at T = max_position_embeddings, and the
  // text projection. BatchNorm, activations and the N x N logits are left out.
  double flops_per_pair() const override;
  std::string describe() const override;
  // BatchNorm buffers under HF names ("vision_model.embeddings.batchnorm.running_mean", ...).
  nn::NamedTensors named_buffers() const override { return nn::batch_norm_buffers(*this); }
  Generator& dropout_generator() { return gen_; }
  const AlignConfig& config() const { return cfg_; }

  static constexpr double kMinTemperature = 0.01;
  std::shared_ptr<BERTModel> text_model;
  std::shared_ptr<AlignVisionModel> vision_model;
  std::shared_ptr<nn::Linear> text_projection;
  Tensor temperature;  // 0-d

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;

 private:
  AlignConfig cfg_;
  Generator gen_;  // dropout masks
};

}  // namespace brigade::models
