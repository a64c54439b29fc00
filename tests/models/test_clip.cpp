// CLIP parity with the plain-PyTorch reference (tests/reference/clip_ref.py; fixture
// tests/fixtures/clip_tiny.safetensors from make_clip_fixture.py, reference in float64): Hugging
// Face names and shapes, init bitwise torch's, image / text embeddings, logits and the
// contrastive loss within 1e-5 and every parameter gradient within 1e-4 (max|a - b| / max|b|
// over each tensor; the key biases, whose exact gradient is 0, normalised by their whole key
// projection), a save -> load round trip with the HF names, Brigade-saved weights loaded into
// the reference give the same loss (when /usr/bin/python3 has torch), bf16 autocast (O1, O2)
// with f32 gradients, zero-shot prediction on a
// constructed case, the pooling rule, config errors and FLOPs.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/data/image/captions.h"
#include "brigade/models/clip/clip.h"
#include "brigade/ops/ops.h"

#include "support/fixture_configs.h"
#include "support/parity.h"

using namespace brigade;
using test_support::rel_err;

namespace {

class ClipParity : public test_support::ParityTest<models::CLIP, models::CLIPConfig> {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(open_fixture("clip_tiny.safetensors", "clip_parity")); }
  Tensor loss(const models::CLIP& m) const override {
    return m.contrastive_loss(r_.get("images"), r_.get("ids"), r_.get("lengths"));
  }
};

TEST_F(ClipParity, ParameterNamesAndShapesAreHuggingFaces) {
  models::CLIP m(cfg_);
  ASSERT_NO_FATAL_FAILURE(test_support::expect_parameters_in_fixture(m, r_));
  const std::set<std::string> names = test_support::parameter_names(m);
  for (const char* s : {"text_model.embeddings.token_embedding.weight",
                        "text_model.embeddings.position_embedding.weight",
                        "text_model.encoder.layers.0.self_attn.q_proj.weight",
                        "text_model.encoder.layers.1.self_attn.k_proj.bias",
                        "text_model.encoder.layers.1.self_attn.v_proj.weight",
                        "text_model.encoder.layers.0.self_attn.out_proj.bias",
                        "text_model.encoder.layers.0.layer_norm1.weight",
                        "text_model.encoder.layers.1.mlp.fc1.weight",
                        "text_model.encoder.layers.1.mlp.fc2.bias",
                        "text_model.encoder.layers.1.layer_norm2.bias",
                        "text_model.final_layer_norm.weight",
                        "vision_model.embeddings.class_embedding",
                        "vision_model.embeddings.patch_embedding.weight",
                        "vision_model.embeddings.position_embedding.weight",
                        "vision_model.pre_layrnorm.weight",
                        "vision_model.encoder.layers.1.self_attn.out_proj.weight",
                        "vision_model.post_layernorm.bias",
                        "visual_projection.weight",
                        "text_projection.weight",
                        "logit_scale"})
    EXPECT_TRUE(names.count(s)) << s;
  EXPECT_FALSE(names.count("vision_model.embeddings.patch_embedding.bias"));
  EXPECT_FALSE(names.count("visual_projection.bias"));
  EXPECT_EQ(m.logit_scale.dim(), 0);
}

TEST_F(ClipParity, InitialisationIsBitwiseTheReferences) {
  models::CLIP m(cfg_);
  EXPECT_FLOAT_EQ(float(m.logit_scale.item()), float(std::log(1 / 0.07)));  // before init too
  expect_init_is_fixtures(m);
}

TEST_F(ClipParity, EmbeddingsLogitsLossAndGradientsMatchTorch) {
  models::CLIP m(cfg_);
  load(m);
  const Tensor images = r_.get("images"), ids = r_.get("ids"), lengths = r_.get("lengths");
  const Tensor img = m.encode_image(images), txt = m.encode_text(ids, lengths);
  EXPECT_EQ(img.shape(), Shape({4, cfg_.projection_dim}));
  EXPECT_LT(rel_err(img, r_.get("image_embeds")), 1e-5);
  EXPECT_LT(rel_err(txt, r_.get("text_embeds")), 1e-5);
  const Tensor logits = m.logits_from_embeds(img, txt);
  EXPECT_LT(rel_err(logits, r_.get("logits_per_image")), 1e-5);
  const Tensor l = m.contrastive_loss(images, ids, lengths);
  EXPECT_LT(rel_err(l, r_.get("loss")), 1e-5) << l.item() << " vs " << r_.get("loss").item();
  autograd::backward(l);
  test_support::expect_gradients_match(r_, m, 1e-4, "k_proj.bias");
}

