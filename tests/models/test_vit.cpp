// ViT parity with the plain-PyTorch reference (tests/reference/encoder_ref.py; fixture
// tests/fixtures/vit_tiny.safetensors from make_encoder_fixtures.py): Hugging Face names and
// shapes, init bitwise torch's, logits and loss within 1e-5 and every parameter gradient within
// 1e-4 (relative: max|a - b| / max|b| over each tensor; the key biases, whose exact gradient is 0,
// normalised by their whole key projection, see grad_err), a save -> load round trip through
// ckpt::save_safetensors with the HF names, and (when /usr/bin/python3 has torch) Brigade-saved
// weights loaded into the reference give the same loss. Also config errors, bad image shapes,
// FLOPs, and the patch projection equal to torch's Conv2d layout.
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
#include "brigade/models/vit/vit.h"

#include "support/parity.h"

using namespace brigade;
using test_support::grad_err;
using test_support::rel_err;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(BRIGADE_FIXTURES_DIR) + "/vit_tiny.safetensors";

models::ViTConfig config_from_json(const nlohmann::json& j) {
  models::ViTConfig c;
  c.image_size = j.at("image_size");
  c.patch_size = j.at("patch_size");
  c.num_channels = j.at("num_channels");
  c.hidden_size = j.at("hidden_size");
  c.num_hidden_layers = j.at("num_hidden_layers");
  c.num_attention_heads = j.at("num_attention_heads");
  c.intermediate_size = j.at("intermediate_size");
  c.num_labels = j.at("num_labels");
  c.layer_norm_eps = j.at("layer_norm_eps");
  return c;
}

nlohmann::json config_json(const models::ViTConfig& c) {
  return {{"image_size", c.image_size},
          {"patch_size", c.patch_size},
          {"num_channels", c.num_channels},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"intermediate_size", c.intermediate_size},
          {"num_labels", c.num_labels},
          {"layer_norm_eps", c.layer_norm_eps}};
}

class VitParity : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kFixture)) << kFixture;
    r_.open(kFixture);
    ASSERT_EQ(r_.metadata("magic").value_or(""), "brigade-fixture");
    ASSERT_EQ(r_.metadata("kind").value_or(""), "vit_parity");
    cfg_ = config_from_json(nlohmann::json::parse(r_.metadata("config").value()));
  }
  void load(models::ViT& m) {
    for (auto& [name, p] : m.named_parameters()) {
      ASSERT_TRUE(r_.contains(name)) << name;
      p.copy_(r_.get(name));
    }
  }
  ckpt::SafetensorsReader r_;
  models::ViTConfig cfg_;
};

TEST_F(VitParity, ParameterNamesAndShapesAreHuggingFaces) {
  models::ViT m(cfg_);
  size_t n = 0;
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(r_.contains(name)) << "Brigade has " << name << ", the reference does not";
    EXPECT_EQ(p.shape(), r_.info(name).shape) << name;
    ++n;
  }
  size_t ref_params = 0;
  for (const std::string& name : r_.names()) ref_params += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(n, ref_params);
  // a few names spelled out
  const auto params = m.named_parameters();
  auto has = [&](const std::string& s) {
    for (auto& [name, p] : params)
      if (name == s) return true;
    return false;
  };
  for (const char* s :
       {"vit.embeddings.cls_token", "vit.embeddings.position_embeddings",
        "vit.embeddings.patch_embeddings.projection.weight", "vit.encoder.layer.1.attention.attention.query.weight",
        "vit.encoder.layer.0.attention.output.dense.bias", "vit.encoder.layer.0.layernorm_before.weight",
        "vit.encoder.layer.0.intermediate.dense.weight", "vit.encoder.layer.1.output.dense.weight",
        "vit.encoder.layer.1.layernorm_after.bias", "vit.layernorm.weight", "classifier.bias"})
    EXPECT_TRUE(has(s)) << s;
  EXPECT_EQ(params.front().first, "vit.embeddings.cls_token");  // HF order
  EXPECT_EQ(params.back().first, "classifier.bias");
}

