// End-to-end model parallelism: the `brigade` binary under mpirun, tensor parallel (tp),
// pipeline parallel (pp) under every schedule, and the 3D mixes, against one process on
// the same tiny corpus. The model is chosen to be awkward: vocabulary 127 (not divisible
// by tp = 2: the vocabulary is padded and the padding masked out of the loss) and 5 blocks
// (not divisible by pp = 2, nor by the 4 stages of interleaving). Checked:
//  - every mix gives the one-process losses and val losses for 10 steps within 1e-5
//    relative (fp32; the global batch is the same 8 rows);
//  - the executor's in-flight count and the memory tags: GPipe holds all m micro-batches'
//    activations, 1F1B at most p (rank r: p - r);
//  - the measured bubble is reported beside the simulator's prediction, with a timeline;
//  - a model-parallel checkpoint resumes on the same mesh as an uninterrupted run, and its
//    model.safetensors is the whole model (one process evaluates it to the same val loss);
//  - a mesh that does not match the job is one clear error line.
// Runs are tiny (a few seconds each); every command is wrapped in `timeout`.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/recipes.h"

namespace fs = std::filesystem;

namespace {

using brigade::test_support::CmdResult;
using brigade::test_support::kMpirun;
using brigade::test_support::per_step;
using brigade::test_support::slurp;

// Vocabulary 127, 5 blocks of 4 heads (seed 11), 10 steps of 8 rows, an evaluation every 5 steps.
const std::string kRecipe = brigade::test_support::tiny_gpt_recipe(
    {"run.name=\"tiny-mp\"", "run.seed=11", "model.vocab_size=127", "model.n_layer=5", "model.n_head=4",
     "train.steps=10", "train.eval_every=5", "schedule.warmup_steps=3", "sample.prompt=\"And the king\"",
     "sample.tokens=8"});

struct Curve {
  std::map<int64_t, double> loss, val_loss;
};

class MpTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = brigade::test_support::write_tiny_run(brigade::test_support::fresh_test_dir("brigade_mp"), kRecipe);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  static bool have_mpirun() { return brigade::test_support::have_mpirun(kMpirun); }

  // `brigade <cmd> tiny.toml <args>` under mpirun -np np, or as one plain process (np == 0).
  CmdResult run(int np, const std::string& args, const std::string& env = "", int limit = 180,
                const std::string& cmd_name = "train tiny.toml") {
    return brigade::test_support::run_brigade(dir_, cmd_name + " " + args, np, kMpirun,
                                              np > 0 ? env : "OMP_NUM_THREADS=1 " + env, limit);
  }
  Curve train_ok(int np, const std::string& out_dir, const std::string& settings) {
    std::string args = "--quiet --no-sample --set run.out_dir=" + out_dir;
    std::istringstream s(settings);
    for (std::string kv; s >> kv;) args += " --set " + kv;
    CmdResult r = run(np, args);
    EXPECT_EQ(r.code, 0) << "np " << np << " " << settings << "\n" << r.err;
    return curve(out_dir);
  }
  Curve curve(const std::string& out_dir) {
    const fs::path m = dir_ / out_dir / "metrics.jsonl";
    return {per_step(m, "loss"), per_step(m, "val_loss")};
  }
  nlohmann::json json_file(const std::string& rel) { return brigade::test_support::json_file(dir_ / rel); }

  fs::path dir_;
};

// The last line of a command's output that is a JSON object.
nlohmann::json last_json(const std::string& out) {
  std::istringstream in(out);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') last = line;
  return nlohmann::json::parse(last.empty() ? "{}" : last);
}

void expect_same_curve(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want,
                       const std::string& what, double tol = 1e-5, bool same_steps = true) {
  ASSERT_FALSE(want.empty()) << what;
  for (const auto& [step, w] : want) {
    auto it = got.find(step);
    if (it == got.end()) {
      ADD_FAILURE() << what << ": no record for step " << step;
      continue;
    }
    EXPECT_LE(std::abs(it->second - w), tol * std::abs(w))
        << what << " step " << step << ": " << it->second << " vs " << w;
  }
  if (same_steps) {
    EXPECT_EQ(got.size(), want.size()) << what;
  }
}

