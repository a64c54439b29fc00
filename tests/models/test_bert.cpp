// BERT (masked LM) parity with the plain-PyTorch reference (tests/reference/encoder_ref.py;
// fixture tests/fixtures/bert_tiny.safetensors from make_encoder_fixtures.py, with padded keys,
// a second token type and -100 labels): Hugging Face names and shapes, init bitwise torch's,
// MLM logits and loss within 1e-5 and every parameter gradient within 1e-4 (relative: max|a - b|
// / max|b| over each tensor; word_embeddings' gradient includes the tied decoder's; the key
// biases, whose exact gradient is 0, normalised by their whole key projection, see grad_err), a save ->
// load round trip through ckpt::save_safetensors with the HF names, and (when /usr/bin/python3
// has torch) Brigade-saved weights loaded into the reference give the same loss. Also: padded
// positions do not change the other positions' logits, mlm_accuracy, errors, FLOPs.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/models/bert/bert.h"

#include "support/fixture_configs.h"
#include "support/parity.h"

using namespace brigade;
using test_support::rel_err;

namespace {

class BertParity : public test_support::ParityTest<models::BERT, models::BERTConfig> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(open_fixture("bert_tiny.safetensors", "bert_parity"));
    ids_ = r_.get("ids");
    mask_ = r_.get("attention_mask");
    types_ = r_.get("token_type_ids");
    labels_ = r_.get("labels");
  }
  Tensor loss(const models::BERT& m) const override { return m.mlm_loss(ids_, labels_, mask_, types_); }
  Tensor ids_, mask_, types_, labels_;
};

TEST_F(BertParity, ParameterNamesAndShapesAreHuggingFaces) {
  models::BERT m(cfg_);
  ASSERT_NO_FATAL_FAILURE(test_support::expect_parameters_in_fixture(m, r_));
  const std::set<std::string> names = test_support::parameter_names(m);
  for (const char* s :
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.bias",
        "bert.encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.1.attention.self.value.bias",
        "bert.encoder.layer.0.attention.output.dense.weight", "bert.encoder.layer.0.attention.output.LayerNorm.weight",
        "bert.encoder.layer.1.intermediate.dense.bias", "bert.encoder.layer.1.output.dense.weight",
        "bert.encoder.layer.1.output.LayerNorm.bias", "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.bias"})
    EXPECT_TRUE(names.count(s)) << s;
  EXPECT_FALSE(names.count("cls.predictions.decoder.weight"));  // tied to the word embeddings
}

TEST_F(BertParity, InitialisationIsBitwiseTorch) {
  models::BERT m(cfg_);
  expect_init_is_fixtures(m);
}

TEST_F(BertParity, LogitsLossAndGradientsMatchTorch) {
  models::BERT m(cfg_);
  load(m);
  const Tensor logits = m.forward(ids_, mask_, types_);
  EXPECT_EQ(logits.shape(), Shape({ids_.size(0), ids_.size(1), cfg_.vocab_size}));
  expect_logits_loss_and_gradients(m, logits);
}

TEST_F(BertParity, RefBackendGivesTheSameLoss) { expect_ref_backend_loss(); }

TEST_F(BertParity, PaddedKeysDoNotReachOtherPositions) {
  // Changing the ids at padded positions of row 0 (mask 0 at t >= 7) leaves the logits of every
  // unpadded position unchanged (bitwise: masked keys never enter the sums).
  models::BERT m(cfg_);
  load(m);
  autograd::NoGradGuard ng;
  std::vector<int64_t> ids = ids_.to_vector_i64();
  const int64_t T = ids_.size(1), V = cfg_.vocab_size;
  for (int64_t t = 7; t < T; ++t) ids[size_t(t)] = (ids[size_t(t)] + 17) % V;
  const std::vector<float> a = m.forward(ids_, mask_, types_).to_vector();
  const std::vector<float> b = m.forward(Tensor::from_vector_i64(ids, ids_.shape()), mask_, types_).to_vector();
  for (int64_t t = 0; t < 7; ++t)
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(a[size_t(t * V + v)], b[size_t(t * V + v)]) << "t=" << t;
  bool changed = false;
  for (int64_t v = 0; v < V; ++v) changed = changed || a[size_t(8 * V + v)] != b[size_t(8 * V + v)];
  EXPECT_TRUE(changed);  // the padded positions' own logits do change
}

