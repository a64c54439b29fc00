// BERT forward, MLM loss and accuracy, init and FLOPs (see bert.h). Differentiable fn:: calls only.
#include "brigade/models/bert/bert.h"

#include <algorithm>

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"

namespace brigade::models {

namespace F = brigade::fn;

void BERTConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    BRIGADE_CHECK(v > 0, ConfigError, "BERTConfig: {} must be positive, got {}", name, v);
  };
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
  positive(type_vocab_size, "type_vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(intermediate_size, "intermediate_size");
  BRIGADE_CHECK(hidden_size % num_attention_heads == 0, ConfigError,
                "BERTConfig: hidden_size {} must be divisible by num_attention_heads {}", hidden_size,
                num_attention_heads);
  BRIGADE_CHECK(hidden_dropout >= 0 && hidden_dropout < 1, ConfigError,
                "BERTConfig: hidden_dropout must be in [0, 1), got {}", hidden_dropout);
  BRIGADE_CHECK(layer_norm_eps > 0, ConfigError, "BERTConfig: layer_norm_eps must be positive, got {}", layer_norm_eps);
}

BERTEmbeddings::BERTEmbeddings(const BERTConfig& c, Generator* gen) {
  const int64_t D = c.hidden_size;
  word_embeddings = register_module("word_embeddings", std::make_shared<nn::Embedding>(c.vocab_size, D));
  position_embeddings =
      register_module("position_embeddings", std::make_shared<nn::Embedding>(c.max_position_embeddings, D));
  token_type_embeddings =
      register_module("token_type_embeddings", std::make_shared<nn::Embedding>(c.type_vocab_size, D));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNorm>(D, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout, gen));
}

Tensor BERTEmbeddings::forward(const Tensor& ids, const Tensor& token_type_ids) const {
  BRIGADE_CHECK(ids.dim() == 2, ShapeError, "BERT.forward: ids must be (B, T), got {}", ids.str());
  const int64_t B = ids.size(0), T = ids.size(1);
  const int64_t max_t = position_embeddings->weight.size(0);
  BRIGADE_CHECK(T <= max_t, ShapeError,
                "BERT.forward: sequence length {} exceeds max_position_embeddings {}; shorten the input", T, max_t);
  Tensor types = token_type_ids;
  if (types.defined())
    BRIGADE_CHECK(types.shape() == ids.shape(), ShapeError, "BERT.forward: token_type_ids must be {} like ids, got {}",
                  shape_str(ids.shape()), shape_str(types.shape()));
  else
    types = Tensor::zeros({B, T}, DType::I64);                                          // (B, T)
  const Tensor pos = Tensor::arange(T, DType::I64);                                     // (T)
  Tensor x = F::add(word_embeddings->forward(ids), position_embeddings->forward(pos));  // (B, T, D)
  x = F::add(x, token_type_embeddings->forward(types));                                 // (B, T, D)
  return dropout->forward(LayerNorm->forward(x));                                       // (B, T, D)
}

BERTLayer::BERTLayer(const BERTConfig& c, Generator* gen) : gen_(gen) {
  const int64_t D = c.hidden_size, M = c.intermediate_size;
  attention = register_module("attention", std::make_shared<nn::Submodules>());
  self_attention = attention->add("self", std::make_shared<nn::EncoderSelfAttention>(D, c.num_attention_heads));
  attention_output = attention->add("output", std::make_shared<nn::Submodules>());
  attention_dense = attention_output->add("dense", std::make_shared<nn::Linear>(D, D));
  attention_ln = attention_output->add("LayerNorm", std::make_shared<nn::LayerNorm>(D, c.layer_norm_eps));
  intermediate = register_module("intermediate", std::make_shared<nn::Submodules>());
  intermediate_dense = intermediate->add("dense", std::make_shared<nn::Linear>(D, M));
  output = register_module("output", std::make_shared<nn::Submodules>());
  output_dense = output->add("dense", std::make_shared<nn::Linear>(M, D));
  output_ln = output->add("LayerNorm", std::make_shared<nn::LayerNorm>(D, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout, gen));
}

Tensor BERTLayer::body(const Tensor& x0, const Tensor& attention_mask) const {
  const Tensor a = self_attention->forward(x0, attention_mask);                                       // (B, T, D)
  const Tensor x = attention_ln->forward(F::add(x0, dropout->forward(attention_dense->forward(a))));  // (B, T, D)
  const Tensor h = F::gelu_erf(intermediate_dense->forward(x));                                       // (B, T, M)
  return output_ln->forward(F::add(x, dropout->forward(output_dense->forward(h))));                   // (B, T, D)
}

Tensor BERTLayer::forward(const Tensor& x, const Tensor& attention_mask) const {
  // The mask is captured (a constant: no gradient), x goes through the inputs.
  return run(
      {x}, [this, attention_mask](const std::vector<Tensor>& in) { return body(in[0], attention_mask); },
      gen_);  // (B, T, D)
}

