// Flamingo: decoupled embedding, Perceiver resampler, media mask, gated cross-attention blocks and
// the model (see flamingo.h). Differentiable fn:: calls only; the media mask is built on the host.
#include "brigade/models/flamingo/flamingo.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"

namespace brigade::models {

namespace F = brigade::fn;

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

constexpr const char* kAdditional = "transformer.wte.additional_embedding.weight";

// (N, T, H*hd) -> (N, H, T, hd) view
Tensor split_heads(const Tensor& y, int64_t heads, int64_t head_dim) {
  return F::transpose(F::reshape(y, {y.size(0), y.size(1), heads, head_dim}), 1, 2);
}
// (N, H, T, hd) -> (N, T, H*hd)
Tensor merge_heads(const Tensor& o) {
  return F::reshape(F::transpose(o, 1, 2), {o.size(0), o.size(2), o.size(1) * o.size(3)});
}

}  // namespace

void FlamingoConfig::validate() const {
  using Sizes = std::initializer_list<std::pair<int64_t, const char*>>;
  for (const auto& [v, name] : Sizes{{vision.image_size, "vision.image_size"},
                                     {vision.patch_size, "vision.patch_size"},
                                     {vision.num_channels, "vision.num_channels"},
                                     {vision.hidden_size, "vision.hidden_size"},
                                     {vision.num_hidden_layers, "vision.num_hidden_layers"},
                                     {vision.num_attention_heads, "vision.num_attention_heads"},
                                     {vision.intermediate_size, "vision.intermediate_size"},
                                     {lm.vocab_size, "lm.vocab_size"},
                                     {lm.block_size, "lm.block_size"},
                                     {lm.n_layer, "lm.n_layer"},
                                     {lm.n_head, "lm.n_head"},
                                     {lm.n_embd, "lm.n_embd"},
                                     {resampler_depth, "resampler_depth"},
                                     {resampler_n_heads, "resampler_n_heads"},
                                     {resampler_head_dim, "resampler_head_dim"},
                                     {resampler_n_latents, "resampler_n_latents"},
                                     {resampler_ff_mult, "resampler_ff_mult"},
                                     {cross_attn_every_n_layers, "cross_attn_every_n_layers"},
                                     {cross_attn_heads, "cross_attn_heads"},
                                     {cross_attn_head_dim, "cross_attn_head_dim"},
                                     {cross_attn_ff_mult, "cross_attn_ff_mult"}})
    BRIGADE_CHECK(v > 0, ConfigError, "FlamingoConfig: {} must be positive, got {}", name, v);
  BRIGADE_CHECK(vision.hidden_size % vision.num_attention_heads == 0, ConfigError,
                "FlamingoConfig: vision.hidden_size {} must be divisible by vision.num_attention_heads {}",
                vision.hidden_size, vision.num_attention_heads);
  BRIGADE_CHECK(vision.image_size % vision.patch_size == 0, ConfigError,
                "FlamingoConfig: vision.image_size {} must be a multiple of vision.patch_size {}", vision.image_size,
                vision.patch_size);
  BRIGADE_CHECK(lm.n_embd % lm.n_head == 0, ConfigError,
                "FlamingoConfig: lm.n_embd {} must be divisible by lm.n_head {}", lm.n_embd, lm.n_head);
  BRIGADE_CHECK(lm.dropout == 0.0, ConfigError,
                "FlamingoConfig: lm.dropout must be 0 (the frozen LM runs without dropout), got {}", lm.dropout);
  BRIGADE_CHECK(vision_hidden_act == "quick_gelu" || vision_hidden_act == "gelu", ConfigError,
                "FlamingoConfig: vision_hidden_act must be \"quick_gelu\" or \"gelu\", got \"{}\"", vision_hidden_act);
  BRIGADE_CHECK(ff_act == "gelu" || ff_act == "relu", ConfigError,
                "FlamingoConfig: ff_act must be \"gelu\" or \"relu\", got \"{}\"", ff_act);
  BRIGADE_CHECK(layer_norm_eps > 0 && vision.layer_norm_eps > 0 && lm.layer_norm_eps > 0, ConfigError,
                "FlamingoConfig: layer_norm_eps must be positive (layer_norm_eps {}, vision {}, lm {})", layer_norm_eps,
                vision.layer_norm_eps, lm.layer_norm_eps);
  BRIGADE_CHECK(initializer_range > 0, ConfigError, "FlamingoConfig: initializer_range must be positive, got {}",
                initializer_range);
}

