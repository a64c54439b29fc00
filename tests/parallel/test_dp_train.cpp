// End-to-end data parallelism: the `brigade` binary under mpirun on the tiny corpus
// and model of tests/cli (2 layers, 32 dims, vocab 128), against one process that
// sees the same global batch of 8 rows:
//  - every dp size / ZeRO stage / allreduce algorithm / accumulation split gives the
//    same loss and val loss per step (1e-5 relative; measured agreement is ~6e-8);
//  - a ZeRO checkpoint resumes at another dp size and split, continuing the
//    uninterrupted curve;
//  - the ring allreduce sends 2 (P-1)/P x the gradient bytes per step;
//  - ZeRO 1/2/3 halve the optimizer state / gradients / parameters of each of 2 ranks;
//  - a rank that fails ends the whole job quickly, and a dp that does not match the
//    number of processes is one clear error line.
// Runs are tiny (a few seconds each); every command is wrapped in `timeout` so a hang
// fails the test instead of stalling it. Tests that need mpirun skip without it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/recipes.h"

namespace fs = std::filesystem;

namespace {

using brigade::test_support::CmdResult;
using brigade::test_support::json_file;
using brigade::test_support::kMpirun;
using brigade::test_support::per_step;

// tests/cli's tiny recipe, one thread per process, 20 steps, evaluation at 10 and 20;
// batch_size 8 is the single-process reference (the global batch of every run here).
const std::string kRecipe =
    brigade::test_support::tiny_gpt_recipe({"train.steps=20", "train.eval_every=10", "schedule.warmup_steps=4",
                                            "sample.prompt=\"And the king\"", "sample.tokens=12"});

constexpr int64_t kVocab = 128, kBlock = 32, kLayers = 2, kEmbd = 32;

// Per-step records of metrics.jsonl.
struct Curve {
  std::map<int64_t, double> loss, val_loss;
  std::map<int64_t, int64_t> bytes_sent;
};

// Elements of the flat gradient of the tiny GPT: every parameter starts on a 16-float
// (64-byte) boundary of the flat layout (data_parallel.h), so each one counts rounded
// up to a multiple of 16 floats. Shapes (Hugging Face GPT-2, tied head): wte (V, C),
// wpe (block, C); per layer ln_1 and ln_2 (C) weight + bias, attn.c_attn (C, 3C) + (3C),
// attn.c_proj (C, C) + (C), mlp.c_fc (C, 4C) + (4C), mlp.c_proj (4C, C) + (C); ln_f (C) x 2.
int64_t tiny_flat_floats() {
  auto r16 = [](int64_t n) { return (n + 15) / 16 * 16; };
  const int64_t C = kEmbd;
  const int64_t per_layer = 4 * r16(C)                     // ln_1, ln_2
                            + r16(C * 3 * C) + r16(3 * C)  // c_attn
                            + r16(C * C) + r16(C)          // attn.c_proj
                            + r16(C * 4 * C) + r16(4 * C)  // c_fc
                            + r16(4 * C * C) + r16(C);     // mlp.c_proj
  return r16(kVocab * C) + r16(kBlock * C) + kLayers * per_layer + 2 * r16(C);
}

class DpTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = brigade::test_support::write_tiny_run(brigade::test_support::fresh_test_dir("brigade_dp"), kRecipe);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);  // kept for inspection when a test fails
  }

  static bool have_mpirun() { return brigade::test_support::have_mpirun(kMpirun); }

  // `brigade train tiny.toml <args>` in the test dir: under mpirun with np processes, or
  // directly when np == 0 (without launcher variables, so it is surely one process).
  // `env` is prepended to the command's environment; `limit` is the hard time limit.
  CmdResult train(int np, const std::string& args, const std::string& env = "", int limit = 120) {
    return brigade::test_support::run_brigade(dir_, "train tiny.toml " + args, np, kMpirun,
                                              np > 0 ? env : "OMP_NUM_THREADS=1 " + env, limit);
  }
  // A run that must succeed; returns its curve.
  Curve train_ok(int np, const std::string& out_dir, const std::string& args) {
    CmdResult r = train(np, "--quiet --no-sample --set run.out_dir=" + out_dir + " " + args);
    EXPECT_EQ(r.code, 0) << "np " << np << " " << args << "\n" << r.err;
    return curve(out_dir);
  }
  Curve curve(const std::string& out_dir) {
    const fs::path m = dir_ / out_dir / "metrics.jsonl";
    return {per_step(m, "loss"), per_step(m, "val_loss"), per_step<int64_t>(m, "bytes_sent")};
  }
  nlohmann::json memory(const std::string& out_dir) { return json_file(dir_ / out_dir / "memory.json"); }

  fs::path dir_;
};

