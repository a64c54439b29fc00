// Flamingo parity with the plain-PyTorch reference (tests/reference/flamingo_ref.py; fixture
// tests/fixtures/flamingo_tiny.safetensors from make_flamingo_fixture.py, reference in float64,
// non-zero gates, a batch of two sequences with tokens before, at and between images and 2 and 3
// images): IDEFICS-layout names and shapes; logits and loss within 1e-5 and every trainable
// gradient within 1e-4 (max|a - b| / max|b| per tensor), for only_attend_immediate_media true
// (GELU) and false (ReLU); frozen parameters get no gradient and are bitwise unchanged by AdamW
// steps; bf16 autocast; at gates 0 the logits are bitwise the LM's (and GPT's on text); the media mask (tokens
// before any image unaffected by images, immediate vs all previous); recompute invariance; a
// save -> load round trip under the names; Brigade-saved weights loaded into the reference give
// the same loss (when /usr/bin/python3 has torch); fn::tanh and fn::concat against finite
// differences; config and input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <span>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/models/flamingo/flamingo.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/ops/ops.h"
#include "brigade/optim/optimizer.h"

#include "support/fixture_configs.h"
#include "support/parity.h"

using namespace brigade;
using test_support::bitwise_equal;
using test_support::rel_err;
namespace F = brigade::fn;

namespace {

// Row t of sequence b of logits (B, T, W) as a vector.
std::vector<float> row(const Tensor& logits, int64_t b, int64_t t) {
  return logits.select(0, b).select(0, t).contiguous().to_vector();
}

class FlamingoParity : public test_support::ParityTest<models::Flamingo, models::FlamingoConfig> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(open_fixture("flamingo_tiny.safetensors", "flamingo_parity"));
    cfg_all_ = nlohmann::json::parse(r_.metadata("config_all_media").value()).get<models::FlamingoConfig>();
    images_ = r_.get("images");
    ids_ = r_.get("ids");
    targets_ = r_.get("targets");
  }
  Tensor loss(const models::Flamingo& m) const override { return m.loss(images_, ids_, targets_); }
  // Logits, loss and every gradient against the fixture's outputs under `prefix`.
  void check_parity(const models::FlamingoConfig& c, const std::string& prefix) {
    models::Flamingo m(c);
    load(m);
    const Tensor logits = m.forward(images_, ids_);
    EXPECT_EQ(logits.shape(), Shape({2, 12, c.vocab_size()}));
    const double le = rel_err(logits, r_.get(prefix + "logits"));
    EXPECT_LT(le, 1e-5);
    const Tensor loss = m.loss(images_, ids_, targets_);
    const double lo = rel_err(loss, r_.get(prefix + "loss"));
    EXPECT_LT(lo, 1e-5) << loss.item() << " vs " << r_.get(prefix + "loss").item();
    autograd::backward(loss);
    double worst = 0;
    std::string worst_name;
    size_t n_trainable = 0;
    for (auto& [name, p] : m.named_parameters()) {
      if (!p.requires_grad()) {
        EXPECT_FALSE(p.grad().defined()) << "frozen " << name << " got a gradient";
        EXPECT_FALSE(r_.contains(prefix + "grad." + name)) << name << " trains in the reference";
        continue;
      }
      ++n_trainable;
      ASSERT_TRUE(p.grad().defined()) << name;
      ASSERT_TRUE(r_.contains(prefix + "grad." + name)) << name << " is frozen in the reference";
      const double e = rel_err(p.grad(), r_.get(prefix + "grad." + name));
      EXPECT_LT(e, 1e-4) << "gradient of " << name;
      if (e > worst) worst = e, worst_name = name;
    }
    size_t ref_grads = 0;
    for (const std::string& name : r_.names()) ref_grads += name.rfind(prefix + "grad.", 0) == 0;
    EXPECT_EQ(n_trainable, ref_grads);
    std::cout << "[flamingo parity " << (prefix.empty() ? "immediate" : prefix) << "] logits " << le << ", loss " << lo
              << ", worst gradient " << worst << " (" << worst_name << ")\n";
  }
  models::FlamingoConfig cfg_all_;
  Tensor images_, ids_, targets_;
};

