// parallel.deterministic, end to end through the `brigade` binary: one global batch of 16 rows
// trained for 20 steps (dropout, gradient clipping and weight decay on) as dp 1, 2, 4 x ZeRO 0-3 x
// accumulation 1, 2, 4 gives one loss curve and one set of final weights, bitwise. The expected
// values come from the single-process run with the whole batch in one micro-step; the claim is
// equality of bits, so there is no tolerance. The same for a masked LM (BERT), whose one-row atoms
// often hold no masked token, and whose data-parallel units differ by stage. Also: the recipe
// errors of the mode, and a ZeRO-3 hang it exposed (a masked-LM rank whose rows held no masked
// token skipped the encoder, and with it the gathers the other ranks waited in).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "support/recipes.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

using test_support::CmdResult;
using test_support::kMpirun;
using test_support::slurp;

constexpr int64_t kGlobalRows = 16;

// 20 steps of the global batch at context 16 (seed 11), dropout, gradient clipping and weight decay on.
const std::string kRecipe =
    test_support::tiny_gpt_recipe({"run.seed=11", "model.block_size=16", "model.dropout=0.1", "train.steps=20",
                                   "train.batch_size=16", "train.seq_len=16", "train.eval_batches=1",
                                   "train.grad_clip=0.5", "optim.weight_decay=0.1", "parallel.deterministic=true"});

// The masked LM: the same run with BERT's keys.
std::string bert_recipe() {
  std::string r = kRecipe;
  const std::string model = "[model]\n";
  r.replace(r.find(model), model.size(), model + "type = \"bert\"\nintermediate_size = 64\n");
  return r;
}

// Every logged loss and gradient norm, as printed.
std::vector<std::string> numbers(const fs::path& metrics) {
  std::vector<std::string> out;
  for (const auto& [step, j] : test_support::read_curve(metrics).records)
    out.push_back(std::to_string(step) + " " + j.at("loss").dump() + " " + j.at("grad_norm").dump());
  return out;
}

