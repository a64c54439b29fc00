// LLaMA model code; see llama.h.
#include "brigade/models/llama/llama.h"

#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"

namespace brigade::models {

namespace F = brigade::fn;

RMSNorm::RMSNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", {dim});
  weight.fill_(1.0);
}
Tensor RMSNorm::forward(const Tensor& x) const { return F::rms_norm(x, weight, eps); }
void RMSNorm::parameter_replaced(const std::string&, const Tensor& t) { weight = t; }

LlamaAttention::LlamaAttention(const LLaMAConfig& c)
    : n_head(c.n_head), n_kv_head(c.n_kv_head), head_dim(c.hidden_size / c.n_head), rope(c.rope()) {
  const int64_t C = c.hidden_size;
  q_proj = register_module("q_proj", std::make_shared<nn::Linear>(C, n_head * head_dim, false));
  k_proj = register_module("k_proj", std::make_shared<nn::Linear>(C, n_kv_head * head_dim, false));
  v_proj = register_module("v_proj", std::make_shared<nn::Linear>(C, n_kv_head * head_dim, false));
  o_proj = register_module("o_proj", std::make_shared<nn::Linear>(n_head * head_dim, C, false));
}

Tensor LlamaAttention::forward(const Tensor& x) const {
  const int64_t B = x.size(0), T = x.size(1), HS = head_dim;
  auto heads = [&](const Tensor& p, int64_t nh) {  // (B, T, nh * HS) -> (B, nh, T, HS)
    return F::transpose(F::reshape(p, {B, T, nh, HS}), 1, 2);
  };
  Tensor q = F::rope(heads(q_proj->forward(x), n_head), rope);     // (B, NH, T, HS)
  Tensor k = F::rope(heads(k_proj->forward(x), n_kv_head), rope);  // (B, NKV, T, HS)
  Tensor v = heads(v_proj->forward(x), n_kv_head);                 // (B, NKV, T, HS)
  Tensor y = F::attention(q, k, v, F::AttentionMask::causal());    // (B, NH, T, HS)
  y = F::reshape(F::transpose(y, 1, 2), {B, T, n_head * HS});      // (B, T, NH * HS)
  return o_proj->forward(y);                                       // (B, T, C)
}

void LlamaAttention::check_heads(int64_t parts) const {
  BRIGADE_CHECK(parts >= 1 && n_head % parts == 0 && n_kv_head % parts == 0, ConfigError,
                "tensor parallelism: parallel.tp = {} must divide model.n_head = {} and model.n_kv_head = {} (each "
                "rank computes whole query heads and the key/value heads they share); choose a parallel.tp that "
                "divides both",
                parts, n_head, n_kv_head);
}

void LlamaAttention::divide_heads(int64_t parts) {
  check_heads(parts);
  n_head /= parts;
  n_kv_head /= parts;
}

LlamaMLP::LlamaMLP(const LLaMAConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  gate_proj = register_module("gate_proj", std::make_shared<nn::Linear>(C, I, false));
  up_proj = register_module("up_proj", std::make_shared<nn::Linear>(C, I, false));
  down_proj = register_module("down_proj", std::make_shared<nn::Linear>(I, C, false));
}

Tensor LlamaMLP::forward(const Tensor& x) const {
  Tensor h = F::mul(F::silu(gate_proj->forward(x)), up_proj->forward(x));  // (B, T, I)
  return down_proj->forward(h);                                            // (B, T, C)
}

LlamaDecoderLayer::LlamaDecoderLayer(const LLaMAConfig& c) {
  self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c));
  mlp = register_module("mlp", std::make_shared<LlamaMLP>(c));
  input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps));
}

Tensor LlamaDecoderLayer::body(const Tensor& x) const {
  Tensor h = F::add(x, self_attn->forward(input_layernorm->forward(x)));  // (B, T, C)
  return F::add(h, mlp->forward(post_attention_layernorm->forward(h)));   // (B, T, C)
}

