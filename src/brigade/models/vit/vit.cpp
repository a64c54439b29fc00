// ViT forward, loss, init and FLOPs (see vit.h). Differentiable fn:: calls only.
#include "brigade/models/vit/vit.h"

#include "brigade/core/error.h"

namespace brigade::models {

namespace F = brigade::fn;

void ViTConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    BRIGADE_CHECK(v > 0, ConfigError, "ViTConfig: {} must be positive, got {}", name, v);
  };
  positive(image_size, "image_size");
  positive(patch_size, "patch_size");
  positive(num_channels, "num_channels");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(intermediate_size, "intermediate_size");
  positive(num_labels, "num_labels");
  BRIGADE_CHECK(image_size % patch_size == 0, ConfigError,
                "ViTConfig: image_size {} must be a multiple of patch_size {}", image_size, patch_size);
  BRIGADE_CHECK(hidden_size % num_attention_heads == 0, ConfigError,
                "ViTConfig: hidden_size {} must be divisible by num_attention_heads {}", hidden_size,
                num_attention_heads);
  BRIGADE_CHECK(hidden_dropout >= 0 && hidden_dropout < 1, ConfigError,
                "ViTConfig: hidden_dropout must be in [0, 1), got {}", hidden_dropout);
  BRIGADE_CHECK(layer_norm_eps > 0, ConfigError, "ViTConfig: layer_norm_eps must be positive, got {}", layer_norm_eps);
}

ViTEmbeddings::ViTEmbeddings(const ViTConfig& c, Generator* gen) {
  const int64_t D = c.hidden_size;
  cls_token = register_parameter("cls_token", {1, 1, D});
  position_embeddings = register_parameter("position_embeddings", {1, 1 + c.num_patches(), D});
  patch_embeddings = register_module("patch_embeddings", std::make_shared<nn::Submodules>());
  projection =
      patch_embeddings->add("projection", std::make_shared<nn::PatchEmbedding>(c.num_channels, D, c.patch_size));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout, gen));
}

void ViTEmbeddings::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "cls_token") cls_token = t;
  if (name == "position_embeddings") position_embeddings = t;
}

Tensor ViTEmbeddings::forward(const Tensor& images) const {
  const int64_t S = position_embeddings.size(1);
  BRIGADE_CHECK(images.dim() == 4 && images.size(1) == projection->in_channels &&
                    (images.size(2) / projection->patch) * (images.size(3) / projection->patch) == S - 1,
                ShapeError, "ViT.forward: images must be (N, C={}, H, W) with {} patches of {}x{}, got {}",
                projection->in_channels, S - 1, projection->patch, projection->patch, shape_str(images.shape()));
  const Tensor patches = projection->forward(images);       // (N, P, D)
  const Tensor x = F::prepend_token(cls_token, patches);    // (N, S, D)
  return dropout->forward(F::add(x, position_embeddings));  // (N, S, D)
}

ViTLayer::ViTLayer(const ViTConfig& c, Generator* gen) : gen_(gen) {
  const int64_t D = c.hidden_size, M = c.intermediate_size;
  attention = register_module("attention", std::make_shared<nn::Submodules>());
  self_attention = attention->add("attention", std::make_shared<nn::EncoderSelfAttention>(D, c.num_attention_heads));
  attention_output = attention->add("output", std::make_shared<nn::Submodules>());
  attention_dense = attention_output->add("dense", std::make_shared<nn::Linear>(D, D));
  intermediate = register_module("intermediate", std::make_shared<nn::Submodules>());
  intermediate_dense = intermediate->add("dense", std::make_shared<nn::Linear>(D, M));
  output = register_module("output", std::make_shared<nn::Submodules>());
  output_dense = output->add("dense", std::make_shared<nn::Linear>(M, D));
  layernorm_before = register_module("layernorm_before", std::make_shared<nn::LayerNorm>(D, c.layer_norm_eps));
  layernorm_after = register_module("layernorm_after", std::make_shared<nn::LayerNorm>(D, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout, gen));
}

Tensor ViTLayer::body(const Tensor& x0) const {
  const Tensor a = self_attention->forward(layernorm_before->forward(x0));                 // (N, S, D)
  const Tensor x = F::add(x0, dropout->forward(attention_dense->forward(a)));              // (N, S, D)
  const Tensor h = F::gelu_erf(intermediate_dense->forward(layernorm_after->forward(x)));  // (N, S, M)
  return F::add(x, dropout->forward(output_dense->forward(h)));                            // (N, S, D)
}