// `got` has exactly the steps of `want` up to `last_step`, each within `tol` relative.
void expect_same_curve(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want,
                       const std::string& what, int64_t last_step = 1 << 30, double tol = 1e-5) {
  size_t compared = 0;
  for (const auto& [step, w] : want) {
    if (step > last_step) break;
    auto it = got.find(step);
    if (it == got.end()) {
      ADD_FAILURE() << what << ": no record for step " << step;
      continue;
    }
    ++compared;
    EXPECT_LE(std::abs(it->second - w), tol * std::abs(w))
        << what << " step " << step << ": " << it->second << " vs " << w;
  }
  EXPECT_GT(compared, 0u) << what;
  for (const auto& [step, g] : got)
    EXPECT_TRUE(step <= last_step && want.count(step)) << what << ": unexpected record for step " << step;
}

TEST_F(DpTrain, DpMatchesSingleProcess) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const Curve ref = train_ok(0, "ref", "");  // one process, batch 8
  ASSERT_EQ(ref.loss.size(), 20u);
  ASSERT_EQ(ref.val_loss.size(), 2u);                // steps 10 and 20
  ASSERT_LT(ref.loss.at(20), ref.loss.at(1) - 0.5);  // it learns, so the curves are not flat

  struct Run {
    int np;
    std::string settings;
  };
  const std::vector<Run> runs = {
      {2, "train.batch_size=4 parallel.zero=0 parallel.allreduce=mpi"},
      {2, "train.batch_size=4 parallel.zero=1 parallel.allreduce=ring"},
      {2, "train.batch_size=4 parallel.zero=2 parallel.allreduce=tree"},
      {2, "train.batch_size=4 parallel.zero=3 parallel.allreduce=mpi"},
      {4, "train.batch_size=2 parallel.zero=0 parallel.allreduce=ring"},
      {4, "train.batch_size=2 parallel.zero=1 parallel.allreduce=tree"},
      {4, "train.batch_size=2 parallel.zero=2 parallel.allreduce=mpi"},
      {4, "train.batch_size=2 parallel.zero=3 parallel.allreduce=ring"},
      {2, "train.batch_size=2 train.accumulation=2 parallel.zero=0"},
      {2, "train.batch_size=2 train.accumulation=2 parallel.zero=3"},
      {2, "train.batch_size=4 parallel.zero=2 parallel.allreduce=ring parallel.overlap=false"},
  };
  int k = 0;
  for (const Run& run : runs) {
    std::string args = "--set parallel.dp=" + std::to_string(run.np);
    std::istringstream s(run.settings);
    for (std::string kv; s >> kv;) args += " --set " + kv;
    const std::string what = "dp " + std::to_string(run.np) + " " + run.settings;
    SCOPED_TRACE(what);
    const Curve c = train_ok(run.np, "run" + std::to_string(k++), args);
    expect_same_curve(c.loss, ref.loss, what + " loss");
    expect_same_curve(c.val_loss, ref.val_loss, what + " val_loss");
  }
}

TEST_F(DpTrain, LlamaUnderZeroMatchesOneProcess) {
  // model.type = "llama": its decoder layers run the plans' forward hooks, so ZeRO-3 gathers
  // and releases them one at a time as it does GPT's blocks.
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const std::string llama = "--set model.type=llama --set model.n_kv_head=1 ";
  const Curve ref = train_ok(0, "ref", llama);
  ASSERT_EQ(ref.loss.size(), 20u);
  for (const char* zero : {"1", "3"}) {
    SCOPED_TRACE(std::string("ZeRO-") + zero);
    const Curve c = train_ok(2, std::string("llama_zero") + zero,
                             llama + "--set parallel.dp=2 --set train.batch_size=4 --set parallel.zero=" + zero);
    expect_same_curve(c.loss, ref.loss, "loss");
    expect_same_curve(c.val_loss, ref.val_loss, "val_loss");
  }
}