TEST_F(FlamingoParity, ParameterNamesAndShapesAreTheReferences) {
  models::Flamingo m(cfg_);
  std::set<std::string> names;
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(r_.contains(name)) << "Brigade has " << name << ", the reference does not";
    EXPECT_EQ(p.shape(), r_.info(name).shape) << name;
    EXPECT_EQ(p.tag(), MemTag::Params) << name;  // frozen ones too: memory accounting counts them
    names.insert(name);
  }
  size_t ref_params = 0;
  for (const std::string& name : r_.names())
    ref_params += !(name.rfind("grad.", 0) == 0 || name.rfind("all_media.", 0) == 0 || name == "images" ||
                    name == "ids" || name == "targets" || name == "logits" || name == "loss");
  EXPECT_EQ(names.size(), ref_params);
  for (const char* s : {"vision_model.embeddings.patch_embedding.weight",
                        "vision_model.pre_layrnorm.weight",
                        "vision_model.encoder.layers.0.self_attn.q_proj.weight",
                        "vision_model.post_layernorm.bias",
                        "perceiver_resampler.latents",
                        "perceiver_resampler.blocks.0.0.context_layer_norm.weight",
                        "perceiver_resampler.blocks.1.0.latents_layer_norm.bias",
                        "perceiver_resampler.blocks.0.0.q_proj.weight",
                        "perceiver_resampler.blocks.1.0.k_proj.weight",
                        "perceiver_resampler.blocks.0.0.v_proj.weight",
                        "perceiver_resampler.blocks.0.0.output_proj.weight",
                        "perceiver_resampler.blocks.0.1.ln.weight",
                        "perceiver_resampler.blocks.0.1.fc.weight",
                        "perceiver_resampler.blocks.1.1.c_proj.weight",
                        "perceiver_resampler.layer_norm.weight",
                        "gated_cross_attn_layers.0.input_layernorm.weight",
                        "gated_cross_attn_layers.1.cross_attn.q_proj.weight",
                        "gated_cross_attn_layers.0.cross_attn.k_proj.weight",
                        "gated_cross_attn_layers.0.cross_attn.v_proj.weight",
                        "gated_cross_attn_layers.0.cross_attn.o_proj.weight",
                        "gated_cross_attn_layers.0.alpha_cross_attn",
                        "gated_cross_attn_layers.1.alpha_dense",
                        "gated_cross_attn_layers.0.post_attention_layernorm.bias",
                        "gated_cross_attn_layers.0.mlp.fc.weight",
                        "gated_cross_attn_layers.1.mlp.c_proj.weight",
                        "transformer.wte.weight",
                        "transformer.wte.additional_embedding.weight",
                        "transformer.wpe.weight",
                        "transformer.h.2.attn.c_attn.weight",
                        "transformer.ln_f.bias"})
    EXPECT_TRUE(names.count(s)) << s;
  // No biases in the new projections; two gated blocks for 3 layers every 2 (before 0 and 2).
  EXPECT_FALSE(names.count("perceiver_resampler.blocks.0.0.q_proj.bias"));
  EXPECT_FALSE(names.count("gated_cross_attn_layers.0.cross_attn.o_proj.bias"));
  EXPECT_FALSE(names.count("gated_cross_attn_layers.2.alpha_dense"));
  EXPECT_EQ(m.gated_cross_attn_layers->size(), 2u);
  EXPECT_EQ(r_.info("transformer.wte.additional_embedding.weight").shape, Shape({2, 16}));
  EXPECT_EQ(m.gated_cross_attn_layers->operator[](0).alpha_cross_attn.shape(), Shape({1}));
  // Blocks the plans reach: vision layer, 2 resampler blocks, 2 gated blocks, 3 LM blocks.
  const auto blocks = nn::find_blocks(m);
  EXPECT_EQ(blocks.size(), 1u + 2u + 2u + 3u);
}

