// BERT (Devlin et al. 2019) for masked language modelling as single-device model code with the
// parameter names and layouts of Hugging Face's BertForMaskedLM, so its safetensors load by
// name: bert.embeddings.{word_embeddings, position_embeddings, token_type_embeddings}.weight,
// bert.embeddings.LayerNorm.{weight,bias}, bert.encoder.layer.{i}.{attention.self.{query,key,
// value}, attention.output.dense, attention.output.LayerNorm, intermediate.dense, output.dense,
// output.LayerNorm}.{weight,bias}, cls.predictions.transform.{dense, LayerNorm}.{weight,bias},
// cls.predictions.bias. The decoder weight is tied to word_embeddings (HF's
// cls.predictions.decoder.weight is that same tensor and is not a separate parameter here).
// Post-LayerNorm encoder (x = LN(x + attn(x)); x = LN(x + mlp(x))), exact (erf) GELU, eps 1e-12,
// position ids 0..T-1, token types 0 unless given. attention_mask (B, T) of 0 / 1: padded keys
// get -inf before the softmax (fn::attention with a key padding mask; HF adds finfo.min, which gives the same
// probabilities whenever a row has an unmasked key). Dropout (hidden_dropout, where HF applies
// hidden_dropout_prob) draws from the model's generator; attention-probability dropout is not
// implemented (parity runs use 0).
// Parity: tests/reference/encoder_ref.py and tests/models/test_bert.cpp.
#pragma once
#include "brigade/core/rng.h"
#include "brigade/nn/layers.h"
#include "brigade/nn/tp_plan.h"

namespace brigade::models {

struct BERTConfig {
  int64_t vocab_size = 30522;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  int64_t hidden_size = 768;       // D
  int64_t num_hidden_layers = 12;  // L
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;  // MLP width
  double layer_norm_eps = 1e-12;
  double hidden_dropout = 0.0;
  double initializer_range = 0.02;
  void validate() const;  // ConfigError naming the field
};

class BERTEmbeddings : public nn::Module {
 public:
  BERTEmbeddings(const BERTConfig& c, Generator* gen);
  // ids (B, T), token_type_ids (B, T) or undefined (all 0) -> (B, T, D)
  Tensor forward(const Tensor& ids, const Tensor& token_type_ids) const;
  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  std::shared_ptr<nn::Dropout> dropout;
};

// One post-LN encoder layer, an nn::Block: plans (ZeRO-3, activation recompute) reach it from
// outside. The attention mask is a constant of the body (it needs no gradient); the body's
// dropout draws from the model's generator, which a recompute replays.
class BERTLayer : public nn::Block {
 public:
  BERTLayer(const BERTConfig& c, Generator* gen);
  // (B, T, D) -> (B, T, D), through Block::run; attention_mask (B, T) of 0 / 1 or undefined.
  Tensor forward(const Tensor& x, const Tensor& attention_mask) const;
  std::shared_ptr<nn::Submodules> attention, attention_output, intermediate, output;
  std::shared_ptr<nn::EncoderSelfAttention> self_attention;  // attention.self
  std::shared_ptr<nn::Linear> attention_dense, intermediate_dense, output_dense;
  std::shared_ptr<nn::LayerNorm> attention_ln, output_ln;  // attention.output.LayerNorm, output.LayerNorm
  std::shared_ptr<nn::Dropout> dropout;