TEST_F(VitParity, InitialisationIsBitwiseTorch) {
  models::ViT m(cfg_);
  Generator g(std::stoull(r_.metadata("init_seed").value()));
  m.init_weights(g);
  for (auto& [name, p] : m.named_parameters()) {
    const Tensor want = r_.get("init." + name);
    ASSERT_EQ(p.shape(), want.shape()) << name;
    EXPECT_EQ(0, std::memcmp(p.raw_data(), want.raw_data(), p.nbytes())) << "parameter " << name << " differs";
  }
}

TEST_F(VitParity, LogitsLossAndGradientsMatchTorch) {
  models::ViT m(cfg_);
  load(m);
  const Tensor images = r_.get("images"), labels = r_.get("labels");
  const Tensor logits = m.forward(images);
  EXPECT_EQ(logits.shape(), Shape({images.size(0), cfg_.num_labels}));
  EXPECT_LT(rel_err(logits, r_.get("logits")), 1e-5);
  const Tensor loss = m.loss(images, labels);
  EXPECT_LT(rel_err(loss, r_.get("loss")), 1e-5) << loss.item() << " vs " << r_.get("loss").item();
  autograd::backward(loss);
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LT(grad_err(r_, name, p.grad()), 1e-4) << "gradient of " << name;
  }
}

TEST_F(VitParity, RefBackendGivesTheSameLoss) {
  models::ViT m(cfg_);
  load(m);
  ops::BackendScope s(ops::Backend::Ref);
  autograd::NoGradGuard ng;
  const Tensor loss = m.loss(r_.get("images"), r_.get("labels"));
  EXPECT_LT(rel_err(loss, r_.get("loss")), 1e-5);
}

TEST_F(VitParity, SaveLoadRoundTripWithHuggingFaceNames) {
  models::ViT a(cfg_);
  load(a);
  const fs::path path = fs::temp_directory_path() / ("brigade_vit_rt_" + std::to_string(::getpid()) + ".safetensors");
  ckpt::save_safetensors(path.string(), a.named_parameters(), {{"config", config_json(cfg_).dump()}});
  models::ViT b(cfg_);
  ckpt::SafetensorsReader r(path.string());
  EXPECT_EQ(r.size(), a.named_parameters().size());
  for (auto& [name, p] : b.named_parameters()) r.get_into(name, p);
  for (auto& [name, p] : a.named_parameters()) {
    const Tensor q = r.get(name);
    EXPECT_EQ(0, std::memcmp(p.raw_data(), q.raw_data(), p.nbytes())) << name;
  }
  autograd::NoGradGuard ng;
  EXPECT_EQ(a.loss(r_.get("images"), r_.get("labels")).item(), b.loss(r_.get("images"), r_.get("labels")).item());
  fs::remove(path);
}