TEST_F(BertParity, MlmAccuracyCountsLabelledArgmaxHits) {
  models::BERT m(cfg_);
  load(m);
  const std::vector<float> logits = r_.get("logits").to_vector();
  const std::vector<int64_t> lab = labels_.to_vector_i64();
  const int64_t V = cfg_.vocab_size;
  int n = 0, hit = 0;
  for (size_t i = 0; i < lab.size(); ++i) {
    if (lab[i] == -100) continue;
    ++n;
    hit += std::max_element(logits.begin() + long(i * V), logits.begin() + long((i + 1) * V)) -
               (logits.begin() + long(i * V)) ==
           lab[i];
  }
  EXPECT_DOUBLE_EQ(m.mlm_accuracy(ids_, labels_, mask_, types_), double(hit) / n);
  // labels equal to the argmax everywhere: accuracy 1; nothing labelled: 0
  std::vector<int64_t> best(lab.size());
  for (size_t i = 0; i < lab.size(); ++i)
    best[i] = std::max_element(logits.begin() + long(i * V), logits.begin() + long((i + 1) * V)) -
              (logits.begin() + long(i * V));
  EXPECT_DOUBLE_EQ(m.mlm_accuracy(ids_, Tensor::from_vector_i64(best, ids_.shape()), mask_, types_), 1.0);
  EXPECT_DOUBLE_EQ(m.mlm_accuracy(ids_, Tensor::full(ids_.shape(), -100, DType::I64), mask_, types_), 0.0);
}

TEST_F(BertParity, SaveLoadRoundTripWithHuggingFaceNames) { expect_save_load_round_trip("bert_rt"); }

TEST_F(BertParity, RunsUnderAutocastWithF32Gradients) {
  // bf16 autocast: the MLM loss stays near the f32 reference (bf16 keeps ~3 significant
  // digits) and every parameter gets an f32 gradient.
  expect_autocast_f32_gradients(2e-2);
}

TEST_F(BertParity, DropoutOnlyInTrainingMode) {
  models::BERTConfig c = cfg_;
  c.hidden_dropout = 0.2;
  models::BERT m(c);
  load(m);
  autograd::NoGradGuard ng;
  m.train(false);
  EXPECT_LT(rel_err(loss(m), r_.get("loss")), 1e-5);  // eval: no dropout
  m.train(true);
  EXPECT_NE(loss(m).item(), r_.get("loss").item());
}

TEST(BertCheckpoint, BrigadeWeightsLoadIntoPyTorchWithTheSameLoss) {
  if (!test_support::have_torch())
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  models::BERTConfig c;  // other sizes than the fixture
  c.vocab_size = 61;
  c.max_position_embeddings = 20;
  c.hidden_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 3;
  c.intermediate_size = 40;
  models::BERT m(c);
  Generator g(99);
  m.init_weights(g);
  test_support::perturb(m.named_parameters(), g, 0.05);  // move off the structured init
  const int64_t B = 3, T = 12;
  std::vector<int64_t> idv, labv, maskv, typev;
  for (int64_t i = 0; i < B * T; ++i) {
    idv.push_back((i * 37 + 11) % c.vocab_size);
    const bool pad = (i / T == 1 && i % T >= 9) || (i / T == 2 && i % T >= 5);
    maskv.push_back(pad ? 0 : 1);
    labv.push_back(!pad && i % 3 == 1 ? (i * 53 + 5) % c.vocab_size : -100);
    typev.push_back(i % T >= 6 ? 1 : 0);
  }
  const Tensor ids = Tensor::from_vector_i64(idv, {B, T}), labels = Tensor::from_vector_i64(labv, {B, T});
  const Tensor mask = Tensor::from_vector_i64(maskv, {B, T}), types = Tensor::from_vector_i64(typev, {B, T});
  const double loss = test_support::item_without_grad([&] { return m.mlm_loss(ids, labels, mask, types); });
  test_support::expect_reference_loss(
      "bert_py", "encoder_ref.py check --model bert --weights", m.named_parameters(), nlohmann::json(c).dump(),
      {{"ids", ids}, {"labels", labels}, {"attention_mask", mask}, {"token_type_ids", types}}, loss);
}

TEST(Bert, ConfigAndShapeErrors) {
  models::BERTConfig c;
  c.hidden_size = 30;
  c.num_attention_heads = 4;
  EXPECT_THROW(models::BERT{c}, ConfigError);
  c = models::BERTConfig{};
  c.vocab_size = 0;
  EXPECT_THROW(models::BERT{c}, ConfigError);
  c = models::BERTConfig{};
  c.vocab_size = 20;
  c.max_position_embeddings = 8;
  c.hidden_size = 8;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.intermediate_size = 8;
  models::BERT m(c);
  const Tensor ids = Tensor::zeros({2, 6}, DType::I64);
  EXPECT_THROW(m.forward(Tensor::zeros({2, 9}, DType::I64)), ShapeError);         // longer than 8 positions
  EXPECT_THROW(m.forward(ids, Tensor::ones({2, 5}, DType::I64)), ShapeError);     // mask shape
  EXPECT_THROW(m.mlm_loss(ids, Tensor::zeros({2, 5}, DType::I64)), ShapeError);   // labels shape
  EXPECT_THROW(m.forward(ids, Tensor::full({2, 6}, 2, DType::I64)), ValueError);  // mask not 0/1
}

TEST(Bert, FlopsPerToken) {
  models::BERTConfig c;  // BERT-base
  models::BERT m(c);
  const double D = 768, M = 3072, L = 12, V = 30522, T = 512;
  EXPECT_DOUBLE_EQ(m.flops_per_token(512), 6 * (L * (4 * D * D + 2 * D * M) + D * D + V * D) + 12 * L * T * D);
}

}  // namespace
