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
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/models/bert/bert.h"

#include "support/parity.h"

using namespace brigade;
using test_support::grad_err;
using test_support::rel_err;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(BRIGADE_FIXTURES_DIR) + "/bert_tiny.safetensors";

models::BERTConfig config_from_json(const nlohmann::json& j) {
  models::BERTConfig c;
  c.vocab_size = j.at("vocab_size");
  c.max_position_embeddings = j.at("max_position_embeddings");
  c.type_vocab_size = j.at("type_vocab_size");
  c.hidden_size = j.at("hidden_size");
  c.num_hidden_layers = j.at("num_hidden_layers");
  c.num_attention_heads = j.at("num_attention_heads");
  c.intermediate_size = j.at("intermediate_size");
  c.layer_norm_eps = j.at("layer_norm_eps");
  return c;
}

nlohmann::json config_json(const models::BERTConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.max_position_embeddings},
          {"type_vocab_size", c.type_vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"intermediate_size", c.intermediate_size},
          {"layer_norm_eps", c.layer_norm_eps}};
}

class BertParity : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kFixture)) << kFixture;
    r_.open(kFixture);
    ASSERT_EQ(r_.metadata("magic").value_or(""), "brigade-fixture");
    ASSERT_EQ(r_.metadata("kind").value_or(""), "bert_parity");
    cfg_ = config_from_json(nlohmann::json::parse(r_.metadata("config").value()));
    ids_ = r_.get("ids");
    mask_ = r_.get("attention_mask");
    types_ = r_.get("token_type_ids");
    labels_ = r_.get("labels");
  }
  void load(models::BERT& m) {
    for (auto& [name, p] : m.named_parameters()) {
      ASSERT_TRUE(r_.contains(name)) << name;
      p.copy_(r_.get(name));
    }
  }
  ckpt::SafetensorsReader r_;
  models::BERTConfig cfg_;
  Tensor ids_, mask_, types_, labels_;
};

TEST_F(BertParity, ParameterNamesAndShapesAreHuggingFaces) {
  models::BERT m(cfg_);
  size_t n = 0;
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(r_.contains(name)) << "Brigade has " << name << ", the reference does not";
    EXPECT_EQ(p.shape(), r_.info(name).shape) << name;
    ++n;
  }
  size_t ref_params = 0;
  for (const std::string& name : r_.names()) ref_params += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(n, ref_params);
  const auto params = m.named_parameters();
  auto has = [&](const std::string& s) {
    for (auto& [name, p] : params)
      if (name == s) return true;
    return false;
  };
  for (const char* s :
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.bias",
        "bert.encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.1.attention.self.value.bias",
        "bert.encoder.layer.0.attention.output.dense.weight", "bert.encoder.layer.0.attention.output.LayerNorm.weight",
        "bert.encoder.layer.1.intermediate.dense.bias", "bert.encoder.layer.1.output.dense.weight",
        "bert.encoder.layer.1.output.LayerNorm.bias", "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.bias"})
    EXPECT_TRUE(has(s)) << s;
  EXPECT_FALSE(has("cls.predictions.decoder.weight"));  // tied to the word embeddings
}

TEST_F(BertParity, InitialisationIsBitwiseTorch) {
  models::BERT m(cfg_);
  Generator g(std::stoull(r_.metadata("init_seed").value()));
  m.init_weights(g);
  for (auto& [name, p] : m.named_parameters()) {
    const Tensor want = r_.get("init." + name);
    ASSERT_EQ(p.shape(), want.shape()) << name;
    EXPECT_EQ(0, std::memcmp(p.raw_data(), want.raw_data(), p.nbytes())) << "parameter " << name << " differs";
  }
}

TEST_F(BertParity, LogitsLossAndGradientsMatchTorch) {
  models::BERT m(cfg_);
  load(m);
  const Tensor logits = m.forward(ids_, mask_, types_);
  EXPECT_EQ(logits.shape(), Shape({ids_.size(0), ids_.size(1), cfg_.vocab_size}));
  EXPECT_LT(rel_err(logits, r_.get("logits")), 1e-5);
  const Tensor loss = m.mlm_loss(ids_, labels_, mask_, types_);
  EXPECT_LT(rel_err(loss, r_.get("loss")), 1e-5) << loss.item() << " vs " << r_.get("loss").item();
  autograd::backward(loss);
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LT(grad_err(r_, name, p.grad()), 1e-4) << "gradient of " << name;
  }
}