// ---------------------------------------------------------------- decoupled embedding, LM

DecoupledEmbedding::DecoupledEmbedding(int64_t V, int64_t A, int64_t C) : nn::Embedding(V, C), num_embeddings(V) {
  additional_embedding = register_module("additional_embedding", std::make_shared<nn::Embedding>(A, C));
}

Tensor DecoupledEmbedding::forward(const Tensor& ids) const {
  const int64_t V = num_embeddings, A = additional_embedding->weight.size(0);
  BRIGADE_CHECK(ids.defined() && !is_floating(ids.dtype()), ShapeError,
                "DecoupledEmbedding: ids must be an integer tensor, got {}", ids.defined() ? ids.str() : "undefined");
  const std::vector<int64_t> v = ids.to_vector_i64();
  std::vector<int64_t> main(v.size()), extra(v.size());
  std::vector<float> m_main(v.size()), m_extra(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    BRIGADE_CHECK(v[i] >= 0 && v[i] < V + A, ValueError, "DecoupledEmbedding: id {} is outside [0, {})", v[i], V + A);
    const bool is_extra = v[i] >= V;
    main[i] = is_extra ? 0 : v[i];
    extra[i] = is_extra ? v[i] - V : 0;
    m_main[i] = is_extra ? 0.f : 1.f;
    m_extra[i] = is_extra ? 1.f : 0.f;
  }
  Shape ms = ids.shape();
  ms.push_back(1);
  const Tensor e_main = nn::Embedding::forward(Tensor::from_vector_i64(main, ids.shape()));           // (..., C)
  const Tensor e_extra = additional_embedding->forward(Tensor::from_vector_i64(extra, ids.shape()));  // (..., C)
  // e_main * 1 + e_extra * 0 == e_main exactly (and the other way round): a select, differentiable.
  return F::add(F::mul(e_main, Tensor::from_vector(m_main, ms)), F::mul(e_extra, Tensor::from_vector(m_extra, ms)));
}

Tensor DecoupledEmbedding::attend(const Tensor& x) const {
  const Tensor main = nn::Embedding::attend(x);                                  // (N, V)
  const Tensor extra = F::matmul(x, additional_embedding->weight, false, true);  // (N, A)
  return F::concat(main, extra, 1);                                              // (N, V + A)
}

FlamingoLM::FlamingoLM(const GPTConfig& c, Generator* gen) {
  wte = register_module(
      "wte", std::make_shared<DecoupledEmbedding>(c.vocab_size, FlamingoConfig::kNumAdditionalTokens, c.n_embd));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
  h = register_module("h", std::make_shared<nn::ModuleList<nn::TransformerBlock>>());
  for (int64_t i = 0; i < c.n_layer; ++i)
    h->push_back(std::make_shared<nn::TransformerBlock>(c.n_embd, c.n_head, 0.0, c.layer_norm_eps, gen));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.n_embd, c.layer_norm_eps));
}

// ---------------------------------------------------------------- resampler

PerceiverAttention::PerceiverAttention(int64_t D, int64_t n_heads, int64_t head_dim, double eps)
    : n_heads(n_heads), head_dim(head_dim) {
  context_layer_norm = register_module("context_layer_norm", std::make_shared<nn::LayerNorm>(D, eps));
  latents_layer_norm = register_module("latents_layer_norm", std::make_shared<nn::LayerNorm>(D, eps));
  const int64_t inner = n_heads * head_dim;
  q_proj = register_module("q_proj", std::make_shared<nn::Linear>(D, inner, false));
  k_proj = register_module("k_proj", std::make_shared<nn::Linear>(D, inner, false));
  v_proj = register_module("v_proj", std::make_shared<nn::Linear>(D, inner, false));
  output_proj = register_module("output_proj", std::make_shared<nn::Linear>(inner, D, false));
}

Tensor PerceiverAttention::forward(const Tensor& context, const Tensor& latents) const {
  const Tensor ctx = context_layer_norm->forward(context);  // (N, S, D)
  const Tensor lat = latents_layer_norm->forward(latents);  // (N, L, D)
  const Tensor kv_in = F::concat(ctx, lat, 1);              // (N, S + L, D): latents attend to media and themselves
  const Tensor q = split_heads(q_proj->forward(lat), n_heads, head_dim);                            // (N, H, L, hd)
  const Tensor k = split_heads(k_proj->forward(kv_in), n_heads, head_dim);                          // (N, H, S + L, hd)
  const Tensor v = split_heads(v_proj->forward(kv_in), n_heads, head_dim);                          // (N, H, S + L, hd)
  const Tensor s = F::mul_scalar(F::matmul(q, k, false, true), 1.0 / std::sqrt(double(head_dim)));  // (N, H, L, S + L)
  const Tensor o = F::matmul(F::softmax(s), v);                                                     // (N, H, L, hd)
  return output_proj->forward(merge_heads(o));                                                      // (N, L, D)
}