TEST_F(DpTrain, MixedPrecisionMatchesOneProcessAndRanksAgreeOnSkips) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  // O2 fp16 with dynamic loss scaling, ZeRO-1/2/3. An Inf gradient is injected at step 3 on one rank
  // only (rank 1 of 2: under ZeRO-1 it sits in rank 1's shard, which rank 0 never sees).
  // The ranks max-reduce the overflow flag, so both skip step 3 and back off the scale, as
  // the one process with the same fault does; any rank that stepped anyway would leave its
  // shard ahead and the curves would part.
  const std::string amp = "--set precision.level=O2 --set precision.dtype=fp16 ";
  const CmdResult one = train(0, "--quiet --no-sample --set run.out_dir=ref " + amp, "BRIGADE_FAULT=0:3:inf_grad");
  ASSERT_EQ(one.code, 0) << one.err;
  const Curve ref = curve("ref");
  for (const char* zero : {"1", "2", "3"}) {
    SCOPED_TRACE(std::string("ZeRO-") + zero);
    const std::string out = std::string("dp_zero") + zero;
    const CmdResult r = train(2,
                              "--quiet --no-sample --set run.out_dir=" + out + " " + amp +
                                  "--set parallel.dp=2 --set train.batch_size=4 --set parallel.zero=" + zero,
                              "BRIGADE_FAULT=1:3:inf_grad");
    ASSERT_EQ(r.code, 0) << r.err;
    // Tolerance 1e-4, not fp32's 1e-5: the fp32 parts differ in summation order (~1e-7
    // relative), and an fp16 activation that lands on the other side of a rounding boundary
    // moves by one fp16 ulp (2^-11 = 4.9e-4 relative); the curves agree to 1e-5 for the first
    // ~17 steps and drift to ~2e-5 by step 20. A rank that stepped at step 3 while the other
    // skipped moves half the weights by one AdamW update: ~1e-2 in the loss.
    const Curve c = curve(out);
    expect_same_curve(c.loss, ref.loss, "loss", 1 << 30, 1e-4);
    expect_same_curve(c.val_loss, ref.val_loss, "val_loss", 1 << 30, 1e-4);
    std::ifstream f(dir_ / out / "metrics.jsonl");
    int64_t skipped_at = 0;
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("skipped") && j["skipped"].get<int64_t>() > 0) skipped_at = j["step"];
    }
    EXPECT_EQ(skipped_at, 3);
  }
}

