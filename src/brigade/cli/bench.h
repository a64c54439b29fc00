// `brigade bench RECIPE [--set ...] [--steps N] [--warmup W]`: training-step speed of any
// recipe's model (its registry task), optimizer, precision and recompute plan on a synthetic
// batch of the micro-batch's shape (Task::synthetic_batch: random ids, images or pairs; no data,
// no evaluation, no checkpoint), for end-to-end comparisons such as bench/gpt_vs_torch.py. Prints one JSON object
// naming the model type it measured: median step time, items/s (tokens, images or pairs; also under "tokens_per_s" /
// "images_per_s" / "pairs_per_s"), FLOPs per item (the task's count), the GEMM ceilings measured in this process (f32
// and bf16, 1024^3 oneDNN matmul), MFU against the ceiling of the dtype the GEMMs run in, peak RSS and the allocator's
// peaks by category. Under mpirun: data parallel (each rank its own batch), and tensor / pipeline parallel through the
// trainer's model-parallel executor (each replica's batch over its tp x pp ranks), with every rank's allocator peaks.
// Not a test: speed targets live in benchmarks, never in timed tests.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/allocator.h"
#include "brigade/dist/process_group.h"
#include "brigade/train/config.h"
#include "brigade/train/task.h"

namespace brigade::cli {

struct BenchOptions {
  int64_t steps = 10;  // timed steps
  int64_t warmup = 2;  // untimed steps first (primitive creation, allocator warm-up)
  // The process group the step's data parallelism runs over (null = the world). `brigade
  // calibrate` gives each rank a group of its own, to time one rank's compute while the other
  // ranks of the launch compute beside it.
  std::shared_ptr<dist::ProcessGroup> group;
  bool gemm_peaks = true;  // measure the f32 and bf16 GEMM ceilings (about a second)
  bool quiet = false;      // no progress lines on stderr
  // After the steps, what else a training run holds memory for: one evaluation batch through the
  // executor (no gradients) and, for a model-parallel run, the checkpoint's gather of the whole
  // model on world rank 0 (staged as "other"). `brigade train --dry-run` of a tp / pp recipe.
  bool eval_and_checkpoint = false;
};

struct BenchResult {
  std::vector<double> step_seconds;  // each timed step
  // each timed step split in two: every micro-step's forward + backward, then the rest (the
  // gradient synchronisation, clipping, loss-scale check and optimizer update: apply_gradients)
  std::vector<double> fwd_bwd_seconds, update_seconds;
  double median_fwd_bwd_s = 0, median_update_s = 0;
  double median_step_s = 0, items_per_s = 0;  // items/s of the job (every rank's batch: dp x one rank's)
  int ranks = 1;                              // the processes of the launch (dp x tp x pp)
  int64_t dp = 1, tp = 1, pp = 1;
  train::ItemKind item = train::ItemKind::Token;
  double flops_per_item = 0, achieved_gflops = 0;
  double gemm_peak_f32 = 0, gemm_peak_bf16 = 0;  // GFLOP/s, this process
  double mfu = 0;                                // against the peak of the GEMM dtype of the precision level
  int64_t parameters = 0;
  int64_t peak_rss_bytes = 0;  // getrusage: the whole process, allocator included
  MemStats memory;             // allocator live/peak by tag
  // steady state: page faults (getrusage minor + major) and allocator blocks taken from
  // the OS, per timed step; both 0 in an allocation-free step
  double timed_page_faults_per_step = 0, timed_os_allocs_per_step = 0;
  double last_loss = 0;
  // every rank's allocator peaks, world rank order (2+ processes; the ranks of a tp / pp mesh
  // hold different shares of the model)
  struct RankPeaks {
    std::array<int64_t, kNumMemTags> peak{}, live{};  // live: at the end
    int64_t total = 0;
  };
  std::vector<RankPeaks> rank_peaks;
};

BenchResult run_bench(const train::Recipe& r, const BenchOptions& o);
std::string bench_json(const train::Recipe& r, const BenchResult& b);  // one line

// `brigade train --dry-run` of a recipe with parallel.tp or parallel.pp above 1, under mpirun with
// dp x tp x pp processes: every rank's memory by category, measured (formulas cannot know how a
// model's activations split over a mesh): one training step of a synthetic batch (the trainer's
// model-parallel executor, data parallelism and optimizer), one evaluation batch and the
// checkpoint's gather (run_bench with eval_and_checkpoint); nothing is read or written. Collective;
// the JSON has dry_run_json's shape ({model, measured, dp, tp, pp, zero, ranks: [{live, peak,
// peak_low, peak_total}]}, one entry per world rank); the report is a table, one column per rank.
nlohmann::json mesh_dry_run_json(const train::Recipe& r);
BenchResult mesh_dry_step(const train::Recipe& r);  // the measurement behind both (rank_peaks)
std::string mesh_dry_run_report(const train::Recipe& r);

}  // namespace brigade::cli
