// ALIGN parity with the plain-PyTorch reference (tests/reference/align_ref.py; fixture
// tests/fixtures/align_tiny.safetensors from make_align_fixture.py, reference in float64): Hugging
// Face names and shapes of every parameter and BatchNorm buffer, the MBConv geometry (HF's padding
// and squeeze-width quirks), train-mode embeddings, logits and the label-smoothed loss within
// 1e-5, every gradient within 1e-4 and the running statistics after the forward; three more
// train-mode forwards then eval mode (BatchNorm momentum 0.99, expand_bn's 0.1); the ref backend;
// bf16 autocast; the HF config JSON; a save -> load round trip; Brigade-saved weights and buffers
// loaded into the reference give the same loss (when /usr/bin/python3 has torch); the frozen
// statistics scope; config errors and FLOPs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/data/image/captions.h"
#include "brigade/models/align/align.h"
#include "brigade/ops/ops.h"

#include "support/fixture_configs.h"
#include "support/parity.h"

using namespace brigade;
using test_support::grad_err;
using test_support::rel_err;

namespace {

const std::string kFixture = std::string(BRIGADE_FIXTURES_DIR) + "/align_tiny.safetensors";

// The model's parameters and BatchNorm buffers, as they are saved.
nn::NamedTensors state_of(const models::ALIGN& m) {
  nn::NamedTensors state = m.named_parameters();
  for (auto& b : m.named_buffers()) state.push_back(b);
  return state;
}

class AlignParity : public test_support::ParityTest<models::ALIGN, models::AlignConfig> {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(open_fixture("align_tiny.safetensors", "align_parity")); }
  Tensor loss(const models::ALIGN& m) const override {
    return m.contrastive_loss(r_.get("images"), r_.get("ids"), r_.get("lengths"));
  }
  // The fixture's weights and (its original) BatchNorm buffers.
  void load(models::ALIGN& m) const override {
    ParityTest::load(m);
    for (auto& [name, b] : m.named_buffers()) {
      ASSERT_TRUE(r_.contains(name)) << name;
      b.copy_(r_.get(name));
    }
  }
  void expect_buffers(const models::ALIGN& m, const std::string& prefix) const {
    for (auto& [name, b] : m.named_buffers()) {
      const Tensor want = r_.get(prefix + name);
      if (b.dtype() == DType::I64)
        EXPECT_EQ(b.to_vector_i64(), want.to_vector_i64()) << prefix << name;
      else
        EXPECT_LT(rel_err(b, want), 1e-5) << prefix << name;
    }
  }
};

}  // namespace

TEST_F(AlignParity, ParameterAndBufferNamesAndShapesAreHuggingFaces) {
  models::ALIGN m(cfg_);
  size_t n = 0;
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(r_.contains(name)) << name;
    EXPECT_EQ(r_.info(name).shape, p.shape()) << name;
    ++n;
  }
  for (auto& [name, b] : m.named_buffers()) {
    ASSERT_TRUE(r_.contains(name)) << name;
    EXPECT_EQ(r_.info(name).shape, b.shape()) << name;
    ++n;
  }
  // every state entry of the fixture (not the inputs, outputs, gradients or later statistics) is ours
  size_t state = 0;
  for (const std::string& name : r_.names()) {
    const bool extra = name.rfind("grad.", 0) == 0 || name.rfind("after_train.", 0) == 0 ||
                       name.rfind("stats", 0) == 0 || name.rfind("eval.", 0) == 0 || name == "images" ||
                       name == "ids" || name == "lengths" || name == "image_embeds" || name == "text_embeds" ||
                       name == "logits_per_image" || name == "loss";
    if (!extra) ++state;
  }
  EXPECT_EQ(n, state);
  EXPECT_EQ(m.named_buffers().size(), 60u);  // 20 BatchNorms
  EXPECT_TRUE(r_.contains("vision_model.encoder.blocks.2.expansion.expand_conv.weight"));
  EXPECT_FALSE(m.named_parameters().empty());
  EXPECT_EQ(m.temperature.shape(), Shape({}));
}

