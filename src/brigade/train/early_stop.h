// Early stopping (train.early_stop): the decision alone, fed one val loss per
// evaluation, so it is testable on a constructed sequence. The trainer saves the
// best model to <run.out_dir>/best on `Improved` and stops on `Stop`.
//
// Rule (Keras-style): an evaluation improves when it is the first one or when
// val_loss < best_val_loss - min_delta; it then becomes the best and the count of
// evaluations without improvement resets to 0. Otherwise the count grows by one,
// and the verdict is `Stop` once it reaches `patience`. A NaN val loss never improves.
// The state travels in checkpoints (state.json), so a resumed run decides exactly as
// an uninterrupted one.
#pragma once
#include <cstdint>

namespace brigade::train {

struct EarlyStopState {
  int64_t best_step = 0;         // step of the best evaluation; 0 = none yet
  double best_val_loss = 0.0;    // meaningful when best_step > 0
  int64_t evals_since_best = 0;  // evaluations without improvement since the best
  bool operator==(const EarlyStopState&) const = default;
};

class EarlyStopper {
 public:
  enum class Verdict { Improved, NoImprovement, Stop };

  // patience >= 1 evaluations, min_delta >= 0 (ValueError otherwise).
  EarlyStopper(int64_t patience, double min_delta, EarlyStopState state = {});

  // The evaluation at `step` gave `val_loss`.
  Verdict observe(int64_t step, double val_loss);
  // True once the count of evaluations without improvement has reached patience
  // (e.g. a checkpoint saved at the stop, resumed with the same patience).
  bool exhausted() const { return state_.best_step > 0 && state_.evals_since_best >= patience_; }

  const EarlyStopState& state() const { return state_; }
  int64_t patience() const { return patience_; }
  double min_delta() const { return min_delta_; }

 private:
  int64_t patience_;
  double min_delta_;
  EarlyStopState state_;
};

}  // namespace brigade::train
