// Non-finite and spiking steps; see step_guard.h.
#include "brigade/train/step_guard.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"
#include "brigade/core/json_number.h"

namespace brigade::train {

double spike_zscore(const std::deque<double>& w, double x) {
  if (w.empty()) return 0.0;
  double mean = 0.0;
  for (double v : w) mean += v;
  mean /= double(w.size());
  double var = 0.0;
  for (double v : w) var += (v - mean) * (v - mean);
  var /= double(w.size());
  const double sd = std::sqrt(var);
  return sd > 0.0 ? (x - mean) / sd : 0.0;
}

StepGuard::StepGuard(const TrainConfig& t) : policy_(t.nonfinite), zscore_(t.spike_zscore), window_(t.spike_window) {}

StepGuard::Verdict StepGuard::skip(int64_t step, std::string reason) {
  ++skipped_;
  if (++consecutive_ > kMaxConsecutiveSkips)
    return {Action::Stop, fmt::format("{} ({} steps in a row skipped up to step {}: the weights have probably "
                                      "diverged; train.nonfinite = \"rollback\" goes back to the last checkpoint)",
                                      reason, consecutive_, step)};
  return {Action::Skip, std::move(reason)};
}

StepGuard::Verdict StepGuard::nonfinite(int64_t step, const std::string& what, double value) {
  const std::string reason = fmt::format("{} {}", what, value);
  if (policy_ == "skip") return skip(step, reason);
  if (policy_ == "rollback") return {Action::Rollback, reason};
  return {Action::Stop, reason};
}

StepGuard::Verdict StepGuard::check_loss(int64_t step, double loss) {
  if (marked(step)) return skip(step, "rolled back from before");
  if (!std::isfinite(loss)) return nonfinite(step, "loss", loss);
  return {};
}

StepGuard::Verdict StepGuard::check_update(int64_t step, double loss, double grad_norm) {
  if (!std::isfinite(grad_norm)) return nonfinite(step, "grad_norm", grad_norm);
  std::string spike;
  if (zscore_ > 0.0 && int64_t(losses_.size()) == window_) {
    const double zl = spike_zscore(losses_, loss), zg = spike_zscore(norms_, grad_norm);
    if (zl > zscore_)
      spike = fmt::format("loss spike ({:.4f}, z = {:.1f} over the last {} steps)", loss, zl, window_);
    else if (zg > zscore_)
      spike = fmt::format("grad_norm spike ({:.4g}, z = {:.1f} over the last {} steps)", grad_norm, zg, window_);
  }
  if (zscore_ > 0.0) {  // every finite value enters, the outliers too
    losses_.push_back(loss);
    norms_.push_back(grad_norm);
    if (int64_t(losses_.size()) > window_) {
      losses_.pop_front();
      norms_.pop_front();
    }
  }
  if (!spike.empty()) return skip(step, spike);
  consecutive_ = 0;
  return {};
}

std::string StepGuard::state() const {
  if (losses_.empty() && marked_.empty() && consecutive_ == 0) return "";
  nlohmann::json j{
      {"losses", losses_}, {"grad_norms", norms_}, {"rolled_back", marked_}, {"consecutive_skips", consecutive_}};
  return j.dump();
}

void StepGuard::set_state(const std::string& text) {
  losses_.clear();
  norms_.clear();
  marked_.clear();
  consecutive_ = 0;
  if (text.empty()) return;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    for (double v : j.at("losses")) losses_.push_back(v);
    for (double v : j.at("grad_norms")) norms_.push_back(v);
    // whole numbers, checked (get<int64_t> of a float such as 1e300 is undefined behaviour)
    auto whole = [&](const nlohmann::json& v, const char* field) {
      const std::optional<int64_t> n = json_int64(v);
      BRIGADE_CHECK(n, CheckpointError,
                    "the step guard's state in state.json is malformed: \"{}\" holds {}, not a "
                    "whole number; the checkpoint is damaged: resume from another one",
                    field, v.dump());
      return *n;
    };
    for (const nlohmann::json& s : j.at("rolled_back")) marked_.insert(whole(s, "rolled_back"));
    consecutive_ = whole(j.at("consecutive_skips"), "consecutive_skips");
    BRIGADE_CHECK(losses_.size() == norms_.size() && consecutive_ >= 0, CheckpointError,
                  "inconsistent windows ({} losses, {} norms)", losses_.size(), norms_.size());
    // a run of more than kMaxConsecutiveSkips skips ends the run, so no saved state holds more
    // (a larger count would also overflow when the next skip adds one)
    BRIGADE_CHECK(consecutive_ <= kMaxConsecutiveSkips + 1, CheckpointError,
                  "the step guard's state in state.json is malformed: {} consecutive skips, more than the {} that "
                  "end a run; the checkpoint is damaged: resume from another one",
                  consecutive_, kMaxConsecutiveSkips);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("the step guard's state ({}) is malformed: {}", text.substr(0, 80), e.what()));
  }
  // a window shorter than before keeps the newest values
  while (int64_t(losses_.size()) > window_) {
    losses_.pop_front();
    norms_.pop_front();
  }
}

}  // namespace brigade::train
