// `brigade calibrate`, `brigade plan` and `brigade train --plan auto` end to end on the tiny GPT,
// one process: the calibration file's contents, the plan listing's JSON, --predict against the
// dry run's memory model (GPT's formulas, an independent source: the plan's memory comes from
// the calibration's measured dry step), --apply, and the errors for a calibration of another
// model and a cluster no plan fits.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/recipes.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

class PlanCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // one folder for the suite (fresh_test_dir names it after a test; none runs yet)
    const fs::path d = fs::temp_directory_path() / ("brigade_plan_cli_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    dir_ = new fs::path(test_support::write_tiny_run(d, test_support::tiny_gpt_recipe({"run.threads=0"}), "tiny.toml"));
    // one process only (no mpirun here): O0 and O2, no recompute and full, 2 to 8 rows
    calibrate_ = new test_support::CmdResult(
        test_support::run_brigade(*dir_,
                                  "calibrate tiny.toml --ranks 1 --levels O0,O2 --recompute none,full --rows "
                                  "2,4,8 --steps 1 --warmup 1 --out cal.json"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete calibrate_;
  }
  static test_support::CmdResult brigade(const std::string& args) { return test_support::run_brigade(*dir_, args); }
  static std::vector<nlohmann::json> lines(const std::string& out) {
    std::vector<nlohmann::json> v;
    std::istringstream in(out);
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) v.push_back(nlohmann::json::parse(l));
    return v;
  }
  static fs::path* dir_;
  static test_support::CmdResult* calibrate_;
};
fs::path* PlanCli::dir_ = nullptr;
test_support::CmdResult* PlanCli::calibrate_ = nullptr;

TEST_F(PlanCli, CalibrateWritesEveryPointOfTheGrid) {
  ASSERT_EQ(calibrate_->code, 0) << calibrate_->err;
  const nlohmann::json c = test_support::json_file(*dir_ / "cal.json");
  EXPECT_EQ(c["format"], "brigade-calibration-1");
  EXPECT_EQ(c["compute"].size(), 2u * 2u * 3u);  // levels x recompute x rows
  for (const auto& p : c["compute"]) {
    EXPECT_EQ(p["ranks"], 1);
    EXPECT_GT(p["fwd_bwd_s"].get<double>(), 0.0);
    EXPECT_GT(p["act_peak"].get<int64_t>(), 0);
  }
  EXPECT_EQ(c["stages"].size(), 2u * 3u);  // levels x rows
  EXPECT_EQ(c["num_blocks"], 2);
  EXPECT_GT(c["gemm_peak_f32_gflops"].get<double>(), 0.0);
}

TEST_F(PlanCli, PredictedMemoryOfTheRecipeIsTheDryRunsFormulas) {
  ASSERT_EQ(calibrate_->code, 0) << calibrate_->err;
  for (const char* level : {"O0"}) {
    const std::string sets = std::string(" --set precision.level=") + level;
    const auto pred = brigade("plan tiny.toml --calibration cal.json --predict" + sets);
    ASSERT_EQ(pred.code, 0) << pred.err;
    const nlohmann::json p = nlohmann::json::parse(pred.out);
    ASSERT_TRUE(p["feasible"].get<bool>()) << p.dump();
    EXPECT_GT(p["items_per_s"].get<double>(), 0.0);
    const auto dry = brigade("train tiny.toml --dry-run --json" + sets);
    ASSERT_EQ(dry.code, 0) << dry.err;
    const nlohmann::json d = nlohmann::json::parse(dry.out)["ranks"][0]["peak"];
    for (const char* cat : {"params", "grads", "optimizer", "activations", "workspace", "other"})
      EXPECT_EQ(p["peak_bytes"][cat], d[cat]) << cat;
  }
}