class Deterministic : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // (fresh_test_dir names the folder after the running test, which a suite set-up has not)
    dir_ = new fs::path(fs::temp_directory_path() / ("brigade_deterministic_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    test_support::write_tiny_run(*dir_, kRecipe);
    std::ofstream(*dir_ / "bert.toml") << bert_recipe();
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  // `brigade train tiny.toml` into run.out_dir = out (one process when np = 1).
  static CmdResult train(const std::string& out, int np, const std::string& args,
                         const std::string& recipe = "tiny.toml") {
    return test_support::run_brigade(*dir_,
                                     "train " + recipe + " --quiet --no-sample --set run.out_dir=" + out + " " + args,
                                     np > 1 ? np : 0, kMpirun);
  }
  static fs::path* dir_;
};
fs::path* Deterministic::dir_ = nullptr;

TEST_F(Deterministic, EveryDpZeroStageAndSplitGivesTheSameBits) {
  if (!test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun";
  const CmdResult ref = train("ref", 1, "");
  ASSERT_EQ(ref.code, 0) << ref.err;
  const test_support::Curve want = test_support::read_curve(*dir_ / "ref/metrics.jsonl");
  ASSERT_EQ(want.loss.size(), 20u);
  const std::string weights = slurp(*dir_ / "ref/checkpoint/model.safetensors");
  ASSERT_FALSE(weights.empty());
  int runs = 0;
  for (int dp : {1, 2, 4})
    for (int zero : {0, 1, 2, 3})
      for (int acc : {1, 2, 4}) {
        if (dp == 1 && zero == 0 && acc == 1) continue;  // the reference
        const int64_t rows = kGlobalRows / (dp * acc);
        const std::string out =
            "dp" + std::to_string(dp) + "_zero" + std::to_string(zero) + "_acc" + std::to_string(acc);
        SCOPED_TRACE(out);
        const CmdResult got = train(
            out, dp,
            "--set parallel.dp=" + std::to_string(dp) + " --set parallel.zero=" + std::to_string(zero) +
                " --set train.accumulation=" + std::to_string(acc) + " --set train.batch_size=" + std::to_string(rows));
        ASSERT_EQ(got.code, 0) << got.err;
        const test_support::Curve c = test_support::read_curve(*dir_ / out / "metrics.jsonl");
        EXPECT_EQ(c.loss_text, want.loss_text) << "the loss curve differs";
        EXPECT_EQ(numbers(*dir_ / out / "metrics.jsonl"), numbers(*dir_ / "ref/metrics.jsonl"));
        EXPECT_TRUE(slurp(*dir_ / out / "checkpoint/model.safetensors") == weights) << "the final weights differ";
        fs::remove_all(*dir_ / out);
        ++runs;
      }
  EXPECT_EQ(runs, 35);
}

TEST_F(Deterministic, MaskedLmGivesTheSameBitsAcrossLayouts) {
  if (!test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun";
  const CmdResult ref = train("bert_ref", 1, "", "bert.toml");
  ASSERT_EQ(ref.code, 0) << ref.err;
  const std::vector<std::string> want = numbers(*dir_ / "bert_ref/metrics.jsonl");
  ASSERT_EQ(want.size(), 20u);
  const std::string weights = slurp(*dir_ / "bert_ref/checkpoint/model.safetensors");
  for (const std::string& layout : {"--set parallel.zero=0 --set train.batch_size=8",
                                    "--set parallel.zero=3 --set train.batch_size=2 --set train.accumulation=4"}) {
    SCOPED_TRACE(layout);
    const CmdResult got = train("bert_dp", 2, "--set parallel.dp=2 --set parallel.timeout_s=60 " + layout, "bert.toml");
    ASSERT_EQ(got.code, 0) << got.err;
    EXPECT_EQ(numbers(*dir_ / "bert_dp/metrics.jsonl"), want);
    EXPECT_TRUE(slurp(*dir_ / "bert_dp/checkpoint/model.safetensors") == weights) << "the final weights differ";
    fs::remove_all(*dir_ / "bert_dp");
  }
}

TEST_F(Deterministic, Zero3MaskedLmWithRowsWithoutMaskedTokensDoesNotHang) {
  if (!test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun";
  // one-row micro-batches of 16 tokens: about 7% hold no masked token (0.85^16), in training and
  // in the final evaluation; the watchdog turns a hang into an error within 30 s
  const CmdResult r = train("bert_z3", 2,
                            "--set parallel.deterministic=false --set parallel.dp=2 --set parallel.zero=3 --set "
                            "train.batch_size=1 --set train.accumulation=4 --set parallel.timeout_s=30",
                            "bert.toml");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("parallel.timeout_s"), std::string::npos) << r.err;
}

TEST_F(Deterministic, AtomsPerRankMustBeAPowerOfTwo) {
  const CmdResult r = train("bad", 1, "--set train.batch_size=6");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("6 rows per rank make 6 atoms"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("power of two"), std::string::npos) << r.err;
  const CmdResult m = train("bad", 1, "--set train.batch_size=6 --set parallel.atom_rows=4");
  EXPECT_EQ(m.code, 1) << m.err;
  EXPECT_NE(m.err.find("not a multiple of parallel.atom_rows = 4"), std::string::npos) << m.err;
}

TEST_F(Deterministic, ASettingItWouldIgnoreIsRefused) {
  const CmdResult ring = train("bad", 1, "--set parallel.allreduce=ring");
  EXPECT_EQ(ring.code, 1) << ring.err;
  EXPECT_NE(ring.err.find("parallel.allreduce = \"ring\" has no effect with parallel.deterministic"), std::string::npos)
      << ring.err;
  const CmdResult ramp =
      train("bad", 1, "--set train.accumulation_mode=ramp --set train.accumulation_max=4 --set train.ramp_steps=5");
  EXPECT_EQ(ramp.code, 1) << ramp.err;
  EXPECT_NE(ramp.err.find("needs train.accumulation_mode = \"static\""), std::string::npos) << ramp.err;
}

}  // namespace
