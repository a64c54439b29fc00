// Hugging Face model directories in (models/hf/hf_dir.h): the tiny directories written by
// tests/reference/make_hf_dirs.py (GPT-2 as real checkpoints store it: no key prefix, mask
// buffers, tied head; LLaMA with GQA and an untied head, in F32, in BF16 and in two shards;
// LLaMA with the legacy {"type": "linear"} rope_scaling; Llama 3.2's layout: llama3 rope_scaling
// and a tied head without lm_head.weight) load and give the reference model's logits within
// 1e-5; the llama3 + tied model's loss within 1e-5 and every gradient within 1e-4 (cpu and ref
// backends), its tied head one parameter; each kind of bad directory gives one error that names
// what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/models/hf/hf_dir.h"
#include "brigade/ops/ops.h"
#include "support/parity.h"
#include "support/test_support.h"

using namespace brigade;
namespace fs = std::filesystem;
using brigade::test_support::rel_err;

namespace {

const fs::path kHf = fs::path(BRIGADE_FIXTURES_DIR) / "hf";

class HfDir : public ::testing::TestWithParam<const char*> {};

TEST_P(HfDir, LoadsAndGivesTheReferenceLogits) {
  const fs::path dir = kHf / GetParam();
  models::HfModel m = models::load_hf_directory(dir.string());
  EXPECT_EQ(m.model_type, std::string(GetParam()).substr(0, 4) == "gpt2" ? "gpt2" : "llama");
  if (m.model_type == "gpt2") {
    EXPECT_EQ(m.skipped.size(), 4u);  // h.<i>.attn.bias and h.<i>.attn.masked_bias, 2 layers
    ASSERT_EQ(m.notes.size(), 1u);    // the fixture's attn_pdrop = 0.1, said, not applied
    EXPECT_NE(m.notes[0].find("attn_pdrop = 0.1 is not applied"), std::string::npos) << m.notes[0];
  } else {
    EXPECT_TRUE(m.notes.empty());
  }
  m.model->train(false);
  ckpt::SafetensorsReader want((dir / "expected.safetensors").string());
  autograd::NoGradGuard no_grad;
  const Tensor logits = m.model->forward(want.get("ids"));
  EXPECT_LT(rel_err(logits, want.get("logits")), 1e-5) << GetParam();
}

TEST_P(HfDir, SavedBackItLoadsBitwiseHereAndIntoThePyTorchReference) {
  const fs::path src = kHf / GetParam();
  const fs::path out = test_support::fresh_test_dir("brigade_hf_out") / "model";
  models::HfModel m = models::load_hf_directory(src.string());
  models::save_hf_directory(*m.model, out.string());
  models::HfModel back = models::load_hf_directory(out.string());
  EXPECT_TRUE(back.skipped.empty());  // no buffers and no tied head written
  EXPECT_TRUE(back.notes.empty());    // attn_pdrop written as 0, what the model does
  m.model->train(false);
  back.model->train(false);
  ckpt::SafetensorsReader want((src / "expected.safetensors").string());
  {
    autograd::NoGradGuard no_grad;
    const Tensor a = m.model->forward(want.get("ids")), b = back.model->forward(want.get("ids"));
    EXPECT_EQ(a.to_vector(), b.to_vector()) << GetParam();
  }
  if (!test_support::have_torch()) GTEST_SKIP() << "python3-torch missing: the PyTorch side is not checked";
  const test_support::CmdResult r = test_support::run_in(
      out.parent_path(), "/usr/bin/python3 " + std::string(BRIGADE_SOURCE_DIR) + "/tests/reference/check_hf_dir.py " +
                             out.string() + " " + (src / "expected.safetensors").string());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  fs::remove_all(out.parent_path());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfDir,
                         ::testing::Values("gpt2", "llama", "llama_bf16", "llama_sharded", "llama_linear",
                                           "llama3_tied"),
                         [](const auto& info) { return std::string(info.param); });

TEST(HfDirScaledRope, ConfigsAreReadAsWritten) {
  const models::HfConfig lin = models::read_hf_config((kHf / "llama_linear").string());
  EXPECT_EQ(lin.llama.rope_scaling, ops::RopeScaling::Linear);  // from the legacy "type" key
  EXPECT_EQ(lin.llama.rope_factor, 4.0);
  EXPECT_FALSE(lin.llama.tie_word_embeddings);
  const models::HfConfig l3 = models::read_hf_config((kHf / "llama3_tied").string());
  EXPECT_EQ(l3.llama.rope_scaling, ops::RopeScaling::Llama3);
  EXPECT_EQ(l3.llama.rope_factor, 8.0);
  EXPECT_EQ(l3.llama.rope_low_freq_factor, 1.0);
  EXPECT_EQ(l3.llama.rope_high_freq_factor, 4.0);
  EXPECT_EQ(l3.llama.rope_original_max_positions, 128.0);
  EXPECT_TRUE(l3.llama.tie_word_embeddings);
  EXPECT_TRUE(l3.notes.empty());
}

// The llama3 + tied fixture against the reference's float64 loss and gradients.
void check_llama3_tied_parity() {
  const fs::path dir = kHf / "llama3_tied";
  models::HfModel m = models::load_hf_directory(dir.string());
  EXPECT_TRUE(m.skipped.empty());
  auto& llama = dynamic_cast<models::LLaMA&>(*m.model);
  EXPECT_EQ(llama.lm_head, nullptr);
  std::vector<std::string> names;
  for (auto& [name, p] : llama.named_parameters()) names.push_back(name);
  EXPECT_EQ(std::count(names.begin(), names.end(), "model.embed_tokens.weight"), 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head.weight"), 0);
  EXPECT_EQ(llama.tied_parameters(), std::vector<std::string>{"model.embed_tokens.weight"});
  ckpt::SafetensorsReader want((dir / "expected.safetensors").string());
  const Tensor ids = want.get("ids"), targets = want.get("targets");
  EXPECT_LT(rel_err(llama.forward(ids), want.get("logits")), 1e-5);
  const Tensor loss = llama.loss(ids, targets);
  EXPECT_LT(rel_err(loss, want.get("loss")), 1e-5) << loss.item() << " vs " << want.get("loss").item();
  autograd::backward(loss);
  for (auto& [name, p] : llama.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    // embed_tokens: the lookup's rows and the head's whole matrix, summed in one gradient
    EXPECT_LT(rel_err(p.grad(), want.get("grad." + name)), 1e-4) << "gradient of " << name;
  }
}

TEST(HfDirScaledRope, Llama3TiedLossAndGradientsMatchTorch) { check_llama3_tied_parity(); }

TEST(HfDirScaledRope, Llama3TiedLossAndGradientsMatchTorchOnTheRefBackend) {
  ops::BackendScope s(ops::Backend::Ref);
  check_llama3_tied_parity();
}

// The scaling and the tie matter: without them the same weights give other logits.
TEST(HfDirScaledRope, DroppingTheScalingChangesTheLogits) {
  const fs::path dir = kHf / "llama3_tied";
  models::HfConfig c = models::read_hf_config(dir.string());
  ckpt::SafetensorsReader want((dir / "expected.safetensors").string());
  c.llama.rope_scaling = ops::RopeScaling::None;
  auto plain = models::make_hf_model(c);
  models::load_hf_weights(dir.string(), "llama", *plain);
  autograd::NoGradGuard no_grad;
  EXPECT_GT(rel_err(plain->forward(want.get("ids")), want.get("logits")), 1e-3);
}

TEST(HfDirScaledRope, SavedConfigHoldsTheScalingAndTheTie) {
  const fs::path out = test_support::fresh_test_dir("brigade_hf_l3") / "model";
  models::HfModel m = models::load_hf_directory((kHf / "llama3_tied").string());
  models::save_hf_directory(*m.model, out.string());
  const nlohmann::json j = nlohmann::json::parse(test_support::slurp(out / "config.json"));
  EXPECT_EQ(j.at("tie_word_embeddings"), true);
  const nlohmann::json& rs = j.at("rope_scaling");
  EXPECT_EQ(rs.at("rope_type"), "llama3");
  EXPECT_EQ(rs.at("factor"), 8.0);
  EXPECT_EQ(rs.at("low_freq_factor"), 1.0);
  EXPECT_EQ(rs.at("high_freq_factor"), 4.0);
  EXPECT_EQ(rs.at("original_max_position_embeddings"), 128);
  ckpt::SafetensorsReader r((out / "model.safetensors").string());
  EXPECT_FALSE(r.contains("lm_head.weight"));
  EXPECT_TRUE(r.contains("model.embed_tokens.weight"));
  models::HfModel lin = models::load_hf_directory((kHf / "llama_linear").string());
  models::save_hf_directory(*lin.model, out.string());
  const nlohmann::json jl = nlohmann::json::parse(test_support::slurp(out / "config.json"));
  EXPECT_EQ(jl.at("rope_scaling"), nlohmann::json({{"factor", 4.0}, {"rope_type", "linear"}}));
  EXPECT_EQ(jl.at("tie_word_embeddings"), false);
  fs::remove_all(out.parent_path());
}

class HfDirErrors : public ::testing::Test {
 protected:
  void SetUp() override { tmp_ = test_support::fresh_test_dir("brigade_hf"); }
  void TearDown() override { fs::remove_all(tmp_); }
  // A copy of fixture `name` to break.
  fs::path copy(const char* name) {
    const fs::path d = tmp_ / name;
    fs::copy(kHf / name, d, fs::copy_options::recursive);
    return d;
  }
  static void expect_error(const fs::path& dir, const std::string& needle) {
    try {
      models::load_hf_directory(dir.string());
      ADD_FAILURE() << "no error; wanted one containing: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  static void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = nlohmann::json::parse(test_support::slurp(dir / "config.json"));
    f(j);
    std::ofstream(dir / "config.json") << j.dump(2);
  }
  // Rewrites model.safetensors through `f` on its (name, tensor) list.
  static void edit_weights(const fs::path& dir, const std::function<void(ckpt::NamedTensors&)>& f) {
    ckpt::NamedTensors t;
    {
      ckpt::SafetensorsReader r((dir / "model.safetensors").string());
      for (const std::string& n : r.names()) t.emplace_back(n, r.get(n));
    }
    f(t);
    ckpt::save_safetensors((dir / "model.safetensors").string(), t);
  }
  fs::path tmp_;
};

TEST_F(HfDirErrors, AMissingShardIsNamed) {
  const fs::path d = copy("llama_sharded");
  fs::remove(d / "model-00002-of-00002.safetensors");
  expect_error(d, "lists shard model-00002-of-00002.safetensors, which is missing");
}

TEST_F(HfDirErrors, AMissingKeyIsNamed) {
  const fs::path d = copy("llama");
  edit_weights(d, [](ckpt::NamedTensors& t) { std::erase_if(t, [](auto& e) { return e.first == "lm_head.weight"; }); });
  expect_error(d, "no weight for \"lm_head.weight\"");
}

TEST_F(HfDirErrors, AWrongShapeIsNamed) {
  const fs::path d = copy("llama");
  edit_weights(d, [](ckpt::NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == "model.norm.weight") v = Tensor::zeros({47});
  });
  expect_error(d, "\"model.norm.weight\" has shape (47)");
}

TEST_F(HfDirErrors, AnUnexpectedKeyIsNamed) {
  const fs::path d = copy("llama");
  edit_weights(
      d, [](ckpt::NamedTensors& t) { t.emplace_back("model.layers.0.self_attn.q_proj.bias", Tensor::zeros({48})); });
  expect_error(d, "tensor \"model.layers.0.self_attn.q_proj.bias\" is not a parameter");
}

TEST_F(HfDirErrors, AnUntiedGpt2HeadIsRefusedAndATiedOneLoads) {
  const fs::path d = copy("gpt2");
  Tensor wte;
  edit_weights(d, [&](ckpt::NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == "wte.weight") wte = v;
    t.emplace_back("lm_head.weight", wte.clone());  // tied: equal to wte
  });
  EXPECT_EQ(models::load_hf_directory(d.string()).skipped.size(), 5u);
  edit_weights(d, [&](ckpt::NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == "lm_head.weight") v = Tensor::zeros(wte.shape());
  });
  expect_error(d, "lm_head.weight differs from wte.weight");
}

