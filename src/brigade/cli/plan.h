// `brigade calibrate` and `brigade plan` (docs/planning.md).
//
// calibrate RECIPE: measures this machine for the recipe's model once and writes
// calibration.json (plan/calibration.h): the GEMM ceilings; for each launch of `ranks`
// processes (1 in this process; more under mpirun, launched as a child, every rank measuring its
// own copy of the model at the same time, with cores / ranks threads each) one point per
// precision level x recompute mode x micro-batch rows: the forward + backward of one
// micro-batch and the update (`brigade bench`'s split step), and in the one-process launch the
// measured dry step's memory; per-block and head times through the pipeline stages; and under
// mpirun the interconnect's alpha-beta fits (plan/comm_bench.h).
//
// plan RECIPE: reads the calibration and prints the top plans (plan/planner.h); --json one
// object per plan; --predict only the recipe's own plan; --apply FILE the best plan's recipe.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/plan/calibration.h"
#include "brigade/plan/planner.h"
#include "brigade/train/config.h"

namespace brigade::cli {

struct CalibrateOptions {
  std::string recipe;
  std::vector<std::string> sets;
  std::string out;                                       // "" = calibration_path(recipe)
  std::vector<int> ranks = {1, 2};                       // launches to measure (1 = this process)
  std::vector<std::string> levels = {"O0", "O1", "O2"};  // precision levels (bf16)
  std::vector<std::string> recompute = {"none", "selective", "full"};
  std::vector<int64_t> rows;      // micro-batch rows; empty = powers of two up to the global batch
  int64_t steps = 5, warmup = 1;  // timed and untimed steps per point
  std::string child_out;          // internal: a rank-launch child writes its points here
  std::string binary;             // the brigade executable ("" = this process's)
  // {A, B}: measure models of A and B blocks at the recipe's width and extrapolate to its
  // model.n_layer (for a model too large to build here; one process only)
  std::vector<int64_t> proxy_layers;
};

// <run.out_dir's parent>/<run.name>-calibration.json
std::string calibration_path(const train::Recipe& r);
int run_calibrate(const CalibrateOptions& o);

struct PlanCommandOptions {
  std::string recipe;
  std::vector<std::string> sets;
  std::string calibration;  // "" = calibration_path(recipe)
  std::string cluster;      // "" = this machine
  bool json = false, predict = false;
  std::string apply;  // write the best plan's recipe here
  int top = 10;
  int64_t max_ranks = 0;
};
// The calibration for `r` from `path` (or its default), refusing one measured for another model.
plan::Calibration load_calibration_for(const train::Recipe& r, const std::string& path);
int run_plan(const PlanCommandOptions& o);

// `brigade train --plan auto`: the best plan of the recipe (from its calibration, on this
// machine). In one process: a one-rank plan's overrides go into `plan_sets` and -1 is returned
// (train here); a plan of R > 1 ranks re-runs this same command line under `mpirun -np R` and
// returns its exit status. Under mpirun with W ranks: the best plan of exactly W ranks (the one
// process chose it among all, so every rank picks the same), its overrides into `plan_sets`, -1.
int plan_for_training(const std::string& recipe, const std::vector<std::string>& sets, const std::string& calibration,
                      int argc, char** argv, std::vector<std::string>& plan_sets);

}  // namespace brigade::cli