TEST_F(MpTrain, EveryScheduleAnd3DMixMatchesOneProcess) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const Curve ref = train_ok(0, "ref", "");
  ASSERT_EQ(ref.loss.size(), 10u);
  ASSERT_EQ(ref.val_loss.size(), 2u);
  ASSERT_LT(ref.loss.at(10), ref.loss.at(1) - 0.3);  // it learns: the curves are not flat
  struct Run {
    int np;
    std::string settings;
  };
  const std::string tp2pp2 = "parallel.tp=2 parallel.pp=2 parallel.microbatches=4 ";
  const std::vector<Run> runs = {
      {2, "parallel.tp=2"},
      {4, tp2pp2 + "parallel.schedule=gpipe"},
      {4, tp2pp2 + "parallel.schedule=1f1b"},
      {4, tp2pp2 + "parallel.schedule=interleaved parallel.virtual_stages=2"},
      {4, tp2pp2 + "parallel.schedule=zb-h1"},
      {4, tp2pp2 + "parallel.schedule=dynamic parallel.virtual_stages=2"},
      {4, "parallel.dp=2 parallel.pp=2 parallel.microbatches=2 parallel.zero=1 train.batch_size=4"},
      {4, "parallel.dp=2 parallel.tp=2 parallel.zero=1 train.batch_size=4"},
      {4, "parallel.pp=4 parallel.microbatches=4 parallel.schedule=zb-h1"},
      {2, "parallel.pp=2 parallel.microbatches=8 parallel.stage_layers=1,4 train.batch_size=8"},
  };
  int k = 0;
  for (const Run& run : runs) {
    const std::string what = "np " + std::to_string(run.np) + " " + run.settings;
    SCOPED_TRACE(what);
    const Curve c = train_ok(run.np, "run" + std::to_string(k++), run.settings);
    expect_same_curve(c.loss, ref.loss, what + " loss");
    expect_same_curve(c.val_loss, ref.val_loss, what + " val_loss");
  }
}

TEST_F(MpTrain, InFlightActivationsFollowTheSchedule) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  // pp = 2, m = 8 micro-batches of 1 row: GPipe runs every forward before any backward,
  // so each rank holds 8 micro-batches' activations; 1F1B holds p - r (2 on rank 0, 1 on rank 1).
  std::map<std::string, nlohmann::json> pipe, mem;
  for (const std::string sched : {"gpipe", "1f1b", "zb-h1"}) {
    SCOPED_TRACE(sched);
    train_ok(2, sched, "parallel.pp=2 parallel.microbatches=8 parallel.schedule=" + sched);
    pipe[sched] = json_file(sched + "/pipeline.json");
    mem[sched] = json_file(sched + "/memory.json");
  }
  EXPECT_EQ(pipe["gpipe"]["peak_in_flight"], nlohmann::json::array({8, 8}));
  EXPECT_EQ(pipe["1f1b"]["peak_in_flight"], nlohmann::json::array({2, 1}));
  // ZB-H1 keeps 1F1B's peak, p (the last rank's deferred weight gradients fill its 1F1B slack)
  for (int r = 0; r < 2; ++r) EXPECT_LE(pipe["zb-h1"]["peak_in_flight"][r].get<int>(), 2);
  // The memory tags show it: rank 0's activation peak under GPipe is several times 1F1B's
  // (8 micro-batches against 2, plus what both hold besides: the batch, the loss, gradients in flight).
  const double g = mem["gpipe"]["ranks"][0]["peak"]["activations"].get<double>();
  const double o = mem["1f1b"]["ranks"][0]["peak"]["activations"].get<double>();
  EXPECT_GT(g, 2.5 * o) << "gpipe " << g << " vs 1f1b " << o;
}