TEST_F(HfDirErrors, UnsupportedOrBadRopeScalingsAreRefusedByName) {
  const fs::path d = copy("llama_linear");
  for (const char* t : {"dynamic", "yarn", "longrope", "su", "ntk"}) {
    edit_config(d, [&](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", t}, {"factor", 2.0}}; });
    expect_error(d, fmt::format("rope_scaling rope_type = \"{}\" is not supported", t));
  }
  edit_config(d, [](nlohmann::json& j) { j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}}; });
  expect_error(d, "rope_scaling type = \"dynamic\" is not supported");  // the legacy key, named as written
  edit_config(d, [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0.0}}; });
  expect_error(d, "factor must be > 0, got 0");
  edit_config(d, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 4.0},
                         {"high_freq_factor", 1.0},
                         {"original_max_position_embeddings", 128}};
  });
  expect_error(d, "0 < low_freq_factor < high_freq_factor, got 4 and 1");
  edit_config(d, [](nlohmann::json& j) { j["rope_scaling"] = {{"factor", 2.0}}; });
  expect_error(d, "has no \"rope_type\"");
  edit_config(d, [](nlohmann::json& j) { j["rope_scaling"] = "linear"; });
  expect_error(d, "neither null nor an object");
  // "default" is the unscaled RoPE: the weights load, the logits are no longer the fixture's.
  edit_config(d, [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "default"}}; });
  const models::HfConfig c = models::read_hf_config(d.string());
  EXPECT_EQ(c.llama.rope_scaling, ops::RopeScaling::None);
  // An unknown key is said, not silently dropped.
  edit_config(d, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"beta", 1}};
  });
  const models::HfConfig n = models::read_hf_config(d.string());
  ASSERT_EQ(n.notes.size(), 1u);
  EXPECT_NE(n.notes[0].find("rope_scaling's \"beta\" = 1 is not read"), std::string::npos) << n.notes[0];
}

