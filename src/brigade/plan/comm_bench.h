// The interconnect half of `brigade calibrate`: times every collective the engine uses
// (allreduce per algorithm, reduce-scatter per algorithm, allgather, a pipeline hop's
// send/recv) through dist::ProcessGroup under the launcher actually used, and fits an
// alpha-beta model per collective and algorithm, seconds(bytes) = alpha + beta * bytes,
// which the planner uses to predict communication time. Written to and read from JSON.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "brigade/dist/process_group.h"

namespace brigade::plan {

// Alpha-beta fit of one collective: seconds(bytes) = alpha + beta * bytes. The coefficients are
// the least-squares fit over `points` constrained to alpha >= 0 and beta >= 0 (a negative
// intercept or slope, which noise can produce, is clamped and the other coefficient refitted).
struct CommFit {
  double alpha_s = 0, beta_s_per_byte = 0;
  std::vector<std::pair<int64_t, double>> points;  // (bytes per rank's buffer, median seconds)
  double seconds(int64_t bytes) const;             // alpha + beta * bytes
  // What the planner predicts with: linear between the two measured sizes around `bytes`
  // (below the smallest, its time; above the largest, its time scaled by size), and
  // seconds(bytes) when no points were kept. On this project's VM large collectives cost more
  // than alpha + beta * bytes says for the mid sizes (fresh temporaries page-fault at 16 MiB), so
  // one straight line through every size misses the buckets' sizes by up to 4x.
  double interpolate(int64_t bytes) const;
};

// Least squares of seconds = alpha + beta * bytes over the points, subject to alpha, beta >= 0:
// the unconstrained fit when both are >= 0, otherwise the better (smaller squared error) of the
// fits with alpha = 0 (beta = max(0, sum(x y) / sum(x x))) and with beta = 0 (alpha = max(0,
// mean y)). This is the exact constrained optimum (the error is convex in alpha and beta).
// One point, or points all at one size, give beta = 0 and alpha = max(0, mean seconds).
// `points` is kept in the result. No points is a ConfigError; so is a non-finite value or a
// negative size.
CommFit fit_alpha_beta(const std::vector<std::pair<int64_t, double>>& points);

struct CommCalibration {
  int ranks = 1;
  // How the job was started, from the environment, e.g. "mpirun -np 2, 2 ranks on this node
  // (OMPI_MCA_btl=self,vader)": the launcher, the world size, ranks per node when the
  // launcher says, and the OMPI_MCA_* settings that change the transport (btl*, pml*, mtl*,
  // coll*, osc*, mpi_yield_when_idle, hwloc_base_binding_policy).
  std::string launcher;
  int reps = 0, warmup = 0;  // timed and untimed repetitions per point
  // Keys: "allreduce/mpi", "allreduce/ring", "allreduce/tree", "reduce_scatter/mpi",
  // "reduce_scatter/ring", "reduce_scatter/tree", "allgather", "sendrecv". Bytes are the full
  // buffer's: allreduce's buffer, reduce-scatter's input (each rank gets 1/ranks of it),
  // allgather's output (each rank contributes 1/ranks of it, in place, as ZeRO gathers its
  // parameters), and for "sendrecv" the message rank 0 sends to rank 1 (one pipeline hop).
  std::map<std::string, CommFit> fits;
  // The CPU seconds of the same collectives while every rank also computes (busy_threads
  // threads of fp32 GEMMs each, as training's compute threads): on a node whose cores the
  // compute fills, a collective that overlaps the compute costs the step the CPU it takes from
  // it (its copies, reductions and polling), not its wall time. Empty when not measured
  // (busy_threads = 0).
  std::map<std::string, CommFit> busy_fits;
  int busy_threads = 0;
  // The fit for `key`; a ConfigError naming the key and the keys present (and, for a one-rank
  // calibration, saying that none are measured without at least 2 ranks).
  const CommFit& fit(const std::string& key) const;
};

struct CommBenchOptions {
  std::vector<int64_t> bytes = {4096, 65536, 1 << 20, 4 << 20, 16 << 20};  // positive multiples of 4 (fp32)
  int reps = 5;                                                            // timed, >= 1
  int warmup = 1;                                                          // untimed, >= 0
  // > 0: also time every collective while busy_threads threads of GEMMs run on each rank
  // (CommCalibration::busy_fits).
  int busy_threads = 0;
};

// Measures every key above at every size in o.bytes on fp32 buffers. Collective over pg: every
// rank calls it with the same options. Each rep is timed on every rank after a barrier; a rep's
// time is the slowest rank's (allreduce_max), a point is the median over reps (the mean of the
// two middle ones for an even count). Every rank returns the same result. With one rank
// (pg.size() == 1, e.g. without mpirun) nothing is measured: ranks = 1 and no fits.
// Bad options (an empty size list, a size that is not a positive multiple of 4, reps < 1,
// warmup < 0) are a ConfigError. Default options take a few seconds at 2 ranks on shared memory.
CommCalibration measure_comm(dist::ProcessGroup& pg, const CommBenchOptions& o = {});

// {"ranks", "launcher", "reps", "warmup", "fits": {key: {"alpha_s", "beta_s_per_byte",
// "points": [[bytes, seconds], ...]}}}. Doubles are written so that they read back exactly.
nlohmann::json comm_to_json(const CommCalibration& c);
// The inverse of comm_to_json. A malformed object (a field missing or of the wrong type, a
// negative or non-finite number) is a ConfigError naming the field, e.g. "fits.allgather.alpha_s".
CommCalibration comm_from_json(const nlohmann::json& j);

}  // namespace brigade::plan
