// Pipeline-parallel schedules as data, and a simulator that predicts them.
//
// A schedule is, for each pipeline rank, the ordered list of actions that rank runs:
// forward, backward (or its two halves: backward-input, the gradient of the stage's
// input, which the previous stage is waiting for; and backward-weight, the gradients
// of the stage's weights, which nobody waits for), and the point-to-point sends and
// receives between neighbouring stages. One executor runs any schedule; this file
// builds them and predicts their timeline. Not here: the executor (it needs the model
// split into stages and MPI), tensor parallelism.
//
// Stages. With p ranks and v virtual stages per rank (interleaving), the model is cut
// into S = p * v stages; virtual stage s lives on rank s % p, as its chunk s / p
// (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
// Clusters", section 2.2). Without interleaving v = 1 and stage s is rank s.
//
// Schedules (m micro-batches):
//   GPipe        all forwards, then all backwards (Huang et al. 2019)
//   1F1B         p - r - 1 warm-up forwards on rank r, then one forward / one backward
//                alternating, then the remaining backwards (PipeDream-Flush; Narayanan
//                et al. 2019/2021)
//   Interleaved  1F1B over the v chunks of each rank, in groups of p micro-batches
//                (Narayanan et al. 2021; needs m % p == 0)
//   ZB-H1        1F1B with each backward split into backward-input (B) and
//                backward-weight (W); the W's are deferred into what would be bubbles,
//                while no rank holds activations of more than p micro-batches, 1F1B's
//                peak (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", the H1
//                schedule: same peak memory as 1F1B). The placement of each W is
//                found by list scheduling with the given costs.
//
// Bubble fraction: (makespan - ideal) / ideal, where ideal = the busiest rank's compute
// time (the time with no pipeline waits at all). With equal stages and free
// communication it is (p - 1) / m for GPipe and 1F1B and (p - 1) / (v m) interleaved.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace brigade::parallel {

enum class PipeSchedule : uint8_t { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };
std::string_view pipe_schedule_name(PipeSchedule s);       // "gpipe", "1f1b", "interleaved", "zb-h1"
PipeSchedule pipe_schedule_from_name(std::string_view s);  // ValueError naming the accepted values

enum class PipeOp : uint8_t {
  Forward,         // run the stage on micro-batch mb; keeps its activations
  Backward,        // full backward of the stage on mb (input and weight gradients); frees them
  BackwardInput,   // the input gradient only (what the previous stage waits for)
  BackwardWeight,  // the weight gradients (frees the activations)
  SendActivation,  // the forward output of (stage, mb) to stage + 1
  RecvActivation,  // the forward input of (stage, mb) from stage - 1
  SendGrad,        // the input gradient of (stage, mb) to stage - 1
  RecvGrad,        // the output gradient of (stage, mb) from stage + 1
};
std::string_view pipe_op_name(PipeOp op);  // "F", "B", "Bi", "W", "sendA", "recvA", "sendG", "recvG"

struct PipeAction {
  PipeOp op;
  int stage = 0;  // virtual stage (0 .. p*v-1)
  int mb = 0;     // micro-batch (0 .. m-1)
  bool operator==(const PipeAction&) const = default;
};

struct PipePlan {
  PipeSchedule kind = PipeSchedule::OneFOneB;
  int p = 1, v = 1, m = 1;
  std::vector<std::vector<PipeAction>> ranks;  // (p) actions in execution order
  int stages() const { return p * v; }
  int rank_of(int stage) const { return stage % p; }
};

// Costs for building ZB-H1 and for simulating: seconds (or any unit) per micro-batch and
// stage. forward[s], backward_input[s], backward_weight[s] for each virtual stage s
// (a full backward costs backward_input + backward_weight); comm = the time one
// activation or gradient takes from a send to the matching receive.
struct PipeCosts {
  std::vector<double> forward, backward_input, backward_weight;
  double comm = 0.0;
  // Equal stages: F per stage, B = b_input + b_weight.
  static PipeCosts uniform(int stages, double f, double b_input, double b_weight, double comm = 0.0);
};

// Builds the schedule. ValueError for p < 1, m < 1, v < 1, v > 1 with a schedule other
// than Interleaved, Interleaved with m % p != 0, or costs of the wrong size (ZB-H1 uses
// `costs` to place the W's; the others ignore it).
PipePlan build_pipe_plan(PipeSchedule kind, int p, int m, int v = 1, const PipeCosts& costs = {});

// One executed action on the simulated (or measured) timeline.
struct PipeEvent {
  int rank = 0;
  PipeAction action;
  double start = 0, end = 0;
};

struct PipeSimulation {
  std::vector<PipeEvent> events;  // compute actions only, in start order per rank
  double makespan = 0;
  double ideal = 0;                 // the busiest rank's compute time
  double bubble = 0;                // (makespan - ideal) / ideal
  std::vector<int> peak_in_flight;  // (p) micro-batches holding activations at once, per rank
};

// Runs each rank's list in order: an action starts when the rank is free and its inputs
// have arrived (a receive waits for the matching send + comm; sends do not block). A
// schedule whose lists cannot complete (a receive nobody sends, a cycle) is a ValueError
// naming the stuck ranks and actions.
PipeSimulation simulate_pipe_plan(const PipePlan& plan, const PipeCosts& costs);

// `dynamic`: among GPipe, 1F1B, ZB-H1 and Interleaved with each v in `virtual_stages`
// that divides the layers (v * p <= n_layers; the caller passes the allowed v), the plan
// the simulator predicts fastest whose peak in-flight micro-batches on every rank stay
// within max_in_flight (0 = no limit). `costs_for_v(v)` gives the per-stage costs of the
// model cut into p*v stages. ValueError when nothing fits.
struct PipeChoice {
  PipePlan plan;
  PipeSimulation sim;
  std::string table;  // every candidate: schedule, v, predicted makespan, bubble, peak in-flight, fits
};
PipeChoice choose_pipe_plan(int p, int m, const std::vector<int>& virtual_stages, int max_in_flight,
                            const std::function<PipeCosts(int v)>& costs_for_v);

// An SVG timeline: one row per rank, one box per compute action (forwards, backwards and
// backward-weights in three colours, the micro-batch written inside), a time axis.
void write_pipe_timeline_svg(const std::string& path, const std::vector<PipeEvent>& events, int p,
                             const std::string& title);

}  // namespace brigade::parallel