FlamingoMLP::FlamingoMLP(int64_t D, int64_t M, bool relu, bool with_ln, double eps) : relu(relu) {
  if (with_ln) ln = register_module("ln", std::make_shared<nn::LayerNorm>(D, eps));
  fc = register_module("fc", std::make_shared<nn::Linear>(D, M, false));
  c_proj = register_module("c_proj", std::make_shared<nn::Linear>(M, D, false));
}

Tensor FlamingoMLP::forward(const Tensor& x) const {
  const Tensor h = fc->forward(ln ? ln->forward(x) : x);       // (..., M)
  return c_proj->forward(relu ? F::relu(h) : F::gelu_erf(h));  // (..., D)
}

PerceiverBlock::PerceiverBlock(int64_t D, int64_t n_heads, int64_t head_dim, int64_t M, bool relu, double eps) {
  attn = register_module("0", std::make_shared<PerceiverAttention>(D, n_heads, head_dim, eps));
  mlp = register_module("1", std::make_shared<FlamingoMLP>(D, M, relu, /*with_ln=*/true, eps));
}

Tensor PerceiverBlock::forward(const Tensor& context, const Tensor& latents) const {
  return run({context, latents}, [this](const std::vector<Tensor>& in) {
    const Tensor lat = F::add(attn->forward(in[0], in[1]), in[1]);  // (N, L, D)
    return F::add(mlp->forward(lat), lat);                          // (N, L, D)
  });
}

PerceiverResampler::PerceiverResampler(const FlamingoConfig& c) {
  const int64_t D = c.vision.hidden_size;
  latents = register_parameter("latents", {c.resampler_n_latents, D});
  blocks = register_module("blocks", std::make_shared<nn::ModuleList<PerceiverBlock>>());
  for (int64_t i = 0; i < c.resampler_depth; ++i)
    blocks->push_back(std::make_shared<PerceiverBlock>(D, c.resampler_n_heads, c.resampler_head_dim,
                                                       c.resampler_ff_mult * D, c.ff_act == "relu", c.layer_norm_eps));
  layer_norm = register_module("layer_norm", std::make_shared<nn::LayerNorm>(D, c.layer_norm_eps));
}

void PerceiverResampler::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "latents") latents = t;
}

Tensor PerceiverResampler::forward(const Tensor& visual) const {
  const int64_t N = visual.size(0), L = latents.size(0), D = latents.size(1);
  BRIGADE_CHECK(visual.dim() == 3 && visual.size(2) == D, ShapeError,
                "PerceiverResampler: visual tokens must be (N, S, {}), got {}", D, visual.str());
  Tensor lat = F::add(Tensor::zeros({N, L, D}, latents.dtype()), latents);  // (N, L, D): latents repeated
  for (const auto& b : *blocks) lat = b->forward(visual, lat);              // (N, L, D)
  return layer_norm->forward(lat);                                          // (N, L, D)
}

// ---------------------------------------------------------------- media mask

MediaMask MediaMask::build(const Tensor& ids, int64_t image_token_id, bool only_immediate) {
  BRIGADE_CHECK(ids.defined() && ids.dim() == 2 && !is_floating(ids.dtype()), ShapeError,
                "Flamingo: ids must be integer (B, T), got {}", ids.defined() ? ids.str() : "undefined");
  MediaMask m;
  m.B = ids.size(0);
  m.T = ids.size(1);
  const std::vector<int64_t> v = ids.to_vector_i64();
  m.text_time.assign(v.size(), 0);
  for (int64_t b = 0; b < m.B; ++b) {
    int64_t n = 0;
    for (int64_t t = 0; t < m.T; ++t) {
      n += v[size_t(b * m.T + t)] == image_token_id;
      m.text_time[size_t(b * m.T + t)] = n;  // cumsum, inclusive
    }
    m.M = std::max(m.M, n);
    m.num_images += n;
  }
  m.allowed.assign(size_t(m.B * m.T * m.M), 0);
  for (int64_t i = 0; i < m.B * m.T; ++i) {
    const int64_t tt = m.text_time[size_t(i)];
    for (int64_t s = 0; s < m.M; ++s) m.allowed[size_t(i * m.M + s)] = only_immediate ? s == tt - 1 : s < tt;
  }
  return m;
}

