// Learning-rate schedules. Every schedule starts with an optional linear warmup
// (step s < warmup: lr (s+1)/warmup), then, with s' = s - warmup and
// D = max(total - warmup, 1), p = clamp(s'/D, 0, 1):
//   constant  lr
//   cosine    min + (lr - min)(1 + cos(pi p))/2    (Loshchilov & Hutter 2017, SGDR
//             without restarts; as in nanoGPT)
//   linear    min + (lr - min)(1 - p)
//   step      max(min, lr gamma^floor(s'/step_every))
//   wsd       warmup-stable-decay (Zhai et al. 2022; Hägele et al. 2024): lr until
//             step total - decay_steps, then from lr to min over decay_steps with
//             q = clamp((s - (total - decay_steps))/decay_steps, 0, 1) and shape
//             linear (1 - q), cosine ((1 + cos(pi q))/2) or sqrt (1 - sqrt(q)).
// Pure functions of the step, so resume needs no schedule state. Which combinations
// are valid (min <= lr, step_every > 0, decay_steps within the run) is checked when
// the recipe is read (train/config.cpp); lr_at() throws ValueError only for a
// step_every or decay_steps that would divide by zero.
#pragma once
#include <cstdint>
#include <string>

namespace brigade::optim {

enum class ScheduleKind { Constant, Cosine, Linear, Step, WSD };
enum class DecayShape { Linear, Cosine, Sqrt };
// ConfigError for unknown names: "constant" "cosine" "linear" "step" "wsd"; "linear" "cosine" "sqrt".
ScheduleKind schedule_from_name(const std::string& name);
DecayShape decay_shape_from_name(const std::string& name);

struct Schedule {
  ScheduleKind kind = ScheduleKind::Cosine;
  double base_lr = 1e-3;
  double min_lr = 0.0;  // floor of every decaying schedule
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  int64_t step_every = 0;                       // step: decay period (> 0)
  double step_gamma = 0.1;                      // step: factor per period
  int64_t decay_steps = 0;                      // wsd: length of the final decay (> 0)
  DecayShape decay_shape = DecayShape::Linear;  // wsd: shape of the final decay
  // lr for optimizer step `step` (0-based); see the formulas above.
  double lr_at(int64_t step) const;
};

}  // namespace brigade::optim