TEST_F(AlignParity, BlockGeometryIsHuggingFaces) {
  // The table make_align_fixture.py asserts against torch: (in, out, stride, k, padding (left,
  // right, top, bottom), squeeze width, residual, expanded).
  struct Row {
    int64_t in, out, stride, k, l, r, t, b, se;
    bool residual;
    int64_t expanded;
  };
  const std::vector<Row> want{{16, 8, 1, 3, 1, 1, 1, 1, 4, false, 16},  {8, 8, 1, 3, 1, 1, 1, 1, 2, true, 8},
                              {8, 16, 2, 5, 1, 2, 1, 2, 2, false, 32},  {16, 16, 1, 5, 2, 2, 2, 2, 4, true, 64},
                              {16, 24, 2, 3, 1, 1, 1, 1, 4, false, 96}, {24, 24, 1, 3, 1, 1, 1, 1, 6, true, 144},
                              {24, 24, 1, 3, 1, 1, 1, 1, 6, true, 144}};
  const std::vector<models::AlignBlockSpec> got = models::align_blocks(cfg_.vision);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& g = got[i];
    const Row& w = want[i];
    EXPECT_EQ(g.in, w.in) << i;
    EXPECT_EQ(g.out, w.out) << i;
    EXPECT_EQ(g.stride, w.stride) << i;
    EXPECT_EQ(g.kernel, w.k) << i;
    EXPECT_EQ(g.depthwise.pad_left, w.l) << i;
    EXPECT_EQ(g.depthwise.pad_right, w.r) << i;
    EXPECT_EQ(g.depthwise.pad_top, w.t) << i;
    EXPECT_EQ(g.depthwise.pad_bottom, w.b) << i;
    EXPECT_EQ(g.se, w.se) << i;
    EXPECT_EQ(g.residual, w.residual) << i;
    EXPECT_EQ(g.expanded, w.expanded) << i;
    EXPECT_EQ(g.depthwise.groups, w.expanded) << i;
  }
  EXPECT_EQ(cfg_.vision.stem_channels(), 16);
  EXPECT_EQ(cfg_.vision.embed_dim(), 24);
  EXPECT_EQ(models::align_final_side(cfg_.vision), 2);
}

TEST_F(AlignParity, TrainModeEmbeddingsLogitsLossGradientsAndStatisticsMatchTorch) {
  models::ALIGN m(cfg_);
  load(m);
  m.train(true);
  const Tensor images = r_.get("images"), ids = r_.get("ids"), lengths = r_.get("lengths");
  const Tensor txt = m.encode_text(ids, lengths), img = m.encode_image(images);
  EXPECT_EQ(img.shape(), Shape({4, 24}));
  EXPECT_LT(rel_err(img, r_.get("image_embeds")), 1e-5);
  EXPECT_LT(rel_err(txt, r_.get("text_embeds")), 1e-5);
  const Tensor logits = m.logits_from_embeds(img, txt);
  EXPECT_LT(rel_err(logits, r_.get("logits_per_image")), 1e-5);
  const Tensor loss = m.contrastive_loss_from_logits(logits);
  EXPECT_LT(rel_err(loss, r_.get("loss")), 1e-5) << loss.item() << " vs " << r_.get("loss").item();
  expect_buffers(m, "after_train.");  // one forward moved the running statistics
  autograd::backward(loss);
  // Exact zeros, where both sides hold rounding noise, normalised by their layer's whole reference
  // gradient: the attention key biases (softmax ignores a shift of a row's scores), and the
  // project_bn biases of blocks 1-3, whose outputs reach the loss only through the next blocks'
  // 1x1 expansion convolutions and their train-mode BatchNorms, which remove a per-channel shift.
  // (Block 0's output also enters block 1's zero-padded depthwise conv, where a shift does not
  // stay uniform: its gradient is not 0.)
  auto exact_zero = [](const std::string& name) {
    for (int b = 1; b < 4; ++b)
      if (name == "vision_model.encoder.blocks." + std::to_string(b) + ".projection.project_bn.bias") return true;
    return false;
  };
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    const double err =
        exact_zero(name) ? grad_err(r_, name, p.grad(), "project_bn.bias") : grad_err(r_, name, p.grad(), "key.bias");
    EXPECT_LT(err, 1e-4) << "gradient of " << name;
    if (exact_zero(name)) {  // the reference agrees that it is 0 (float64 rounding noise)
      auto max_abs = [](const Tensor& t) {
        double mx = 0;
        for (float v : t.to_vector()) mx = std::max(mx, double(std::abs(v)));
        return mx;
      };
      EXPECT_LT(max_abs(r_.get("grad." + name)),
                1e-9 * max_abs(r_.get("grad." + name.substr(0, name.size() - 4) + "weight")))
          << name;
    }
  }
}