 private:
  Tensor body(const Tensor& x, const Tensor& attention_mask) const;
  Generator* gen_;  // the dropout generator (its state is replayed by a recompute)
};

class BERTModel : public nn::Module {
 public:
  BERTModel(const BERTConfig& c, Generator* gen);
  std::shared_ptr<BERTEmbeddings> embeddings;
  std::shared_ptr<nn::Submodules> encoder;  // holds "layer"
  std::shared_ptr<nn::ModuleList<BERTLayer>> layer;
};

// cls.predictions: transform (dense, exact GELU, LayerNorm) and the output bias of the tied decoder.
class BERTPredictionHead : public nn::Module {
 public:
  BERTPredictionHead(const BERTConfig& c);
  std::shared_ptr<nn::Submodules> transform;
  std::shared_ptr<nn::Linear> dense;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  Tensor bias;  // (V)

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

class BERT : public nn::Module {
 public:
  explicit BERT(const BERTConfig& c);
  // Initialisation (documented, not bitwise HF): in registration order, every linear and
  // embedding weight ~ normal(0, initializer_range) from `gen`; biases (cls.predictions.bias
  // included) 0; LayerNorm weight 1, bias 0. HF draws the same distributions but also zeroes
  // the padding row of word_embeddings (pad_token_id); Brigade does not (and has no padding_idx
  // that would keep that row's gradient at 0).
  void init_weights(Generator& gen);
  // ids (B, T) i32/i64 in [0, V); attention_mask (B, T) of 0 / 1 or undefined (no padding);
  // token_type_ids (B, T) or undefined (all 0). Returns the MLM logits (B, T, V).
  Tensor forward(const Tensor& ids, const Tensor& attention_mask = Tensor(),
                 const Tensor& token_type_ids = Tensor()) const;
  // The prediction head on the labelled positions only (label != -100, in row-major order):
  // logits (M, V) and their labels (M) i64. The encoder runs on every position; the transform
  // and the tied decoder (the bulk of a small model's FLOPs with a large vocabulary) only on the
  // M rows the loss reads, about 15% under MLM masking. M == 0 gives (0, V) and (0).
  struct MaskedLogits {
    Tensor logits;  // (M, V), recorded
    Tensor labels;  // (M) i64
  };
  MaskedLogits masked_logits(const Tensor& ids, const Tensor& labels, const Tensor& attention_mask = Tensor(),
                             const Tensor& token_type_ids = Tensor()) const;
  // Mean cross-entropy (0-d) over the positions whose label is not -100 (labels (B, T)), computed
  // on masked_logits; with no labelled position, the full logits' cross-entropy with
  // ignore_index -100 (what ops::cross_entropy defines for that case).
  Tensor mlm_loss(const Tensor& ids, const Tensor& labels, const Tensor& attention_mask = Tensor(),
                  const Tensor& token_type_ids = Tensor()) const;
  // The forward in pieces, for pipeline stages:
  // masked_logits(ids, labels, mask, types) == masked_head(run_blocks(embed(ids, types), 0, L, mask), labels)
  // whenever a position is labelled.
  Tensor embed(const Tensor& ids, const Tensor& token_type_ids = Tensor()) const;  // (B, T) -> (B, T, D)
  // Layers [begin, end) on x (B, T, D); attention_mask (B, T) of 0 / 1 or undefined.
  Tensor run_blocks(const Tensor& x, int64_t begin, int64_t end, const Tensor& attention_mask = Tensor()) const;
  // The prediction head on the labelled rows of the encoder's output x (B, T, D); M == 0 gives
  // (0, V) unrecorded logits, as masked_logits.
  MaskedLogits masked_head(const Tensor& x, const Tensor& labels) const;
  // The tied decoder reads word_embeddings in the head: a pipeline keeps it on its first and
  // last stage and sums its gradients.
  std::vector<std::string> tied_parameters() const { return {"bert.embeddings.word_embeddings.weight"}; }
  // The tensor-parallel plan (nn/tp_plan.h): in every encoder layer attention.self.{query, key,
  // value} and intermediate.dense column-parallel, attention.output.dense and output.dense
  // row-parallel, the heads divided. The embeddings, the LayerNorms, the row-parallel biases and
  // the prediction head (with the tied decoder) are replicated: every rank computes them alike.
  static nn::TpPlan tp_plan();
  // Fraction of the labelled positions (label != -100) whose argmax logit is the label (no graph
  // recorded); 0 when no position is labelled.
  double mlm_accuracy(const Tensor& ids, const Tensor& labels, const Tensor& attention_mask = Tensor(),
                      const Tensor& token_type_ids = Tensor()) const;
  // Model FLOPs per token of one training step (forward + backward = 3x forward, 2 per
  // multiply-add): 6 (L (4 D^2 + 2 D F) + D^2 + V D) + 12 L T D, i.e. the encoder GEMMs, the
  // MLM transform and the tied decoder, plus attention's two T x T x D products per layer.
  double flops_per_token(int64_t T) const;
  const BERTConfig& config() const { return cfg_; }
  Generator& dropout_generator() { return gen_; }
  std::shared_ptr<BERTModel> bert;
  std::shared_ptr<nn::Submodules> cls;
  std::shared_ptr<BERTPredictionHead> predictions;

 private:
  Tensor logits_flat(const Tensor& ids, const Tensor& attention_mask, const Tensor& token_type_ids) const;
  Tensor encode(const Tensor& ids, const Tensor& attention_mask, const Tensor& token_type_ids) const;  // (B, T, D)
  Tensor head(const Tensor& h) const;  // (N, D) -> logits (N, V)
  BERTConfig cfg_;
  Generator gen_;  // dropout masks
};

}  // namespace brigade::models