// `--dry-run` of a tp / pp recipe under mpirun measures one step on every rank: each category's
// peak is what the real run's memory.json measured on that rank (10 steps, two evaluations and the
// final checkpoint's gather); on one process it is the data-parallel prediction, which says so.
TEST_F(MpTrain, DryRunOfAMeshIsEveryRanksMeasuredPeaks) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  for (const std::string settings : {"parallel.tp=2", "parallel.pp=2 parallel.microbatches=4 parallel.schedule=1f1b"}) {
    SCOPED_TRACE(settings);
    std::string sets;
    std::istringstream in(settings);
    for (std::string kv; in >> kv;) sets += " --set " + kv;
    const std::string out = settings.substr(9, 4);
    train_ok(2, out, settings);
    const nlohmann::json real = json_file(out + "/memory.json");
    const CmdResult d = run(2, "--dry-run --json" + sets);
    ASSERT_EQ(d.code, 0) << d.err;
    const nlohmann::json dry = last_json(d.out);
    EXPECT_TRUE(dry.at("measured").get<bool>());
    ASSERT_EQ(dry.at("ranks").size(), 2u) << dry.dump();
    ASSERT_EQ(real.at("ranks").size(), 2u) << real.dump();
    for (size_t k = 0; k < 2; ++k)
      for (const auto& [cat, v] : real["ranks"][k]["peak"].items())
        EXPECT_EQ(dry["ranks"][k]["peak"][cat].get<int64_t>(), v.get<int64_t>()) << "rank " << k << " " << cat;
    if (settings.find("pp") != std::string::npos) {  // rank 0 gathers the other stage's parameters
      EXPECT_GT(real["ranks"][0]["peak"]["other"].get<int64_t>(), 0) << "the checkpoint's gather is measured";
    }
  }
  const CmdResult one = run(0, "--dry-run --json --set parallel.tp=2");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("models data parallelism only"), std::string::npos) << one.out;
  const CmdResult three = run(2, "--dry-run --set parallel.tp=2 --set parallel.pp=2");
  EXPECT_NE(three.code, 0);
  EXPECT_NE(three.err.find("dp x tp x pp = 1 x 2 x 2"), std::string::npos) << three.err;
}

// `brigade calibrate --ranks 2` measures the mesh points (tp 2; pp 2 under GPipe at two micro-batch
// counts and half the rows, and 1F1B), and `plan --predict` derives any tp 2 or pp 2 plan's memory
// from them: against the measured dry run of the same plan (an independent measurement), every
// category of the busiest rank within 2%, for micro-batch counts and row counts not calibrated.
TEST_F(MpTrain, PlannedMeshMemoryIsTheMeasuredDryRunsBusiestRank) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const CmdResult cal = brigade::test_support::run_brigade(
      dir_,
      "calibrate tiny.toml --ranks 1,2 --levels O0 --recompute none --rows 4,8 --steps 1 --warmup 0 --out cal.json", 0,
      "", brigade::test_support::kMpiEnv, 600);
  ASSERT_EQ(cal.code, 0) << cal.err;
  const nlohmann::json c = json_file("cal.json");
  ASSERT_EQ(c.at("mesh").size(), 5u) << c["mesh"].dump();
  for (const std::string plan :
       {"parallel.tp=2 train.batch_size=4 train.accumulation=2",
        "parallel.pp=2 parallel.microbatches=8 parallel.schedule=1f1b",
        "parallel.pp=2 parallel.microbatches=2 parallel.schedule=1f1b train.batch_size=4 train.accumulation=2",
        "parallel.pp=2 parallel.microbatches=8 parallel.schedule=gpipe"}) {
    SCOPED_TRACE(plan);
    std::string sets = " --set run.threads=1";
    std::istringstream in(plan);
    for (std::string kv; in >> kv;) sets += " --set " + kv;
    const CmdResult pr = run(0, "--predict --json --calibration cal.json" + sets, "", 180, "plan tiny.toml");
    ASSERT_EQ(pr.code, 0) << pr.err;
    const nlohmann::json p = last_json(pr.out);
    EXPECT_FALSE(p.value("memory_approximate", true)) << p.dump();
    const CmdResult d = run(2, "--dry-run --json" + sets);
    ASSERT_EQ(d.code, 0) << d.err;
    const nlohmann::json dry = last_json(d.out);
    const nlohmann::json* busiest = &dry["ranks"][0];
    for (const auto& k : dry["ranks"])
      if (k["peak_total"].get<int64_t>() > (*busiest)["peak_total"].get<int64_t>()) busiest = &k;
    for (const auto& [cat, v] : (*busiest)["peak"].items()) {
      const double want = v.get<double>(), got = p["peak_bytes"][cat].get<double>();
      EXPECT_LE(std::abs(got - want), 0.02 * want + 64 * 1024) << cat << ": predicted " << got << ", measured " << want;
    }
    const double want = (*busiest)["peak_total"].get<double>(), got = p["peak_bytes"]["total"].get<double>();
    EXPECT_LE(std::abs(got - want), 0.02 * want) << "total: predicted " << got << ", measured " << want;
  }
}