TEST_F(ClipParity, RefBackendGivesTheSameLoss) { expect_ref_backend_loss(); }

TEST_F(ClipParity, RunsUnderAutocastWithF32Gradients) {
  // bf16 autocast (O1: GEMMs and attention in bf16; O2: also the rest the table allows): the
  // loss stays near the f32 reference and every parameter gets an f32 gradient.
  expect_autocast_f32_gradients(3e-2);
}

TEST_F(ClipParity, PaddingAfterTheEndTokenDoesNotChangeTheTextEmbedding) {
  models::CLIP m(cfg_);
  load(m);
  autograd::NoGradGuard ng;
  const Tensor ids = r_.get("ids"), lengths = r_.get("lengths");
  std::vector<int64_t> v = ids.to_vector_i64();
  for (size_t i = 8 + 5; i < 16; ++i) v[i] = 7;  // row 1 (length 5): garbage after its end token
  const Tensor a = m.encode_text(ids, lengths);
  const Tensor b = m.encode_text(Tensor::from_vector_i64(v, ids.shape()), lengths);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  // a shorter context (T = 6) gives the same embeddings for the rows that fit
  const Tensor short_ids = ids.narrow(1, 0, 6).contiguous();
  const Tensor rows = m.encode_text(short_ids.narrow(0, 1, 3).contiguous(), Tensor::from_vector_i64({5, 6, 3}, {3}));
  EXPECT_LT(rel_err(rows, r_.get("text_embeds").narrow(0, 1, 3).contiguous()), 1e-5);
  EXPECT_THROW(m.encode_text(ids, Tensor::from_vector_i64({8, 0, 6, 3}, {4})), ValueError);
  EXPECT_THROW(m.encode_text(ids, Tensor::from_vector_i64({8, 9, 6, 3}, {4})), ValueError);
  EXPECT_THROW(m.encode_text(ids, Tensor::from_vector_i64({8, 5}, {2})), ShapeError);
}

TEST_F(ClipParity, SaveLoadRoundTripWithHuggingFaceNames) {
  models::CLIP a(cfg_), b(cfg_);
  load(a);
  const test_support::TempSafetensors file("clip_rt", a.named_parameters(), {{"config", nlohmann::json(cfg_).dump()}});
  EXPECT_TRUE(file.reader.contains("vision_model.pre_layrnorm.weight"));
  EXPECT_EQ(file.reader.info("logit_scale").shape, Shape({}));
  test_support::expect_round_trip(file.reader, a.named_parameters(), b.named_parameters());
  autograd::NoGradGuard ng;
  EXPECT_EQ(loss(a).item(), loss(b).item());
}

TEST(ClipCheckpoint, BrigadeWeightsLoadIntoPyTorchWithTheSameLoss) {
  if (!test_support::have_torch())
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  models::CLIPConfig c;  // other sizes than the fixture; the caption tokenizer's vocabulary
  data::CaptionTokenizer tok;
  c.text.vocab_size = tok.vocab_size();
  c.text.max_position_embeddings = tok.max_length();
  c.text.hidden_size = 24;
  c.text.num_hidden_layers = 2;
  c.text.num_attention_heads = 2;
  c.text.intermediate_size = 40;
  c.vision.image_size = 8;
  c.vision.patch_size = 2;
  c.vision.num_channels = 3;
  c.vision.hidden_size = 16;
  c.vision.num_hidden_layers = 3;
  c.vision.num_attention_heads = 4;
  c.vision.intermediate_size = 32;
  c.projection_dim = 12;
  models::CLIP m(c);
  Generator g(99);
  m.init_weights(g);
  test_support::perturb(m.named_parameters(), g, 0.05);  // move off the structured init
  Tensor images = Tensor::empty({5, 3, 8, 8});
  g.normal_(images, 0.0, 1.0);
  const data::CaptionPairs pairs = data::make_caption_pairs(tok, {0, 9, 3, 5, 1}, 7, tok.max_length());
  const double loss = test_support::item_without_grad(
      [&] { return m.contrastive_loss(images, pairs.tokens.ids, pairs.tokens.lengths); });
  test_support::expect_reference_loss(
      "clip_py", "clip_ref.py check --weights", m.named_parameters(), nlohmann::json(c).dump(),
      {{"images", images}, {"ids", pairs.tokens.ids}, {"lengths", pairs.tokens.lengths}}, loss);
}

