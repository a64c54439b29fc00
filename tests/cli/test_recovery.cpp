// Recovery from bad steps and crashed processes, end to end through the `brigade` binary on a
// tiny corpus and model: train.nonfinite = "stop" | "skip" | "rollback", spike detection
// (train.spike_zscore), and `brigade train --max-restarts` after SIGKILLs. Faults are injected
// with BRIGADE_FAULT (trainer.cpp): nan_loss / nan_grad / big_loss at a step, kill at a step in a
// given attempt. The expected weights come from runs without the fault or from the other policy.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/recipes.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

using test_support::CmdResult;
using test_support::kMpirun;
using test_support::slurp;

// 12 steps of 4 rows on two threads, a checkpoint every 4 steps.
const std::string kRecipe =
    test_support::tiny_gpt_recipe({"run.threads=2", "train.batch_size=4", "train.checkpoint_every=4"});

class Recovery : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::write_tiny_run(test_support::fresh_test_dir("brigade_recovery"), kRecipe);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `brigade train tiny.toml` into run.out_dir = out, with BRIGADE_FAULT = fault ("" = none), as
  // one process or under mpirun -np np.
  CmdResult train(const std::string& out, const std::string& args, const std::string& fault = "", int np = 0,
                  int limit_s = 300) {
    const std::string env = fault.empty() ? "" : "BRIGADE_FAULT='" + fault + "'";
    return test_support::run_brigade(dir_, "train tiny.toml --quiet --no-sample --set run.out_dir=" + out + " " + args,
                                     np, kMpirun, env, limit_s);
  }
  std::string model(const std::string& out) { return slurp(dir_ / out / "checkpoint/model.safetensors"); }
  std::string optimizer(const std::string& out) { return slurp(dir_ / out / "checkpoint/optimizer.safetensors"); }
  std::vector<std::string> records(const std::string& out, const std::string& key) {
    std::ifstream f(dir_ / out / "metrics.jsonl");
    std::vector<std::string> got;
    for (std::string line; std::getline(f, line);)
      if (line.find("\"" + key + "\"") != std::string::npos) got.push_back(line);
    return got;
  }
  // The same fault and `args` under train.nonfinite = "skip" (into skip_out) and "rollback" (into
  // rb_out): both succeed with bitwise the same weights, and the rollback run logs one rollback,
  // back to step `back_to`.
  void expect_rollback_equals_skip(const std::string& skip_out, const std::string& rb_out, const std::string& args,
                                   const std::string& fault, int back_to) {
    const CmdResult skip = train(skip_out, "--set train.nonfinite=skip" + args, fault);
    ASSERT_EQ(skip.code, 0) << skip.err;
    const CmdResult rb = train(rb_out, "--set train.nonfinite=rollback" + args, fault);
    ASSERT_EQ(rb.code, 0) << rb.err;
    EXPECT_EQ(model(rb_out), model(skip_out));
    const std::vector<std::string> back = records(rb_out, "rollback_from");
    ASSERT_EQ(back.size(), 1u);
    EXPECT_NE(back[0].find("\"step\":" + std::to_string(back_to)), std::string::npos) << back[0];
  }
  fs::path dir_;
};

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

