// The parity tests' fixtures (tests/fixtures, made by tests/reference/make_*_fixture*.py): the
// model configs as the reference scripts write them into a fixture's "config" metadata and read
// them from weights Brigade saves (the *_ref.py `check` commands), as nlohmann::json bindings (a
// test reads `j.get<models::BERTConfig>()` and writes `nlohmann::json(c)`; the keys are the
// fields' names, except CLIP's and Flamingo's towers: text_config, vision_config, lm_config);
// ParityTest, the base of a test against a fixture; running a reference's check command.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include <gtest/gtest.h>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/rng.h"
#include "brigade/ops/ops.h"

#include "brigade/models/bert/bert.h"
#include "brigade/models/clip/clip.h"
#include "brigade/models/flamingo/flamingo.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"
#include "brigade/models/swin/swin.h"
#include "brigade/models/vit/vit.h"
#include "support/parity.h"

// In the configs' own namespace, where nlohmann::json finds them.
namespace brigade::models {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GPTConfig, vocab_size, block_size, n_layer, n_head, n_embd, layer_norm_eps)

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LLaMAConfig, vocab_size, hidden_size, intermediate_size, n_layer, n_head, n_kv_head,
                                   max_position, rms_norm_eps, rope_theta)

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BERTConfig, vocab_size, max_position_embeddings, type_vocab_size, hidden_size,
                                   num_hidden_layers, num_attention_heads, intermediate_size, layer_norm_eps)

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ViTConfig, image_size, patch_size, num_channels, hidden_size, num_hidden_layers,
                                   num_attention_heads, intermediate_size, num_labels, layer_norm_eps)

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SwinConfig, image_size, patch_size, num_channels, embed_dim, depths, num_heads,
                                   window_size, mlp_ratio, num_labels, layer_norm_eps)

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CLIPTextConfig, vocab_size, max_position_embeddings, hidden_size, num_hidden_layers,
                                   num_attention_heads, intermediate_size, layer_norm_eps)

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CLIPVisionConfig, image_size, patch_size, num_channels, hidden_size,
                                   num_hidden_layers, num_attention_heads, intermediate_size, layer_norm_eps)

// The (key, member) pairs of the configs whose towers are keyed apart from their members' names,
// for both directions: clip_fields(c, f) and flamingo_fields(c, f) call f(key, member) for each.
template <class C, class F>
void clip_fields(C& c, F f) {
  f("text_config", c.text);
  f("vision_config", c.vision);
  f("projection_dim", c.projection_dim);
  f("hidden_act", c.hidden_act);
  f("logit_scale_init_value", c.logit_scale_init_value);
  f("initializer_range", c.initializer_range);
}

template <class C, class F>
void flamingo_fields(C& c, F f) {
  f("vision_config", c.vision);
  f("vision_hidden_act", c.vision_hidden_act);
  f("lm_config", c.lm);
  f("resampler_depth", c.resampler_depth);
  f("resampler_n_heads", c.resampler_n_heads);
  f("resampler_head_dim", c.resampler_head_dim);
  f("resampler_n_latents", c.resampler_n_latents);
  f("resampler_ff_mult", c.resampler_ff_mult);
  f("cross_attn_every_n_layers", c.cross_attn_every_n_layers);
  f("cross_attn_heads", c.cross_attn_heads);
  f("cross_attn_head_dim", c.cross_attn_head_dim);
  f("cross_attn_ff_mult", c.cross_attn_ff_mult);
  f("only_attend_immediate_media", c.only_attend_immediate_media);
  f("ff_act", c.ff_act);
  f("layer_norm_eps", c.layer_norm_eps);
}

inline void to_json(nlohmann::json& j, const CLIPConfig& c) {
  clip_fields(c, [&](const char* key, const auto& v) { j[key] = v; });
}
inline void from_json(const nlohmann::json& j, CLIPConfig& c) {
  clip_fields(c, [&](const char* key, auto& v) { j.at(key).get_to(v); });
}
inline void to_json(nlohmann::json& j, const FlamingoConfig& c) {
  flamingo_fields(c, [&](const char* key, const auto& v) { j[key] = v; });
}
inline void from_json(const nlohmann::json& j, FlamingoConfig& c) {
  flamingo_fields(c, [&](const char* key, auto& v) { j.at(key).get_to(v); });
}

}  // namespace brigade::models