Tensor LlamaDecoderLayer::forward(const Tensor& x) const {
  return run({x}, [this](const std::vector<Tensor>& in) { return body(in[0]); });  // (B, T, C); no dropout
}

LlamaModel::LlamaModel(const LLaMAConfig& c) {
  embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size));
  layers = register_module("layers", std::make_shared<nn::ModuleList<LlamaDecoderLayer>>());
  for (int64_t i = 0; i < c.n_layer; ++i) layers->push_back(std::make_shared<LlamaDecoderLayer>(c));
  norm = register_module("norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps));
}

LLaMA::LLaMA(const LLaMAConfig& c) : cfg_(c) {
  BRIGADE_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.n_layer > 0 && c.n_head > 0 &&
                    c.n_kv_head > 0 && c.max_position > 0,
                ConfigError,
                "LLaMA config: all sizes must be positive (vocab_size={}, hidden_size={}, intermediate_size={}, "
                "n_layer={}, n_head={}, n_kv_head={}, max_position={})",
                c.vocab_size, c.hidden_size, c.intermediate_size, c.n_layer, c.n_head, c.n_kv_head, c.max_position);
  BRIGADE_CHECK(c.hidden_size % c.n_head == 0, ConfigError,
                "LLaMA config: hidden_size={} must be divisible by n_head={}", c.hidden_size, c.n_head);
  BRIGADE_CHECK(c.n_head % c.n_kv_head == 0, ConfigError,
                "LLaMA config: n_kv_head={} must divide n_head={} (each kv head serves n_head / n_kv_head query "
                "heads)",
                c.n_kv_head, c.n_head);
  BRIGADE_CHECK((c.hidden_size / c.n_head) % 2 == 0, ConfigError,
                "LLaMA config: the head size hidden_size / n_head = {} must be even for rotary embeddings",
                c.hidden_size / c.n_head);
  BRIGADE_CHECK(c.rms_norm_eps >= 0 && c.rope_theta > 0 && c.init_std >= 0, ConfigError,
                "LLaMA config: rms_norm_eps={} and init_std={} must be >= 0 and rope_theta={} > 0", c.rms_norm_eps,
                c.init_std, c.rope_theta);
  try {
    ops::check_rope_spec(c.rope(), "LLaMA config");
  } catch (const ValueError& e) {
    throw ConfigError(e.what());
  }
  model = register_module("model", std::make_shared<LlamaModel>(c));
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, false));
  name_parameters();
}

void LLaMA::init_weights(Generator& g) {
  for (auto& [name, p] : named_parameters()) {
    if (p.dim() == 1)
      p.fill_(1.0);  // RMSNorm weights (the only 1-d parameters: there are no biases)
    else
      g.normal_(p, 0.0, cfg_.init_std);  // embed_tokens, projections, lm_head
  }
}

Tensor LLaMA::embed(const Tensor& ids) const {
  BRIGADE_CHECK(ids.dim() == 2, ShapeError, "LLaMA.forward: ids must be (B, T), got {}", ids.str());
  const int64_t T = ids.size(1);
  BRIGADE_CHECK(T <= cfg_.max_position, ShapeError,
                "LLaMA.forward: sequence length {} exceeds max_position {}; shorten the input or raise max_position", T,
                cfg_.max_position);
  return model->embed_tokens->forward(ids);  // (B, T, C)
}

Tensor LLaMA::run_blocks(const Tensor& x0, int64_t begin, int64_t end) const {
  BRIGADE_CHECK(0 <= begin && begin <= end && end <= cfg_.n_layer, ValueError,
                "LLaMA.run_blocks: layers [{}, {}) outside [0, {})", begin, end, cfg_.n_layer);
  Tensor x = x0;
  for (int64_t i = begin; i < end; ++i) x = (*model->layers)[size_t(i)].forward(x);  // (B, T, C)
  return x;
}

