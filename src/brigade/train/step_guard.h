// What the trainer does with a step whose loss or gradient norm is non-finite or an outlier
// (train.nonfinite, train.spike_zscore, train.spike_window), as a decision alone, so it is
// testable on constructed sequences. The trainer calls decide() once per step with values every
// rank agrees on (the global loss and gradient norm), so every rank reaches the same verdict.
//
// - non-finite loss or gradient norm: "stop" ends the run with an error naming the step (the
//   default: the trainer's error says what to try); "skip" leaves weights and optimizer state untouched for that step
//   (the schedule and the data move on); "rollback" goes back to the last checkpoint and replays from there with that
//   step's batch skipped. More than kMaxConsecutiveSkips skipped steps in a row end the run (the weights themselves
//   have probably diverged: skipping cannot recover, a rollback can).
// - spike detection (train.spike_zscore > 0): once the last train.spike_window steps are known,
//   a step whose loss or gradient norm lies more than spike_zscore standard deviations above that
//   window's mean is skipped (llm.c's outlier rule). Every finite value enters the window, the
//   outliers too, so a lasting change of level is accepted after a while rather than skipped
//   forever.
// - steps marked skipped by a rollback are skipped when replayed, whatever their values.
// The state (windows, marked steps, the run of skips) travels in state.json, so a resumed run
// decides exactly as an uninterrupted one.
#pragma once
#include <cstdint>
#include <deque>
#include <set>
#include <string>

#include "brigade/train/config.h"

namespace brigade::train {

class StepGuard {
 public:
  enum class Action { Apply, Skip, Rollback, Stop };
  struct Verdict {
    Action action = Action::Apply;
    std::string reason;  // why, when not Apply: "loss nan", "grad_norm inf", "loss spike (z = 7.2)", ...
  };
  static constexpr int64_t kMaxConsecutiveSkips = 10;

  explicit StepGuard(const TrainConfig& t);

  // Step `step` (1-based) has this global loss (agreed by every rank), before its update: Skip or
  // Rollback when the step was rolled back from before or its loss is not finite (Stop under
  // train.nonfinite = "stop"); Apply means "go on to check_update".
  Verdict check_loss(int64_t step, double loss);
  // The same step's global gradient norm, before the optimizer runs: a non-finite norm or a spike
  // of the loss or the norm. Stop under "stop", or after too many skips in a row.
  Verdict check_update(int64_t step, double loss, double grad_norm);
  // A rollback was made from `step`: its replay skips that step's batch.
  void mark_rolled_back(int64_t step) { marked_.insert(step); }
  bool marked(int64_t step) const { return marked_.count(step) > 0; }

  std::string state() const;                    // JSON text for state.json ("" when there is nothing to keep)
  void set_state(const std::string& text);      // "" = fresh; CheckpointError when malformed
  int64_t skipped() const { return skipped_; }  // steps skipped by this guard so far (this process)

 private:
  Verdict nonfinite(int64_t step, const std::string& what, double value);
  Verdict skip(int64_t step, std::string reason);  // counts the run of skips

  std::string policy_;
  double zscore_;
  int64_t window_;
  std::deque<double> losses_, norms_;  // the last `window_` finite values
  std::set<int64_t> marked_;           // steps rolled back from
  int64_t consecutive_ = 0;            // skipped steps in a row
  int64_t skipped_ = 0;
};

// z-score of x against the values of w (population standard deviation); 0 when they are all equal.
double spike_zscore(const std::deque<double>& w, double x);

}  // namespace brigade::train
