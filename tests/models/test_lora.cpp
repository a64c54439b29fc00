// LoRA (nn/lora.h) against a plain-PyTorch LoRA (tests/reference/make_lora_fixtures.py) on
// GPT-2 (c_attn, HF Conv1D layout) and LLaMA (q_proj, v_proj): the adapters' initialisation
// bitwise, 10 AdamW steps on the adapters alone (losses within 1e-5, adapter gradients within
// 1e-4 at the first and the last step), the base weights bitwise unchanged and without gradients;
// merged logits equal unmerged ones; adapters saved in PEFT's format (a golden config, PEFT's
// key names) load back into a fresh base model; bad options and bad adapter folders are clear
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/peft.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"
#include "brigade/nn/lora.h"
#include "brigade/optim/optimizer.h"
#include "brigade/parallel/tensor_parallel.h"
#include "support/fixture_configs.h"
#include "support/parity.h"
#include "support/test_support.h"

using namespace brigade;
using brigade::test_support::rel_err;

namespace {

const std::string kDir = BRIGADE_FIXTURES_DIR;

struct Case {
  const char* name;
  const char* file;
};

// The fixture's base model, its parameters copied in.
std::unique_ptr<models::CausalLM> base_model(const ckpt::SafetensorsReader& r) {
  const auto j = nlohmann::json::parse(r.metadata("config").value());
  std::unique_ptr<models::CausalLM> m;
  if (r.metadata("kind").value() == "lora_gpt2")
    m = std::make_unique<models::GPT>(j.get<models::GPTConfig>());
  else
    m = std::make_unique<models::LLaMA>(j.get<models::LLaMAConfig>());
  for (auto& [name, p] : m->named_parameters()) {
    EXPECT_TRUE(r.contains(name)) << name;
    p.copy_(r.get(name));
  }
  return m;
}

nn::LoraOptions options(const ckpt::SafetensorsReader& r) {
  const auto l = nlohmann::json::parse(r.metadata("lora").value());
  nn::LoraOptions o;
  o.r = l.at("r");
  o.alpha = l.at("alpha");
  o.target_modules = nlohmann::json::parse(r.metadata("targets").value()).get<std::vector<std::string>>();
  return o;
}

class Lora : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const std::string path = kDir + "/" + GetParam().file;
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    r_.open(path);
    model_ = base_model(r_);
    gen_ = std::make_unique<Generator>(nlohmann::json::parse(r_.metadata("lora").value()).at("lora_seed"));
    adapted_ = nn::apply_lora(*model_, options(r_), *gen_);
  }
  ckpt::SafetensorsReader r_;
  std::unique_ptr<models::CausalLM> model_;
  std::unique_ptr<Generator> gen_;
  std::vector<std::string> adapted_;
};

TEST_P(Lora, AdaptsTheTargetsAndStartsAsTorchDoes) {
  EXPECT_EQ(adapted_, nlohmann::json::parse(r_.metadata("adapted").value()).get<std::vector<std::string>>());
  const nn::NamedTensors lora = nn::lora_parameters(*model_);
  ASSERT_EQ(lora.size(), 2 * adapted_.size());
  for (auto& [name, p] : lora) {
    EXPECT_TRUE(p.requires_grad()) << name;
    if (name.ends_with(".lora_A.weight")) {
      const Tensor want = r_.get("init." + name);
      ASSERT_EQ(p.shape(), want.shape()) << name;
      EXPECT_EQ(0, std::memcmp(p.raw_data(), want.raw_data(), p.nbytes())) << name << " differs from torch's draw";
    } else {
      for (float v : p.to_vector()) ASSERT_EQ(v, 0.f) << name;
    }
  }
  // An untouched adapter (B = 0) leaves the base model's loss exactly.
  const Tensor ids = r_.get("ids"), targets = r_.get("targets");
  EXPECT_NEAR(model_->loss(ids, targets).item(), r_.get("losses").to_vector()[0], 1e-5);
}