Tensor MediaMask::select_matrix() const {
  std::vector<float> sel(size_t(B * M * num_images), 0.f);
  int64_t image = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = T > 0 ? text_time[size_t(b * T + T - 1)] : 0;  // images of sequence b
    for (int64_t s = 0; s < n; ++s) sel[size_t((b * M + s) * num_images + image++)] = 1.f;
  }
  return Tensor::from_vector(sel, {B * M, num_images});  // (B*M, N)
}

Tensor MediaMask::additive(int64_t L) const {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a(size_t(B * T * M * L), 0.f);
  for (int64_t i = 0; i < B * T; ++i) {
    if (text_time[size_t(i)] == 0) continue;  // sees no media: all 0, zeroed by has_media
    for (int64_t s = 0; s < M; ++s)
      if (!allowed[size_t(i * M + s)]) std::fill_n(a.begin() + (i * M + s) * L, L, -inf);
  }
  return Tensor::from_vector(a, {B, 1, T, M * L});  // (B, 1, T, M*L)
}

Tensor MediaMask::has_media() const {
  std::vector<float> h(size_t(B * T));
  for (size_t i = 0; i < h.size(); ++i) h[i] = text_time[i] > 0 ? 1.f : 0.f;
  return Tensor::from_vector(h, {B, T, 1});  // (B, T, 1)
}

// ---------------------------------------------------------------- gated cross-attention

MaskedCrossAttention::MaskedCrossAttention(int64_t C, int64_t Dv, int64_t heads, int64_t head_dim)
    : heads(heads), head_dim(head_dim) {
  const int64_t inner = heads * head_dim;
  q_proj = register_module("q_proj", std::make_shared<nn::Linear>(C, inner, false));
  k_proj = register_module("k_proj", std::make_shared<nn::Linear>(Dv, inner, false));
  v_proj = register_module("v_proj", std::make_shared<nn::Linear>(Dv, inner, false));
  o_proj = register_module("o_proj", std::make_shared<nn::Linear>(inner, C, false));
}

Tensor MaskedCrossAttention::forward(const Tensor& x, const Tensor& media, const Tensor& additive,
                                     const Tensor& has_media) const {
  const int64_t inner = heads * head_dim;
  const Tensor q = split_heads(q_proj->forward(x), heads, head_dim);  // (B, H, T, hd)
  // k and v as one GEMM on [k_proj; v_proj] (OpenFlamingo's to_kv): media then feeds one op per
  // block, so its gradient is a sum of one term per block, whose order cannot change its bits
  // (activation recompute stays bitwise).
  const Tensor w_kv = F::concat(k_proj->weight, v_proj->weight, 0);                                 // (2 inner, Dv)
  const Tensor kv = F::linear(media, w_kv, Tensor(), ops::WeightLayout::OutIn);                     // (B, M*L, 2 inner)
  const Tensor k = split_heads(F::narrow(kv, 2, 0, inner), heads, head_dim);                        // (B, H, M*L, hd)
  const Tensor v = split_heads(F::narrow(kv, 2, inner, inner), heads, head_dim);                    // (B, H, M*L, hd)
  const Tensor s = F::mul_scalar(F::matmul(q, k, false, true), 1.0 / std::sqrt(double(head_dim)));  // (B, H, T, M*L)
  const Tensor p = F::softmax(F::add(s, additive));                // (B, H, T, M*L): 0 outside the token's media
  const Tensor o = o_proj->forward(merge_heads(F::matmul(p, v)));  // (B, T, C)
  return F::mul(o, has_media);  // (B, T, C): tokens before any image attend to nothing
}

GatedCrossAttentionBlock::GatedCrossAttentionBlock(const FlamingoConfig& c) {
  const int64_t C = c.lm.n_embd;
  input_layernorm = register_module("input_layernorm", std::make_shared<nn::LayerNorm>(C, c.layer_norm_eps));
  cross_attn = register_module("cross_attn", std::make_shared<MaskedCrossAttention>(
                                                 C, c.vision.hidden_size, c.cross_attn_heads, c.cross_attn_head_dim));
  alpha_cross_attn = register_parameter("alpha_cross_attn", {1});
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<nn::LayerNorm>(C, c.layer_norm_eps));
  mlp = register_module("mlp", std::make_shared<FlamingoMLP>(C, c.cross_attn_ff_mult * C, c.ff_act == "relu",
                                                             /*with_ln=*/false, c.layer_norm_eps));
  alpha_dense = register_parameter("alpha_dense", {1});
}