namespace brigade::test_support {

// Weights Brigade saved load into the PyTorch reference with the same loss: writes `state` (with
// the config JSON `config`) as model.safetensors and `batch` with its `loss` as
// batch.safetensors in a fresh temp folder named by `stem`, and runs `/usr/bin/python3
// tests/reference/<command> <model.safetensors> --batch <batch.safetensors>`, which exits 0 when
// the reference's loss agrees.
inline void expect_reference_loss(const std::string& stem, const std::string& command, const ckpt::NamedTensors& state,
                                  const std::string& config, ckpt::NamedTensors batch, double loss) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("brigade_" + stem + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ckpt::save_safetensors((dir / "model.safetensors").string(), state, {{"config", config}});
  batch.emplace_back("loss", Tensor::full({}, loss));
  ckpt::save_safetensors((dir / "batch.safetensors").string(), batch, {});
  const std::string cmd = "/usr/bin/python3 " + std::string(BRIGADE_SOURCE_DIR) + "/tests/reference/" + command + " " +
                          (dir / "model.safetensors").string() + " --batch " + (dir / "batch.safetensors").string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::filesystem::remove_all(dir);
}

// A model config from a fixture's "config" metadata: Config::from_json where the model has one,
// else the JSON bindings above.
template <class Config>
Config config_from_metadata(const std::string& text) {
  if constexpr (requires { Config::from_json(text); })
    return Config::from_json(text);
  else
    return nlohmann::json::parse(text).get<Config>();
}

// The base of a model's parity test: the reader of its fixture and the config that fixture was
// made with, loading the model from it, and the checks every model makes against its fixture.
// A test defines `loss`, the model's loss on the fixture's batch.
template <class Model, class Config>
class ParityTest : public ::testing::Test {
 protected:
  // Opens tests/fixtures/<file>, checks its magic and kind and reads its config; call it under
  // ASSERT_NO_FATAL_FAILURE.
  void open_fixture(const std::string& file, const std::string& kind) {
    const std::string path = std::string(BRIGADE_FIXTURES_DIR) + "/" + file;
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (the scripts in tests/reference make it)";
    r_.open(path);
    ASSERT_EQ(r_.metadata("magic").value_or(""), "brigade-fixture");
    ASSERT_EQ(r_.metadata("kind").value_or(""), kind);
    cfg_ = config_from_metadata<Config>(r_.metadata("config").value());
  }
  virtual void load(Model& m) const { load_parameters(r_, m); }
  virtual Tensor loss(const Model& m) const = 0;

  // init_weights from the fixture's init_seed gives every parameter bitwise the fixture's
  // `prefix + name`.
  void expect_init_is_fixtures(Model& m, const std::string& prefix = "init.") const {
    Generator g(std::stoull(r_.metadata("init_seed").value()));
    m.init_weights(g);
    for (auto& [name, p] : m.named_parameters()) {
      const Tensor want = r_.get(prefix + name);
      ASSERT_EQ(p.shape(), want.shape()) << name;
      EXPECT_EQ(0, std::memcmp(p.raw_data(), want.raw_data(), p.nbytes())) << "parameter " << name << " differs";
    }
  }

  // `logits` (of the fixture's model `m`) and its loss are within 1e-5 of the fixture's, then
  // the loss's backward gives every parameter a gradient within 1e-4 (grad_err, `key_bias`).
  void expect_logits_loss_and_gradients(const Model& m, const Tensor& logits,
                                        const std::string& key_bias = "key.bias") const {
    EXPECT_LT(rel_err(logits, r_.get("logits")), 1e-5);
    const Tensor l = loss(m);
    EXPECT_LT(rel_err(l, r_.get("loss")), 1e-5) << l.item() << " vs " << r_.get("loss").item();
    autograd::backward(l);
    expect_gradients_match(r_, m, 1e-4, key_bias);
  }

  // A save -> load round trip under the parameters' names (with the config JSON): another model
  // loads them bitwise and gives the same loss.
  void expect_save_load_round_trip(const std::string& stem) const {
    Model a(cfg_), b(cfg_);
    load(a);
    const TempSafetensors file(stem, a.named_parameters(), {{"config", nlohmann::json(cfg_).dump()}});
    expect_round_trip(file.reader, a.named_parameters(), b.named_parameters());
    autograd::NoGradGuard ng;
    EXPECT_EQ(loss(a).item(), loss(b).item());
  }

  // On the ref backend the loss is within 1e-5 of the fixture's.
  void expect_ref_backend_loss() const {
    Model m(cfg_);
    load(m);
    ops::BackendScope s(ops::Backend::Ref);
    autograd::NoGradGuard ng;
    EXPECT_LT(rel_err(loss(m), r_.get("loss")), 1e-5);
  }

  // Under bf16 autocast (O1, O2) the loss is f32 and within `tol` (relative) of the fixture's,
  // and the backward gives every parameter an f32 gradient (with `frozen`, only the parameters
  // that require one, and the others none).
  void expect_autocast_f32_gradients(double tol, bool frozen = false) const {
    for (amp::Level level : {amp::Level::O1, amp::Level::O2}) {
      Model m(cfg_);
      load(m);
      Tensor l;
      {
        amp::AutocastScope scope(amp::Policy{level, DType::BF16});
        l = loss(m);
      }
      EXPECT_EQ(l.dtype(), DType::F32);
      EXPECT_NEAR(l.item(), r_.get("loss").item(), tol * std::abs(r_.get("loss").item())) << amp::level_name(level);
      autograd::backward(l);
      for (auto& [name, p] : m.named_parameters()) {
        if (frozen) {
          EXPECT_EQ(p.grad().defined(), p.requires_grad()) << name;
          if (!p.requires_grad()) continue;
        } else {
          ASSERT_TRUE(p.grad().defined()) << name;
        }
        EXPECT_EQ(p.grad().dtype(), DType::F32) << name;
      }
    }
  }

  ckpt::SafetensorsReader r_;
  Config cfg_;
};

}  // namespace brigade::test_support