TEST_P(Lora, TenAdamWStepsMatchTorchAndLeaveTheBaseUntouched) {
  const auto hp = nlohmann::json::parse(r_.metadata("adamw").value());
  const nn::NamedTensors lora = nn::lora_parameters(*model_);
  optim::AdamW opt(lora, optim::AdamWOptions{hp["betas"][0], hp["betas"][1], hp["eps"], hp["weight_decay"]});
  const int steps = hp["steps"];
  const std::vector<float> want = r_.get("losses").to_vector();
  ASSERT_EQ(want.size(), size_t(steps + 1));
  const Tensor ids = r_.get("ids"), targets = r_.get("targets");
  for (int k = 0; k <= steps; ++k) {
    opt.zero_grad();
    const Tensor loss = model_->loss(ids, targets);
    EXPECT_NEAR(loss.item(), want[size_t(k)], 1e-5 * std::abs(want[size_t(k)])) << "loss after " << k << " steps";
    autograd::backward(loss);
    if (k == 0 || k == steps)
      for (auto& [name, p] : lora) {
        ASSERT_TRUE(p.grad().defined()) << name;
        const Tensor g = r_.get((k == 0 ? "grad0." : "grad10.") + name);
        EXPECT_LT(rel_err(p.grad(), g), 1e-4) << "gradient of " << name << " at step " << k;
      }
    if (k < steps) opt.step(hp["lr"]);
  }
  // The trajectory is held by the loss at every step and the gradients at steps 0 and 10, not by
  // the adapters themselves: AdamW's normalised step moves an element whose gradient is at float
  // rounding level by about lr either way, so single elements of B may differ by more than the
  // gradients do while every loss still agrees to 1e-5.
  for (auto& [name, p] : model_->named_parameters()) {
    if (name.find(".lora_") != std::string::npos) continue;
    EXPECT_FALSE(p.requires_grad()) << name;
    EXPECT_FALSE(p.grad().defined()) << name << " is frozen but got a gradient";
    const Tensor base = r_.get(name);
    EXPECT_EQ(0, std::memcmp(p.raw_data(), base.raw_data(), p.nbytes())) << name << " changed";
  }
}

TEST_P(Lora, MergedLogitsEqualUnmergedAndUnmergeRestoresTheBase) {
  // Trained adapters from the fixture, so B A is not zero.
  for (auto& [name, p] : nn::lora_parameters(*model_)) p.copy_(r_.get("final." + name));
  const Tensor ids = r_.get("ids");
  autograd::NoGradGuard no_grad;
  const Tensor unmerged = model_->forward(ids);
  nn::merge_lora(*model_);
  EXPECT_LT(rel_err(model_->forward(ids), unmerged), 1e-5);
  EXPECT_THROW(nn::merge_lora(*model_), ValueError);
  nn::unmerge_lora(*model_);
  for (auto& [name, p] : model_->named_parameters()) {
    if (name.find(".lora_") == std::string::npos) {
      EXPECT_LT(rel_err(p, r_.get(name)), 1e-6) << name;
    }
  }
  EXPECT_LT(rel_err(model_->forward(ids), unmerged), 1e-6);
  EXPECT_THROW(nn::unmerge_lora(*model_), ValueError);
}

