// Hugging Face model directories in (models/hf/hf_dir.h): the tiny directories written by
// tests/reference/make_hf_dirs.py (GPT-2 as real checkpoints store it: no key prefix, mask
// buffers, tied head; LLaMA with GQA and an untied head, in F32, in BF16 and in two shards)
// load and give the reference model's logits within 1e-5; each kind of bad directory gives
// one error that names what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/models/hf/hf_dir.h"
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
    ASSERT_EQ(m.notes.size(), 1u);   // the fixture's attn_pdrop = 0.1, said, not applied
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
  const test_support::CmdResult r =
      test_support::run_in(out.parent_path(), "/usr/bin/python3 " + std::string(BRIGADE_SOURCE_DIR) +
                                                  "/tests/reference/check_hf_dir.py " + out.string() + " " +
                                                  (src / "expected.safetensors").string());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  fs::remove_all(out.parent_path());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfDir, ::testing::Values("gpt2", "llama", "llama_bf16", "llama_sharded"),
                         [](const auto& info) { return std::string(info.param); });

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
  edit_weights(d, [](ckpt::NamedTensors& t) { t.emplace_back("model.layers.0.self_attn.q_proj.bias", Tensor::zeros({48})); });
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
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  });
  expect_error(d, "rope_scaling");
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

}  // namespace
