// CLIP towers, embeddings, contrastive loss, zero-shot prediction, init and FLOPs (see clip.h).
// Differentiable fn:: calls only.
#include "brigade/models/clip/clip.h"

#include <initializer_list>
#include <utility>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"

namespace brigade::models {

namespace F = brigade::fn;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

void CLIPConfig::validate() const {
  // The sizes that must be positive, by tower, in this order (the first bad one is reported).
  using Sizes = std::initializer_list<std::pair<int64_t, const char*>>;
  const auto positive = [](const char* tower, Sizes sizes) {
    for (const auto& [v, name] : sizes)
      BRIGADE_CHECK(v > 0, ConfigError, "CLIPConfig: {}{} must be positive, got {}", tower, name, v);
  };
  positive("text.", {{text.vocab_size, "vocab_size"},
                     {text.max_position_embeddings, "max_position_embeddings"},
                     {text.hidden_size, "hidden_size"},
                     {text.num_hidden_layers, "num_hidden_layers"},
                     {text.num_attention_heads, "num_attention_heads"},
                     {text.intermediate_size, "intermediate_size"}});
  positive("vision.", {{vision.image_size, "image_size"},
                       {vision.patch_size, "patch_size"},
                       {vision.num_channels, "num_channels"},
                       {vision.hidden_size, "hidden_size"},
                       {vision.num_hidden_layers, "num_hidden_layers"},
                       {vision.num_attention_heads, "num_attention_heads"},
                       {vision.intermediate_size, "intermediate_size"}});
  positive("", {{projection_dim, "projection_dim"}});
  BRIGADE_CHECK(text.hidden_size % text.num_attention_heads == 0, ConfigError,
                "CLIPConfig: text.hidden_size {} must be divisible by text.num_attention_heads {}", text.hidden_size,
                text.num_attention_heads);
  BRIGADE_CHECK(vision.hidden_size % vision.num_attention_heads == 0, ConfigError,
                "CLIPConfig: vision.hidden_size {} must be divisible by vision.num_attention_heads {}",
                vision.hidden_size, vision.num_attention_heads);
  BRIGADE_CHECK(vision.image_size % vision.patch_size == 0, ConfigError,
                "CLIPConfig: vision.image_size {} must be a multiple of vision.patch_size {}", vision.image_size,
                vision.patch_size);
  BRIGADE_CHECK(text.layer_norm_eps > 0 && vision.layer_norm_eps > 0, ConfigError,
                "CLIPConfig: layer_norm_eps must be positive (text {}, vision {})", text.layer_norm_eps,
                vision.layer_norm_eps);
  BRIGADE_CHECK(hidden_act == "quick_gelu" || hidden_act == "gelu", ConfigError,
                "CLIPConfig: hidden_act must be \"quick_gelu\" or \"gelu\", got \"{}\"", hidden_act);
  BRIGADE_CHECK(std::isfinite(logit_scale_init_value), ConfigError,
                "CLIPConfig: logit_scale_init_value must be finite, got {}", logit_scale_init_value);
  BRIGADE_CHECK(initializer_range > 0, ConfigError, "CLIPConfig: initializer_range must be positive, got {}",
                initializer_range);
}

// ---------------------------------------------------------------- layers

CLIPAttention::CLIPAttention(int64_t D, int64_t n_head) : n_head(n_head) {
  k_proj = register_module("k_proj", std::make_shared<nn::Linear>(D, D));
  v_proj = register_module("v_proj", std::make_shared<nn::Linear>(D, D));
  q_proj = register_module("q_proj", std::make_shared<nn::Linear>(D, D));
  out_proj = register_module("out_proj", std::make_shared<nn::Linear>(D, D));
}

Tensor CLIPAttention::forward(const Tensor& x, bool causal) const {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2), HS = D / n_head;
  auto heads = [&](const Tensor& y) {  // (B, T, D) -> (B, NH, T, HS) view
    return F::transpose(F::reshape(y, {B, T, n_head, HS}), 1, 2);
  };
  const Tensor q = heads(q_proj->forward(x));  // (B, NH, T, HS)
  const Tensor k = heads(k_proj->forward(x));  // (B, NH, T, HS)
  const Tensor v = heads(v_proj->forward(x));  // (B, NH, T, HS)
  const Tensor o = F::attention(
      q, k, v, causal ? F::AttentionMask::causal() : F::AttentionMask{});  // (B, NH, T, HS), scale 1/sqrt(HS)
  return out_proj->forward(F::reshape(F::transpose(o, 1, 2), {B, T, D}));  // (B, T, D)
}

