// StepGuard (train/step_guard.h) on constructed sequences: the verdict of each policy for a
// non-finite loss or gradient norm, spike detection against a window whose mean and standard
// deviation are worked out by hand, the run-of-skips limit, steps marked by a rollback, and the
// state's round trip (a resumed guard decides as the uninterrupted one).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "brigade/core/error.h"
#include "brigade/train/step_guard.h"

using namespace brigade;
using namespace brigade::train;
using Action = StepGuard::Action;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

TrainConfig config(const std::string& policy, double z = 0.0, int64_t window = 100) {
  TrainConfig t;
  t.nonfinite = policy;
  t.spike_zscore = z;
  t.spike_window = window;
  return t;
}

TEST(StepGuard, ZScoreIsThePopulationStandardScore) {
  // 1 2 3 4: mean 2.5, variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
  const std::deque<double> w{1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(spike_zscore(w, 5.0), 2.5 / std::sqrt(1.25));
  EXPECT_DOUBLE_EQ(spike_zscore(w, 2.5), 0.0);
  EXPECT_DOUBLE_EQ(spike_zscore({3, 3, 3}, 100.0), 0.0);  // no spread: nothing is an outlier
}

TEST(StepGuard, EachPolicyOnANonFiniteLossOrNorm) {
  for (const auto& [policy, action] :
       {std::pair{"stop", Action::Stop}, {"skip", Action::Skip}, {"rollback", Action::Rollback}}) {
    SCOPED_TRACE(policy);
    StepGuard g(config(policy));
    EXPECT_EQ(g.check_loss(1, 2.0).action, Action::Apply);
    EXPECT_EQ(g.check_update(1, 2.0, 1.0).action, Action::Apply);
    const StepGuard::Verdict a = g.check_loss(2, kNaN);
    EXPECT_EQ(a.action, action);
    EXPECT_EQ(a.reason, "loss nan");
    const StepGuard::Verdict b = g.check_update(3, 2.0, kInf);
    EXPECT_EQ(b.action, action);
    EXPECT_EQ(b.reason, "grad_norm inf");
  }
}

TEST(StepGuard, MoreThanTenSkipsInARowStop) {
  StepGuard g(config("skip"));
  for (int64_t s = 1; s <= StepGuard::kMaxConsecutiveSkips; ++s) EXPECT_EQ(g.check_loss(s, kNaN).action, Action::Skip);
  EXPECT_EQ(g.check_update(11, 1.0, 1.0).action, Action::Apply);  // an applied step ends the run of skips
  for (int64_t s = 12; s < 12 + StepGuard::kMaxConsecutiveSkips; ++s)
    EXPECT_EQ(g.check_loss(s, kNaN).action, Action::Skip);
  const StepGuard::Verdict v = g.check_loss(22, kNaN);
  EXPECT_EQ(v.action, Action::Stop);
  EXPECT_NE(v.reason.find("11 steps in a row skipped up to step 22"), std::string::npos) << v.reason;
  EXPECT_EQ(g.skipped(), 21);
}

TEST(StepGuard, SpikeAboveTheWindowIsSkippedAndStillEntersIt) {
  StepGuard g(config("stop", /*z=*/2.0, /*window=*/4));
  // losses 1 2 3 4 (norms constant 1): no verdict before the window is full
  for (int s = 1; s <= 4; ++s) EXPECT_EQ(g.check_update(s, double(s), 1.0).action, Action::Apply);
  // z of 5 against {1,2,3,4} = 2.236 > 2: skipped (not stopped: spikes skip under every policy)
  const StepGuard::Verdict v = g.check_update(5, 5.0, 1.0);
  EXPECT_EQ(v.action, Action::Skip);
  EXPECT_NE(v.reason.find("loss spike"), std::string::npos) << v.reason;
  EXPECT_NE(v.reason.find("z = 2.2"), std::string::npos) << v.reason;
  // the window is now {2,3,4,5}: 5.5 has z = 2 / sqrt(1.25) = 1.79, accepted
  EXPECT_EQ(g.check_update(6, 5.5, 1.0).action, Action::Apply);
  // a gradient-norm spike: norms {1,1,1,1} have no spread; add spread, then an outlier
  StepGuard n(config("skip", 3.0, 4));
  for (double x : {1.0, 1.1, 0.9, 1.0}) EXPECT_EQ(n.check_update(1, 2.0, x).action, Action::Apply);
  const StepGuard::Verdict gv = n.check_update(5, 2.0, 10.0);
  EXPECT_EQ(gv.action, Action::Skip);
  EXPECT_NE(gv.reason.find("grad_norm spike"), std::string::npos) << gv.reason;
}

TEST(StepGuard, MarkedStepsAreSkippedOnReplay) {
  StepGuard g(config("rollback"));
  g.mark_rolled_back(7);
  EXPECT_EQ(g.check_loss(6, 1.0).action, Action::Apply);
  const StepGuard::Verdict v = g.check_loss(7, 1.0);  // a finite loss, skipped all the same
  EXPECT_EQ(v.action, Action::Skip);
  EXPECT_EQ(v.reason, "rolled back from before");
}

TEST(StepGuard, StateRoundTripDecidesAsTheUninterruptedGuard) {
  const TrainConfig t = config("skip", 1.5, 3);
  StepGuard a(t), b(t);
  const double losses[] = {3.0, 2.9, 2.8, 2.75, 9.0, 2.7, 2.6, 20.0};
  for (int s = 0; s < 4; ++s) a.check_update(s + 1, losses[s], 1.0 + 0.1 * s);
  a.check_loss(5, kNaN);  // a skip in progress travels too
  a.mark_rolled_back(12);
  b.set_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  for (int s = 4; s < 8; ++s) {
    const StepGuard::Verdict va = a.check_update(s + 1, losses[s], 1.0), vb = b.check_update(s + 1, losses[s], 1.0);
    EXPECT_EQ(va.action, vb.action) << s;
    EXPECT_EQ(va.reason, vb.reason) << s;
  }
  EXPECT_EQ(b.check_loss(12, 1.0).action, Action::Skip);
  EXPECT_TRUE(StepGuard(t).state().empty());  // nothing to keep for a fresh guard
  StepGuard c(t);
  EXPECT_THROW(c.set_state("{\"losses\": [1], \"grad_norms\": []"), CheckpointError);
  EXPECT_THROW(c.set_state("{\"losses\": [1], \"grad_norms\": [], \"rolled_back\": [], \"consecutive_skips\": 0}"),
               CheckpointError);
}

// The state's step numbers are whole numbers, checked: a float such as 1e300 reached an int64_t
// conversion (undefined behaviour) when state.json was damaged (found writing its fuzz target, tests/fuzz).
TEST(StepGuard, AStateWithAFractionalOrHugeStepIsACheckpointError) {
  StepGuard g(config("skip", 1.5, 3));
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    try {
      g.set_state(text);
      ADD_FAILURE() << "no error; wanted one containing: " << needle;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"losses": [1], "grad_norms": [1], "rolled_back": [1e300], "consecutive_skips": 0})",
               "\"rolled_back\" holds 1e+300, not a whole number");
  expect_error(R"({"losses": [1], "grad_norms": [1], "rolled_back": [3], "consecutive_skips": 2.5})",
               "\"consecutive_skips\" holds 2.5, not a whole number");
  // a count that no run reaches (and that the next skip would overflow)
  expect_error(R"({"losses": [1], "grad_norms": [1], "rolled_back": [3], "consecutive_skips": 9223372036854775807})",
               "9223372036854775807 consecutive skips, more than the 10 that end a run");
  g.set_state(R"({"losses": [1], "grad_norms": [1], "rolled_back": [3.0], "consecutive_skips": 0})");
  EXPECT_TRUE(g.marked(3));
}

}  // namespace
