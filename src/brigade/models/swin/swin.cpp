// Swin forward, loss, init and FLOPs (see swin.h). Differentiable fn:: calls only.
#include "brigade/models/swin/swin.h"

#include <cmath>

#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::models {

namespace F = brigade::fn;

void SwinConfig::validate() const {
  auto positive = [](int64_t v, const std::string& name) {
    BRIGADE_CHECK(v > 0, ConfigError, "SwinConfig: {} must be positive, got {}", name, v);
  };
  positive(image_size, "image_size");
  positive(patch_size, "patch_size");
  positive(num_channels, "num_channels");
  positive(embed_dim, "embed_dim");
  positive(window_size, "window_size");
  positive(num_labels, "num_labels");
  BRIGADE_CHECK(!depths.empty() && depths.size() == num_heads.size(), ConfigError,
                "SwinConfig: depths and num_heads must be non-empty and of the same length (one per stage), got {} "
                "and {}",
                depths.size(), num_heads.size());
  BRIGADE_CHECK(image_size % patch_size == 0, ConfigError,
                "SwinConfig: image_size {} must be a multiple of patch_size {}", image_size, patch_size);
  BRIGADE_CHECK(mlp_ratio > 0, ConfigError, "SwinConfig: mlp_ratio must be positive, got {}", mlp_ratio);
  BRIGADE_CHECK(layer_norm_eps > 0, ConfigError, "SwinConfig: layer_norm_eps must be positive, got {}", layer_norm_eps);
  for (int64_t s = 0; s < num_stages(); ++s) {
    positive(depths[size_t(s)], "depths[" + std::to_string(s) + "]");
    positive(num_heads[size_t(s)], "num_heads[" + std::to_string(s) + "]");
    const int64_t r = resolution(s);
    if (s > 0)
      BRIGADE_CHECK(resolution(s - 1) % 2 == 0 && r > 0, ConfigError,
                    "SwinConfig: stage {} merges patches of a {}x{} grid, which must be even (image_size / "
                    "patch_size / 2^stage)",
                    s - 1, resolution(s - 1), resolution(s - 1));
    BRIGADE_CHECK(r % stage_window(s) == 0, ConfigError,
                  "SwinConfig: window_size {} must divide stage {}'s {}x{} grid (no padding is implemented)",
                  window_size, s, r, r);
    BRIGADE_CHECK(dim(s) % num_heads[size_t(s)] == 0, ConfigError,
                  "SwinConfig: stage {}'s dimension {} must be divisible by num_heads[{}] = {}", s, dim(s), s,
                  num_heads[size_t(s)]);
  }
}

// ------------------------------------------------------------------ attention

SwinSelfAttention::SwinSelfAttention(int64_t dim, int64_t n_head_, int64_t ws) : n_head(n_head_), window(ws) {
  relative_position_bias_table =
      register_parameter("relative_position_bias_table", {(2 * ws - 1) * (2 * ws - 1), n_head});
  query = register_module("query", std::make_shared<nn::Linear>(dim, dim));
  key = register_module("key", std::make_shared<nn::Linear>(dim, dim));
  value = register_module("value", std::make_shared<nn::Linear>(dim, dim));
  relative_position_index = ops::relative_position_index(ws);  // (N*N) i64
}

void SwinSelfAttention::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "relative_position_bias_table") relative_position_bias_table = t;
}

Tensor SwinSelfAttention::forward(const Tensor& x, const Tensor& mask) const {
  const int64_t BW = x.size(0), N = x.size(1), D = x.size(2), HS = D / n_head;
  auto heads = [&](const Tensor& t) {  // (BW, N, D) -> (BW, NH, N, HS)
    return F::transpose(F::reshape(t, {BW, N, n_head, HS}), 1, 2);
  };
  const Tensor q = heads(query->forward(x)), k = heads(key->forward(x)), v = heads(value->forward(x));
  const Tensor bias = F::relative_position_bias(relative_position_bias_table, relative_position_index);  // (NH, N, N)
  const Tensor ctx =
      F::attention(q, k, v, F::AttentionMask::additive(bias, mask), 1.0 / std::sqrt(double(HS)));  // (BW, NH, N, HS)
  return F::reshape(F::transpose(ctx, 1, 2), {BW, N, D});                                          // (BW, N, D)
}

// ------------------------------------------------------------------ block