BERTModel::BERTModel(const BERTConfig& c, Generator* gen) {
  embeddings = register_module("embeddings", std::make_shared<BERTEmbeddings>(c, gen));
  encoder = register_module("encoder", std::make_shared<nn::Submodules>());
  layer = encoder->add("layer", std::make_shared<nn::ModuleList<BERTLayer>>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layer->push_back(std::make_shared<BERTLayer>(c, gen));
}

BERTPredictionHead::BERTPredictionHead(const BERTConfig& c) {
  bias = register_parameter("bias", {c.vocab_size});
  transform = register_module("transform", std::make_shared<nn::Submodules>());
  dense = transform->add("dense", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
  LayerNorm = transform->add("LayerNorm", std::make_shared<nn::LayerNorm>(c.hidden_size, c.layer_norm_eps));
}

void BERTPredictionHead::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "bias") bias = t;
}

BERT::BERT(const BERTConfig& c) : cfg_(c) {
  cfg_.validate();
  bert = register_module("bert", std::make_shared<BERTModel>(cfg_, &gen_));
  cls = register_module("cls", std::make_shared<nn::Submodules>());
  predictions = cls->add("predictions", std::make_shared<BERTPredictionHead>(cfg_));
  name_parameters();
}

void BERT::init_weights(Generator& g) {
  const double std = cfg_.initializer_range;
  for (auto& [name, p] : named_parameters()) {
    const bool is_ln = name.find("LayerNorm") != std::string::npos;
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (is_ln && !is_bias)
      p.fill_(1.0);
    else if (is_bias)
      p.zero_();
    else
      g.normal_(p, 0.0, std);  // linear and embedding weights
  }
}

Tensor BERT::embed(const Tensor& ids, const Tensor& token_type_ids) const {
  return bert->embeddings->forward(ids, token_type_ids);  // (B, T, D)
}

Tensor BERT::run_blocks(const Tensor& x0, int64_t begin, int64_t end, const Tensor& attention_mask) const {
  BRIGADE_CHECK(0 <= begin && begin <= end && end <= cfg_.num_hidden_layers, ValueError,
                "BERT.run_blocks: layers [{}, {}) outside [0, {})", begin, end, cfg_.num_hidden_layers);
  Tensor x = x0;
  for (int64_t i = begin; i < end; ++i) x = (*bert->layer)[size_t(i)].forward(x, attention_mask);  // (B, T, D)
  return x;
}

Tensor BERT::encode(const Tensor& ids, const Tensor& attention_mask, const Tensor& token_type_ids) const {
  Tensor x = embed(ids, token_type_ids);  // (B, T, D)
  if (attention_mask.defined())
    BRIGADE_CHECK(attention_mask.shape() == ids.shape(), ShapeError,
                  "BERT.forward: attention_mask must be {} like ids, got {}", shape_str(ids.shape()),
                  shape_str(attention_mask.shape()));
  return run_blocks(x, 0, cfg_.num_hidden_layers, attention_mask);  // (B, T, D)
}

nn::TpPlan BERT::tp_plan() {
  using nn::TpStyle;
  return {{{"bert.encoder.layer.*.attention.self", TpStyle::Heads},
           {"bert.encoder.layer.*.attention.self.query", TpStyle::Column},
           {"bert.encoder.layer.*.attention.self.key", TpStyle::Column},
           {"bert.encoder.layer.*.attention.self.value", TpStyle::Column},
           {"bert.encoder.layer.*.attention.output.dense", TpStyle::Row},
           {"bert.encoder.layer.*.intermediate.dense", TpStyle::Column},
           {"bert.encoder.layer.*.output.dense", TpStyle::Row}}};
}

Tensor BERT::head(const Tensor& hf) const {
  const auto& p = *predictions;
  const Tensor h = p.LayerNorm->forward(F::gelu_erf(p.dense->forward(hf)));  // (N, D)
  // tied decoder: logits = h W_word^T + bias
  return F::linear(h, bert->embeddings->word_embeddings->weight, p.bias, ops::WeightLayout::OutIn);  // (N, V)
}

Tensor BERT::logits_flat(const Tensor& ids, const Tensor& attention_mask, const Tensor& token_type_ids) const {
  const Tensor x = encode(ids, attention_mask, token_type_ids);  // (B, T, D)
  return head(F::reshape(x, {ids.numel(), cfg_.hidden_size}));   // (B*T, V)
}

Tensor BERT::forward(const Tensor& ids, const Tensor& attention_mask, const Tensor& token_type_ids) const {
  return F::reshape(logits_flat(ids, attention_mask, token_type_ids),
                    {ids.size(0), ids.size(1), cfg_.vocab_size});  // (B, T, V)
}

