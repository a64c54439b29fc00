// Swin parity with the plain-PyTorch reference (tests/reference/swin_ref.py; fixture
// tests/fixtures/swin_tiny.safetensors from make_swin_fixture.py, computed in float64): Hugging
// Face names and shapes, logits and loss within 1e-5 and every parameter gradient within 1e-4
// (max|a - b| / max|b| per tensor; the key biases, whose exact gradient is 0, normalised by their
// whole key projection), a save -> load round trip with the HF names, Brigade-saved weights
// loaded into the reference give the same loss (when /usr/bin/python3 has torch), shifted and
// unshifted blocks differ, config and shape errors, init and FLOPs.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/models/swin/swin.h"

#include "support/fixture_configs.h"
#include "support/parity.h"

using namespace brigade;
using test_support::rel_err;

namespace {

class SwinParity : public test_support::ParityTest<models::Swin, models::SwinConfig> {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(open_fixture("swin_tiny.safetensors", "swin_parity")); }
  Tensor loss(const models::Swin& m) const override { return m.loss(r_.get("images"), r_.get("labels")); }
};

TEST_F(SwinParity, ParameterNamesAndShapesAreHuggingFaces) {
  models::Swin m(cfg_);
  ASSERT_NO_FATAL_FAILURE(test_support::expect_parameters_in_fixture(m, r_));
  const auto params = m.named_parameters();
  const std::set<std::string> names = test_support::parameter_names(m);
  for (const char* s :
       {"swin.embeddings.patch_embeddings.projection.weight", "swin.embeddings.patch_embeddings.projection.bias",
        "swin.embeddings.norm.weight", "swin.encoder.layers.0.blocks.1.layernorm_before.bias",
        "swin.encoder.layers.0.blocks.0.attention.self.relative_position_bias_table",
        "swin.encoder.layers.1.blocks.1.attention.self.query.weight",
        "swin.encoder.layers.0.blocks.0.attention.self.value.bias",
        "swin.encoder.layers.0.blocks.0.attention.output.dense.weight",
        "swin.encoder.layers.1.blocks.0.layernorm_after.weight",
        "swin.encoder.layers.1.blocks.0.intermediate.dense.bias", "swin.encoder.layers.0.blocks.1.output.dense.weight",
        "swin.encoder.layers.0.downsample.reduction.weight", "swin.encoder.layers.0.downsample.norm.weight",
        "swin.encoder.layers.0.downsample.norm.bias", "swin.layernorm.weight", "classifier.weight", "classifier.bias"})
    EXPECT_TRUE(names.count(s)) << s;
  EXPECT_FALSE(names.count("swin.encoder.layers.0.downsample.reduction.bias"));
  EXPECT_FALSE(names.count("swin.encoder.layers.1.downsample.norm.weight"));  // the last stage does not merge
  EXPECT_EQ(params.front().first, "swin.embeddings.patch_embeddings.projection.weight");
  EXPECT_EQ(params.back().first, "classifier.bias");
}

TEST_F(SwinParity, LogitsLossAndGradientsMatchTorch) {
  models::Swin m(cfg_);
  load(m);
  const Tensor images = r_.get("images");
  const Tensor logits = m.forward(images);
  EXPECT_EQ(logits.shape(), Shape({images.size(0), cfg_.num_labels}));
  expect_logits_loss_and_gradients(m, logits);
}

TEST_F(SwinParity, RefBackendGivesTheSameLoss) { expect_ref_backend_loss(); }

TEST_F(SwinParity, SaveLoadRoundTripWithHuggingFaceNames) { expect_save_load_round_trip("swin_rt"); }

TEST_F(SwinParity, RunsUnderAutocastWithF32Gradients) { expect_autocast_f32_gradients(3e-2); }

TEST_F(SwinParity, ShiftedAndUnshiftedBlocksDiffer) {
  models::Swin m(cfg_);
  load(m);
  // stage 0: 8x8 grid, window 4: block 0 unshifted, block 1 shifted by 2 with a mask;
  // stage 1: 4x4 grid <= window: one window, no shift (HF's rule)
  const auto& s0 = (*m.swin->layers)[0];
  const auto& s1 = (*m.swin->layers)[1];
  EXPECT_EQ((*s0.blocks)[0].shift, 0);
  EXPECT_EQ((*s0.blocks)[1].shift, 2);
  EXPECT_TRUE((*s0.blocks)[1].attn_mask.defined());
  EXPECT_EQ((*s0.blocks)[1].attn_mask.shape(), Shape({4, 16, 16}));
  EXPECT_EQ((*s1.blocks)[1].shift, 0);
  EXPECT_EQ((*s1.blocks)[1].window, 4);
  EXPECT_FALSE((*s1.blocks)[1].attn_mask.defined());
  // the same weights in an unshifted block give another output
  const auto& shifted = (*s0.blocks)[1];
  models::SwinLayer plain(cfg_, cfg_.embed_dim, cfg_.num_heads[0], 8, 4, 0);
  plain.name_parameters();
  auto src = shifted.named_parameters();
  auto dst = plain.named_parameters();
  ASSERT_EQ(src.size(), dst.size());
  for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
  autograd::NoGradGuard ng;
  Tensor x = Tensor::empty({2, 64, cfg_.embed_dim});
  Generator g(5);
  g.normal_(x, 0.0, 1.0);
  const Tensor a = shifted.forward(x), b = plain.forward(x);
  EXPECT_GT(rel_err(a, b), 1e-3);
  // the fixture's logits depend on the shift: turning block 1's shift off moves them well past
  // the parity tolerance (so the parity test checks the shifted path, mask included)
  auto& blk = (*s0.blocks)[1];
  blk.attn_mask = Tensor();  // shifted without the -100 mask: wrong too
  EXPECT_GT(rel_err(m.forward(r_.get("images")), r_.get("logits")), 1e-4);
  blk.shift = 0;
  EXPECT_GT(rel_err(m.forward(r_.get("images")), r_.get("logits")), 1e-3);
}