SwinLayer::SwinLayer(const SwinConfig& c, int64_t D, int64_t n_head, int64_t r, int64_t ws, int64_t s)
    : resolution(r), window(ws), shift(s) {
  const int64_t M = int64_t(c.mlp_ratio * double(D));
  layernorm_before = register_module("layernorm_before", std::make_shared<nn::LayerNorm>(D, c.layer_norm_eps));
  attention = register_module("attention", std::make_shared<nn::Submodules>());
  self_attention = attention->add("self", std::make_shared<SwinSelfAttention>(D, n_head, ws));
  attention_output = attention->add("output", std::make_shared<nn::Submodules>());
  attention_dense = attention_output->add("dense", std::make_shared<nn::Linear>(D, D));
  layernorm_after = register_module("layernorm_after", std::make_shared<nn::LayerNorm>(D, c.layer_norm_eps));
  intermediate = register_module("intermediate", std::make_shared<nn::Submodules>());
  intermediate_dense = intermediate->add("dense", std::make_shared<nn::Linear>(D, M));
  output = register_module("output", std::make_shared<nn::Submodules>());
  output_dense = output->add("dense", std::make_shared<nn::Linear>(M, D));
  if (shift > 0) attn_mask = ops::swin_shift_mask(r, r, ws, shift);  // (nW, N, N)
}

Tensor SwinLayer::body(const Tensor& x0) const {
  const int64_t B = x0.size(0), L = x0.size(1), D = x0.size(2), r = resolution;
  BRIGADE_CHECK(L == r * r, ShapeError, "SwinLayer.forward: x must be (B, {}, D) for a {}x{} grid, got {}", r * r, r, r,
                shape_str(x0.shape()));
  Tensor h = F::reshape(layernorm_before->forward(x0), {B, r, r, D});  // (B, r, r, D)
  if (shift > 0) h = F::roll2d(h, -shift, -shift);
  const Tensor win = F::window_partition(h, window);                                   // (B*nW, N, D)
  const Tensor a = attention_dense->forward(self_attention->forward(win, attn_mask));  // (B*nW, N, D)
  Tensor back = F::window_reverse(a, window, r, r);                                    // (B, r, r, D)
  if (shift > 0) back = F::roll2d(back, shift, shift);
  const Tensor x = F::add(x0, F::reshape(back, {B, L, D}));                                // (B, L, D)
  const Tensor m = F::gelu_erf(intermediate_dense->forward(layernorm_after->forward(x)));  // (B, L, M)
  return F::add(x, output_dense->forward(m));                                              // (B, L, D)
}

Tensor SwinLayer::forward(const Tensor& x) const {
  return run({x}, [this](const std::vector<Tensor>& in) { return body(in[0]); });  // (B, L, D); no dropout
}

// ------------------------------------------------------------------ patch merging

SwinPatchMerging::SwinPatchMerging(int64_t D, int64_t r, double eps) : resolution(r) {
  reduction = register_module("reduction", std::make_shared<nn::Linear>(4 * D, 2 * D, false));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(4 * D, eps));
}

Tensor SwinPatchMerging::forward(const Tensor& x) const {
  const int64_t B = x.size(0), D = x.size(2), r = resolution;
  const Tensor g = F::patch_merge(F::reshape(x, {B, r, r, D}));  // (B, (r/2)^2, 4D)
  return reduction->forward(norm->forward(g));                   // (B, (r/2)^2, 2D)
}

// ------------------------------------------------------------------ stages, embeddings, model

SwinStage::SwinStage(const SwinConfig& c, int64_t s) {
  blocks = register_module("blocks", std::make_shared<nn::ModuleList<SwinLayer>>());
  const int64_t r = c.resolution(s), ws = c.stage_window(s), shift = c.stage_shift(s);
  for (int64_t j = 0; j < c.depths[size_t(s)]; ++j)
    blocks->push_back(std::make_shared<SwinLayer>(c, c.dim(s), c.num_heads[size_t(s)], r, ws, j % 2 ? shift : 0));
  if (s + 1 < c.num_stages())
    downsample = register_module("downsample", std::make_shared<SwinPatchMerging>(c.dim(s), r, c.layer_norm_eps));
}

Tensor SwinStage::forward(const Tensor& x0) const {
  Tensor x = x0;
  for (const auto& b : *blocks) x = b->forward(x);
  return downsample ? downsample->forward(x) : x;
}

