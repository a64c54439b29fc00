// What `brigade calibrate` measured on this machine for one recipe's model, as the planner
// reads it (calibration.json): the GEMM ceilings, one point per (ranks launched together,
// threads per rank, precision level, recompute mode, micro-batch rows) with the forward +
// backward time of one micro-batch, the update time and the measured dry step's memory, and
// the interconnect's alpha-beta fits (comm_bench.h). The measuring lives in the cli
// (cli/calibrate.cpp); this file is the data and the lookups, so `brigade plan` runs in
// seconds from the file alone.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/plan/comm_bench.h"
#include "brigade/train/config.h"
#include "brigade/train/memory_plan.h"

namespace brigade::plan {

// One measured configuration of the model on one rank.
struct ComputePoint {
  int ranks = 1;    // processes launched together, each measuring its own copy at the same time
  int threads = 1;  // OpenMP threads of each
  std::string level = "O0", recompute = "none";
  int64_t rows = 1;          // micro-batch rows (train.seq_len tokens each for the sequence models)
  double fwd_bwd_s = 0;      // one micro-batch's forward + backward, median
  double update_s = 0;       // clipping, the loss-scale check and the optimizer update of one step, median
  int64_t act_peak = 0;      // the measured dry step (train::measured_inputs) at this point
  int64_t act_live = 0;      //
  int64_t work_compute = 0;  // kernel workspace
  int64_t params_work = 0;   // working copies of the parameters (16-bit casts at O1-O3)
  // ZeRO-2/3's view of the dry step's backward (train::MemoryInputs): optional in the file, absent
  // (-1, 0) in calibrations written before them
  int64_t params_work_backward = -1;
  std::vector<std::string> early_grads;
};

// One transformer block's and the head's forward / backward split (input, weight) on one
// micro-batch, from the task's pipeline stages (train/stage_timing.h), for the pipeline simulator.
struct StagePoint {
  int ranks = 1, threads = 1;
  std::string level = "O0";
  int64_t rows = 1;
  double block_f = 0, block_bi = 0, block_w = 0, head_f = 0, head_bi = 0, head_w = 0;
};

// The memory of one tensor- or pipeline-parallel step, every rank of the launch measured by the
// mesh dry step of `brigade train --dry-run` (cli/bench.h: one training step of a synthetic batch
// through the model-parallel executor, an evaluation batch and the checkpoint's gather). The
// planner derives tp / pp plans' memory from these: activations linear in the rows, and for
// pipelines in the micro-batches each stage holds (two GPipe points separate what a stage keeps
// per micro-batch from the one micro-batch's transient peak; planner.cpp).
struct MeshPoint {
  int64_t tp = 1, pp = 1;
  std::string schedule = "1f1b";  // pp > 1
  int64_t microbatches = 1;       // pp > 1
  int threads = 1;
  std::string level = "O0", recompute = "none";
  int64_t rows = 1;  // the step's batch (train.batch_size rows)
  struct Rank {
    std::array<int64_t, kNumMemTags> peak{};  // by MemTag
    int64_t total = 0;                        // the allocator's peak of the sum
  };
  std::vector<Rank> ranks;  // world rank order (tp fastest)
};

// One step of a launch whose ranks run in lockstep, measured as training runs it (`brigade bench`
// over the whole launch): kind "dp" (data parallel over every rank, ZeRO-0, the recipe's buckets,
// algorithm and overlap; each rank `rows` rows), "zero3" (the same at ZeRO-3) or "tp" (tensor
// parallel over every rank, `rows` rows). Ranks that wait on each other at every bucket, gathered
// unit or block's allreduce run slower than ranks that each measure their own copy (the compute
// points), by more than the priced communication; the planner scales a dp or tp plan's
// micro-steps by the measured ratio.
struct SyncPoint {
  std::string kind = "dp";  // dp | zero3 | tp
  int ranks = 2, threads = 1;
  std::string level = "O0";
  int64_t rows = 1;
  double fwd_bwd_s = 0;  // every micro-step's forward + backward of one step, median
  double update_s = 0;   // the rest of the step (gradient synchronisation, clipping, optimizer), median
};

struct Calibration {
  std::string created;        // UTC time
  std::string host;           // hostname
  int cores = 1;              // what OpenMP counts on this machine
  double gemm_peak_f32 = 0;   // GFLOP/s, one process, all cores
  double gemm_peak_bf16 = 0;  //
  std::map<std::string, std::string>
      model;                    // the recipe keys the points depend on (model.*, train.seq_len, optim.name)
  int64_t parameters = 0;       // trainable parameters of the model
  int64_t num_blocks = 0;       // transformer blocks (0 without pipeline stages)
  double flops_per_item = 0;    // the task's count for one item (forward + backward)
  int64_t items_per_row = 1;    // tokens per row (seq_len) or 1
  int64_t hidden_per_row = 0;   // elements of one row's activation between blocks (T x C; 0 without stages)
  bool has_stages = false;      // the task gives pipeline stages (tp and pp possible)
  bool tp_plan = false;         // ... and a tensor-parallel plan
  std::string item = "tokens";  // tokens | images | pairs
  // empty: measured on the model itself. {A, B}: the model was too large to build, so it was
  // measured with A and B blocks at its full width and every per-block quantity (parameters,
  // FLOPs, units, times, activation peaks) extrapolated linearly to its num_blocks
  std::vector<int64_t> proxy_layers;
  // the parameter units as data parallelism lays them out (train::MemoryInputs::units), below
  // ZeRO-3 and at ZeRO-3 (where every block is its own unit), and the frozen parameters
  std::vector<train::PlannedUnit> units, units_zero3;
  std::vector<train::MemoryInputs::Frozen> frozen;
  std::vector<ComputePoint> compute;
  std::vector<StagePoint> stages;
  std::vector<MeshPoint> mesh;          // optional in the file (older calibrations have none)
  std::vector<SyncPoint> sync;          // optional in the file (older calibrations have none)
  std::map<int, CommCalibration> comm;  // by ranks launched together

  // Forward + backward seconds at `rows`, linear between the two nearest measured row counts of
  // the same (ranks, threads, level, recompute), proportional beyond them; < 0 when nothing was
  // measured there.
  double fwd_bwd_seconds(int ranks, int threads, const std::string& level, const std::string& recompute,
                         double rows) const;
};

// The recipe keys a calibration depends on; plan refuses a calibration whose keys differ.
std::map<std::string, std::string> calibration_key(const train::Recipe& r);
// "" when `c` was measured for r's model, otherwise the differences, one "key: a (calibrated) vs b" each.
std::string calibration_mismatch(const Calibration& c, const train::Recipe& r);

nlohmann::json calibration_to_json(const Calibration& c);
Calibration calibration_from_json(const nlohmann::json& j, const std::string& origin);
Calibration read_calibration(const std::string& path);  // IoError / ConfigError naming the file
void write_calibration(const std::string& path, const Calibration& c);

}  // namespace brigade::plan
