// Gradient accumulation, static and adaptive (train/accumulation.h), end to end
// through the `brigade` binary on a tiny corpus, plus the noise-scale estimator's
// algebra. Expected values come from the definitions: a step of N micro-batches
// of B rows equals one step of N*B rows; the ramp and noise-scale rules are
// recomputed here from the logged values.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/train/accumulation.h"
#include "brigade/train/config.h"
#include "support/recipes.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

// 12 steps of 8 rows ("acc", seed 11), an evaluation every 6 steps, no checkpoint_every key.
const std::string kRecipe =
    test_support::tiny_gpt_recipe({"run.name=\"acc\"", "run.seed=11", "train.eval_every=6", "train.checkpoint_every"});

class Accumulation : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::write_tiny_run(test_support::fresh_test_dir("brigade_acc"), kRecipe, "acc.toml");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `brigade train acc.toml` with `args`: its exit status (its stderr in err()).
  int train(const std::string& args) {
    last_ = test_support::run_brigade(dir_, "train acc.toml --quiet --no-sample " + args);
    return last_.code;
  }
  std::string err() const { return last_.err; }
  // Step records ("loss") and eval records ("val_loss") of a run.
  std::vector<nlohmann::json> records(const std::string& out, const char* key) const {
    std::vector<nlohmann::json> v;
    std::ifstream f(dir_ / out / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains(key)) v.push_back(j);
    }
    return v;
  }
  nlohmann::json memory(const std::string& out) const {
    std::ifstream f(dir_ / out / "memory.json");
    return nlohmann::json::parse(f);
  }
  fs::path dir_;
  test_support::CmdResult last_;
};

TEST_F(Accumulation, MicroStepsEqualOneBigBatchWithLessActivationMemory) {
  ASSERT_EQ(train("--set run.out_dir=big"), 0) << err();
  ASSERT_EQ(train("--set run.out_dir=acc --set train.batch_size=2 --set train.accumulation=4"), 0) << err();
  for (const char* key : {"loss", "val_loss"}) {
    auto a = records("big", key), b = records("acc", key);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    for (size_t i = 0; i < a.size(); ++i) {
      const double x = a[i][key], y = b[i][key];
      EXPECT_NEAR(y, x, 1e-5 * std::abs(x)) << key << " at step " << a[i]["step"];
    }
  }
  auto b = records("acc", "loss");
  EXPECT_EQ(b.back()["tokens_seen"], 12 * 8 * 32);
  EXPECT_EQ(b.back()["accumulation"], 4);
  const int64_t act_big = memory("big")["peak"]["activations"], act_acc = memory("acc")["peak"]["activations"];
  EXPECT_LT(act_acc, act_big / 2) << "4 micro-batches of 2 rows should need well under half the activations of 8 rows";
}

TEST_F(Accumulation, RampGrowsAsConfiguredAndResumesExactly) {
  const std::string ramp =
      "--set train.batch_size=2 --set train.accumulation=1 --set train.accumulation_mode=ramp "
      "--set train.accumulation_max=4 --set train.ramp_steps=8";
  ASSERT_EQ(train(ramp + " --set run.out_dir=straight"), 0) << err();
  ASSERT_EQ(train(ramp + " --set run.out_dir=resumed --stop-at 5"), 0) << err();
  ASSERT_EQ(train(ramp + " --set run.out_dir=resumed --resume"), 0) << err();
  auto a = records("straight", "loss"), b = records("resumed", "loss");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  int64_t tokens = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    // step s (0-based) uses 1 + floor((4 - 1) * min(1, s / 8)) micro-steps
    const int64_t expect = 1 + int64_t(std::floor(3.0 * std::min(1.0, double(i) / 8.0)));
    EXPECT_EQ(a[i]["accumulation"], expect) << "step " << i + 1;
    tokens += expect * 2 * 32;
    EXPECT_EQ(a[i]["tokens_seen"], tokens) << "step " << i + 1;
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;  // bitwise
    EXPECT_EQ(a[i]["accumulation"], b[i]["accumulation"]);
  }
}

TEST_F(Accumulation, NoiseScaleGrowsByItsRuleAndResumesExactly) {
  // Short sequences and one row per micro-step: the gradient is noisy, so the measured
  // noise scale soon exceeds what 2 micro-steps cover and the accumulation grows.
  const std::string noise =
      "--set train.batch_size=1 --set train.seq_len=8 --set train.steps=30 --set train.eval_every=0 "
      "--set optim.lr=1e-2 --set train.accumulation=2 --set train.accumulation_mode=noise_scale "
      "--set train.accumulation_max=8";
  ASSERT_EQ(train(noise + " --set run.out_dir=straight"), 0) << err();
  ASSERT_EQ(train(noise + " --set run.out_dir=resumed --stop-at 10"), 0) << err();
  ASSERT_EQ(train(noise + " --set run.out_dir=resumed --resume"), 0) << err();
  auto a = records("straight", "loss"), b = records("resumed", "loss");
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), 30u);
  EXPECT_EQ(a.front()["accumulation"], 2);
  EXPECT_GT(a.back()["accumulation"].get<int64_t>(), 2) << "the accumulation never grew";
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    // next = clamp(max(current, ceil(noise_scale / rows per micro-step)), 2, 8), rows = 1
    const int64_t cur = a[i]["accumulation"];
    const double ns = a[i]["noise_scale"];
    const int64_t want = std::clamp<int64_t>(std::max<int64_t>(cur, int64_t(std::ceil(ns))), 2, 8);
    EXPECT_EQ(a[i + 1]["accumulation"], want) << "after step " << i + 1 << " (noise scale " << ns << ")";
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["accumulation"], b[i]["accumulation"]) << "step " << i + 1;
  }
}