TEST_F(HfDirErrors, ATiedLlamaHeadInTheFilesMustEqualTheEmbedding) {
  const fs::path d = copy("llama3_tied");
  Tensor emb;
  edit_weights(d, [&](ckpt::NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == "model.embed_tokens.weight") emb = v;
    t.emplace_back("lm_head.weight", emb.clone());  // older savers keep the tied copy
  });
  models::HfModel m = models::load_hf_directory(d.string());
  ASSERT_EQ(m.skipped.size(), 1u);
  EXPECT_NE(m.skipped[0].find("tied to embed_tokens"), std::string::npos) << m.skipped[0];
  edit_weights(d, [&](ckpt::NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == "lm_head.weight") v = Tensor::zeros(emb.shape());
  });
  expect_error(d,
               "lm_head.weight differs from model.embed_tokens.weight, but config.json says "
               "tie_word_embeddings = true");
  // An untied config needs the head.
  edit_weights(d, [](ckpt::NamedTensors& t) { std::erase_if(t, [](auto& e) { return e.first == "lm_head.weight"; }); });
  edit_config(d, [](nlohmann::json& j) { j["tie_word_embeddings"] = false; });
  expect_error(d, "no weight for \"lm_head.weight\"");
}

TEST_F(HfDirErrors, UnequalGpt2DropoutsAreRefused) {
  const fs::path d = copy("gpt2");
  edit_config(d, [](nlohmann::json& j) { j["embd_pdrop"] = 0.0; });
  expect_error(d, "embd_pdrop = 0 and resid_pdrop = 0.1");
}