TEST_F(AlignParity, RunningStatisticsAfterThreeForwardsThenEvalModeMatchTorch) {
  models::ALIGN m(cfg_);
  load(m);
  m.train(true);
  {
    autograd::NoGradGuard ng;
    for (int i = 0; i < 3; ++i) m.encode_image(r_.get("stats_images." + std::to_string(i)));
  }
  expect_buffers(m, "stats.");
  m.train(false);
  autograd::NoGradGuard ng;
  const Tensor img = m.encode_image(r_.get("images"));
  EXPECT_LT(rel_err(img, r_.get("eval.image_embeds")), 1e-5);
  const Tensor logits = m.logits_from_embeds(img, m.encode_text(r_.get("ids"), r_.get("lengths")));
  EXPECT_LT(rel_err(logits, r_.get("eval.logits_per_image")), 1e-5);
  EXPECT_LT(rel_err(m.contrastive_loss_from_logits(logits), r_.get("eval.loss")), 1e-5);
  // eval mode reads the statistics and leaves them alone
  expect_buffers(m, "stats.");
}

TEST_F(AlignParity, FrozenStatisticsScopeNormalisesAlikeAndLeavesTheBuffers) {
  models::ALIGN a(cfg_), b(cfg_);
  load(a);
  load(b);
  autograd::NoGradGuard ng;
  Tensor frozen;
  {
    nn::FrozenBatchNormStats scope;
    EXPECT_TRUE(nn::FrozenBatchNormStats::active());
    frozen = a.encode_image(r_.get("images"));
  }
  EXPECT_FALSE(nn::FrozenBatchNormStats::active());
  for (auto& [name, t] : a.named_buffers()) {  // untouched: still the fixture's originals
    const Tensor want = r_.get(name);
    EXPECT_EQ(0, std::memcmp(t.raw_data(), want.to(t.dtype()).raw_data(), t.nbytes())) << name;
  }
  const Tensor moving = b.encode_image(r_.get("images"));
  EXPECT_EQ(frozen.to_vector(), moving.to_vector());  // the same batch statistics
}

TEST_F(AlignParity, RefBackendGivesTheSameLoss) { expect_ref_backend_loss(); }

TEST_F(AlignParity, RunsUnderAutocastWithF32Gradients) { expect_autocast_f32_gradients(3e-2); }

TEST_F(AlignParity, ConfigJsonRoundTripAndSaveLoadWithHuggingFaceNames) {
  const models::AlignConfig c = models::AlignConfig::from_json(cfg_.to_json());
  EXPECT_EQ(c.to_json(), cfg_.to_json());
  EXPECT_EQ(c.vision.depthwise_padding, std::vector<int64_t>{4});
  EXPECT_EQ(c.vision.batch_norm_momentum, 0.99);
  models::ALIGN a(cfg_);
  load(a);
  const test_support::TempSafetensors file("align_rt", state_of(a), {{"config", cfg_.to_json()}});
  models::ALIGN b(models::AlignConfig::from_json(file.reader.metadata("config").value()));
  test_support::expect_round_trip(file.reader, state_of(a), state_of(b));
  a.train(false);
  b.train(false);
  autograd::NoGradGuard ng;
  EXPECT_EQ(loss(a).item(), loss(b).item());
}

TEST(AlignCheckpoint, BrigadeWeightsAndStatisticsLoadIntoPyTorchWithTheSameLoss) {
  if (!test_support::have_torch())
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  // another geometry than the fixture (3 channels, 12 px, width 0.75), the caption vocabulary
  data::CaptionTokenizer tok;
  models::AlignConfig c;
  c.text = {.vocab_size = tok.vocab_size(),
            .max_position_embeddings = tok.max_length(),
            .hidden_size = 24,
            .num_hidden_layers = 2,
            .num_attention_heads = 2,
            .intermediate_size = 40};
  c.vision.num_channels = 3;
  c.vision.image_size = 12;
  c.vision.width_coefficient = 0.75;
  c.vision.depth_coefficient = 1.0;
  c.vision.kernel_sizes = {3, 5};
  c.vision.in_channels = {32, 16};
  c.vision.out_channels = {16, 40};
  c.vision.strides = {1, 2};
  c.vision.num_block_repeats = {2, 1};
  c.vision.expand_ratios = {1, 3};
  c.vision.hidden_dim = 16;
  c.projection_dim = c.vision.embed_dim();
  models::ALIGN m(c);
  Generator g(99);
  m.init_weights(g);
  test_support::perturb(m.named_parameters(), g, 0.05);  // off the structured init
  Tensor images = Tensor::empty({5, 3, 12, 12});
  g.normal_(images, 0.0, 1.0);
  const data::CaptionPairs pairs = data::make_caption_pairs(tok, {0, 9, 3, 5, 1}, 7, tok.max_length());
  {
    autograd::NoGradGuard ng;  // move the running statistics away from (0, 1)
    m.encode_image(images);
  }
  m.train(false);
  const double loss = test_support::item_without_grad(
      [&] { return m.contrastive_loss(images, pairs.tokens.ids, pairs.tokens.lengths); });
  test_support::expect_reference_loss(
      "align_py", "align_ref.py check --mode eval --weights", state_of(m), c.to_json(),
      {{"images", images}, {"ids", pairs.tokens.ids}, {"lengths", pairs.tokens.lengths}}, loss);
}