TEST_F(PlanCli, ListsPlansBestFirstRejectsTheUncalibratedAndApplies) {
  ASSERT_EQ(calibrate_->code, 0) << calibrate_->err;
  const auto r = brigade("plan tiny.toml --calibration cal.json --json --apply best.toml");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ps = lines(r.out);
  ASSERT_GT(ps.size(), 4u);
  ASSERT_TRUE(ps[0]["feasible"].get<bool>());
  bool saw_uncalibrated = false;
  double last = 1e300;
  for (const auto& p : ps) {
    if (p["feasible"].get<bool>()) {
      EXPECT_LE(p["items_per_s"].get<double>(), last);
      last = p["items_per_s"].get<double>();
    } else if (p["ranks"].get<int>() == 2) {
      saw_uncalibrated |= p["reason"].get<std::string>().find("not calibrated for 2 ranks") != std::string::npos;
    }
  }
  EXPECT_TRUE(saw_uncalibrated) << "a 2-rank plan without a 2-rank calibration must be rejected as such";
  // the applied recipe is a whole recipe with the best plan's keys
  const auto dry = brigade("train best.toml --dry-run");
  EXPECT_EQ(dry.code, 0) << dry.err;
  std::ifstream in(*dir_ / "best.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  for (const auto& o : ps[0]["overrides"]) {
    const std::string kv = o.get<std::string>();
    const std::string key = kv.substr(kv.find('.') + 1, kv.find('=') - kv.find('.') - 1);
    EXPECT_NE(ss.str().find(key + " = "), std::string::npos) << key;
  }
}

TEST_F(PlanCli, RefusesAnotherModelsCalibrationAndSaysWhatNoPlanFits) {
  ASSERT_EQ(calibrate_->code, 0) << calibrate_->err;
  auto r = brigade("plan tiny.toml --calibration cal.json --set model.n_layer=3");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("model.n_layer: 2 (calibrated) vs 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("brigade calibrate"), std::string::npos) << r.err;
  std::ofstream(*dir_ / "small.toml") << "[cluster]\nname = \"tiny\"\nnodes = 1\nranks_per_node = 1\n"
                                         "cores_per_node = 2\nmemory_per_rank_gb = 0.0001\n"
                                         "[cluster.intra]\nlatency_us = 1\ngbps = 10\n";
  r = brigade("plan tiny.toml --calibration cal.json --cluster small.toml");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no plan of tiny.toml fits tiny"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the least memory any plan needs is"), std::string::npos) << r.err;
}

