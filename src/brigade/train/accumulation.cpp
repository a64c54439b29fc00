// Gradient accumulation policy; see accumulation.h.
#include "brigade/train/accumulation.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"
#include "brigade/core/json_number.h"

namespace brigade::train {

AccumulationPolicy::AccumulationPolicy(const TrainConfig& t, int64_t rows_per_micro)
    : start_(t.accumulation),
      max_(t.accumulation_max > 0 ? t.accumulation_max : t.accumulation),
      ramp_steps_(t.ramp_steps),
      rows_per_micro_(rows_per_micro),
      ema_(t.noise_ema),
      current_(t.accumulation) {
  if (t.accumulation_mode == "static")
    mode_ = Mode::Static;
  else if (t.accumulation_mode == "ramp")
    mode_ = Mode::Ramp;
  else if (t.accumulation_mode == "noise_scale")
    mode_ = Mode::NoiseScale;
  else
    throw ConfigError(fmt::format("train.accumulation_mode = \"{}\": use \"static\", \"ramp\" or \"noise_scale\"",
                                  t.accumulation_mode));
}

int64_t AccumulationPolicy::at(int64_t step) const {
  switch (mode_) {
    case Mode::Static: return start_;
    case Mode::Ramp: {
      const double f = std::min(1.0, double(step) / double(std::max<int64_t>(ramp_steps_, 1)));
      return start_ + int64_t(std::floor(double(max_ - start_) * f));
    }
    case Mode::NoiseScale: return current_;
  }
  return start_;
}

void AccumulationPolicy::observe(double g_small_sq, int64_t b_small, double g_big_sq, int64_t b_big) {
  if (mode_ != Mode::NoiseScale) return;
  BRIGADE_ASSERT(b_small > 0 && b_big > b_small, "noise scale needs b_small < b_big ({} vs {})", b_small, b_big);
  const double bs = double(b_small), bb = double(b_big);
  const double g2 = (bb * g_big_sq - bs * g_small_sq) / (bb - bs);
  const double s = (g_small_sq - g_big_sq) / (1.0 / bs - 1.0 / bb);
  if (!std::isfinite(g2) || !std::isfinite(s)) return;
  if (observations_ == 0) {
    ema_s_ = s;
    ema_g_ = g2;
  } else {
    ema_s_ = ema_ * ema_s_ + (1.0 - ema_) * s;
    ema_g_ = ema_ * ema_g_ + (1.0 - ema_) * g2;
  }
  ++observations_;
  const double b_simple = noise_scale();
  if (b_simple > 0) {
    const int64_t want = int64_t(std::ceil(b_simple / double(rows_per_micro_)));
    current_ = std::clamp(std::max(current_, want), start_, max_);
  }
}

double AccumulationPolicy::noise_scale() const {
  if (observations_ == 0 || !(ema_g_ > 0)) return 0.0;
  return std::max(0.0, ema_s_ / ema_g_);
}

std::string AccumulationPolicy::state() const {
  return nlohmann::json{{"current", current_}, {"ema_s", ema_s_}, {"ema_g", ema_g_}, {"observations", observations_}}
      .dump();
}

void AccumulationPolicy::set_state(const std::string& text) {
  if (text.empty()) return;  // a checkpoint from before adaptive accumulation: start fresh
  try {
    auto j = nlohmann::json::parse(text);
    // whole numbers, checked (get<int64_t> of a float such as 1e300 is undefined behaviour)
    auto whole = [&](const char* field) {
      const std::optional<int64_t> n = json_int64(j.at(field));
      BRIGADE_CHECK(n && *n >= 0, CheckpointError,
                    "the accumulation state in state.json is corrupted: \"{}\" holds {}, not a whole number >= 0; "
                    "resume from another checkpoint",
                    field, j.at(field).dump());
      return *n;
    };
    current_ = std::clamp(whole("current"), start_, max_);
    ema_s_ = j.at("ema_s").get<double>();
    ema_g_ = j.at("ema_g").get<double>();
    observations_ = whole("observations");
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("the accumulation state in state.json is corrupted ({})", e.what()));
  }
}

}  // namespace brigade::train