TEST_F(FlamingoParity, FrozenAndTrainableParameters) {
  models::Flamingo m(cfg_);
  int64_t trainable = 0;
  for (auto& [name, p] : m.named_parameters()) {
    const bool frozen = name.rfind("vision_model.", 0) == 0 ||
                        (name.rfind("transformer.", 0) == 0 && name != "transformer.wte.additional_embedding.weight");
    EXPECT_EQ(p.requires_grad(), !frozen) << name;
    if (!frozen) trainable += p.numel();
  }
  int64_t listed = 0;
  for (auto& [name, p] : m.trainable_parameters()) listed += p.numel();
  EXPECT_EQ(listed, trainable);
  EXPECT_LT(trainable, m.num_parameters());  // num_parameters counts the frozen ones too
}

TEST_F(FlamingoParity, LogitsLossAndGradientsMatchTorch) { check_parity(cfg_, ""); }

TEST_F(FlamingoParity, AllPreviousMediaAndReluMatchTorch) { check_parity(cfg_all_, "all_media."); }

TEST_F(FlamingoParity, RefBackendGivesTheSameLoss) { expect_ref_backend_loss(); }

TEST_F(FlamingoParity, RunsUnderAutocastWithF32Gradients) {
  // bf16 autocast (O1: GEMMs in bf16; O2: also the rest the table allows): the loss stays near
  // the f32 reference and every trainable parameter gets an f32 gradient, the frozen ones none.
  expect_autocast_f32_gradients(3e-2, /*frozen=*/true);
}

TEST_F(FlamingoParity, RecomputeGivesBitwiseTheSameGradients) {
  auto grads = [&](nn::Recompute mode) {
    models::Flamingo m(cfg_);
    load(m);
    for (auto& [name, b] : nn::find_blocks(m)) b->recompute = mode;
    const Tensor loss = m.loss(images_, ids_, targets_);
    autograd::backward(loss);
    std::vector<Tensor> out{loss.detach()};
    for (auto& [name, p] : m.trainable_parameters()) out.push_back(p.grad());
    return out;
  };
  const auto a = grads(nn::Recompute::None), b = grads(nn::Recompute::Full), c = grads(nn::Recompute::Selective);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(a[i], b[i])) << i << " full: " << rel_err(b[i], a[i]);
    EXPECT_TRUE(bitwise_equal(a[i], c[i])) << i << " selective: " << rel_err(c[i], a[i]);
  }
}

TEST_F(FlamingoParity, AtGatesZeroTheLogitsAreTheLanguageModels) {
  models::Flamingo m(cfg_);
  load(m);
  autograd::NoGradGuard ng;
  const Tensor gated = m.forward(images_, ids_);
  const Tensor lm = m.lm_logits(ids_);
  EXPECT_FALSE(bitwise_equal(gated, lm));  // the fixture's gates are non-zero
  // The evaluation control: gates forced to 0 without touching the parameters.
  m.set_gates_forced_zero(true);
  EXPECT_TRUE(bitwise_equal(m.forward(images_, ids_), lm));
  m.set_gates_forced_zero(false);
  // Gate parameters at 0 (a fresh model): every gated block adds tanh(0) * y = 0 exactly, so the
  // logits are bitwise the LM's, whatever the images.
  m.zero_gates();
  EXPECT_TRUE(bitwise_equal(m.forward(images_, ids_), lm));
  Tensor other = Tensor::empty(images_.shape());
  Generator g(7);
  g.normal_(other, 0.0, 3.0);
  EXPECT_TRUE(bitwise_equal(m.forward(other, ids_), lm));

  // On text (ids < V) the extended LM is bitwise GPT-2 with the same weights: the decoupled
  // lookup selects with exact 0 / 1 masks and the head's first V columns are GPT's own matmul.
  models::GPT gpt(cfg_.lm);
  for (auto& [name, p] : gpt.named_parameters()) p.copy_(r_.get(name));
  std::vector<int64_t> text = ids_.to_vector_i64();
  for (int64_t& id : text) id = id >= cfg_.lm.vocab_size ? id % 7 : id;
  const Tensor tids = Tensor::from_vector_i64(text, ids_.shape());
  const Tensor want = gpt.forward(tids);                                          // (B, T, V)
  const Tensor got = m.forward(Tensor(), tids).narrow(2, 0, cfg_.lm.vocab_size);  // (B, T, V) of (B, T, V + 2)
  EXPECT_TRUE(bitwise_equal(got.contiguous(), want));
}