TEST_F(PlanCli, TrainPlanAutoTrainsWithTheBestPlan) {
  ASSERT_EQ(calibrate_->code, 0) << calibrate_->err;
  const auto best = lines(brigade("plan tiny.toml --calibration cal.json --json").out).at(0);
  const auto r = brigade("train tiny.toml --plan auto --calibration cal.json --quiet --no-sample --stop-at 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("plan: " + best["plan"].get<std::string>()), std::string::npos) << r.err;
  // the run's saved recipe has the plan's keys
  const auto mem = test_support::json_file(*dir_ / "run/memory.json");
  std::string level;
  for (const auto& o : best["overrides"])
    if (o.get<std::string>().rfind("precision.level=", 0) == 0) level = o.get<std::string>().substr(16);
  EXPECT_EQ(mem["precision"]["level"], level);
}

// A model too large to build is calibrated from models of 1 and 2 blocks at its width
// (--proxy-layers), every per-block quantity extrapolated. The independent source: the same
// model of 3 blocks calibrated whole. Structure and memory are exact (linear in the blocks);
// the times are measured, so they are only compared for being there.
TEST(PlanCliProxy, ProxiesOfOneAndTwoBlocksGiveTheWholeModelsStructureAndMemory) {
  const fs::path d = fs::temp_directory_path() / ("brigade_plan_proxy_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  test_support::write_tiny_run(
      d,
      test_support::tiny_gpt_recipe({"model.type=\"llama\"", "model.n_layer=3", "model.n_kv_head=1", "run.threads=0"}),
      "llama3.toml");
  const std::string grid = " --levels O0,O2 --recompute none,full --rows 2 --steps 1 --warmup 0";
  const auto whole = test_support::run_brigade(d, "calibrate llama3.toml --ranks 1 --out whole.json" + grid);
  ASSERT_EQ(whole.code, 0) << whole.err;
  const auto proxy = test_support::run_brigade(d, "calibrate llama3.toml --proxy-layers 1,2 --out proxy.json" + grid);
  ASSERT_EQ(proxy.code, 0) << proxy.err;
  const nlohmann::json w = test_support::json_file(d / "whole.json"), p = test_support::json_file(d / "proxy.json");
  EXPECT_EQ(p["proxy_layers"], nlohmann::json::array({1, 2}));
  for (const char* k : {"parameters", "num_blocks", "hidden_per_row", "items_per_row", "tp_plan", "has_stages"})
    EXPECT_EQ(p[k], w[k]) << k;
  EXPECT_NEAR(p["flops_per_item"].get<double>(), w["flops_per_item"].get<double>(),
              1e-9 * w["flops_per_item"].get<double>());
  // the units: as many, each of the same size (names of the extrapolated copies differ)
  for (const char* k : {"units", "units_zero3"}) {
    ASSERT_EQ(p[k].size(), w[k].size()) << k;
    for (size_t i = 0; i < w[k].size(); ++i) {
      int64_t a = 0, b = 0;
      for (const auto& pr : p[k][i]["params"]) a += pr[1].get<int64_t>();
      for (const auto& pr : w[k][i]["params"]) b += pr[1].get<int64_t>();
      EXPECT_EQ(a, b) << k << " " << i;
    }
  }
  ASSERT_EQ(p["compute"].size(), w["compute"].size());
  for (size_t i = 0; i < w["compute"].size(); ++i) {
    const auto &a = p["compute"][i], &b = w["compute"][i];
    EXPECT_EQ(a["level"], b["level"]);
    EXPECT_EQ(a["recompute"], b["recompute"]);
    for (const char* k : {"act_peak", "act_live", "params_work", "params_work_backward", "early_grads", "work_compute"})
      EXPECT_EQ(a[k], b[k]) << k << " at " << b["level"] << " " << b["recompute"];
    EXPECT_GT(a["fwd_bwd_s"].get<double>(), 0.0);
    EXPECT_GT(a["update_s"].get<double>(), 0.0);
  }
  EXPECT_FALSE(p["stages"].empty());
  // and so the planner predicts the same memory from either
  for (const char* level : {"O0", "O2"}) {
    const std::string args = std::string("plan llama3.toml --predict --set precision.level=") + level;
    const auto a = test_support::run_brigade(d, args + " --calibration proxy.json");
    const auto b = test_support::run_brigade(d, args + " --calibration whole.json");
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(nlohmann::json::parse(a.out)["peak_bytes"], nlohmann::json::parse(b.out)["peak_bytes"]) << level;
  }
  // bad proxies: named, with what to give
  const auto bad = test_support::run_brigade(d, "calibrate llama3.toml --proxy-layers 2,4" + grid);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("--proxy-layers 2,4: give two block counts A,B"), std::string::npos) << bad.err;
  const auto ranks = test_support::run_brigade(d, "calibrate llama3.toml --proxy-layers 1,2 --ranks 1,2" + grid);
  EXPECT_EQ(ranks.code, 1);
  EXPECT_NE(ranks.err.find("--proxy-layers measures one process"), std::string::npos) << ranks.err;
  fs::remove_all(d);
}

}  // namespace

// A launch of 2 ranks writes its points beside the calibration: into a folder that does not
// exist yet too (runs/ in a fresh checkout), as the 1-rank points do.
// An mpirun that cannot launch (here one that exits 3, as OpenMPI does for root without its
// two variables) stops the calibration before any point is measured, with the launcher's exit
// status (not the raw wait status) and what to do.
TEST(PlanCliRanks, ALaunchThatCannotStartFailsBeforeMeasuring) {
  const fs::path d = test_support::write_tiny_run(test_support::fresh_test_dir("brigade_plan_cli"),
                                                  test_support::tiny_gpt_recipe({"run.threads=0"}), "tiny.toml");
  fs::create_directories(d / "fakebin");
  std::ofstream(d / "fakebin/mpirun") << "#!/bin/sh\nexit 3\n";
  fs::permissions(d / "fakebin/mpirun", fs::perms::owner_all);
  const auto r = test_support::run_brigade(
      d, "calibrate tiny.toml --ranks 1,2 --levels O0 --recompute none --rows 2 --steps 1 --warmup 0 --out cal.json", 0,
      "", "PATH=\"" + (d / "fakebin").string() + ":$PATH\"");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("cannot launch 2 ranks for the calibration"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with 3;"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--ranks 1"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("1 rank x"), std::string::npos) << "measured before checking the launch:\n" << r.err;
  EXPECT_FALSE(fs::exists(d / "cal.json"));
}

