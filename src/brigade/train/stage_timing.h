// Measured per-micro-batch times of one transformer block and of the head, through a task's
// pipeline stages (task.h Stages) on a synthetic micro-batch: the forward, and the backward
// split into its input part and its deferred weight-gradient GEMMs (the costs the pipeline
// simulator takes). Used by the `dynamic` schedule choice and by `brigade calibrate`.
#pragma once
#include "brigade/amp/policy.h"
#include "brigade/core/tensor.h"
#include "brigade/train/task.h"

namespace brigade::train {

struct StageTimes {
  double block_f = 0, block_bi = 0, block_w = 0;  // block 0, seconds (medians of `reps`, after a warm-up)
  double head_f = 0, head_bi = 0, head_w = 0;     // the head and loss
};

// `syn`: a synthetic micro-batch of the activation's rows; `act`: the activation shape between
// blocks (Stages::hidden(rows)). Leaves no gradient on the model's parameters.
StageTimes measure_stage_times(nn::Module& model, const Stages& stages, const Batch& syn, const Shape& act,
                               const amp::Policy& policy, int reps = 3);

}  // namespace brigade::train
