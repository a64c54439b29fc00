// Learning-rate schedules: constant, and linear warmup followed by cosine decay
// to a floor (Loshchilov & Hutter 2017, SGDR without restarts; as in nanoGPT).
// Pure functions of the step, so resume needs no schedule state.
#pragma once
#include <cstdint>
#include <string>

namespace brigade::optim {

enum class ScheduleKind { Constant, Cosine };
ScheduleKind schedule_from_name(const std::string& name);  // ConfigError for unknown names

struct Schedule {
  ScheduleKind kind = ScheduleKind::Cosine;
  double base_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  // lr for optimizer step `step` (0-based): warmup (step+1)/warmup * base_lr, then
  // min_lr + 0.5 (base_lr - min_lr)(1 + cos(pi * progress)), progress in [0, 1].
  double lr_at(int64_t step) const;
};

}  // namespace brigade::optim