TEST(Align, TemperatureClampAndInit) {
  models::AlignConfig c = models::AlignConfig::from_json(ckpt::SafetensorsReader(kFixture).metadata("config").value());
  models::ALIGN m(c);
  EXPECT_EQ(m.scale_name(), "temperature");
  EXPECT_EQ(m.clamp_scale(0.001), models::ALIGN::kMinTemperature);
  EXPECT_EQ(m.clamp_scale(-3.0), models::ALIGN::kMinTemperature);
  EXPECT_EQ(m.clamp_scale(0.5), 0.5);
  Generator g(5);
  m.init_weights(g);
  EXPECT_EQ(m.temperature.item(), 1.0);
  EXPECT_EQ(m.text_projection->bias.to_vector(), std::vector<float>(24, 0.f));
  for (auto& [name, b] : m.named_buffers()) {
    if (name.size() > 11 && name.compare(name.size() - 11, 11, "running_var") == 0) {
      EXPECT_EQ(b.to_vector(), std::vector<float>(size_t(b.numel()), 1.f)) << name;
    }
  }
  // logits divide by the temperature
  autograd::NoGradGuard ng;
  const Tensor e = Tensor::from_vector({1.f, 0.f, 0.5f, 0.5f}, {2, 2});  // e e^T = [[1, .5], [.5, .5]]
  m.temperature.fill_(0.5);
  EXPECT_EQ(m.logits_from_embeds(e, e).to_vector(), (std::vector<float>{2.f, 1.f, 1.f, 1.f}));
}

TEST(Align, ConfigErrorsNameTheField) {
  const models::AlignConfig base =
      models::AlignConfig::from_json(ckpt::SafetensorsReader(kFixture).metadata("config").value());
  auto fails = [&](auto edit, const std::string& needle) {
    models::AlignConfig c = base;
    edit(c);
    try {
      c.validate();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails([](auto& c) { c.projection_dim = 32; }, "projection_dim");
  fails([](auto& c) { c.vision.strides[1] = 3; }, "strides[1]");
  fails([](auto& c) { c.vision.hidden_dim = 1; }, "hidden_dim");
  fails([](auto& c) { c.vision.in_channels[1] = 24; }, "in_channels[1]");
  fails([](auto& c) { c.vision.kernel_sizes.pop_back(); }, "kernel_sizes");
  fails([](auto& c) { c.vision.image_size = 1; }, "image_size");
  fails([](auto& c) { c.vision.pooling_type = "max"; }, "pooling_type");
  EXPECT_THROW(models::AlignConfig::from_json("{\"text_config\": {}}"), ConfigError);
  EXPECT_THROW(models::AlignConfig::from_json(R"({"text_config": {"hidden_dropout_prob": 0.1}, "vision_config": {}})"),
               ConfigError);
}

TEST(Align, FlopsPerPairCountEveryConvolution) {
  // one stage of one non-expanding block, 1 channel, 8 px: stem (0, 1, 0, 1)-padded 3x3 stride 2
  // -> 4x4 x 8 channels (width 0.25: round_filters(32) = 8), depthwise 3x3, SE 8 -> 2 -> 8,
  // projection 8 -> 8; text 1 layer, D 8, MLP 16, T 4; projection 8 x 8.
  models::AlignConfig c;
  c.text = {.vocab_size = 10,
            .max_position_embeddings = 4,
            .hidden_size = 8,
            .num_hidden_layers = 1,
            .num_attention_heads = 2,
            .intermediate_size = 16};
  c.vision.num_channels = 1;
  c.vision.image_size = 8;
  c.vision.width_coefficient = 0.25;
  c.vision.depth_coefficient = 1.0;
  c.vision.kernel_sizes = {3};
  c.vision.in_channels = {32};
  c.vision.out_channels = {32};
  c.vision.strides = {1};
  c.vision.num_block_repeats = {1};
  c.vision.expand_ratios = {1};
  c.projection_dim = 8;
  const models::ALIGN m(c);
  const double stem = 16.0 * 1 * 8 * 9, dw = 16.0 * 8 * 9, se = 2.0 * 8 * 2, proj = 16.0 * 8 * 8;
  const double text = 4.0 * (4 * 64 + 2 * 8 * 16) + 2 * 16 * 8 + 8 * 8;
  EXPECT_DOUBLE_EQ(m.flops_per_pair(), 6.0 * (stem + dw + se + proj + text));
}
