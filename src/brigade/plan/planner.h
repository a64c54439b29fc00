// The planner behind `brigade plan`: for a recipe and a cluster it enumerates the plans
// (dp x tp x pp, pipeline schedule and micro-batches, ZeRO stage, recompute policy, precision
// level, accumulation), predicts each one's per-rank peak memory by category and its step time,
// rejects those that do not fit or divide (with the reason), and ranks the rest by predicted
// items/s. docs/planning.md gives the model, its assumptions and its measured accuracy.
//
// Step time = accumulation x (one micro-batch's forward + backward, from the calibration's
// measured points at this plan's ranks, threads, level, recompute and rows; divided by tp plus
// the tp allreduces; through the pipeline simulator for pp) + the update (measured, over this
// rank's share of the parameters) + the exposed data-parallel communication (alpha-beta fits of
// the collectives the ZeRO stage runs). Memory = train::predict_memory (the dry-run model) fed
// with the calibration's measured activation and workspace peaks at the plan's settings; tp and
// pp split it by the rank's share of the parameters and blocks (a model, marked approximate).
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/allocator.h"
#include "brigade/plan/calibration.h"
#include "brigade/train/config.h"

namespace brigade::plan {

// A link between ranks: seconds(bytes) = latency + bytes / bandwidth.
struct Link {
  double latency_s = 0, bytes_per_s = 0;
};

// The machines a plan runs on. From a calibration (this machine: one node, its cores, links
// from the measured fits) or described by hand in TOML (read_cluster).
struct Cluster {
  std::string name = "this machine";
  int nodes = 1;
  int ranks_per_node = 1;       // the most processes per node
  int cores_per_node = 1;       // cores shared by a node's ranks (threads per rank = cores / ranks)
  int64_t memory_per_rank = 0;  // bytes a rank may use (0 = no limit)
  double gemm_gflops_f32 = 0;   // per node, all cores (0 = the calibration's)
  double gemm_gflops_bf16 = 0;  //
  double efficiency = 0;  // fraction of the GEMM peak a step reaches when nothing is calibrated (0 = the calibration's)
  Link intra, inter;      // within a node, between nodes (described clusters)
  bool described = false;  // read from a file (links from it, not from the calibration's fits)
};
// [cluster] name, nodes, ranks_per_node, cores_per_node, memory_per_rank_gb, gemm_gflops_f32,
// gemm_gflops_bf16, efficiency; [cluster.intra] / [cluster.inter] latency_us, gbps (gigabits/s).
Cluster read_cluster(const std::string& path);
Cluster parse_cluster(const std::string& toml_text, const std::string& origin);
// This machine as calibrated: one node of c.cores cores, memory from /proc/meminfo's MemAvailable.
Cluster local_cluster(const Calibration& c);

struct Plan {
  int64_t dp = 1, tp = 1, pp = 1;
  int64_t microbatches = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  int64_t zero = 0;
  std::string recompute = "none";
  std::string level = "O0";
  int64_t accumulation = 1,
          batch_size = 1;  // micro-step rows per dp rank; batch x accumulation x dp = the global batch
  int threads = 1;         // per rank
  int64_t ranks() const { return dp * tp * pp; }
  std::string label() const;  // "dp2 zero1 O2 selective acc1 b8"
  // The recipe keys that give this plan (--set values).
  std::vector<std::string> overrides() const;
};

struct Prediction {
  Plan plan;
  bool feasible = true;
  std::string reason;  // why not, when !feasible
  double step_s = 0, items_per_s = 0;
  double compute_s = 0, update_s = 0, comm_s = 0, bubble = 0;  // parts of step_s (bubble: the pipeline's, a fraction)
  std::array<int64_t, kNumMemTags> peak{};                     // bytes per category, the busiest rank
  std::array<int64_t, kNumMemTags> peak_low{};  // the low end where communication timing decides (ZeRO-2/3 buckets)
  int64_t peak_total = 0;
  bool memory_approximate = false;  // tp / pp without a calibrated mesh point: a modelled split
  bool calibrated = true;           // compute from measured points (false: from FLOPs x efficiency)
  // the micro-steps' scale for ranks in lockstep (the calibration's SyncPoint ratio; 1 without one)
  double sync_factor = 1.0;
};

struct PlanOptions {
  // empty = those the calibration measured (a described cluster without points: O0-O2 and
  // none / selective / full)
  std::vector<std::string> levels, recompute;
  int64_t max_ranks = 0;   // 0 = every core of every node
  int64_t only_ranks = 0;  // > 0: only plans of exactly this many ranks (a job already launched)
};

// The recipe's own plan, predicted (what `brigade plan --predict` prints).
Prediction predict(const train::Recipe& r, const Calibration& c, const Cluster& cl);
// Every plan of the recipe's global batch on the cluster, feasible first by predicted items/s,
// then the rejected ones.
std::vector<Prediction> enumerate_plans(const train::Recipe& r, const Calibration& c, const Cluster& cl,
                                        const PlanOptions& o = {});
// The recipe with the plan's keys set (what --apply writes and `train --plan auto` trains).
train::Recipe apply_plan(const train::Recipe& r, const Plan& p);

// Feasible plans, and those rejected only for needing more memory than a rank has, carry their
// predicted step time and memory; other rejected plans their reason alone.
nlohmann::json prediction_json(const Prediction& p, const std::string& item);
// The top `top` feasible plans as a table, then how many were rejected and the commonest reasons.
std::string plan_table(const std::vector<Prediction>& ps, const std::string& item, int top);

}  // namespace brigade::plan