TEST_F(MpTrain, ReportsMeasuredBubbleBesidePredictionWithTimeline) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const CmdResult r = run(2, "--no-sample --set run.out_dir=bubble --set parallel.pp=2 --set parallel.microbatches=4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("pipeline: bubble measured"), std::string::npos) << r.err;
  const nlohmann::json pj = json_file("bubble/pipeline.json");
  const double measured = pj.at("measured_bubble"), predicted = pj.at("predicted_bubble");
  EXPECT_TRUE(std::isfinite(measured) && measured > 0.0) << measured;
  // >= 0, not > 0: the simulated bubble is exactly 0 when the slower stage never waits (one rank
  // descheduled on a loaded machine measures its stage many times the other's; see
  // PipeSchedule.OneFOneBWithOneSlowStageHasNoBubble)
  EXPECT_TRUE(std::isfinite(predicted) && predicted >= 0.0) << predicted;
  const std::string svg = slurp(dir_ / "bubble/pipeline.svg");
  // one box per compute action: 2 ranks x 4 micro-batches x (F + B)
  size_t boxes = 0;
  for (size_t at = 0; (at = svg.find("<rect", at)) != std::string::npos; ++at) ++boxes;
  EXPECT_GE(boxes, 16u) << svg.substr(0, 400);
}

TEST_F(MpTrain, ResumesOnTheSameMeshAndSavesTheWholeModel) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const std::string mesh = "parallel.tp=2 parallel.pp=2 parallel.microbatches=2 parallel.schedule=1f1b";
  const std::string sets =
      " --set parallel.tp=2 --set parallel.pp=2 --set parallel.microbatches=2 --set parallel.schedule=1f1b";
  const Curve whole = train_ok(4, "whole", mesh);
  ASSERT_EQ(run(4, "--quiet --no-sample --set run.out_dir=cut --stop-at 4" + sets).code, 0);
  const CmdResult resumed = run(4, "--quiet --no-sample --set run.out_dir=cut --resume" + sets);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const Curve cut = curve("cut");
  expect_same_curve(cut.loss, whole.loss, "resumed loss", 1e-6);
  // (the cut run also evaluated at its --stop-at step 4)
  expect_same_curve(cut.val_loss, whole.val_loss, "resumed val_loss", 1e-6, /*same_steps=*/false);
  // The checkpoint is the whole model: one process continues from its weights with a fresh optimizer
  // (a different mesh cannot take the per-rank optimizer state: that is a clear error instead).
  const CmdResult other = run(2,
                              "--quiet --no-sample --resume --set run.out_dir=whole --set train.steps=12 "
                              "--set parallel.tp=2");
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.err.find("same mesh"), std::string::npos) << other.err;
  const CmdResult gen = run(0, "--ckpt whole/checkpoint --tokens 5 --prompt And", "", 60, "generate");
  EXPECT_EQ(gen.code, 0) << gen.err;
}

TEST_F(MpTrain, MeshMismatchIsAClearError) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const CmdResult r = run(2, "--quiet --no-sample --set parallel.tp=2 --set parallel.pp=2", "", 60);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("mpirun -np 4"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
}

}  // namespace