TEST_F(FlamingoParity, MediaMaskFollowsTheImageTokens) {
  using models::MediaMask;
  const int64_t img = cfg_.image_token_id();
  const MediaMask mi = MediaMask::build(ids_, img, true), ma = MediaMask::build(ids_, img, false);
  EXPECT_EQ(mi.M, 3);
  EXPECT_EQ(mi.num_images, 5);
  // ids: [3 5 I 7 8 E I 9 10 11 E 4] and [6 I 2 3 I 4 I 5 6 7 E 8]
  EXPECT_EQ(mi.text_time,
            (std::vector<int64_t>{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 0, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3}));
  auto allowed = [](const MediaMask& m, int64_t b, int64_t t) {
    std::vector<int> out;
    for (int64_t s = 0; s < m.M; ++s) out.push_back(m.allowed[size_t((b * m.T + t) * m.M + s)]);
    return out;
  };
  EXPECT_EQ(allowed(mi, 0, 1), (std::vector<int>{0, 0, 0}));  // before any image: nothing
  EXPECT_EQ(allowed(mi, 0, 2), (std::vector<int>{1, 0, 0}));  // the <image> token sees its image
  EXPECT_EQ(allowed(mi, 0, 7), (std::vector<int>{0, 1, 0}));  // immediate: the latest image only
  EXPECT_EQ(allowed(ma, 0, 7), (std::vector<int>{1, 1, 0}));  // all previous (slot 2 is empty)
  EXPECT_EQ(allowed(ma, 1, 11), (std::vector<int>{1, 1, 1}));
  // The gather: slot (b, m) -> image index, row-major over the sequences; seq 0's slot 2 is empty.
  EXPECT_EQ(mi.select_matrix().to_vector(), (std::vector<float>{1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                                                0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(mi.has_media().to_vector()[0], 0.f);
  EXPECT_EQ(mi.has_media().to_vector()[2], 1.f);
}

TEST_F(FlamingoParity, TokensSeeOnlyTheirMedia) {
  models::Flamingo m(cfg_);
  load(m);
  autograd::NoGradGuard ng;
  const Tensor base = m.forward(images_, ids_);
  // Change image 0 (sequence 0's first image) only.
  Tensor changed = images_.clone();
  Tensor noise = Tensor::empty({1, 1, 8, 8});
  Generator g(3);
  g.normal_(noise, 0.0, 2.0);
  changed.narrow(0, 0, 1).copy_(noise);
  const Tensor out = m.forward(changed, ids_);
  // Tokens before sequence 0's first image attend to nothing: bitwise unchanged.
  for (int64_t t = 0; t < 2; ++t) EXPECT_EQ(row(out, 0, t), row(base, 0, t)) << t;
  // From the <image> token on, the image reaches them.
  for (int64_t t = 2; t < 12; ++t) EXPECT_NE(row(out, 0, t), row(base, 0, t)) << t;
  // Sequence 1 never sees sequence 0's images.
  for (int64_t t = 0; t < 12; ++t) EXPECT_EQ(row(out, 1, t), row(base, 1, t)) << t;

  // One cross-attention layer: in the immediate mode a token after image 1 ignores image 0's
  // latents; attending to all previous media it does not.
  for (bool immediate : {true, false}) {
    const models::MediaMask mm = models::MediaMask::build(ids_, cfg_.image_token_id(), immediate);
    const auto& xa = *(*m.gated_cross_attn_layers)[0].cross_attn;
    const int64_t L = cfg_.resampler_n_latents, Dv = cfg_.vision.hidden_size, C = cfg_.lm.n_embd;
    Tensor x = Tensor::empty({2, 12, C}), media = Tensor::empty({2, 3 * L, Dv});
    g.normal_(x, 0.0, 1.0);
    g.normal_(media, 0.0, 1.0);
    const Tensor y0 = xa.forward(x, media, mm.additive(L), mm.has_media());
    Tensor media2 = media.clone();
    media2.select(0, 0).narrow(0, 0, L).fill_(0.5);  // sequence 0, slot 0 (image 0)
    const Tensor y1 = xa.forward(x, media2, mm.additive(L), mm.has_media());
    for (int64_t t = 0; t < 12; ++t) {
      const bool sees_image0 = t >= 2 && (t < 6 || !immediate);
      if (sees_image0) {
        EXPECT_NE(row(y0, 0, t), row(y1, 0, t)) << "immediate " << immediate << " t " << t;
      } else {
        EXPECT_EQ(row(y0, 0, t), row(y1, 0, t)) << "immediate " << immediate << " t " << t;
      }
      if (t < 2) {  // no media: exactly 0
        for (float v : row(y0, 0, t)) EXPECT_EQ(v, 0.f);
      }
    }
  }
}

TEST_F(FlamingoParity, TrainingLeavesFrozenParametersBitwiseUnchanged) {
  models::Flamingo m(cfg_);
  load(m);
  std::vector<std::pair<std::string, Tensor>> before;
  for (auto& [name, p] : m.named_parameters()) before.emplace_back(name, p.clone());
  optim::AdamW opt(m.trainable_parameters(), optim::AdamWOptions{});
  double first = 0, last = 0;
  for (int step = 0; step < 3; ++step) {
    m.zero_grad();
    const Tensor loss = m.loss(images_, ids_, targets_);
    (step == 0 ? first : last) = loss.item();
    autograd::backward(loss);
    opt.step(1e-2);
  }
  EXPECT_LT(last, first);
  const auto now = m.named_parameters();
  for (size_t i = 0; i < now.size(); ++i) {
    const bool same = bitwise_equal(now[i].second, before[i].second);
    if (now[i].second.requires_grad()) {
      EXPECT_FALSE(same) << now[i].first << " did not train";
    } else {
      EXPECT_TRUE(same) << "frozen " << now[i].first << " changed";
    }
  }
}

TEST_F(FlamingoParity, SaveLoadRoundTripUnderTheNames) {
  models::Flamingo a(cfg_), b(cfg_);
  load(a);
  const test_support::TempSafetensors file("flamingo_rt", a.named_parameters(),
                                           {{"config", nlohmann::json(cfg_).dump()}});
  const auto saved = nlohmann::json::parse(file.reader.metadata("config").value()).get<models::FlamingoConfig>();
  EXPECT_EQ(saved.cross_attn_every_n_layers, 2);
  test_support::expect_round_trip(file.reader, a.named_parameters(), b.named_parameters());
  autograd::NoGradGuard ng;
  EXPECT_EQ(loss(a).item(), loss(b).item());
}

models::FlamingoConfig small_config() {
  models::FlamingoConfig c;
  c.vision.image_size = 8;
  c.vision.patch_size = 2;
  c.vision.num_channels = 3;
  c.vision.hidden_size = 12;
  c.vision.num_hidden_layers = 2;
  c.vision.num_attention_heads = 3;
  c.vision.intermediate_size = 20;
  c.vision_hidden_act = "gelu";
  c.lm.vocab_size = 30;
  c.lm.block_size = 20;
  c.lm.n_layer = 4;
  c.lm.n_head = 2;
  c.lm.n_embd = 8;
  c.resampler_depth = 1;
  c.resampler_n_heads = 3;
  c.resampler_head_dim = 4;
  c.resampler_n_latents = 5;
  c.resampler_ff_mult = 2;
  c.cross_attn_every_n_layers = 1;  // IDEFICS's default: before every layer
  c.cross_attn_heads = 2;
  c.cross_attn_head_dim = 6;
  c.cross_attn_ff_mult = 3;
  return c;
}

TEST(FlamingoCheckpoint, BrigadeWeightsLoadIntoPyTorchWithTheSameLoss) {
  if (!test_support::have_torch())
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  const models::FlamingoConfig c = small_config();  // other sizes than the fixture
  models::Flamingo m(c);
  Generator g(99);
  m.init_weights(g);
  {
    autograd::NoGradGuard ng;
    test_support::perturb(m.named_parameters(), g, 0.3);  // off the structured init, gates non-zero
  }
  const int64_t V = c.lm.vocab_size, I = c.image_token_id(), E = c.end_of_chunk_token_id();
  const std::vector<int64_t> ids = {I, 4, 5, E, 7, I, 8, 9, 2,  //
                                    1, 2, 3, 4, I, 6, 7, E, 3};
  std::vector<int64_t> tg(ids.size(), -100);
  for (size_t i = 0; i + 1 < ids.size(); ++i)
    if (i % 9 != 8 && ids[i + 1] != I) tg[i] = ids[i + 1];
  const Tensor tids = Tensor::from_vector_i64(ids, {2, 9}), targets = Tensor::from_vector_i64(tg, {2, 9});
  Tensor images = Tensor::empty({3, 3, 8, 8});
  g.normal_(images, 0.0, 1.0);
  const double loss = test_support::item_without_grad([&] { return m.loss(images, tids, targets); });
  EXPECT_GT(V, 0);
  test_support::expect_reference_loss("flamingo_py", "flamingo_ref.py check --weights", m.named_parameters(),
                                      nlohmann::json(c).dump(),
                                      {{"images", images}, {"ids", tids}, {"targets", targets}}, loss);
}

TEST(Flamingo, FreshModelStartsAsTheLanguageModel) {
  models::Flamingo m(small_config());
  Generator g(5);
  m.init_weights(g);
  for (const auto& b : *m.gated_cross_attn_layers) {
    EXPECT_EQ(b->alpha_cross_attn.item(), 0.0);
    EXPECT_EQ(b->alpha_dense.item(), 0.0);
  }
  const int64_t I = small_config().image_token_id();
  const Tensor ids = Tensor::from_vector_i64({1, I, 3, 4, I, 6}, {1, 6});
  Tensor images = Tensor::empty({2, 3, 8, 8});
  g.normal_(images, 0.0, 1.0);
  autograd::NoGradGuard ng;
  EXPECT_TRUE(bitwise_equal(m.forward(images, ids), m.lm_logits(ids)));
  // A batch without images: the dense halves still run, the cross-attention halves add nothing.
  const Tensor text = Tensor::from_vector_i64({1, 2, 3}, {1, 3});
  EXPECT_EQ(m.forward(Tensor(), text).shape(), Shape({1, 3, 32}));
}

TEST(Flamingo, ConfigAndInputErrors) {
  auto bad = [](auto edit, const char* field) {
    models::FlamingoConfig c = small_config();
    edit(c);
    try {
      models::Flamingo m(c);
      ADD_FAILURE() << "no error for " << field;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  bad([](models::FlamingoConfig& c) { c.resampler_n_latents = 0; }, "resampler_n_latents");
  bad([](models::FlamingoConfig& c) { c.cross_attn_every_n_layers = 0; }, "cross_attn_every_n_layers");
  bad([](models::FlamingoConfig& c) { c.ff_act = "swish"; }, "ff_act");
  bad([](models::FlamingoConfig& c) { c.lm.dropout = 0.1; }, "lm.dropout");
  bad([](models::FlamingoConfig& c) { c.vision.image_size = 9; }, "vision.image_size");
  bad([](models::FlamingoConfig& c) { c.lm.n_embd = 9; }, "lm.n_embd");
  bad([](models::FlamingoConfig& c) { c.vision_hidden_act = "relu"; }, "vision_hidden_act");
  models::Flamingo m(small_config());
  const int64_t I = small_config().image_token_id();
  const Tensor ids = Tensor::from_vector_i64({1, I, 3}, {1, 3});
  autograd::NoGradGuard ng;
  EXPECT_THROW(m.forward(Tensor::zeros({2, 3, 8, 8}), ids), ShapeError);  // 2 images, 1 <image> token
  EXPECT_THROW(m.forward(Tensor(), ids), ShapeError);
  EXPECT_THROW(m.forward(Tensor(), Tensor::from_vector_i64({1, 32}, {1, 2})), ValueError);  // id >= V + 2
  EXPECT_THROW(m.forward(Tensor(), Tensor::zeros({1, 21}, DType::I64)), ShapeError);        // T > block_size
  EXPECT_THROW(m.loss(Tensor(), Tensor::from_vector_i64({1, 2}, {1, 2}), Tensor::zeros({2, 1}, DType::I64)),
               ShapeError);
}

// ---- fn::tanh and fn::concat against central finite differences (f32, h = 1e-2)

Tensor rand_leaf(const Shape& s, unsigned seed, bool grad = true) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-1.5f, 1.5f);
  std::vector<float> v(size_t(shape_numel(s)));
  for (auto& e : v) e = U(rng);
  Tensor t = Tensor::from_vector(v, s);
  if (grad) t.set_requires_grad(true);
  return t;
}

void check_fd(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> leaves) {
  const Tensor y0 = f(leaves);
  const Tensor R = rand_leaf(y0.shape(), 999, false);
  auto L = [&]() { return F::sum_all(F::mul(f(leaves), R)); };
  autograd::backward(L());
  for (Tensor& x : leaves) {
    if (!x.requires_grad()) {
      EXPECT_FALSE(x.grad().defined());
      continue;
    }
    ASSERT_TRUE(x.grad().defined());
    autograd::NoGradGuard ng;
    const std::vector<float> g = x.grad().to_vector();
    const std::vector<double> fd =
        test_support::central_difference([&] { return L().item(); }, std::span(x.data<float>(), g.size()), 1e-2);
    for (size_t j = 0; j < g.size(); ++j) EXPECT_NEAR(g[j], fd[j], 1e-2) << j;
  }
}

TEST(FlamingoFunctions, TanhAndConcatMatchFiniteDifferences) {
  check_fd([](const std::vector<Tensor>& v) { return F::tanh(v[0]); }, {rand_leaf({3, 5}, 1)});
  check_fd([](const std::vector<Tensor>& v) { return F::concat(v[0], v[1], 1); },
           {rand_leaf({2, 3, 4}, 2), rand_leaf({2, 2, 4}, 3)});
  check_fd([](const std::vector<Tensor>& v) { return F::concat(v[0], v[1], -1); },
           {rand_leaf({2, 3}, 4, false), rand_leaf({2, 5}, 5)});  // one input wants no gradient
  const Tensor a = Tensor::from_vector({1, 2, 3, 4}, {2, 2}), b = Tensor::from_vector({5, 6}, {1, 2});
  EXPECT_EQ(F::concat(a, b, 0).to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(F::tanh(Tensor::zeros({1})).item(), 0.0);
  EXPECT_THROW(F::concat(a, Tensor::zeros({2, 3}), 0), ShapeError);
  EXPECT_THROW(F::concat(a, b, 2), ShapeError);
}

}  // namespace