CLIPMLP::CLIPMLP(int64_t D, int64_t M, bool quick_gelu) : quick_gelu(quick_gelu) {
  fc1 = register_module("fc1", std::make_shared<nn::Linear>(D, M));
  fc2 = register_module("fc2", std::make_shared<nn::Linear>(M, D));
}

Tensor CLIPMLP::forward(const Tensor& x) const {
  const Tensor h = fc1->forward(x);                                     // (B, T, M)
  return fc2->forward(quick_gelu ? F::quick_gelu(h) : F::gelu_erf(h));  // (B, T, D)
}

CLIPEncoderLayer::CLIPEncoderLayer(int64_t D, int64_t n_head, int64_t M, double eps, bool quick_gelu) {
  self_attn = register_module("self_attn", std::make_shared<CLIPAttention>(D, n_head));
  layer_norm1 = register_module("layer_norm1", std::make_shared<nn::LayerNorm>(D, eps));
  mlp = register_module("mlp", std::make_shared<CLIPMLP>(D, M, quick_gelu));
  layer_norm2 = register_module("layer_norm2", std::make_shared<nn::LayerNorm>(D, eps));
}

Tensor CLIPEncoderLayer::body(const Tensor& x0, bool causal) const {
  const Tensor x = F::add(x0, self_attn->forward(layer_norm1->forward(x0), causal));  // (B, T, D)
  return F::add(x, mlp->forward(layer_norm2->forward(x)));                            // (B, T, D)
}

Tensor CLIPEncoderLayer::forward(const Tensor& x, bool causal) const {
  return run({x}, [this, causal](const std::vector<Tensor>& in) { return body(in[0], causal); });  // (B, T, D)
}

namespace {

// A tower's "encoder": its "layers", c.num_hidden_layers encoder layers of the tower's config c
// (text or vision); `layers` is set to the list.
template <class TowerConfig>
std::shared_ptr<nn::Submodules> make_encoder(const TowerConfig& c, bool quick_gelu,
                                             std::shared_ptr<nn::ModuleList<CLIPEncoderLayer>>& layers) {
  auto encoder = std::make_shared<nn::Submodules>();
  layers = encoder->add("layers", std::make_shared<nn::ModuleList<CLIPEncoderLayer>>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers->push_back(std::make_shared<CLIPEncoderLayer>(c.hidden_size, c.num_attention_heads, c.intermediate_size,
                                                         c.layer_norm_eps, quick_gelu));
  return encoder;
}

}  // namespace

// ---------------------------------------------------------------- text tower

CLIPTextTransformer::CLIPTextTransformer(const CLIPTextConfig& c, bool quick_gelu) {
  embeddings = register_module("embeddings", std::make_shared<nn::Submodules>());
  token_embedding = embeddings->add("token_embedding", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size));
  position_embedding =
      embeddings->add("position_embedding", std::make_shared<nn::Embedding>(c.max_position_embeddings, c.hidden_size));
  encoder = register_module("encoder", make_encoder(c, quick_gelu, layers));
  final_layer_norm =
      register_module("final_layer_norm", std::make_shared<nn::LayerNorm>(c.hidden_size, c.layer_norm_eps));
}

