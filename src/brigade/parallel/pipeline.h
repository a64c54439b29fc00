// Pipeline parallelism: the executor that runs a schedule (pipeline_schedule.h) across
// the ranks of a pipeline group, and the cut of a model's layers into stages.
//
// The executor knows nothing of the model. This rank holds v chunks (virtual stages
// rank, rank + p, ...); each chunk is a forward function the caller builds from
// single-device model code (for GPT: embed on the first stage, a run of blocks, the
// head and loss on the last one). The executor walks this rank's action list in order:
//   recvA   receive the activation (B_mb, T, C) of (stage, mb) from the previous stage
//           into a fresh leaf that requires grad (blocking);
//   F       run the chunk on it (the first stage gets no input and reads its own
//           micro-batch); the graph is kept until the backward;
//   sendA   send the output, as fp32 (non-blocking: two neighbours sending to each other
//           at once cannot deadlock);
//   recvG   receive the gradient of that output;
//   B       backpropagate it (on the last stage: the loss times root_scale), then keep the
//           input leaf's gradient for sendG;
//   Bi / W  the same backward split in two (autograd::DeferWeightGradScope): Bi computes
//           every gradient but the GEMM weight gradients, W computes those later;
//   sendG   send the input gradient to the previous stage (non-blocking).
// Sends complete at the end of the step. Tags encode (kind, stage, micro-batch), so a
// message can only match its own receive.
//
// Each action is timed (seconds since the step began), giving the measured timeline that
// write_pipe_timeline_svg draws and the measured bubble that is reported beside the
// simulator's prediction. The executor also counts the micro-batches whose activations
// this rank holds (from F to B, or to W under ZB-H1), the quantity the schedules trade.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "brigade/core/tensor.h"
#include "brigade/dist/process_group.h"
#include "brigade/parallel/pipeline_schedule.h"

namespace brigade::parallel {

// One chunk of this rank: forward(mb, x) -> the activation for the next stage, or on the
// last stage the micro-batch's mean loss (0-d, f32). x is undefined on stage 0.
struct PipeChunk {
  std::function<Tensor(int mb, const Tensor& x)> forward;
};

struct PipeStepResult {
  double loss_sum = 0.0;          // last stage: sum of the micro-batches' losses; 0 elsewhere
  std::vector<PipeEvent> events;  // this rank's compute actions, measured (seconds from the step start)
  double busy = 0.0;              // seconds spent in compute actions
  double makespan = 0.0;          // seconds from the step start to the last action's end
  int peak_in_flight = 0;         // micro-batches holding activations at once on this rank
};

class PipelineExecutor {
 public:
  // `pp`: the pipeline group (rank r runs plan.ranks[r]); `activation`: the shape of one
  // micro-batch's activation between stages (B_mb, T, C).
  PipelineExecutor(PipePlan plan, dist::ProcessGroup& pp, Shape activation);
  const PipePlan& plan() const { return plan_; }
  // Runs this rank's actions for one step. chunks[c] is virtual stage c * p + rank. With
  // train = false only the forwards and the activation transfers run (under no_grad; the
  // plan's order is kept, which every schedule allows): evaluation. `activation`, when given,
  // is micro-batch mb's activation shape (an evaluation batch cut into uneven micro-batches);
  // in evaluation a micro-batch whose shape has no element is skipped by every rank.
  PipeStepResult run(const std::vector<PipeChunk>& chunks, double root_scale, bool train = true,
                     const std::function<Shape(int mb)>& activation = {});

 private:
  PipePlan plan_;
  dist::ProcessGroup& pp_;
  Shape act_;
};

// The cut of n blocks into S contiguous stages of at least one block each that minimises
// the largest stage cost, stage 0 also paying first_extra (the embeddings) and stage S-1
// last_extra (the head and loss). Returns S + 1 boundaries: stage s has blocks
// [b[s], b[s+1]). ConfigError when S > n.
std::vector<int64_t> partition_layers(const std::vector<double>& block_cost, int S, double first_extra,
                                      double last_extra);
// Boundaries from an explicit list of blocks per stage ("3,4,5" -> 0,3,7,12); ConfigError
// unless it has S positive counts summing to n.
std::vector<int64_t> stage_bounds_from_list(const std::vector<int64_t>& counts, int S, int64_t n);

// The measured bubble of a step, as the simulator defines it: (makespan − ideal) / ideal,
// ideal = the busiest rank's compute time. `busy` and `makespan` are per rank.
double measured_bubble(const std::vector<double>& busy, const std::vector<double>& makespan);

}  // namespace brigade::parallel
