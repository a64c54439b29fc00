// LR schedules; see schedule.h.
#include "brigade/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "brigade/core/error.h"

namespace brigade::optim {

ScheduleKind schedule_from_name(const std::string& name) {
  if (name == "constant") return ScheduleKind::Constant;
  if (name == "cosine") return ScheduleKind::Cosine;
  if (name == "linear") return ScheduleKind::Linear;
  if (name == "step") return ScheduleKind::Step;
  if (name == "wsd") return ScheduleKind::WSD;
  throw ConfigError(fmt::format(
      "unknown schedule '{}': use 'constant', 'cosine', 'linear', 'step' or 'wsd' (see docs/optimizers.md)", name));
}

DecayShape decay_shape_from_name(const std::string& name) {
  if (name == "linear") return DecayShape::Linear;
  if (name == "cosine") return DecayShape::Cosine;
  if (name == "sqrt") return DecayShape::Sqrt;
  throw ConfigError(fmt::format("unknown decay shape '{}': use 'linear', 'cosine' or 'sqrt'", name));
}

double Schedule::lr_at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return base_lr * double(step + 1) / double(warmup_steps);
  const int64_t s = step - warmup_steps;
  const int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
  const double p = std::clamp(double(s) / double(span), 0.0, 1.0);
  switch (kind) {
    case ScheduleKind::Constant: return base_lr;
    case ScheduleKind::Cosine: return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * p));
    case ScheduleKind::Linear: return min_lr + (base_lr - min_lr) * (1.0 - p);
    case ScheduleKind::Step: {
      BRIGADE_CHECK(step_every > 0, ValueError, "step schedule: step_every = {} must be > 0; set schedule.step_every",
                    step_every);
      return std::max(min_lr, base_lr * std::pow(step_gamma, double(s / step_every)));
    }
    case ScheduleKind::WSD: {
      BRIGADE_CHECK(decay_steps > 0, ValueError, "wsd schedule: decay_steps = {} must be > 0; set schedule.decay_steps",
                    decay_steps);
      const int64_t start = total_steps - decay_steps;
      if (step < start) return base_lr;
      const double q = std::clamp(double(step - start) / double(decay_steps), 0.0, 1.0);
      double f = 1.0 - q;
      if (decay_shape == DecayShape::Cosine) f = 0.5 * (1.0 + std::cos(M_PI * q));
      if (decay_shape == DecayShape::Sqrt) f = 1.0 - std::sqrt(q);
      return min_lr + (base_lr - min_lr) * f;
    }
  }
  return base_lr;
}

}  // namespace brigade::optim