TEST_F(BertParity, RefBackendGivesTheSameLoss) {
  models::BERT m(cfg_);
  load(m);
  ops::BackendScope s(ops::Backend::Ref);
  autograd::NoGradGuard ng;
  EXPECT_LT(rel_err(m.mlm_loss(ids_, labels_, mask_, types_), r_.get("loss")), 1e-5);
}

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

TEST_F(BertParity, SaveLoadRoundTripWithHuggingFaceNames) {
  models::BERT a(cfg_);
  load(a);
  const fs::path path = fs::temp_directory_path() / ("brigade_bert_rt_" + std::to_string(::getpid()) + ".safetensors");
  ckpt::save_safetensors(path.string(), a.named_parameters(), {{"config", config_json(cfg_).dump()}});
  models::BERT b(cfg_);
  ckpt::SafetensorsReader r(path.string());
  EXPECT_EQ(r.size(), a.named_parameters().size());
  for (auto& [name, p] : b.named_parameters()) r.get_into(name, p);
  for (auto& [name, p] : a.named_parameters()) {
    const Tensor q = r.get(name);
    EXPECT_EQ(0, std::memcmp(p.raw_data(), q.raw_data(), p.nbytes())) << name;
  }
  autograd::NoGradGuard ng;
  EXPECT_EQ(a.mlm_loss(ids_, labels_, mask_, types_).item(), b.mlm_loss(ids_, labels_, mask_, types_).item());
  fs::remove(path);
}

TEST_F(BertParity, RunsUnderAutocastWithF32Gradients) {
  // bf16 autocast: the MLM loss stays near the f32 reference (bf16 keeps ~3 significant
  // digits) and every parameter gets an f32 gradient.
  for (amp::Level level : {amp::Level::O1, amp::Level::O2}) {
    models::BERT m(cfg_);
    load(m);
    Tensor loss;
    {
      amp::AutocastScope scope(amp::Policy{level, DType::BF16});
      loss = m.mlm_loss(ids_, labels_, mask_, types_);
    }
    EXPECT_EQ(loss.dtype(), DType::F32);
    EXPECT_NEAR(loss.item(), r_.get("loss").item(), 2e-2 * std::abs(r_.get("loss").item())) << amp::level_name(level);
    autograd::backward(loss);
    for (auto& [name, p] : m.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().dtype(), DType::F32) << name;
    }
  }
}

TEST_F(BertParity, DropoutOnlyInTrainingMode) {
  models::BERTConfig c = cfg_;
  c.hidden_dropout = 0.2;
  models::BERT m(c);
  load(m);
  autograd::NoGradGuard ng;
  m.train(false);
  EXPECT_LT(rel_err(m.mlm_loss(ids_, labels_, mask_, types_), r_.get("loss")), 1e-5);  // eval: no dropout
  m.train(true);
  EXPECT_NE(m.mlm_loss(ids_, labels_, mask_, types_).item(), r_.get("loss").item());
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
  for (auto& [name, p] : m.named_parameters()) {  // move off the structured init
    Tensor noise = Tensor::empty(p.shape());
    g.normal_(noise, 0.0, 0.05);
    p.copy_(ops::add(p, noise));
  }
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
  double loss;
  {
    autograd::NoGradGuard ng;
    loss = m.mlm_loss(ids, labels, mask, types).item();
  }
  const fs::path dir = fs::temp_directory_path() / ("brigade_bert_py_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ckpt::save_safetensors((dir / "model.safetensors").string(), m.named_parameters(),
                         {{"config", config_json(c).dump()}});
  ckpt::save_safetensors((dir / "batch.safetensors").string(),
                         {{"ids", ids},
                          {"labels", labels},
                          {"attention_mask", mask},
                          {"token_type_ids", types},
                          {"loss", Tensor::full({}, loss)}},
                         {});
  const std::string cmd = "/usr/bin/python3 " + std::string(BRIGADE_SOURCE_DIR) +
                          "/tests/reference/encoder_ref.py check --model bert --weights " +
                          (dir / "model.safetensors").string() + " --batch " + (dir / "batch.safetensors").string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove_all(dir);
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