TEST_F(DpTrain, ResumeAtAnotherDp) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const Curve ref = train_ok(0, "ref", "");
  ASSERT_EQ(ref.loss.size(), 20u);

  // First half: dp 2, ZeRO-2, stopped (and checkpointed) at step 10.
  const Curve first =
      train_ok(2, "split", "--stop-at 10 --set parallel.dp=2 --set train.batch_size=4 --set parallel.zero=2");
  ASSERT_EQ(first.loss.size(), 10u);
  expect_same_curve(first.loss, ref.loss, "first half loss", 10);
  expect_same_curve(first.val_loss, ref.val_loss, "first half val_loss", 10);
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_ / "split/checkpoint")) files.insert(e.path().filename().string());
  std::set<int> shard_ranks;
  const std::regex shard_re("optimizer-0*([0-9]+)-of-0*2\\.safetensors");
  for (const std::string& f : files) {
    std::smatch m;
    if (std::regex_match(f, m, shard_re)) shard_ranks.insert(std::stoi(m[1]));
  }
  EXPECT_EQ(shard_ranks, (std::set<int>{0, 1})) << "checkpoint files: " << ::testing::PrintToString(files);
  EXPECT_TRUE(files.count("optimizer.index.json")) << ::testing::PrintToString(files);
  EXPECT_FALSE(files.count("optimizer.safetensors")) << "unsharded optimizer state written under ZeRO-2";

  struct Resume {
    int np;  // 0: one process without mpirun
    std::string settings;
  };
  const std::vector<Resume> resumes = {
      {0, "parallel.dp=1 train.batch_size=8 parallel.zero=0"},
      {4, "parallel.dp=4 train.batch_size=2 parallel.zero=3"},
      {4, "parallel.dp=4 train.batch_size=1 train.accumulation=2 parallel.zero=1"},
  };
  int k = 0;
  for (const Resume& rs : resumes) {
    const std::string what = "resume at " + rs.settings;
    SCOPED_TRACE(what);
    const std::string out_dir = "resumed" + std::to_string(k);
    fs::copy(dir_ / "split", dir_ / out_dir, fs::copy_options::recursive);
    std::string args = "--no-sample --resume --set run.out_dir=" + out_dir;
    std::istringstream s(rs.settings);
    for (std::string kv; s >> kv;) args += " --set " + kv;
    if (k > 0) args += " --quiet";  // the first one prints, to check its message
    const CmdResult r = train(rs.np, args);
    ASSERT_EQ(r.code, 0) << r.err;
    if (k == 0) {
      EXPECT_NE(r.err.find("resuming with a different batch split"), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
    }
    const Curve c = curve(out_dir);
    expect_same_curve(c.loss, ref.loss, what + " loss");  // 1..10 kept from the first half, 11..20 resumed
    expect_same_curve(c.val_loss, ref.val_loss, what + " val_loss");
    ++k;
  }
}

TEST_F(DpTrain, BytesSentMatchesFormula) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  // ZeRO-0 with one bucket (the model is far below bucket_mb): one ring allreduce of the
  // whole flat gradient per step, G = 4 x tiny_flat_floats() bytes. In the ring each rank
  // sends P-1 chunks of G/P in the reduce-scatter and P-1 in the allgather: 2 (P-1)/P x G
  // (exact here: the flat size divides evenly by 2 and 4). The trainer's own messages
  // (loss, evaluation) travel on another group and are not counted.
  const int64_t G = 4 * tiny_flat_floats();
  ASSERT_EQ(G, 122368);  // 30592 floats: every tiny-model parameter is a multiple of 16 floats
  for (int P : {2, 4}) {
    SCOPED_TRACE("dp " + std::to_string(P));
    ASSERT_EQ(tiny_flat_floats() % P, 0);
    const int64_t want = 2 * (P - 1) * G / P;
    const Curve c =
        train_ok(P, "bytes" + std::to_string(P),
                 "--set train.steps=3 --set schedule.warmup_steps=1 --set parallel.dp=" + std::to_string(P) +
                     " --set train.batch_size=" + std::to_string(8 / P) +
                     " --set parallel.zero=0 --set parallel.allreduce=ring");
    ASSERT_EQ(c.bytes_sent.size(), 3u);
    for (const auto& [step, bytes] : c.bytes_sent) EXPECT_EQ(bytes, want) << "step " << step;
  }
}

