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

using brigade::test_support::rel_err;

// The fixture holds the initial weights under the parameters' own names.
class GptParity : public test_support::ParityTest<models::GPT, models::GPTConfig> {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(open_fixture("gpt2_tiny.safetensors", "gpt2_parity")); }
  Tensor loss(const models::GPT& m) const override { return m.loss(r_.get("ids"), r_.get("targets")); }
};

TEST_F(GptParity, InitialisationIsBitwiseTorch) {
  models::GPT m(cfg_);
  expect_init_is_fixtures(m, "");
}

TEST_F(GptParity, LogitsLossAndGradientsMatchTorch) {
  models::GPT m(cfg_);
  load(m);
  expect_logits_loss_and_gradients(m, m.forward(r_.get("ids")));  // no name ends in key.bias: rel_err throughout
}

TEST_F(GptParity, TenAdamWStepsMatchTorch) {
  models::GPT m(cfg_);
  load(m);
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
  if (!test_support::have_torch())
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
  const auto [ids, targets] = test_support::lm_batch(c.vocab_size);
  optim::AdamW opt(m.named_parameters(), optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  test_support::take_adamw_steps(opt, m, ids, targets);
  const double loss = test_support::item_without_grad([&] { return m.loss(ids, targets); });
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