models::CLIPConfig small_config() {
  models::CLIPConfig c;
  c.text.vocab_size = 31;
  c.text.max_position_embeddings = 11;
  c.text.hidden_size = 16;
  c.text.num_hidden_layers = 1;
  c.text.num_attention_heads = 2;
  c.text.intermediate_size = 32;
  c.vision.image_size = 8;
  c.vision.patch_size = 4;
  c.vision.num_channels = 1;
  c.vision.hidden_size = 16;
  c.vision.num_hidden_layers = 1;
  c.vision.num_attention_heads = 2;
  c.vision.intermediate_size = 32;
  c.projection_dim = 4;
  return c;
}

TEST(Clip, ZeroShotPredictsTheNearestClassEmbedding) {
  models::CLIP m(small_config());
  Generator g(5);
  m.init_weights(g);
  Tensor images = Tensor::empty({6, 1, 8, 8});
  g.normal_(images, 0.0, 1.0);
  autograd::NoGradGuard ng;
  const std::vector<float> img = m.encode_image(images).to_vector();  // (6, 4), unit rows
  for (int i = 0; i < 6; ++i) {
    double n = 0;
    for (int e = 0; e < 4; ++e) n += double(img[size_t(i * 4 + e)]) * img[size_t(i * 4 + e)];
    EXPECT_NEAR(n, 1.0, 1e-5);
  }
  // Class k's text embedding is image (k + 2) % 6's embedding: the cosine is 1 with it and
  // below 1 with every other (distinct) image, so image i is predicted as class (i - 2) mod 6.
  std::vector<float> cls(6 * 4);
  for (int k = 0; k < 6; ++k)
    for (int e = 0; e < 4; ++e) cls[size_t(k * 4 + e)] = img[size_t(((k + 2) % 6) * 4 + e)];
  const Tensor pred = m.zero_shot_predict(images, Tensor::from_vector(cls, {6, 4}));
  EXPECT_EQ(pred.dtype(), DType::I64);
  EXPECT_EQ(pred.to_vector_i64(), (std::vector<int64_t>{4, 5, 0, 1, 2, 3}));  // image i -> class (i - 2) mod 6
  // far-away distractors (negated embeddings) never win
  std::vector<float> two(2 * 4);
  for (int e = 0; e < 4; ++e) {
    two[size_t(e)] = -img[size_t(e)];
    two[size_t(4 + e)] = img[size_t(e)];
  }
  EXPECT_EQ(m.zero_shot_predict(images.narrow(0, 0, 1).contiguous(), Tensor::from_vector(two, {2, 4})).to_vector_i64(),
            (std::vector<int64_t>{1}));
  EXPECT_THROW(m.zero_shot_predict(images, Tensor::zeros({3, 5})), ShapeError);
}

TEST(Clip, ZeroShotWithCaptionPrompts) {
  // The Fashion-MNIST prompts go through the text tower: (10, E) unit embeddings, and images
  // whose embedding equals a prompt's are predicted as that class.
  data::CaptionTokenizer tok;
  models::CLIP m(small_config());
  Generator g(6);
  m.init_weights(g);
  autograd::NoGradGuard ng;
  const data::TokenBatch p = tok.batch(data::zero_shot_prompts(), tok.max_length());
  const Tensor cls = m.encode_text(p.ids, p.lengths);  // (10, 4)
  EXPECT_EQ(cls.shape(), Shape({10, 4}));
  Tensor images = Tensor::empty({3, 1, 8, 8});
  g.normal_(images, 0.0, 1.0);
  const Tensor pred = m.zero_shot_predict(images, cls);
  const std::vector<float> img = m.encode_image(images).to_vector(), c = cls.to_vector();
  const std::vector<int64_t> pv = pred.to_vector_i64();
  for (int i = 0; i < 3; ++i) {
    double best = -2;
    int64_t arg = -1;
    for (int k = 0; k < 10; ++k) {
      double s = 0;
      for (int e = 0; e < 4; ++e) s += double(img[size_t(i * 4 + e)]) * c[size_t(k * 4 + e)];
      if (s > best + 1e-6) best = s, arg = k;
    }
    EXPECT_EQ(pv[size_t(i)], arg);
  }
}