void GatedCrossAttentionBlock::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "alpha_cross_attn") alpha_cross_attn = t;
  if (name == "alpha_dense") alpha_dense = t;
}

Tensor GatedCrossAttentionBlock::body(const Tensor& x0, const Tensor& media, const Tensor& additive,
                                      const Tensor& has_media) const {
  Tensor x = x0;
  if (media.defined()) {  // without media every token's cross-attention output is 0: x + 0 == x
    const Tensor y = cross_attn->forward(input_layernorm->forward(x0), media, additive, has_media);  // (B, T, C)
    x = F::add(x0, F::mul(y, F::tanh(alpha_cross_attn)));                                            // (B, T, C)
  }
  const Tensor f = mlp->forward(post_attention_layernorm->forward(x));  // (B, T, C)
  return F::add(x, F::mul(f, F::tanh(alpha_dense)));                    // (B, T, C)
}

Tensor GatedCrossAttentionBlock::forward(const Tensor& x, const Tensor& media, const Tensor& additive,
                                         const Tensor& has_media) const {
  if (!media.defined())
    return run({x}, [this](const std::vector<Tensor>& in) { return body(in[0], Tensor(), Tensor(), Tensor()); });
  return run({x, media}, [this, additive, has_media](const std::vector<Tensor>& in) {
    return body(in[0], in[1], additive, has_media);
  });
}

// ---------------------------------------------------------------- Flamingo

Flamingo::Flamingo(const FlamingoConfig& c) : cfg_(c) {
  cfg_.validate();
  vision_model = register_module(
      "vision_model", std::make_shared<CLIPVisionTransformer>(cfg_.vision, cfg_.vision_hidden_act == "quick_gelu"));
  perceiver_resampler = register_module("perceiver_resampler", std::make_shared<PerceiverResampler>(cfg_));
  gated_cross_attn_layers =
      register_module("gated_cross_attn_layers", std::make_shared<nn::ModuleList<GatedCrossAttentionBlock>>());
  for (int64_t j = 0; j < cfg_.num_cross_attn_layers(); ++j)
    gated_cross_attn_layers->push_back(std::make_shared<GatedCrossAttentionBlock>(cfg_));
  transformer = register_module("transformer", std::make_shared<FlamingoLM>(cfg_.lm, &gen_));
  name_parameters();
  // Frozen: the vision tower and the LM, but for the new tokens' rows.
  for (auto& [name, p] : named_parameters())
    if (starts_with(name, "vision_model.") || (starts_with(name, "transformer.") && name != kAdditional))
      p.set_requires_grad(false);
}

void Flamingo::init_weights(Generator& g) {
  for (auto& [name, p] : named_parameters()) {
    if (ends_with(name, "alpha_cross_attn") || ends_with(name, "alpha_dense")) {
      p.zero_();
    } else if (name == "perceiver_resampler.latents") {
      g.normal_(p, 0.0, 1.0);
    } else if (contains(name, "layer_norm") || contains(name, "layernorm") || contains(name, "layrnorm") ||
               contains(name, ".ln_") || contains(name, ".ln.")) {
      ends_with(name, ".bias") ? p.zero_() : p.fill_(1.0);
    } else if (ends_with(name, ".bias")) {
      p.zero_();
    } else {
      g.normal_(p, 0.0, cfg_.initializer_range);
    }
  }
}

void Flamingo::zero_gates() {
  for (const auto& b : *gated_cross_attn_layers) {
    b->alpha_cross_attn.zero_();
    b->alpha_dense.zero_();
  }
}

nn::NamedTensors Flamingo::trainable_parameters() const {
  nn::NamedTensors out;
  for (auto& [name, p] : named_parameters())
    if (p.requires_grad()) out.emplace_back(name, p);
  return out;
}

Tensor Flamingo::visual_tokens(const Tensor& images) const {
  autograd::NoGradGuard ng;  // frozen tower, constant images: nothing to differentiate
  const auto& vm = *vision_model;
  Tensor x = vm.pre_layrnorm->forward(vm.embeddings->forward(images));   // (N, 1 + P, Dv)
  for (const auto& l : *vm.layers) x = l->forward(x, /*causal=*/false);  // (N, 1 + P, Dv)
  return x;  // HF's last_hidden_state: no post_layernorm (IDEFICS)
}