Tensor CLIPTextTransformer::forward(const Tensor& ids, const Tensor& lengths) const {
  const int64_t T_max = position_embedding->weight.size(0), D = position_embedding->weight.size(1);
  BRIGADE_CHECK(
      ids.dim() == 2 && ids.size(0) > 0 && ids.size(1) > 0 && ids.size(1) <= T_max && !is_floating(ids.dtype()),
      ShapeError, "CLIP.encode_text: ids must be integer (M, T) with 1 <= T <= {}, got {} {}", T_max,
      shape_str(ids.shape()), dtype_name(ids.dtype()));
  const int64_t M = ids.size(0), T = ids.size(1);
  BRIGADE_CHECK(lengths.defined() && lengths.dim() == 1 && lengths.size(0) == M && !is_floating(lengths.dtype()),
                ShapeError, "CLIP.encode_text: lengths must be integer (M={}), got {}", M,
                lengths.defined() ? shape_str(lengths.shape()) : std::string("undefined"));
  const std::vector<int64_t> len = lengths.to_vector_i64();
  std::vector<float> sel(size_t(M * M * T), 0.f);  // one-hot rows picking (b, lengths[b] - 1)
  for (int64_t b = 0; b < M; ++b) {
    BRIGADE_CHECK(len[size_t(b)] >= 1 && len[size_t(b)] <= T, ValueError,
                  "CLIP.encode_text: lengths[{}] = {} is outside [1, {}]", b, len[size_t(b)], T);
    sel[size_t(b * M * T + b * T + len[size_t(b)] - 1)] = 1.f;
  }
  const Tensor pos = F::narrow(position_embedding->weight, 0, 0, T);  // (T, D)
  Tensor x = F::add(token_embedding->forward(ids), pos);              // (M, T, D)
  for (const auto& l : *layers) x = l->forward(x, /*causal=*/true);   // (M, T, D)
  x = final_layer_norm->forward(x);                                   // (M, T, D)
  const Tensor pick = Tensor::from_vector(sel, {M, M * T});           // (M, M*T) constant
  return F::matmul(pick, F::reshape(x, {M * T, D}));                  // (M, D), exact gather
}

// ---------------------------------------------------------------- vision tower

CLIPPatchEmbedding::CLIPPatchEmbedding(int64_t C, int64_t D, int64_t p) : channels(C), dim(D), patch(p) {
  weight = register_parameter("weight", {D, C, p, p});
}

Tensor CLIPPatchEmbedding::forward(const Tensor& images) const {
  const Tensor patches = F::patchify(images, patch);                     // (N, P, C*p*p)
  const Tensor w = F::reshape(weight, {dim, channels * patch * patch});  // (D, C*p*p)
  return F::linear(patches, w, Tensor(), ops::WeightLayout::OutIn);      // (N, P, D)
}

void CLIPPatchEmbedding::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "weight") weight = t;
}

CLIPVisionEmbeddings::CLIPVisionEmbeddings(const CLIPVisionConfig& c) {
  class_embedding = register_parameter("class_embedding", {c.hidden_size});
  patch_embedding = register_module("patch_embedding",
                                    std::make_shared<CLIPPatchEmbedding>(c.num_channels, c.hidden_size, c.patch_size));
  position_embedding =
      register_module("position_embedding", std::make_shared<nn::Embedding>(1 + c.num_patches(), c.hidden_size));
}

void CLIPVisionEmbeddings::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "class_embedding") class_embedding = t;
}

Tensor CLIPVisionEmbeddings::forward(const Tensor& images) const {
  const int64_t S = position_embedding->weight.size(0), p = patch_embedding->patch;
  BRIGADE_CHECK(images.dim() == 4 && images.size(1) == patch_embedding->channels && images.size(2) % p == 0 &&
                    images.size(3) % p == 0 && (images.size(2) / p) * (images.size(3) / p) == S - 1,
                ShapeError, "CLIP.encode_image: images must be (N, C={}, H, W) with {} patches of {}x{}, got {}",
                patch_embedding->channels, S - 1, p, p, shape_str(images.shape()));
  const Tensor patches = patch_embedding->forward(images);      // (N, P, D)
  const Tensor x = F::prepend_token(class_embedding, patches);  // (N, S, D)
  return F::add(x, position_embedding->weight);                 // (N, S, D)
}

