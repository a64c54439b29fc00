// `brigade bench RECIPE [--set ...] [--steps N] [--warmup W]`: training-step speed of any
// recipe's model (its registry task), optimizer, precision and recompute plan on a synthetic
// batch of the micro-batch's shape (Task::synthetic_batch: random ids, images or pairs; no data,
// no evaluation, no checkpoint), for end-to-end comparisons such as bench/gpt_vs_torch.py. One
// process, one rank. Prints one JSON object naming the model type it measured: median step time,
// items/s (tokens, images or pairs; also under "tokens_per_s" / "images_per_s" / "pairs_per_s"),
// FLOPs per item (the task's count), the GEMM ceilings measured in this process (f32 and bf16,
// 1024^3 oneDNN matmul), MFU against the ceiling of the dtype the GEMMs run in, peak RSS and the
// allocator's peaks by category.
// Not a test: speed targets live in benchmarks, never in timed tests.
#pragma once
#include <cstdint>
#include <memory>
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
};

struct BenchResult {
  std::vector<double> step_seconds;  // each timed step
  // each timed step split in two: every micro-step's forward + backward, then the rest (the
  // gradient synchronisation, clipping, loss-scale check and optimizer update: apply_gradients)
  std::vector<double> fwd_bwd_seconds, update_seconds;
  double median_fwd_bwd_s = 0, median_update_s = 0;
  double median_step_s = 0, items_per_s = 0;  // items/s of the job (every rank's batch: dp x one rank's)
  int ranks = 1;                              // data-parallel ranks (the processes of the launch)
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
};

BenchResult run_bench(const train::Recipe& r, const BenchOptions& o);
std::string bench_json(const train::Recipe& r, const BenchResult& b);  // one line

}  // namespace brigade::cli