SwinEmbeddings::SwinEmbeddings(const SwinConfig& c) : image_size(c.image_size) {
  patch_embeddings = register_module("patch_embeddings", std::make_shared<nn::Submodules>());
  projection = patch_embeddings->add("projection",
                                     std::make_shared<nn::PatchEmbedding>(c.num_channels, c.embed_dim, c.patch_size));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(c.embed_dim, c.layer_norm_eps));
}

Tensor SwinEmbeddings::forward(const Tensor& images) const {
  BRIGADE_CHECK(images.dim() == 4 && images.size(1) == projection->in_channels && images.size(2) == image_size &&
                    images.size(3) == image_size,
                ShapeError, "Swin.forward: images must be (N, C={}, {}, {}), got {}", projection->in_channels,
                image_size, image_size, shape_str(images.shape()));
  return norm->forward(projection->forward(images));  // (N, P, D)
}

SwinModel::SwinModel(const SwinConfig& c) {
  embeddings = register_module("embeddings", std::make_shared<SwinEmbeddings>(c));
  encoder = register_module("encoder", std::make_shared<nn::Submodules>());
  layers = encoder->add("layers", std::make_shared<nn::ModuleList<SwinStage>>());
  for (int64_t s = 0; s < c.num_stages(); ++s) layers->push_back(std::make_shared<SwinStage>(c, s));
  layernorm = register_module("layernorm", std::make_shared<nn::LayerNorm>(c.num_features(), c.layer_norm_eps));
}

Swin::Swin(const SwinConfig& c) : cfg_(c) {
  cfg_.validate();
  swin = register_module("swin", std::make_shared<SwinModel>(cfg_));
  classifier = register_module("classifier", std::make_shared<nn::Linear>(cfg_.num_features(), cfg_.num_labels));
  name_parameters();
}

void Swin::init_weights(Generator& g) {
  const double std = cfg_.initializer_range;
  auto has = [](const std::string& s, const char* sub) { return s.find(sub) != std::string::npos; };
  for (auto& [name, p] : named_parameters()) {
    const bool is_ln = has(name, "layernorm") || has(name, ".norm.");
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_ln && !is_bias)
      p.fill_(1.0);
    else if (is_bias || has(name, "relative_position_bias_table"))
      p.zero_();
    else
      g.normal_(p, 0.0, std);  // linear and patch-projection weights
  }
}

Tensor Swin::forward(const Tensor& images) const {
  Tensor x = swin->embeddings->forward(images);           // (N, P, D)
  for (const auto& s : *swin->layers) x = s->forward(x);  // (N, L, D_last)
  x = swin->layernorm->forward(x);                        // (N, L, D_last)
  const int64_t N = x.size(0), L = x.size(1), D = x.size(2);
  const Tensor avg = Tensor::full({1, 1, L}, 1.0 / double(L), x.dtype());  // mean over tokens
  const Tensor pooled = F::reshape(F::matmul(avg, x), {N, D});             // (N, D)
  return classifier->forward(pooled);                                      // (N, num_labels)
}

Tensor Swin::loss(const Tensor& images, const Tensor& labels) const {
  BRIGADE_CHECK(labels.dim() == 1 && images.dim() >= 1 && labels.size(0) == images.size(0), ShapeError,
                "Swin.loss: labels must be (N) for images {}, got {}", shape_str(images.shape()),
                shape_str(labels.shape()));
  return F::cross_entropy(forward(images), labels, -100);  // 0-d
}

double Swin::flops_per_image() const {
  const double p = double(cfg_.patch_size), P = double(cfg_.resolution(0) * cfg_.resolution(0));
  double macs = P * double(cfg_.num_channels) * p * p * double(cfg_.embed_dim);
  for (int64_t s = 0; s < cfg_.num_stages(); ++s) {
    const double r = double(cfg_.resolution(s)), L = r * r, d = double(cfg_.dim(s));
    const double M = double(int64_t(cfg_.mlp_ratio * d)), Nw = double(cfg_.stage_window(s) * cfg_.stage_window(s));
    macs += double(cfg_.depths[size_t(s)]) * (L * (4 * d * d + 2 * d * M) + 2 * L * Nw * d);
    if (s + 1 < cfg_.num_stages()) macs += L * 2 * d * d;  // (L/4) tokens x (4d -> 2d)
  }
  macs += double(cfg_.num_features()) * double(cfg_.num_labels);
  return 3.0 * 2.0 * macs;
}

}  // namespace brigade::models