Tensor Flamingo::media_latents(const Tensor& images) const {
  return perceiver_resampler->forward(visual_tokens(images));  // (N, L, Dv)
}

Tensor Flamingo::run(const Tensor& images, const Tensor& ids, bool gated, bool check_images) const {
  return run_media(images, Tensor(), ids, gated, check_images);
}

Tensor Flamingo::hidden_from_latents(const Tensor& latents, const Tensor& ids) const {
  BRIGADE_CHECK(!latents.defined() || latents.dim() == 3, ShapeError,
                "Flamingo.hidden_from_latents: latents must be (N, L, Dv), got {}", shape_str(latents.shape()));
  return run_media(Tensor(), latents, ids, !gates_forced_zero_, true, /*head=*/false);
}

Tensor Flamingo::run_media(const Tensor& images, const Tensor& latents, const Tensor& ids, bool gated,
                           bool check_images, bool head) const {
  const MediaMask mm = MediaMask::build(ids, cfg_.image_token_id(), cfg_.only_attend_immediate_media);
  const int64_t B = mm.B, T = mm.T, C = cfg_.lm.n_embd;
  BRIGADE_CHECK(T >= 1 && T <= cfg_.lm.block_size, ShapeError,
                "Flamingo.forward: sequence length {} must be in [1, lm.block_size = {}]", T, cfg_.lm.block_size);
  const int64_t n_images = latents.defined() ? latents.size(0) : images.defined() ? images.size(0) : 0;
  BRIGADE_CHECK(!check_images || n_images == mm.num_images, ShapeError,
                "Flamingo.forward: ids hold {} <image> tokens (id {}) but {} images were given; pass one image per "
                "<image> token",
                mm.num_images, cfg_.image_token_id(), n_images);
  Tensor media, additive, has_media;
  if (gated && mm.num_images > 0) {
    const Tensor lat = latents.defined() ? latents : media_latents(images);  // (N, L, Dv)
    const int64_t N = lat.size(0), L = lat.size(1), Dv = lat.size(2);
    const Tensor per_seq = F::matmul(mm.select_matrix(), F::reshape(lat, {N, L * Dv}));  // (B*M, L*Dv), exact gather
    media = F::reshape(per_seq, {B, mm.M * L, Dv});                                      // (B, M*L, Dv)
    additive = mm.additive(L);                                                           // (B, 1, T, M*L)
    has_media = mm.has_media();                                                          // (B, T, 1)
  }
  const auto& t = *transformer;
  const Tensor pos = Tensor::arange(T, DType::I64);             // (T)
  Tensor x = F::add(t.wte->forward(ids), t.wpe->forward(pos));  // (B, T, C), as GPT::embed
  const int64_t n = cfg_.cross_attn_every_n_layers;
  for (int64_t i = 0; i < cfg_.lm.n_layer; ++i) {
    if (gated && i % n == 0) x = (*gated_cross_attn_layers)[size_t(i / n)].forward(x, media, additive, has_media);
    x = (*t.h)[size_t(i)].forward(x);  // (B, T, C)
  }
  x = F::reshape(t.ln_f->forward(x), {B * T, C});  // (B*T, C)
  return head ? t.wte->attend(x) : x;              // (B*T, V + 2) or (B*T, C)
}

Tensor Flamingo::forward(const Tensor& images, const Tensor& ids) const {
  const Tensor logits = run(images, ids, !gates_forced_zero_, true);         // (B*T, V + 2)
  return F::reshape(logits, {ids.size(0), ids.size(1), cfg_.vocab_size()});  // (B, T, V + 2)
}

Tensor Flamingo::lm_logits(const Tensor& ids) const {
  const Tensor logits = run(Tensor(), ids, false, false);  // (B*T, V + 2); <image> tokens need no image here
  return F::reshape(logits, {ids.size(0), ids.size(1), cfg_.vocab_size()});  // (B, T, V + 2)
}

Tensor Flamingo::loss(const Tensor& images, const Tensor& ids, const Tensor& targets) const {
  BRIGADE_CHECK(targets.defined() && targets.shape() == ids.shape(), ShapeError,
                "Flamingo.loss: targets {} must match ids {}", targets.defined() ? targets.str() : "undefined",
                ids.str());
  return F::cross_entropy(run(images, ids, !gates_forced_zero_, true), targets.reshape({targets.numel()}));  // 0-d
}

}  // namespace brigade::models