TEST_F(VitParity, RunsUnderAutocastWithF32Gradients) {
  // bf16 autocast (O1: GEMMs and attention in bf16; O2: also the rest that the table allows):
  // the loss stays near the f32 reference (bf16 keeps ~3 significant digits; 2 layers) and
  // every parameter gets an f32 gradient.
  for (amp::Level level : {amp::Level::O1, amp::Level::O2}) {
    models::ViT m(cfg_);
    load(m);
    Tensor loss;
    {
      amp::AutocastScope scope(amp::Policy{level, DType::BF16});
      loss = m.loss(r_.get("images"), r_.get("labels"));
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

TEST_F(VitParity, DropoutOnlyInTrainingMode) {
  models::ViTConfig c = cfg_;
  c.hidden_dropout = 0.2;
  models::ViT m(c);
  load(m);
  autograd::NoGradGuard ng;
  const Tensor images = r_.get("images"), labels = r_.get("labels");
  m.train(false);
  EXPECT_LT(rel_err(m.loss(images, labels), r_.get("loss")), 1e-5);  // eval: no dropout
  m.train(true);
  EXPECT_NE(m.loss(images, labels).item(), r_.get("loss").item());
}

TEST(VitCheckpoint, BrigadeWeightsLoadIntoPyTorchWithTheSameLoss) {
  if (!test_support::have_torch())
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  models::ViTConfig c;  // other sizes than the fixture: 3 channels, 8x8 images of 2x2 patches
  c.image_size = 8;
  c.patch_size = 2;
  c.num_channels = 3;
  c.hidden_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.intermediate_size = 40;
  c.num_labels = 7;
  models::ViT m(c);
  Generator g(99);
  m.init_weights(g);
  for (auto& [name, p] : m.named_parameters()) {  // move off the structured init
    Tensor noise = Tensor::empty(p.shape());
    g.normal_(noise, 0.0, 0.05);
    p.copy_(ops::add(p, noise));
  }
  Tensor images = Tensor::empty({4, 3, 8, 8});
  g.normal_(images, 0.0, 1.0);
  const Tensor labels = Tensor::from_vector_i64({0, 6, 3, 3}, {4});
  double loss;
  {
    autograd::NoGradGuard ng;
    loss = m.loss(images, labels).item();
  }
  const fs::path dir = fs::temp_directory_path() / ("brigade_vit_py_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ckpt::save_safetensors((dir / "model.safetensors").string(), m.named_parameters(),
                         {{"config", config_json(c).dump()}});
  ckpt::save_safetensors((dir / "batch.safetensors").string(),
                         {{"images", images}, {"labels", labels}, {"loss", Tensor::full({}, loss)}}, {});
  const std::string cmd = "/usr/bin/python3 " + std::string(BRIGADE_SOURCE_DIR) +
                          "/tests/reference/encoder_ref.py check --model vit --weights " +
                          (dir / "model.safetensors").string() + " --batch " + (dir / "batch.safetensors").string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove_all(dir);
}

TEST(Vit, PatchProjectionIsConv2dLayout) {
  // One image, one patch channel layout check: a weight that picks pixel (c, i, j) of each patch.
  models::ViTConfig c;
  c.image_size = 4;
  c.patch_size = 2;
  c.num_channels = 2;
  c.hidden_size = 8;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.intermediate_size = 8;
  c.num_labels = 2;
  models::ViT m(c);
  auto& proj = *m.vit->embeddings->projection;
  std::vector<float> w(8 * 2 * 2 * 2, 0.f);
  for (int d = 0; d < 8; ++d) w[size_t(d * 8 + d)] = 1.f;  // output d = feature d = (c, i, j) with d = c*4 + i*2 + j
  proj.weight.copy_(Tensor::from_vector(w, {8, 2, 2, 2}));
  std::vector<float> img(2 * 4 * 4);
  for (size_t i = 0; i < img.size(); ++i) img[i] = float(i);
  const std::vector<float> y = proj.forward(Tensor::from_vector(img, {1, 2, 4, 4})).to_vector();  // (1, 4, 8)
  for (int pi = 0; pi < 4; ++pi)
    for (int ch = 0; ch < 2; ++ch)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
          const int h = (pi / 2) * 2 + i, x = (pi % 2) * 2 + j;  // patch pi is row pi / 2, column pi % 2
          EXPECT_EQ(y[size_t(pi * 8 + ch * 4 + i * 2 + j)], img[size_t((ch * 4 + h) * 4 + x)]);
        }
}

TEST(Vit, ConfigAndShapeErrors) {
  models::ViTConfig c;
  c.image_size = 10;
  c.patch_size = 4;
  EXPECT_THROW(models::ViT{c}, ConfigError);
  c = models::ViTConfig{};
  c.hidden_size = 30;
  c.num_attention_heads = 4;
  EXPECT_THROW(models::ViT{c}, ConfigError);
  c = models::ViTConfig{};
  c.image_size = 8;
  c.patch_size = 4;
  c.hidden_size = 8;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.intermediate_size = 8;
  c.num_labels = 3;
  models::ViT m(c);
  try {
    m.forward(Tensor::zeros({2, 3, 12, 12}));
    ADD_FAILURE() << "no error for a 12x12 image on an 8x8 model";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("ViT.forward"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.loss(Tensor::zeros({2, 3, 8, 8}), Tensor::from_vector_i64({1}, {1})), ShapeError);
}

TEST(Vit, FlopsPerImage) {
  models::ViTConfig c;  // ViT-B/16 at 224: 196 patches
  models::ViT m(c);
  const double D = 768, M = 3072, L = 12, P = 196, S = 197;
  const double fwd = 2 * (P * 3 * 16 * 16 * D + S * L * (4 * D * D + 2 * D * M) + D * 1000) + 4 * L * S * S * D;
  EXPECT_DOUBLE_EQ(m.flops_per_image(), 3 * fwd);
  EXPECT_NEAR(m.flops_per_image() / 3 / 2, 17.6e9, 0.2e9);  // ~17.6 GMACs forward, the published figure
}

}  // namespace