INSTANTIATE_TEST_SUITE_P(Models, Lora,
                         ::testing::Values(Case{"gpt2", "lora_gpt2.safetensors"},
                                           Case{"llama", "lora_llama.safetensors"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(LoraOptions, BadOptionsAreClearErrors) {
  models::GPTConfig c;
  c.vocab_size = 16;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  models::GPT m(c);
  Generator g(1);
  nn::LoraOptions o;
  o.target_modules = {"q_proj"};
  try {
    nn::apply_lora(m, o, g);
    FAIL() << "no error for a target that matches nothing";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("\"q_proj\" matches no Linear layer"), std::string::npos) << msg;
    EXPECT_NE(msg.find("transformer.h.0.attn.c_attn"), std::string::npos) << msg;
  }
  o.target_modules = {"c_attn"};
  o.r = 0;
  EXPECT_THROW(nn::apply_lora(m, o, g), ConfigError);
  o.r = 2;
  o.dropout = 0.1;  // no generator
  EXPECT_THROW(nn::apply_lora(m, o, g), ConfigError);
  o.dropout = 0;
  EXPECT_EQ(nn::apply_lora(m, o, g), std::vector<std::string>{"transformer.h.0.attn.c_attn"});
  EXPECT_THROW(nn::apply_lora(m, o, g), ConfigError);  // already adapted
  // Tensor parallelism would shard the base under an unsharded adapter: refused before any change.
  try {
    parallel::apply_tensor_parallel(m, models::GPT::tp_plan(), dist::ProcessGroup::world());
    FAIL() << "tensor parallelism accepted an adapted layer";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.0.attn.c_attn carries a LoRA adapter"), std::string::npos)
        << e.what();
  }
}

// The adapter a fresh base model gets from `dir`, as a program loading a PEFT adapter does:
// its config builds the adapters, then the tensors are copied in under the model's names.
std::unique_ptr<models::CausalLM> load_adapted(const ckpt::SafetensorsReader& fixture, const std::string& dir) {
  const ckpt::PeftAdapter a = ckpt::read_peft_adapter(dir);
  std::unique_ptr<models::CausalLM> m = base_model(fixture);
  nn::LoraOptions o;
  o.r = a.config.r;
  o.alpha = a.config.lora_alpha;
  o.rslora = a.config.use_rslora;
  o.target_modules = a.config.target_modules;
  Generator unused(0);  // the saved A replaces the draw
  nn::apply_lora(*m, o, unused);
  nn::NamedTensors params = nn::lora_parameters(*m);
  EXPECT_EQ(params.size(), a.tensors.size());
  for (auto& [name, p] : params) {
    bool found = false;
    for (auto& [key, t] : a.tensors)
      if (key == name) {
        EXPECT_EQ(t.shape(), p.shape()) << name;
        p.copy_(t);
        found = true;
      }
    EXPECT_TRUE(found) << name << " is not in the adapter file";
  }
  return m;
}

TEST_P(Lora, SavesInPeftsFormatAndLoadsBackIntoAFreshModel) {
  for (auto& [name, p] : nn::lora_parameters(*model_)) p.copy_(r_.get("final." + name));
  const std::filesystem::path dir = brigade::test_support::fresh_test_dir("brigade_peft") / "adapter";
  ckpt::PeftLoraConfig c;
  c.r = options(r_).r;
  c.lora_alpha = options(r_).alpha;
  c.target_modules = options(r_).target_modules;
  c.fan_in_fan_out = nn::lora_fan_in_fan_out(*model_);
  c.base_model_name_or_path = "runs/gpt-kjv/hf";
  ckpt::save_peft_adapter(dir.string(), nn::lora_parameters(*model_), c);

  // Key names and shapes as PEFT writes them.
  ckpt::SafetensorsReader st((dir / "adapter_model.safetensors").string());
  const auto adapted = nlohmann::json::parse(r_.metadata("adapted").value()).get<std::vector<std::string>>();
  EXPECT_EQ(st.names().size(), 2 * adapted.size());
  for (const std::string& layer : adapted) {
    const std::string a = "base_model.model." + layer + ".lora_A.weight",
                      b = "base_model.model." + layer + ".lora_B.weight";
    ASSERT_TRUE(st.contains(a)) << a;
    ASSERT_TRUE(st.contains(b)) << b;
    EXPECT_EQ(st.info(a).shape[0], c.r) << a;
    EXPECT_EQ(st.info(b).shape[1], c.r) << b;
  }
  if (std::string(GetParam().name) == "gpt2") {
    const auto golden = nlohmann::json::parse(brigade::test_support::slurp(
        std::filesystem::path(BRIGADE_SOURCE_DIR) / "tests/models/golden/peft_gpt2_adapter_config.json"));
    EXPECT_EQ(nlohmann::json::parse(brigade::test_support::slurp(dir / "adapter_config.json")), golden);
  }

  const Tensor ids = r_.get("ids");
  autograd::NoGradGuard no_grad;
  const std::unique_ptr<models::CausalLM> back = load_adapted(r_, dir.string());
  const Tensor want = model_->forward(ids), got = back->forward(ids);
  EXPECT_EQ(0, std::memcmp(got.raw_data(), want.raw_data(), got.nbytes())) << "a loaded adapter gives other logits";
  std::filesystem::remove_all(dir.parent_path());
}

TEST(PeftAdapter, BadFoldersAreClearErrors) {
  const std::filesystem::path dir = brigade::test_support::fresh_test_dir("brigade_peft_bad");
  auto expect_error = [&](const std::string& config, const std::string& needle) {
    std::ofstream(dir / "adapter_config.json") << config;
    try {
      ckpt::read_peft_adapter(dir.string());
      ADD_FAILURE() << "no error for " << config;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"peft_type": "IA3", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]})", "only \"LORA\"");
  expect_error(R"({"peft_type": "LORA", "lora_alpha": 8, "target_modules": ["c_attn"]})", "no \"r\" field");
  expect_error(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ".*attn"})", "regular expression");
  expect_error(R"({"peft_type": "LORA", "r": "four", "lora_alpha": 8, "target_modules": ["c_attn"]})", "wrong type");
  expect_error(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "bias": "all"})",
               "only \"none\"");
  expect_error(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]})",
               "adapter_model.safetensors: missing");
  ckpt::save_safetensors((dir / "adapter_model.safetensors").string(),
                         {{"base_model.model.transformer.wte.weight", Tensor::zeros({2, 2})}});
  expect_error(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]})",
               "\"base_model.model.transformer.wte.weight\" is not a LoRA adapter weight");
  std::filesystem::remove(dir / "adapter_config.json");
  try {
    ckpt::read_peft_adapter(dir.string());
    ADD_FAILURE() << "no error without adapter_config.json";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("adapter_config.json"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
