// ViT parity with the plain-PyTorch reference (tests/reference/encoder_ref.py; fixture
// tests/fixtures/vit_tiny.safetensors from make_encoder_fixtures.py): Hugging Face names and
// shapes, init bitwise torch's, logits and loss within 1e-5 and every parameter gradient within
// 1e-4 (relative: max|a - b| / max|b| over each tensor; the key biases, whose exact gradient is 0,
// normalised by their whole key projection, see grad_err), a save -> load round trip through
// ckpt::save_safetensors with the HF names, and (when /usr/bin/python3 has torch) Brigade-saved
// weights loaded into the reference give the same loss. Also config errors, bad image shapes,
// FLOPs, and the patch projection equal to torch's Conv2d layout.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/models/vit/vit.h"

#include "support/fixture_configs.h"
#include "support/parity.h"

using namespace brigade;
using test_support::rel_err;

namespace {

class VitParity : public test_support::ParityTest<models::ViT, models::ViTConfig> {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(open_fixture("vit_tiny.safetensors", "vit_parity")); }
  Tensor loss(const models::ViT& m) const override { return m.loss(r_.get("images"), r_.get("labels")); }
};

TEST_F(VitParity, ParameterNamesAndShapesAreHuggingFaces) {
  models::ViT m(cfg_);
  ASSERT_NO_FATAL_FAILURE(test_support::expect_parameters_in_fixture(m, r_));
  // a few names spelled out
  const auto params = m.named_parameters();
  const std::set<std::string> names = test_support::parameter_names(m);
  for (const char* s :
       {"vit.embeddings.cls_token", "vit.embeddings.position_embeddings",
        "vit.embeddings.patch_embeddings.projection.weight", "vit.encoder.layer.1.attention.attention.query.weight",
        "vit.encoder.layer.0.attention.output.dense.bias", "vit.encoder.layer.0.layernorm_before.weight",
        "vit.encoder.layer.0.intermediate.dense.weight", "vit.encoder.layer.1.output.dense.weight",
        "vit.encoder.layer.1.layernorm_after.bias", "vit.layernorm.weight", "classifier.bias"})
    EXPECT_TRUE(names.count(s)) << s;
  EXPECT_EQ(params.front().first, "vit.embeddings.cls_token");  // HF order
  EXPECT_EQ(params.back().first, "classifier.bias");
}

TEST_F(VitParity, InitialisationIsBitwiseTorch) {
  models::ViT m(cfg_);
  expect_init_is_fixtures(m);
}

TEST_F(VitParity, LogitsLossAndGradientsMatchTorch) {
  models::ViT m(cfg_);
  load(m);
  const Tensor images = r_.get("images");
  const Tensor logits = m.forward(images);
  EXPECT_EQ(logits.shape(), Shape({images.size(0), cfg_.num_labels}));
  expect_logits_loss_and_gradients(m, logits);
}

TEST_F(VitParity, RefBackendGivesTheSameLoss) { expect_ref_backend_loss(); }

TEST_F(VitParity, SaveLoadRoundTripWithHuggingFaceNames) { expect_save_load_round_trip("vit_rt"); }

TEST_F(VitParity, RunsUnderAutocastWithF32Gradients) {
  // bf16 autocast (O1: GEMMs and attention in bf16; O2: also the rest that the table allows):
  // the loss stays near the f32 reference (bf16 keeps ~3 significant digits; 2 layers) and
  // every parameter gets an f32 gradient.
  expect_autocast_f32_gradients(2e-2);
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
  test_support::perturb(m.named_parameters(), g, 0.05);  // move off the structured init
  Tensor images = Tensor::empty({4, 3, 8, 8});
  g.normal_(images, 0.0, 1.0);
  const Tensor labels = Tensor::from_vector_i64({0, 6, 3, 3}, {4});
  const double loss = test_support::item_without_grad([&] { return m.loss(images, labels); });
  test_support::expect_reference_loss("vit_py", "encoder_ref.py check --model vit --weights", m.named_parameters(),
                                      nlohmann::json(c).dump(), {{"images", images}, {"labels", labels}}, loss);
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
