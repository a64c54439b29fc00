// GPT-2 parity with the PyTorch reference (tests/reference/gpt2_ref.py; fixture
// tests/fixtures/gpt2_tiny.safetensors made by make_fixtures.py, written by an
// independent safetensors writer): torch-identical init bit for bit, logits and
// loss to 1e-5, every parameter gradient to 1e-4, and the losses of 10 AdamW steps
// to 1e-5. Relative errors are max|a - b| / max|b| over each tensor.
// Also: a Brigade checkpoint loads into the PyTorch model and gives the same loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/optim/optimizer.h"
#include "brigade/train/checkpoint.h"
#include "support/fixture_configs.h"
#include "support/parity.h"

using namespace brigade;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(BRIGADE_FIXTURES_DIR) + "/gpt2_tiny.safetensors";

using brigade::test_support::rel_err;

models::GPTConfig fixture_config(const ckpt::SafetensorsReader& r) {
  return brigade::test_support::gpt_config_from_json(nlohmann::json::parse(r.metadata("config").value()));
}

void load_fixture_params(const ckpt::SafetensorsReader& r, models::GPT& m) {
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(r.contains(name)) << name;
    p.copy_(r.get(name));
  }
}

class GptParity : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kFixture)) << kFixture;
    r_.open(kFixture);
    ASSERT_EQ(r_.metadata("magic").value_or(""), "brigade-fixture");
    cfg_ = fixture_config(r_);
  }
  ckpt::SafetensorsReader r_;
  models::GPTConfig cfg_;
};

TEST_F(GptParity, InitialisationIsBitwiseTorch) {
  models::GPT m(cfg_);
  Generator g(std::stoull(r_.metadata("init_seed").value()));
  m.init_weights(g);
  for (auto& [name, p] : m.named_parameters()) {
    Tensor want = r_.get(name);
    ASSERT_EQ(p.shape(), want.shape()) << name;
    EXPECT_EQ(0, std::memcmp(p.raw_data(), want.raw_data(), p.nbytes())) << "parameter " << name << " differs";
  }
}

TEST_F(GptParity, LogitsLossAndGradientsMatchTorch) {
  models::GPT m(cfg_);
  load_fixture_params(r_, m);
  Tensor ids = r_.get("ids"), targets = r_.get("targets");
  Tensor logits = m.forward(ids);
  EXPECT_LT(rel_err(logits, r_.get("logits")), 1e-5);
  Tensor loss = m.loss(ids, targets);
  EXPECT_LT(rel_err(loss, r_.get("loss")), 1e-5) << loss.item() << " vs " << r_.get("loss").item();
  autograd::backward(loss);
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LT(rel_err(p.grad(), r_.get("grad." + name)), 1e-4) << "gradient of " << name;
  }
}

TEST_F(GptParity, TenAdamWStepsMatchTorch) {
  models::GPT m(cfg_);
  load_fixture_params(r_, m);
  auto hp = nlohmann::json::parse(r_.metadata("adamw").value());
  optim::AdamW opt(m.named_parameters(),
                   optim::AdamWOptions{hp["betas"][0], hp["betas"][1], hp["eps"], hp["weight_decay"]});
  const double lr = hp["lr"];
  Tensor ids = r_.get("ids"), targets = r_.get("targets");
  std::vector<float> want = r_.get("adamw_losses").to_vector();
  ASSERT_EQ(want.size(), size_t(hp["steps"].get<int>() + 1));
  for (size_t k = 0; k < want.size(); ++k) {
    opt.zero_grad();
    Tensor loss = m.loss(ids, targets);
    EXPECT_NEAR(loss.item(), want[k], 1e-5 * std::abs(want[k])) << "loss after " << k << " AdamW steps";
    if (k + 1 == want.size()) break;
    autograd::backward(loss);
    opt.step(lr);
  }
}

TEST(GptCheckpoint, BrigadeCheckpointLoadsIntoPyTorchWithTheSameLoss) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  models::GPTConfig c;
  c.vocab_size = 101;  // odd sizes on purpose
  c.block_size = 24;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 24;
  models::GPT m(c);
  Generator g(99);
  m.init_weights(g);
  // a few optimizer steps so the weights are no longer at their (structured) init
  std::vector<int64_t> idv, tgv;
  for (int i = 0; i < 2 * 20; ++i) {
    idv.push_back((i * 37 + 11) % c.vocab_size);
    tgv.push_back((i * 53 + 5) % c.vocab_size);
  }
  Tensor ids = Tensor::from_vector_i64(idv, {2, 20}), targets = Tensor::from_vector_i64(tgv, {2, 20});
  optim::AdamW opt(m.named_parameters(), optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  for (int s = 0; s < 3; ++s) {
    opt.zero_grad();
    autograd::backward(m.loss(ids, targets));
    opt.step(1e-2);
  }
  double loss;
  {
    autograd::NoGradGuard ng;
    loss = m.loss(ids, targets).item();
  }
  const fs::path dir = fs::temp_directory_path() / ("brigade_gpt_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  train::Recipe recipe;
  recipe.model.vocab_size = c.vocab_size;
  recipe.model.block_size = c.block_size;
  recipe.model.n_layer = c.n_layer;
  recipe.model.n_head = c.n_head;
  recipe.model.n_embd = c.n_embd;
  train::save_checkpoint((dir / "ckpt").string(), m, &opt, train::TrainState{}, recipe, "");
  ckpt::save_safetensors((dir / "batch.safetensors").string(),
                         {{"ids", ids}, {"targets", targets}, {"loss", Tensor::full({}, loss)}}, {});
  const std::string cmd = "/usr/bin/python3 " + std::string(BRIGADE_SOURCE_DIR) +
                          "/tests/reference/check_checkpoint.py --model " + (dir / "ckpt/model.safetensors").string() +
                          " --batch " + (dir / "batch.safetensors").string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove_all(dir);
}

}  // namespace