BERT::MaskedLogits BERT::masked_logits(const Tensor& ids, const Tensor& labels, const Tensor& attention_mask,
                                       const Tensor& token_type_ids) const {
  BRIGADE_CHECK(labels.shape() == ids.shape(), ShapeError,
                "BERT.masked_logits: labels must be {} like ids (-100 where not masked), got {}",
                shape_str(ids.shape()), shape_str(labels.shape()));
  const std::vector<int64_t> lab = labels.to_vector_i64();
  std::vector<int64_t> rows, picked;
  for (size_t i = 0; i < lab.size(); ++i)
    if (lab[i] != -100) rows.push_back(int64_t(i)), picked.push_back(lab[i]);
  if (rows.empty()) {
    // The encoder still runs (its output unused): under ZeRO-3 it gathers each block, which every
    // data-parallel rank must do in step with the others, whatever its rows hold.
    (void)encode(ids, attention_mask, token_type_ids);
    MaskedLogits out;
    out.labels = Tensor::from_vector_i64(picked, {0});
    out.logits = Tensor::zeros({0, cfg_.vocab_size});
    return out;
  }
  return masked_head(encode(ids, attention_mask, token_type_ids), labels);
}

BERT::MaskedLogits BERT::masked_head(const Tensor& x0, const Tensor& labels) const {
  BRIGADE_CHECK(x0.dim() == 3 && labels.dim() == 2 && x0.size(0) == labels.size(0) && x0.size(1) == labels.size(1),
                ShapeError, "BERT.masked_head: x must be (B, T, D) and labels (B, T), got {} and {}",
                shape_str(x0.shape()), shape_str(labels.shape()));
  const std::vector<int64_t> lab = labels.to_vector_i64();
  std::vector<int64_t> rows, picked;
  for (size_t i = 0; i < lab.size(); ++i)
    if (lab[i] != -100) rows.push_back(int64_t(i)), picked.push_back(lab[i]);
  const int64_t M = int64_t(rows.size());
  MaskedLogits out;
  out.labels = Tensor::from_vector_i64(picked, {M});
  if (M == 0) {
    out.logits = Tensor::zeros({0, cfg_.vocab_size});
    return out;
  }
  const Tensor x = F::reshape(x0, {labels.numel(), cfg_.hidden_size});     // (B*T, D)
  out.logits = head(F::embedding(x, Tensor::from_vector_i64(rows, {M})));  // rows of x, then (M, V)
  return out;
}

Tensor BERT::mlm_loss(const Tensor& ids, const Tensor& labels, const Tensor& attention_mask,
                      const Tensor& token_type_ids) const {
  BRIGADE_CHECK(labels.shape() == ids.shape(), ShapeError,
                "BERT.mlm_loss: labels must be {} like ids (-100 where not masked), got {}", shape_str(ids.shape()),
                shape_str(labels.shape()));
  const MaskedLogits m = masked_logits(ids, labels, attention_mask, token_type_ids);
  if (m.labels.numel() == 0) {  // nothing labelled: the full logits' cross-entropy, as before
    const Tensor logits = logits_flat(ids, attention_mask, token_type_ids);  // (B*T, V)
    return F::cross_entropy(logits, labels.reshape({labels.numel()}), -100);
  }
  return F::cross_entropy(m.logits, m.labels, -100);  // 0-d
}

double BERT::mlm_accuracy(const Tensor& ids, const Tensor& labels, const Tensor& attention_mask,
                          const Tensor& token_type_ids) const {
  BRIGADE_CHECK(labels.shape() == ids.shape(), ShapeError, "BERT.mlm_accuracy: labels must be {} like ids, got {}",
                shape_str(ids.shape()), shape_str(labels.shape()));
  autograd::NoGradGuard ng;
  const std::vector<float> logits = logits_flat(ids, attention_mask, token_type_ids).to_vector();  // (B*T) x V
  const std::vector<int64_t> lab = labels.to_vector_i64();
  const int64_t V = cfg_.vocab_size;
  int64_t n = 0, hit = 0;
  for (size_t i = 0; i < lab.size(); ++i) {
    if (lab[i] == -100) continue;
    const float* row = logits.data() + i * size_t(V);
    const int64_t arg = std::max_element(row, row + V) - row;
    ++n;
    hit += arg == lab[i];
  }
  return n ? double(hit) / double(n) : 0.0;
}

double BERT::flops_per_token(int64_t T) const {
  const double D = double(cfg_.hidden_size), M = double(cfg_.intermediate_size), L = double(cfg_.num_hidden_layers),
               V = double(cfg_.vocab_size);
  return 6.0 * (L * (4 * D * D + 2 * D * M) + D * D + V * D) + 12.0 * L * double(T) * D;
}

}  // namespace brigade::models