TEST(PlanCliRanks, TwoRankCalibrationIntoAFolderNotYetMade) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun on PATH";
  const fs::path d = test_support::write_tiny_run(test_support::fresh_test_dir("brigade_plan_cli"),
                                                  test_support::tiny_gpt_recipe({"run.threads=0"}), "tiny.toml");
  const auto r = test_support::run_brigade(
      d,
      "calibrate tiny.toml --ranks 2 --levels O0 --recompute none --rows 2 --steps 1 --warmup 0 --out new/dir/cal.json",
      0, "", test_support::kMpiEnv);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json c = test_support::json_file(d / "new/dir/cal.json");
  ASSERT_EQ(c["compute"].size(), 1u);
  EXPECT_EQ(c["compute"][0]["ranks"], 2);
  EXPECT_TRUE(c["comm"].contains("2")) << c["comm"].dump();
  EXPECT_TRUE(fs::exists(d / "new/dir/cal.json.ranks2.log"));
  EXPECT_TRUE(c["comm"]["2"].contains("busy_fits")) << "the collectives beside a compute load";
  // the steps in lockstep: data parallel at ZeRO-0 and ZeRO-3, tensor parallel (the GPT has a tp plan)
  ASSERT_EQ(c["sync"].size(), 3u) << c["sync"].dump();
  std::set<std::string> kinds;
  for (const auto& e : c["sync"]) {
    kinds.insert(e["kind"].get<std::string>());
    EXPECT_EQ(e["ranks"], 2);
    EXPECT_EQ(e["rows"], 2);
    EXPECT_GT(e["fwd_bwd_s"].get<double>(), 0.0) << e.dump();
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"dp", "zero3", "tp"}));

  // A calibration from before the busy timings still plans, and says what it lacks.
  const auto fresh = test_support::run_brigade(d, "plan tiny.toml --calibration new/dir/cal.json --predict");
  ASSERT_EQ(fresh.code, 0) << fresh.err;
  EXPECT_EQ(fresh.err.find("idle cores only"), std::string::npos) << fresh.err;
  EXPECT_EQ(fresh.err.find("no lockstep steps"), std::string::npos) << fresh.err;
  {  // one from before the lockstep steps still plans, and says what it lacks (the ratio 1: test_planner.cpp)
    nlohmann::json unsynced = c;
    unsynced.erase("sync");
    std::ofstream(d / "unsynced.json") << unsynced.dump();
    const auto u = test_support::run_brigade(d, "plan tiny.toml --calibration unsynced.json --predict");
    ASSERT_EQ(u.code, 0) << u.err;
    EXPECT_NE(u.err.find("no lockstep steps"), std::string::npos) << u.err;
    EXPECT_NE(u.err.find("brigade calibrate"), std::string::npos) << u.err;
  }
  nlohmann::json old = c;
  old["comm"]["2"].erase("busy_fits");
  old["comm"]["2"].erase("busy_threads");
  std::ofstream(d / "old.json") << old.dump();
  const auto stale = test_support::run_brigade(d, "plan tiny.toml --calibration old.json --predict");
  ASSERT_EQ(stale.code, 0) << stale.err;
  EXPECT_NE(stale.err.find("idle cores only"), std::string::npos) << stale.err;
  EXPECT_NE(stale.err.find("brigade calibrate"), std::string::npos) << stale.err;

  // The MPI wait's switch takes "poll" or "block"; anything else is refused by name.
  const auto bad = test_support::run_brigade(
      d, "calibrate tiny.toml --ranks 2 --levels O0 --recompute none --rows 2 --steps 1 --warmup 0 --out bad.json", 0,
      "", std::string(test_support::kMpiEnv) + " BRIGADE_MPI_WAIT=sometimes");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("BRIGADE_MPI_WAIT = 'sometimes'"), std::string::npos) << bad.err;
}