TEST(SwinCheckpoint, BrigadeWeightsLoadIntoPyTorchWithTheSameLoss) {
  if (!test_support::have_torch())
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  models::SwinConfig c;  // other sizes than the fixture: 3 channels, 3 stages, window 4
  c.image_size = 16;
  c.patch_size = 2;
  c.num_channels = 3;
  c.embed_dim = 8;
  c.depths = {2, 1, 2};
  c.num_heads = {1, 2, 2};
  c.window_size = 4;
  c.mlp_ratio = 4.0;
  c.num_labels = 7;
  models::Swin m(c);
  Generator g(99);
  m.init_weights(g);
  test_support::perturb(m.named_parameters(), g, 0.05);
  Tensor images = Tensor::empty({3, 3, 16, 16});
  g.normal_(images, 0.0, 1.0);
  const Tensor labels = Tensor::from_vector_i64({0, 6, 3}, {3});
  const double loss = test_support::item_without_grad([&] { return m.loss(images, labels); });
  test_support::expect_reference_loss("swin_py", "swin_ref.py check --weights", m.named_parameters(),
                                      nlohmann::json(c).dump(), {{"images", images}, {"labels", labels}}, loss);
}

models::SwinConfig small() {
  models::SwinConfig c;
  c.image_size = 16;
  c.patch_size = 2;
  c.num_channels = 1;
  c.embed_dim = 8;
  c.depths = {2, 2};
  c.num_heads = {2, 4};
  c.window_size = 4;
  c.num_labels = 3;
  return c;
}

TEST(Swin, ConfigAndShapeErrors) {
  auto expect_config_error = [](const models::SwinConfig& c, const std::string& word) {
    try {
      models::Swin m(c);
      ADD_FAILURE() << "no ConfigError (" << word << ")";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  models::SwinConfig c = small();
  c.window_size = 3;  // 8x8 grid
  expect_config_error(c, "window_size");
  c = small();
  c.image_size = 15;
  expect_config_error(c, "patch_size");
  c = small();
  c.num_heads = {3, 4};  // 8 channels
  expect_config_error(c, "num_heads");
  c = small();
  c.depths = {2, 2, 2};
  expect_config_error(c, "depths");
  c = small();
  c.image_size = 12;  // 6x6 grid -> 3x3 -> odd grid cannot merge again
  c.window_size = 3;
  c.depths = {1, 1, 1};
  c.num_heads = {1, 1, 1};
  expect_config_error(c, "even");
  c = small();
  c.depths = {2, 0};
  expect_config_error(c, "depths[1]");
  models::Swin m(small());
  try {
    m.forward(Tensor::zeros({2, 1, 12, 12}));
    ADD_FAILURE() << "no error for a 12x12 image on a 16x16 model";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("Swin.forward"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.forward(Tensor::zeros({2, 3, 16, 16})), ShapeError);
  EXPECT_THROW(m.loss(Tensor::zeros({2, 1, 16, 16}), Tensor::from_vector_i64({1}, {1})), ShapeError);
}

TEST(Swin, InitWeightsIsHuggingFaces) {
  models::Swin m(small());
  Generator g(7);
  m.init_weights(g);
  for (auto& [name, p] : m.named_parameters()) {
    const std::vector<float> v = p.to_vector();
    const bool ln = name.find("layernorm") != std::string::npos || name.find(".norm.") != std::string::npos;
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (ln && !bias) {
      for (float x : v) EXPECT_EQ(x, 1.f) << name;
    } else if (bias || name.find("relative_position_bias_table") != std::string::npos) {
      for (float x : v) EXPECT_EQ(x, 0.f) << name;
    } else {
      double s = 0;
      for (float x : v) s += double(x) * x;
      EXPECT_NEAR(std::sqrt(s / double(v.size())), 0.02, 0.02 * 0.5) << name;
    }
  }
}

TEST(Swin, FlopsPerImage) {
  models::SwinConfig c;  // Swin-T at 224: published 4.5 GMACs (forward)
  models::Swin m(c);
  EXPECT_NEAR(m.flops_per_image() / 3 / 2, 4.5e9, 0.2e9);
  // the tiny config, by hand: embed 64*4*8; stage 0 L=64 d=8 M=32 N=16; stage 1 L=16 d=16 M=64 N=16
  models::Swin t(small());
  const double macs = 64 * 4 * 8 + 2 * (64 * (4 * 64 + 2 * 8 * 32) + 2 * 64 * 16 * 8) + 64 * 2 * 64 +
                      2 * (16 * (4 * 256 + 2 * 16 * 64) + 2 * 16 * 16 * 16) + 16 * 3;
  EXPECT_DOUBLE_EQ(t.flops_per_image(), 6 * macs);
}

}  // namespace
