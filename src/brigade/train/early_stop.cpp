// Early-stopping decision; see early_stop.h.
#include "brigade/train/early_stop.h"

#include <cmath>

#include "brigade/core/error.h"

namespace brigade::train {

EarlyStopper::EarlyStopper(int64_t patience, double min_delta, EarlyStopState state)
    : patience_(patience), min_delta_(min_delta), state_(state) {
  BRIGADE_CHECK(patience >= 1, ValueError,
                "early stopping: patience = {} must be >= 1 evaluation; set "
                "train.patience to a positive value",
                patience);
  BRIGADE_CHECK(min_delta >= 0 && std::isfinite(min_delta), ValueError,
                "early stopping: min_delta = {} must be a finite number >= 0; set train.min_delta to e.g. 0",
                min_delta);
}

EarlyStopper::Verdict EarlyStopper::observe(int64_t step, double val_loss) {
  const bool first = state_.best_step == 0;
  if (!std::isnan(val_loss) && (first || val_loss < state_.best_val_loss - min_delta_)) {
    state_.best_step = step;
    state_.best_val_loss = val_loss;
    state_.evals_since_best = 0;
    return Verdict::Improved;
  }
  if (first) return Verdict::NoImprovement;  // NaN before any real evaluation: nothing to count against
  ++state_.evals_since_best;
  return state_.evals_since_best >= patience_ ? Verdict::Stop : Verdict::NoImprovement;
}

}  // namespace brigade::train