TEST_F(Recovery, NonFiniteLossStopsByDefaultNamingTheStep) {
  const CmdResult r = train("stop", "", "0:5:nan_loss");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("brigade: error: loss nan at step 5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("train.nonfinite"), std::string::npos) << r.err;  // says what to try
  const CmdResult g = train("stop_grad", "", "0:6:nan_grad");            // fp32: no loss scaler to catch it
  EXPECT_EQ(g.code, 1) << g.err;
  EXPECT_NE(g.err.find("grad_norm nan at step 6"), std::string::npos) << g.err;
}

TEST_F(Recovery, SkipLeavesWeightsAndOptimizerStateOfThePreviousStep) {
  for (const char* kind : {"nan_loss", "nan_grad"}) {
    SCOPED_TRACE(kind);
    const std::string out = std::string("skip_") + kind;
    ASSERT_EQ(train(out, "--set train.nonfinite=skip --stop-at 5").code, 0);
    const std::string m5 = model(out), o5 = optimizer(out);
    const CmdResult r = train(out, "--set train.nonfinite=skip --resume --stop-at 6", std::string("0:6:") + kind);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(model(out), m5);
    EXPECT_EQ(optimizer(out), o5);
    const std::vector<std::string> skips = records(out, "skipped_update");
    ASSERT_EQ(skips.size(), 1u);
    EXPECT_NE(skips[0].find("\"step\":6"), std::string::npos) << skips[0];
    EXPECT_NE(skips[0].find(std::string(kind) == "nan_loss" ? "loss nan" : "grad_norm nan"), std::string::npos)
        << skips[0];
    ASSERT_EQ(train(out, "--set train.nonfinite=skip --resume").code, 0);  // and goes on normally
  }
}

TEST_F(Recovery, RollbackReplaysFromTheLastCheckpointAndEqualsSkipping) {
  // the same fault under "skip" and under "rollback": going back to the step-4 checkpoint and
  // replaying steps 5-6 without step 7's batch gives the skip run's weights, bitwise
  ASSERT_NO_FATAL_FAILURE(expect_rollback_equals_skip("skip", "rollback", "", "0:7:nan_loss", 4));
  EXPECT_EQ(optimizer("rollback"), optimizer("skip"));
  const std::string back = records("rollback", "rollback_from").at(0);
  EXPECT_NE(back.find("\"rollback_from\":7"), std::string::npos) << back;
  // the skip leaves its record in the replay, and the loss curve has each step once
  EXPECT_EQ(records("rollback", "skipped_update").size(), 1u);
  EXPECT_EQ(records("rollback", "loss").size(), 12u);
  // the step marked for skipping travels in the checkpoint: a run resumed past it keeps it
  EXPECT_NE(slurp(dir_ / "rollback/checkpoint/state.json").find("rolled_back"), std::string::npos);
}

TEST_F(Recovery, RollbackUnderDataParallelZero3MatchesOneProcessSkipping) {
  if (!test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun";
  // the fault on rank 1 only: its NaN makes the global loss NaN, so both ranks roll back together
  const CmdResult one = train("one", "--set train.nonfinite=skip --set run.threads=1", "0:7:nan_loss");
  ASSERT_EQ(one.code, 0) << one.err;
  const CmdResult dp = train("dp",
                             "--set train.nonfinite=rollback --set run.threads=1 --set parallel.dp=2 --set "
                             "train.batch_size=2 --set parallel.zero=3",
                             "1:7:nan_loss", 2);
  ASSERT_EQ(dp.code, 0) << dp.err;
  EXPECT_EQ(records("dp", "rollback_from").size(), 1u);
  const test_support::Curve a = test_support::read_curve(dir_ / "one/metrics.jsonl"),
                            b = test_support::read_curve(dir_ / "dp/metrics.jsonl");
  EXPECT_EQ(a.loss.count(7), 0u);  // the skipped step logs no number
  test_support::expect_close(b.loss, a.loss, "loss", 1e-5);
  test_support::expect_close(b.val_loss, a.val_loss, "val_loss", 1e-5);
}

TEST_F(Recovery, AStoppedRankEndsTheJobNamingIt) {
  if (!test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun";
  // rank 1 stops (SIGSTOP) in step 3; rank 0 waits in the step's allreduce until the watchdog
  // ends the job, within parallel.timeout_s + the watchdog's 3 s for answers + the launcher's kill
  const std::string out = "hang_" + std::to_string(::getpid());
  const CmdResult r = train(out,
                            "--set run.threads=1 --set parallel.dp=2 --set train.batch_size=2 --set "
                            "parallel.timeout_s=3",
                            "1:3:stop", 2, /*limit_s=*/90);
  std::system(("pkill -KILL -f 'run.out_dir=" + out + "' >/dev/null 2>&1").c_str());  // never leave it stopped
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.code, 124) << "the job hung until the test's time limit\n" << r.err;
  EXPECT_NE(r.err.find("brigade: error: [rank 0 of 2] parallel.timeout_s = 3: allreduce over 2 ranks has not "
                       "completed after"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("not arrived: rank 1 (does not answer: stopped, hung or gone)"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 45.0) << r.err;  // a liveness bound with room for a loaded machine, not a speed target
}

TEST_F(Recovery, RollbackBeforeThePeriodicCheckpointGoesBackToStepZero) {
  expect_rollback_equals_skip("skip0", "rb0", " --set train.checkpoint_every=0", "0:3:nan_grad", 0);
}

TEST_F(Recovery, TooManySkipsInARowStop) {
  std::string faults;
  for (int s = 2; s <= 12; ++s)
    faults += (faults.empty() ? "" : ",") + std::string("0:") + std::to_string(s) + ":nan_loss";
  const CmdResult r = train("many", "--set train.nonfinite=skip", faults);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("11 steps in a row skipped up to step 12"), std::string::npos) << r.err;
}

TEST_F(Recovery, SpikeDetectionSkipsAnOutlierLoss) {
  // a loss 1000x the others at step 9, with a 4-step window: z is far above 5
  const std::string spike = "--set train.spike_zscore=5 --set train.spike_window=4";
  const CmdResult r = train("spike", spike, "0:9:big_loss");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> skips = records("spike", "skipped_update");
  ASSERT_EQ(skips.size(), 1u);
  EXPECT_NE(skips[0].find("\"step\":9"), std::string::npos) << skips[0];
  EXPECT_NE(skips[0].find("loss spike"), std::string::npos) << skips[0];
  // without the outlier nothing is skipped, and the detector's state survives a resume bitwise
  ASSERT_EQ(train("calm", spike + " --stop-at 6").code, 0);
  ASSERT_EQ(train("calm", spike + " --resume").code, 0);
  ASSERT_EQ(train("calm_whole", spike).code, 0);
  EXPECT_TRUE(records("calm", "skipped_update").empty());
  EXPECT_EQ(model("calm"), model("calm_whole"));
  EXPECT_NE(slurp(dir_ / "calm/checkpoint/state.json").find("grad_norms"), std::string::npos);
}

TEST_F(Recovery, MaxRestartsSurvivesKillsAndEndsWithTheUninterruptedWeights) {
  ASSERT_EQ(train("whole", "").code, 0);
  // killed at steps 3 (before any checkpoint), 6 and 11, one kill per process
  const CmdResult r = train("killed", "--max-restarts 3", "0:3:kill@0,0:6:kill@1,0:11:kill@2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count(r.err, "killed by signal 9"), 3) << r.err;
  EXPECT_EQ(count(r.err, "from the start (no checkpoint yet)"), 1) << r.err;
  EXPECT_EQ(count(r.err, "from the checkpoint in"), 2) << r.err;
  EXPECT_EQ(model("killed"), model("whole"));
  EXPECT_EQ(optimizer("killed"), optimizer("whole"));
}

TEST_F(Recovery, MaxRestartsGivesUpOnARepeatingCrash) {
  const CmdResult r = train("again", "--max-restarts 2", "0:5:kill");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(count(r.err, "killed by signal 9"), 3) << r.err;
  EXPECT_NE(r.err.find("brigade: error: the training process was killed by signal 9 (Killed) after 2 restarts"),
            std::string::npos)
      << r.err;
}

TEST_F(Recovery, MaxRestartsDoesNotResumeAnOlderRunsCheckpoint) {
  // an older run with another seed left its checkpoint in the same folder; this run dies before
  // writing its own, so the restart must start afresh, not continue the older run
  ASSERT_EQ(train("shared", "--set run.seed=99").code, 0);
  ASSERT_EQ(train("whole", "").code, 0);
  const CmdResult r = train("shared", "--max-restarts 1", "0:2:kill@0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("from the start (no checkpoint yet)"), std::string::npos) << r.err;
  EXPECT_EQ(model("shared"), model("whole"));
}

TEST_F(Recovery, ResumeIfAnyStartsOrResumes) {
  ASSERT_EQ(train("auto", "--resume-if-any --stop-at 4").code, 0);  // nothing there: starts
  const CmdResult r = train("auto", "--resume-if-any");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(train("whole", "").code, 0);
  EXPECT_EQ(model("auto"), model("whole"));
  const CmdResult both = train("auto", "--resume-if-any --resume");
  EXPECT_EQ(both.code, 1);
  EXPECT_NE(both.err.find("--resume-if-any and --resume"), std::string::npos) << both.err;
}

}  // namespace