TEST(Clip, ContrastiveLossIsSymmetricCrossEntropy) {
  models::CLIP m(small_config());
  // logits [[2, 0], [1, 3]]: image->text CE = mean(lse(2,0) - 2, lse(1,3) - 3),
  // text->image on the transpose [[2, 1], [0, 3]].
  const Tensor l = Tensor::from_vector({2, 0, 1, 3}, {2, 2});
  auto lse = [](double a, double b) { return std::log(std::exp(a) + std::exp(b)); };
  const double i2t = 0.5 * ((lse(2, 0) - 2) + (lse(1, 3) - 3));
  const double t2i = 0.5 * ((lse(2, 1) - 2) + (lse(0, 3) - 3));
  EXPECT_NEAR(m.contrastive_loss_from_logits(l).item(), 0.5 * (i2t + t2i), 1e-6);
  EXPECT_THROW(m.contrastive_loss_from_logits(Tensor::zeros({2, 3})), ShapeError);
}

TEST(Clip, ConfigAndShapeErrors) {
  auto bad = [](auto edit) {
    models::CLIPConfig c = small_config();
    edit(c);
    EXPECT_THROW(models::CLIP{c}, ConfigError);
  };
  bad([](models::CLIPConfig& c) { c.vision.image_size = 10; });
  bad([](models::CLIPConfig& c) { c.text.hidden_size = 15; });
  bad([](models::CLIPConfig& c) { c.vision.num_attention_heads = 3; });
  bad([](models::CLIPConfig& c) { c.projection_dim = 0; });
  bad([](models::CLIPConfig& c) { c.text.vocab_size = 0; });
  bad([](models::CLIPConfig& c) { c.hidden_act = "relu"; });
  bad([](models::CLIPConfig& c) { c.text.layer_norm_eps = 0; });
  models::CLIP m(small_config());
  try {
    m.encode_image(Tensor::zeros({2, 1, 12, 12}));
    ADD_FAILURE() << "no error for a 12x12 image on an 8x8 model";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("CLIP.encode_image"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.encode_text(Tensor::zeros({2, 12}, DType::I64), Tensor::from_vector_i64({1, 1}, {2})), ShapeError);
  EXPECT_THROW(m.contrastive_loss(Tensor::zeros({2, 1, 8, 8}), Tensor::zeros({3, 4}, DType::I64),
                                  Tensor::from_vector_i64({1, 1, 1}, {3})),
               ShapeError);
}

TEST(Clip, FlopsPerPair) {
  models::CLIPConfig c;  // ViT-B/32 at 224 (49 patches) + the 12-layer 512-wide text tower, T 77
  models::CLIP m(c);
  const double Dv = 768, Mv = 3072, Lv = 12, P = 49, S = 50, Dt = 512, Mt = 2048, Lt = 12, T = 77, E = 512;
  const double v = P * 3 * 32 * 32 * Dv + S * Lv * (4 * Dv * Dv + 2 * Dv * Mv) + Dv * E + Lv * 2 * S * S * Dv;
  const double t = T * Lt * (4 * Dt * Dt + 2 * Dt * Mt) + Dt * E + Lt * 2 * T * T * Dt;
  EXPECT_DOUBLE_EQ(m.flops_per_pair(), 3 * 2 * (v + t));
  EXPECT_NEAR(m.flops_per_pair() / 6, 4.4e9 + 2.9e9, 0.3e9);  // ~4.4 + ~2.9 GMACs forward (published ViT-B/32 ~4.4)
}

}  // namespace