Tensor ViTLayer::forward(const Tensor& x) const {
  return run(
      {x}, [this](const std::vector<Tensor>& in) { return body(in[0]); }, gen_);  // (N, S, D)
}

ViTModel::ViTModel(const ViTConfig& c, Generator* gen) {
  embeddings = register_module("embeddings", std::make_shared<ViTEmbeddings>(c, gen));
  encoder = register_module("encoder", std::make_shared<nn::Submodules>());
  layer = encoder->add("layer", std::make_shared<nn::ModuleList<ViTLayer>>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layer->push_back(std::make_shared<ViTLayer>(c, gen));
  layernorm = register_module("layernorm", std::make_shared<nn::LayerNorm>(c.hidden_size, c.layer_norm_eps));
}

ViT::ViT(const ViTConfig& c) : cfg_(c) {
  cfg_.validate();
  vit = register_module("vit", std::make_shared<ViTModel>(cfg_, &gen_));
  classifier = register_module("classifier", std::make_shared<nn::Linear>(cfg_.hidden_size, cfg_.num_labels));
  name_parameters();
}

void ViT::init_weights(Generator& g) {
  const double std = cfg_.initializer_range;
  for (auto& [name, p] : named_parameters()) {
    const bool is_ln = name.find("layernorm") != std::string::npos;
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_ln && !is_bias)
      p.fill_(1.0);
    else if (is_bias)
      p.zero_();
    else
      g.normal_(p, 0.0, std);  // weights, cls_token, position_embeddings
  }
}

Tensor ViT::forward(const Tensor& images) const {
  return head(run_blocks(embed(images), 0, cfg_.num_hidden_layers));  // (N, num_labels)
}

Tensor ViT::embed(const Tensor& images) const { return vit->embeddings->forward(images); }  // (N, S, D)

Tensor ViT::run_blocks(const Tensor& x0, int64_t begin, int64_t end) const {
  BRIGADE_CHECK(0 <= begin && begin <= end && end <= cfg_.num_hidden_layers, ValueError,
                "ViT.run_blocks: layers [{}, {}) outside [0, {})", begin, end, cfg_.num_hidden_layers);
  Tensor x = x0;
  for (int64_t i = begin; i < end; ++i) x = (*vit->layer)[size_t(i)].forward(x);  // (N, S, D)
  return x;
}

Tensor ViT::head(const Tensor& x0) const {
  const Tensor x = vit->layernorm->forward(x0);                                         // (N, S, D)
  const Tensor cls = F::reshape(F::narrow(x, 1, 0, 1), {x.size(0), cfg_.hidden_size});  // (N, D)
  return classifier->forward(cls);                                                      // (N, num_labels)
}

nn::TpPlan ViT::tp_plan() {
  using nn::TpStyle;
  return {{{"vit.encoder.layer.*.attention.attention", TpStyle::Heads},
           {"vit.encoder.layer.*.attention.attention.query", TpStyle::Column},
           {"vit.encoder.layer.*.attention.attention.key", TpStyle::Column},
           {"vit.encoder.layer.*.attention.attention.value", TpStyle::Column},
           {"vit.encoder.layer.*.attention.output.dense", TpStyle::Row},
           {"vit.encoder.layer.*.intermediate.dense", TpStyle::Column},
           {"vit.encoder.layer.*.output.dense", TpStyle::Row}}};
}

Tensor ViT::loss(const Tensor& images, const Tensor& labels) const {
  BRIGADE_CHECK(labels.dim() == 1 && images.dim() >= 1 && labels.size(0) == images.size(0), ShapeError,
                "ViT.loss: labels must be (N) for images {}, got {}", shape_str(images.shape()),
                shape_str(labels.shape()));
  return F::cross_entropy(forward(images), labels, -100);  // 0-d
}

double ViT::flops_per_image() const {
  const double D = double(cfg_.hidden_size), M = double(cfg_.intermediate_size), L = double(cfg_.num_hidden_layers);
  const double P = double(cfg_.num_patches()), S = P + 1, p = double(cfg_.patch_size);
  const double gemm =
      P * double(cfg_.num_channels) * p * p * D + S * L * (4 * D * D + 2 * D * M) + D * double(cfg_.num_labels);
  const double attn = L * 2 * S * S * D;  // q k^T and p v, multiply-adds per image
  return 3.0 * 2.0 * (gemm + attn);
}

}  // namespace brigade::models