namespace {
// norm, flattened: (B, T, C) -> (B*T, C)
Tensor head_features(const LlamaModel& m, const Tensor& x, int64_t C) {
  BRIGADE_CHECK(x.dim() == 3, ShapeError, "LLaMA head: x must be (B, T, C), got {}", x.str());
  return F::reshape(m.norm->forward(x), {x.size(0) * x.size(1), C});  // (B*T, C)
}
}  // namespace

Tensor LLaMA::forward_flat(const Tensor& ids) const {
  const Tensor x = head_features(*model, run_blocks(embed(ids), 0, cfg_.n_layer), cfg_.hidden_size);  // (B*T, C)
  return lm_head ? lm_head->forward(x) : model->embed_tokens->attend(x);                              // (B*T, V)
}

Tensor LLaMA::head_loss(const Tensor& x, const Tensor& targets) const {
  const Tensor h = head_features(*model, x, cfg_.hidden_size);  // (B*T, C)
  const Tensor t = targets.reshape({targets.numel()});
  return lm_head ? lm_head->lm_loss(h, t) : model->embed_tokens->lm_loss(h, t);  // 0-d
}

std::vector<std::string> LLaMA::tied_parameters() const {
  if (cfg_.tie_word_embeddings) return {"model.embed_tokens.weight"};
  return {};
}

nn::TpPlan LLaMA::tp_plan(bool tied_head) {
  using nn::TpStyle;
  nn::TpPlan plan{{{"model.embed_tokens", TpStyle::VocabEmbedding},
                   {"model.layers.*.self_attn", TpStyle::Heads},
                   {"model.layers.*.self_attn.q_proj", TpStyle::Column},
                   {"model.layers.*.self_attn.k_proj", TpStyle::Column},
                   {"model.layers.*.self_attn.v_proj", TpStyle::Column},
                   {"model.layers.*.self_attn.o_proj", TpStyle::Row},
                   {"model.layers.*.mlp.gate_proj", TpStyle::Column},
                   {"model.layers.*.mlp.up_proj", TpStyle::Column},
                   {"model.layers.*.mlp.down_proj", TpStyle::Row}}};
  if (!tied_head) plan.rules.push_back({"lm_head", TpStyle::VocabHead});
  return plan;
}

std::vector<std::pair<std::string, nn::Module*>> LLaMA::blocks() {
  std::vector<std::pair<std::string, nn::Module*>> out;
  const auto& layers = *model->layers;
  for (size_t i = 0; i < layers.size(); ++i) out.emplace_back(fmt::format("model.layers.{}", i), &layers[i]);
  return out;
}

void LLaMA::set_recompute(const std::vector<nn::Recompute>& modes) {
  auto& layers = *model->layers;
  BRIGADE_CHECK(modes.size() == layers.size(), ValueError, "LLaMA.set_recompute: {} modes for {} layers", modes.size(),
                layers.size());
  for (size_t i = 0; i < layers.size(); ++i) layers[i].recompute = modes[i];
}

std::vector<nn::Recompute> LLaMA::recompute_modes() const {
  std::vector<nn::Recompute> out;
  for (const auto& l : *model->layers) out.push_back(l->recompute);
  return out;
}

Tensor LLaMA::forward(const Tensor& ids) const {
  return F::reshape(forward_flat(ids), {ids.size(0), ids.size(1), cfg_.vocab_size});  // (B, T, V)
}

Tensor LLaMA::loss(const Tensor& ids, const Tensor& targets) const {
  BRIGADE_CHECK(targets.shape() == ids.shape(), ShapeError, "LLaMA.loss: targets {} must match ids {}", targets.str(),
                ids.str());
  return head_loss(run_blocks(embed(ids), 0, cfg_.n_layer), targets);  // 0-d
}

double LLaMA::flops_per_token(int64_t T) const {
  const double N =
      double(num_parameters() - (cfg_.tie_word_embeddings ? int64_t(0) : model->embed_tokens->weight.numel()));
  return 6.0 * N + 12.0 * double(cfg_.n_layer) * double(T) * double(cfg_.hidden_size);
}

}  // namespace brigade::models