CLIPVisionTransformer::CLIPVisionTransformer(const CLIPVisionConfig& c, bool quick_gelu) {
  embeddings = register_module("embeddings", std::make_shared<CLIPVisionEmbeddings>(c));
  pre_layrnorm = register_module("pre_layrnorm", std::make_shared<nn::LayerNorm>(c.hidden_size, c.layer_norm_eps));
  encoder = register_module("encoder", make_encoder(c, quick_gelu, layers));
  post_layernorm = register_module("post_layernorm", std::make_shared<nn::LayerNorm>(c.hidden_size, c.layer_norm_eps));
}

Tensor CLIPVisionTransformer::forward(const Tensor& images) const {
  Tensor x = pre_layrnorm->forward(embeddings->forward(images));  // (N, S, D)
  for (const auto& l : *layers) x = l->forward(x, /*causal=*/false);
  const int64_t N = x.size(0), D = x.size(2);
  return post_layernorm->forward(F::reshape(F::narrow(x, 1, 0, 1), {N, D}));  // (N, D)
}

// ---------------------------------------------------------------- CLIP

CLIP::CLIP(const CLIPConfig& c) : cfg_(c) {
  cfg_.validate();
  const bool qg = cfg_.hidden_act == "quick_gelu";
  text_model = register_module("text_model", std::make_shared<CLIPTextTransformer>(cfg_.text, qg));
  vision_model = register_module("vision_model", std::make_shared<CLIPVisionTransformer>(cfg_.vision, qg));
  visual_projection = register_module(
      "visual_projection", std::make_shared<nn::Linear>(cfg_.vision.hidden_size, cfg_.projection_dim, false));
  text_projection = register_module("text_projection",
                                    std::make_shared<nn::Linear>(cfg_.text.hidden_size, cfg_.projection_dim, false));
  logit_scale = register_parameter("logit_scale", {});
  logit_scale.fill_(cfg_.logit_scale_init_value);
  name_parameters();
}

void CLIP::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "logit_scale") logit_scale = t;
}

void CLIP::init_weights(Generator& g) {
  for (auto& [name, p] : named_parameters()) {
    const bool text = name.rfind("text_", 0) == 0;
    const double D = double(text ? cfg_.text.hidden_size : cfg_.vision.hidden_size);
    const double L = double(text ? cfg_.text.num_hidden_layers : cfg_.vision.num_hidden_layers);
    if (name == "logit_scale") {
      p.fill_(cfg_.logit_scale_init_value);
    } else if (ends_with(name, ".bias")) {
      p.zero_();
    } else if (contains(name, "layer_norm") || contains(name, "layrnorm") || contains(name, "layernorm")) {
      p.fill_(1.0);
    } else {
      double std;
      if (contains(name, "class_embedding"))
        std = 1.0 / std::sqrt(D);
      else if (contains(name, "embedding"))
        std = cfg_.initializer_range;
      else if (contains(name, "q_proj") || contains(name, "k_proj") || contains(name, "v_proj") ||
               contains(name, "fc2"))
        std = 1.0 / std::sqrt(D) / std::sqrt(2 * L);
      else if (contains(name, "out_proj"))
        std = 1.0 / std::sqrt(D);
      else if (contains(name, "fc1"))
        std = 1.0 / std::sqrt(2 * D);
      else  // visual_projection, text_projection
        std = 1.0 / std::sqrt(D);
      g.normal_(p, 0.0, std);
    }
  }
}

Tensor CLIP::encode_image(const Tensor& images) const {
  return F::l2_normalize(visual_projection->forward(vision_model->forward(images)));  // (N, E)
}

Tensor CLIP::encode_text(const Tensor& ids, const Tensor& lengths) const {
  return F::l2_normalize(text_projection->forward(text_model->forward(ids, lengths)));  // (M, E)
}

Tensor CLIP::logits_from_embeds(const Tensor& img, const Tensor& txt) const {
  return logits_with_scale(img, txt, logit_scale);
}