TEST_F(HfDirErrors, AnUnknownModelTypeOrAnUnsupportedFieldIsRefusedByName) {
  const fs::path d = copy("llama");
  edit_config(d, [](nlohmann::json& j) { j["model_type"] = "mistral"; });
  expect_error(d, "model_type \"mistral\" is not supported");
  edit_config(d, [](nlohmann::json& j) {
    j["model_type"] = "llama";
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};  // llama3 without its other three
  });
  expect_error(d, "rope_scaling of type \"llama3\" needs a number \"low_freq_factor\"");
  edit_config(d, [](nlohmann::json& j) {
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = true;
  });
  expect_error(d, "attention_bias = true is not supported");
  const fs::path g = copy("gpt2");
  edit_config(g, [](nlohmann::json& j) { j["activation_function"] = "relu"; });
  expect_error(g, "activation_function = \"relu\" is not supported");
  fs::remove(g / "config.json");
  expect_error(g, "no config.json");
}

// config.json sizes are whole numbers in range: a float such as 1e300 used to reach get<int64_t>()
// (undefined behaviour) and a huge width overflowed 4 * n_embd (found writing its fuzz target, tests/fuzz).
TEST_F(HfDirErrors, FractionalOrOutOfRangeSizesAreRefusedByName) {
  const fs::path g = copy("gpt2");
  edit_config(g, [](nlohmann::json& j) { j["vocab_size"] = 1e300; });
  expect_error(g, "\"vocab_size\" = 1e+300 is not a whole number");
  edit_config(g, [](nlohmann::json& j) { j["vocab_size"] = 96.5; });
  expect_error(g, "\"vocab_size\" = 96.5 is not a whole number");
  edit_config(g, [](nlohmann::json& j) {
    j["vocab_size"] = 96;
    j["n_embd"] = int64_t(1) << 40;
    j["n_inner"] = int64_t(1) << 62;
  });
  expect_error(g, "\"n_embd\" = 1099511627776 is outside [1, 131072]");
  edit_config(g, [](nlohmann::json& j) {
    j["n_embd"] = 32;
    j["n_inner"] = nullptr;
    j["n_layer"] = 0;
  });
  expect_error(g, "\"n_layer\" = 0 is outside [1, 4096]");
  edit_config(g, [](nlohmann::json& j) {
    j["n_layer"] = 2.0;  // a whole number written as a float still reads
    j["vocab_size"] = 96.0;
  });
  EXPECT_NO_THROW(models::load_hf_directory(g.string()));
  const fs::path l = copy("llama");
  edit_config(l, [](nlohmann::json& j) { j["pretraining_tp"] = -1e300; });
  expect_error(l, "\"pretraining_tp\" = -1e+300 is not a whole number");
}