TEST_F(Accumulation, NoiseScaleIsMeasuredOnUnscaledGradientsUnderLossScaling) {
  // The one-micro-batch gradient is read before the step's unscaling, with the loss scale
  // (here 2^16 under fp16 dynamic scaling) still in it; the estimate must divide it out and
  // agree with fp32's to fp16 rounding, not be off by the scale squared.
  const std::string noise =
      "--set train.batch_size=1 --set train.seq_len=8 --set train.steps=6 --set train.eval_every=0 "
      "--set train.accumulation=2 --set train.accumulation_mode=noise_scale --set train.accumulation_max=8";
  ASSERT_EQ(train(noise + " --set run.out_dir=fp32"), 0) << err();
  ASSERT_EQ(train(noise + " --set run.out_dir=fp16 --set precision.level=O2 --set precision.dtype=fp16"), 0) << err();
  auto a = records("fp32", "loss"), b = records("fp16", "loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(b.front()["loss_scale"].get<double>(), 65536.0);
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i]["noise_scale"], y = b[i]["noise_scale"];
    EXPECT_NEAR(y, x, 0.05 * std::abs(x) + 1e-9) << "step " << i + 1;
  }
}

TEST(AccumulationPolicy, NoiseScaleEstimatorRecoversKnownNoise) {
  // A gradient with true squared norm |G|^2 = 4 and per-row noise trace S = 12:
  // E|G_b|^2 = |G|^2 + S / b, so B_simple = S / |G|^2 = 3 rows.
  train::TrainConfig t;
  t.accumulation = 2;
  t.accumulation_max = 10;
  t.accumulation_mode = "noise_scale";
  train::AccumulationPolicy p(t, /*rows_per_micro=*/1);
  EXPECT_EQ(p.at(0), 2);
  p.observe(4.0 + 12.0 / 2.0, 2, 4.0 + 12.0 / 8.0, 8);
  EXPECT_NEAR(p.noise_scale(), 3.0, 1e-12);
  EXPECT_EQ(p.at(1), 3);  // ceil(3 / 1)
  // Smoothing: a second measurement with S = 36 moves the averages by (1 - 0.9).
  p.observe(4.0 + 36.0 / 2.0, 2, 4.0 + 36.0 / 8.0, 8);
  EXPECT_NEAR(p.noise_scale(), (0.9 * 12 + 0.1 * 36) / 4.0, 1e-12);
  EXPECT_EQ(p.at(2), 4);  // ceil(3.6)
  // State round trip.
  train::AccumulationPolicy q(t, 1);
  q.set_state(p.state());
  EXPECT_EQ(q.at(5), p.at(5));
  EXPECT_DOUBLE_EQ(q.noise_scale(), p.noise_scale());
  // Never beyond the maximum, never shrinking.
  p.observe(1.0 + 1000.0 / 2.0, 2, 1.0 + 1000.0 / 8.0, 8);
  EXPECT_EQ(p.at(3), 10);
  p.observe(100.0 + 0.1 / 2.0, 2, 100.0 + 0.1 / 8.0, 8);
  EXPECT_EQ(p.at(4), 10);
}

// The saved state's counters are whole numbers >= 0, checked: a float such as 1e300 reached an
// int64_t conversion (undefined behaviour) when state.json was damaged (found writing its fuzz target, tests/fuzz).
TEST(AccumulationPolicy, AStateWithAFractionalOrHugeCounterIsACheckpointError) {
  train::TrainConfig t;
  t.accumulation = 2;
  t.accumulation_max = 10;
  t.accumulation_mode = "noise_scale";
  train::AccumulationPolicy p(t, 1);
  auto state = [](const std::string& current) {
    return "{\"current\": " + current + ", \"ema_s\": 0.5, \"ema_g\": 0.25, \"observations\": 3}";
  };
  for (const auto& [bad, shown] :
       std::vector<std::pair<std::string, std::string>>{{"1e300", "1e+300"}, {"2.5", "2.5"}, {"-4", "-4"}}) {
    try {
      p.set_state(state(bad));
      ADD_FAILURE() << bad << ": no error";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("\"current\" holds " + shown + ", not a whole number >= 0"),
                std::string::npos)
          << e.what();
    }
  }
  p.set_state(state("5.0"));  // a whole number written as a float reads
  EXPECT_EQ(p.at(0), 5);
}

TEST(AccumulationPolicy, BadSettingsAreConfigErrors) {
  const std::string base = "[train]\nsteps = 10\n[schedule]\nwarmup_steps = 1\n";
  auto msg = [&](std::vector<std::string> sets) -> std::string {
    try {
      train::parse_recipe(base, "a.toml", sets);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg({"train.accumulation_mode=noise_scale", "train.accumulation_max=8"}).find("accumulation >= 2"),
            std::string::npos);
  EXPECT_NE(msg({"train.accumulation_mode=ramp", "train.accumulation_max=8"}).find("ramp_steps"), std::string::npos);
  EXPECT_NE(msg({"train.accumulation_mode=ramp", "train.ramp_steps=5"}).find("accumulation_max"), std::string::npos);
  EXPECT_NE(msg({"train.accumulation_max=4"}).find("no effect"), std::string::npos);
  EXPECT_NE(msg({"train.accumulation_mode=noise_scal"}).find("did you mean"), std::string::npos);
  EXPECT_NE(msg({"train.accumulation=2", "train.accumulation_mode=noise_scale", "train.accumulation_max=8",
                 "parallel.zero=2"})
                .find("ZeRO"),
            std::string::npos);
  EXPECT_EQ(msg({"train.accumulation=2", "train.accumulation_mode=noise_scale", "train.accumulation_max=8"}), "");
}

}  // namespace
