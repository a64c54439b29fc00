// LR schedules; see schedule.h.
#include "brigade/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "brigade/core/error.h"

namespace brigade::optim {

ScheduleKind schedule_from_name(const std::string& name) {
  if (name == "constant") return ScheduleKind::Constant;
  if (name == "cosine") return ScheduleKind::Cosine;
  throw ConfigError(fmt::format("unknown schedule '{}': use 'cosine' or 'constant'", name));
}

double Schedule::lr_at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return base_lr * double(step + 1) / double(warmup_steps);
  if (kind == ScheduleKind::Constant) return base_lr;
  const int64_t decay_steps = std::max<int64_t>(total_steps - warmup_steps, 1);
  const double progress = std::clamp(double(step - warmup_steps) / double(decay_steps), 0.0, 1.0);
  return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace brigade::optim