// A shard index names files of the model folder only (an absolute path or ".." was read wherever
// it pointed), and a shard that is not a string is a CheckpointError (it was a json type_error).
TEST_F(HfDirErrors, AShardOutsideTheFolderOrNotANameIsRefused) {
  const fs::path d = copy("llama_sharded");
  copy("llama");  // ../llama/model.safetensors exists: without the check it would be read
  const fs::path index = d / "model.safetensors.index.json";
  const nlohmann::json orig = nlohmann::json::parse(test_support::slurp(index));
  const std::string first = orig.at("weight_map").begin().key();
  for (const nlohmann::json& name : {nlohmann::json("../llama/model.safetensors"), nlohmann::json("/etc/passwd")}) {
    nlohmann::json j = orig;
    j["weight_map"][first] = name;
    std::ofstream(index) << j.dump(2);
    expect_error(d, "names shard " + name.dump() + ", which is not a file of");
  }
  nlohmann::json j = orig;
  j["weight_map"][first] = 1;
  std::ofstream(index) << j.dump(2);
  expect_error(d, "weight_map[\"" + first + "\"] = 1 is not a shard file name");
  std::ofstream(index) << orig.dump(2);
  EXPECT_NO_THROW(models::load_hf_directory(d.string()));
}

}  // namespace