Tensor CLIP::logits_with_scale(const Tensor& img, const Tensor& txt, const Tensor& s) const {
  BRIGADE_CHECK(img.dim() == 2 && txt.dim() == 2 && img.size(1) == txt.size(1), ShapeError,
                "CLIP.logits: embeddings must be (N, E) and (M, E), got {} and {}", shape_str(img.shape()),
                shape_str(txt.shape()));
  const Tensor scale = F::reshape(F::exp(s), {1, 1});      // (1, 1)
  return F::mul(scale, F::matmul(img, txt, false, true));  // (N, M)
}

Tensor CLIP::contrastive_loss_from_logits(const Tensor& logits_per_image) const {
  BRIGADE_CHECK(logits_per_image.dim() == 2 && logits_per_image.size(0) == logits_per_image.size(1) &&
                    logits_per_image.size(0) > 0,
                ShapeError, "CLIP.contrastive_loss: needs N matching pairs, (N, N) logits, got {}",
                shape_str(logits_per_image.shape()));
  const int64_t N = logits_per_image.size(0);
  const Tensor labels = Tensor::arange(N, DType::I64);                               // (N)
  const Tensor li = F::cross_entropy(logits_per_image, labels);                      // image -> text
  const Tensor lt = F::cross_entropy(F::transpose(logits_per_image, 0, 1), labels);  // text -> image
  // (li + lt) / 2 as a mean over the pair [li, lt] (prepend_token only moves values): a
  // reduction, which every precision policy keeps in f32, where an elementwise add would run in
  // bf16 under O2.
  const Tensor both = F::prepend_token(li, F::reshape(lt, {1, 1, 1}));  // (1, 2, 1)
  return F::mean_all(both);                                             // 0-d
}

std::string CLIP::describe() const {
  return fmt::format("CLIP, image tower {} layers x {}, patch {}; text tower {} layers x {}",
                     cfg_.vision.num_hidden_layers, cfg_.vision.hidden_size, cfg_.vision.patch_size,
                     cfg_.text.num_hidden_layers, cfg_.text.hidden_size);
}

Tensor CLIP::zero_shot_predict(const Tensor& images, const Tensor& class_text_embeds) const {
  autograd::NoGradGuard ng;
  const Tensor img = encode_image(images);  // (N, E)
  BRIGADE_CHECK(
      class_text_embeds.dim() == 2 && class_text_embeds.size(0) > 0 && class_text_embeds.size(1) == img.size(1),
      ShapeError, "CLIP.zero_shot_predict: class_text_embeds must be (K, E={}), got {}", img.size(1),
      shape_str(class_text_embeds.shape()));
  const int64_t N = img.size(0), K = class_text_embeds.size(0);
  const std::vector<float> s = F::matmul(img, class_text_embeds, false, true).to_vector();  // (N, K)
  std::vector<int64_t> pred(size_t(N), 0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 1; k < K; ++k)
      if (s[size_t(i * K + k)] > s[size_t(i * K + pred[size_t(i)])]) pred[size_t(i)] = k;
  return Tensor::from_vector_i64(pred, {N});
}

double CLIP::flops_per_pair() const {
  const auto& v = cfg_.vision;
  const auto& t = cfg_.text;
  const double E = double(cfg_.projection_dim);
  const double Dv = double(v.hidden_size), Mv = double(v.intermediate_size), Lv = double(v.num_hidden_layers);
  const double P = double(v.num_patches()), S = P + 1, p = double(v.patch_size);
  const double Dt = double(t.hidden_size), Mt = double(t.intermediate_size), Lt = double(t.num_hidden_layers);
  const double T = double(t.max_position_embeddings);
  const double vision =
      P * double(v.num_channels) * p * p * Dv + S * Lv * (4 * Dv * Dv + 2 * Dv * Mv) + Dv * E + Lv * 2 * S * S * Dv;
  const double text = T * Lt * (4 * Dt * Dt + 2 * Dt * Mt) + Dt * E + Lt * 2 * T * T * Dt;
  return 3.0 * 2.0 * (vision + text);
}

}  // namespace brigade::models