TEST_F(DpTrain, MemoryShardsWithZero) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  // Live bytes per rank at the end of a run (ZeRO-3 releases the gathered units after
  // the final checkpoint; --no-sample keeps them released), dp 2, ZeRO 0..3.
  std::vector<nlohmann::json> ranks;  // per stage: memory.json "ranks"
  for (int zero = 0; zero <= 3; ++zero) {
    const std::string out_dir = "zero" + std::to_string(zero);
    train_ok(2, out_dir,
             "--set train.steps=2 --set schedule.warmup_steps=1 --set parallel.dp=2 --set train.batch_size=4 --set "
             "parallel.zero=" +
                 std::to_string(zero));
    const nlohmann::json m = memory(out_dir);
    ASSERT_TRUE(m.contains("ranks")) << m.dump();
    ASSERT_EQ(m["ranks"].size(), 2u) << m.dump();
    ranks.push_back(m.at("ranks"));
  }
  auto live = [&](int zero, int rank, const char* tag) -> int64_t {
    return ranks[size_t(zero)][size_t(rank)].at("live").at(tag);
  };
  // Slack. Flat params and grads (one buffer each): a rank's shard is S = round_up(G/2, 16)
  // floats, and the allocator rounds a block of 4 KiB..1 MiB up to 4 KiB (round_size in
  // src/brigade/core/allocator.cpp), so a shard may differ from half the full buffer by
  // < 4 KiB + 64 B. Optimizer state (AdamW: exp_avg, exp_avg_sq, one tensor per parameter
  // or shard piece): every whole tiny-model parameter has a size the allocator keeps exact
  // (128, 384, 512 B or 4, 12, 16 KiB), and the two ranks hold exactly half the flat space
  // each (G/2 is a multiple of 16 floats), so only the parameters cut by a shard boundary
  // (at most 2 per rank) round up, by < 4 KiB per state tensor: < 2 x 2 x 4 KiB.
  const int64_t buffer_slack = 4096 + 64, optimizer_slack = 2 * 2 * 4096;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int64_t params0 = live(0, r, "params"), grads0 = live(0, r, "grads"), opt0 = live(0, r, "optimizer");
    ASSERT_GE(params0, 4 * tiny_flat_floats());
    ASSERT_GE(grads0, 4 * tiny_flat_floats());
    ASSERT_GE(opt0, 2 * 4 * tiny_flat_floats());
    auto expect_half = [](int64_t got, int64_t full, int64_t slack, const std::string& what) {
      EXPECT_LE(std::abs(2 * got - full), 2 * slack) << what << ": " << got << " bytes vs unsharded " << full;
      EXPECT_LT(got, full * 3 / 4) << what << " is not sharded: " << got << " bytes vs unsharded " << full;
    };
    for (int zero = 1; zero <= 3; ++zero) {
      SCOPED_TRACE("ZeRO-" + std::to_string(zero));
      expect_half(live(zero, r, "optimizer"), opt0, optimizer_slack, "optimizer state");
      if (zero >= 2)
        expect_half(live(zero, r, "grads"), grads0, buffer_slack, "gradients");
      else
        EXPECT_EQ(live(zero, r, "grads"), grads0) << "ZeRO-1 keeps the full gradient buffer";
      if (zero == 3)
        expect_half(live(zero, r, "params"), params0, buffer_slack, "parameters");
      else
        EXPECT_EQ(live(zero, r, "params"), params0) << "ZeRO-1/2 keep the full parameters";
    }
  }
}

TEST_F(DpTrain, FailingRankEndsTheJob) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  // The hard limit (90 s) is above the 60 s the test allows, so a hang shows as a failure.
  const std::string args = "--quiet --no-sample --set parallel.dp=2 --set train.batch_size=4";
  const CmdResult raised = train(2, args, "BRIGADE_FAULT=1:3:raise", 90);
  EXPECT_NE(raised.code, 0) << raised.err;
  EXPECT_LT(raised.seconds, 60.0);
  EXPECT_NE(raised.err.find("[rank 1 of 2]"), std::string::npos) << raised.err;
  EXPECT_NE(raised.err.find("injected fault"), std::string::npos) << raised.err;

  const CmdResult killed = train(2, args, "BRIGADE_FAULT=1:3:kill", 90);
  EXPECT_NE(killed.code, 0) << killed.err;
  EXPECT_NE(killed.code, 124) << "timed out: " << killed.err;
  EXPECT_LT(killed.seconds, 60.0);
}

TEST_F(DpTrain, DpMismatchIsAClearError) {
  // No launcher: one process, but the recipe asks for two.
  const CmdResult r = train(0, "--quiet --no-sample --set parallel.dp=2", "", 60);
  EXPECT_EQ(r.code, 1) << r.err;
  std::istringstream s(r.err);
  std::vector<std::string> errors;
  for (std::string line; std::getline(s, line);)
    if (line.rfind("brigade: error:", 0) == 0) errors.push_back(line);
  ASSERT_EQ(errors.size(), 1u) << r.err;
  EXPECT_NE(errors[0].find("mpirun -np 2"), std::string::npos) << errors[0];
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
}

}  // namespace
