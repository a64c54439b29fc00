// Loss scalers; see loss_scaler.h.
#include "brigade/amp/loss_scaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "brigade/core/enum_names.h"
#include "brigade/core/error.h"
#include "brigade/core/json_number.h"

namespace brigade::amp {

// The names, indexed by ScaleMode.
constexpr std::string_view kScaleModeNames[] = {"none", "static", "dynamic", "adaptive"};

std::string_view scale_mode_name(ScaleMode m) { return enum_name(m, kScaleModeNames); }

ScaleMode scale_mode_from_name(std::string_view s) {
  return enum_from_name<ScaleMode>(s, kScaleModeNames, "loss-scaling mode",
                                   R"("none", "static", "dynamic" or "adaptive")");
}

double max_finite(DType dt) {
  switch (dt) {
    case DType::F16: return 65504.0;
    case DType::BF16: return 3.3895313892515355e38;
    default: return double(std::numeric_limits<float>::max());
  }
}

LossScaler::LossScaler(LossScalerOptions o) : o_(o) {
  if (o_.mode == ScaleMode::None) return;
  BRIGADE_CHECK(o_.init_scale > 0 && o_.min_scale > 0 && o_.min_scale <= o_.init_scale && o_.init_scale <= o_.max_scale,
                ValueError, "loss scaler: need 0 < min_scale <= init_scale <= max_scale, got {} <= {} <= {}",
                o_.min_scale, o_.init_scale, o_.max_scale);
  BRIGADE_CHECK(o_.growth > 1 && o_.backoff > 0 && o_.backoff < 1 && o_.growth_interval >= 1 && o_.hysteresis >= 1,
                ValueError,
                "loss scaler: need growth > 1, 0 < backoff < 1, growth_interval >= 1 and hysteresis >= 1, got {}, "
                "{}, {}, {}",
                o_.growth, o_.backoff, o_.growth_interval, o_.hysteresis);
  scale_ = o_.init_scale;
}

UnscaleResult LossScaler::unscale_(const std::vector<Tensor>& grads) const {
  UnscaleResult r;
  if (!enabled()) return r;
  const float inv = float(1.0 / scale_);
  int bad = 0;
  float amax = 0.0f;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    BRIGADE_CHECK(g.dtype() == DType::F32 && g.is_contiguous(), InternalError,
                  "unscale_: gradients must be contiguous f32, got {}", g.str());
    float* p = g.data<float>();
    const int64_t n = g.numel();
    // One pass: scale, and fold each element into the Inf/NaN flag and the max. x - x is
    // 0 for finite x and NaN for Inf and NaN, so `bad` catches both without a branch.
#pragma omp parallel for schedule(static) reduction(| : bad) reduction(max : amax) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const float v = p[i] * inv;
      p[i] = v;
      bad |= (v - v) != 0.0f;
      amax = std::max(amax, std::fabs(v));
    }
  }
  r.found_inf = bad ? 1.0 : 0.0;
  r.amax = bad ? 0.0 : double(amax);
  return r;
}

bool LossScaler::update(const UnscaleResult& r) {
  if (!enabled()) return false;
  if (r.found_inf > 0) {
    ++overflows_;
    ++skipped_;
    ++streak_;
    good_ = 0;
    const bool back_off = o_.mode == ScaleMode::Dynamic || (o_.mode == ScaleMode::Adaptive && streak_ > o_.hysteresis);
    if (back_off) {
      scale_ = std::max(scale_ * o_.backoff, o_.min_scale);
      window_amax_ = 0;
    }
    return true;
  }
  streak_ = 0;
  if (o_.mode == ScaleMode::Static) return false;
  ++good_;
  window_amax_ = std::max(window_amax_, r.amax);
  if (good_ < o_.growth_interval) return false;
  double next = scale_ * o_.growth;
  if (o_.mode == ScaleMode::Adaptive && window_amax_ > 0) {
    // the largest power of two s with window_amax * s * kHeadroom <= max finite
    const double target = std::exp2(std::floor(std::log2(max_finite(o_.dtype) / (window_amax_ * kHeadroom))));
    next = std::max(scale_, target);  // grows only; overflows bring it down
  }
  scale_ = std::clamp(next, o_.min_scale, o_.max_scale);
  good_ = 0;
  window_amax_ = 0;
  return false;
}

std::string LossScaler::state() const {
  if (!enabled()) return "";
  return nlohmann::json{
      {"mode", scale_mode_name(o_.mode)}, {"scale", scale_},     {"good_steps", good_},        {"streak", streak_},
      {"overflows", overflows_},          {"skipped", skipped_}, {"window_amax", window_amax_}}
      .dump();
}

void LossScaler::set_state(const std::string& json) {
  if (json.empty() || !enabled()) return;
  try {
    const auto j = nlohmann::json::parse(json);
    // whole numbers, checked (get<int64_t> of a float such as 1e300 is undefined behaviour)
    auto whole = [&](const char* field) {
      const std::optional<int64_t> n = json_int64(j.at(field));
      BRIGADE_CHECK(n && *n >= 0, CheckpointError,
                    "the loss-scaler state in state.json is malformed: \"{}\" holds {}, not a whole number >= 0; "
                    "the checkpoint is damaged: resume from another one",
                    field, j.at(field).dump());
      return *n;
    };
    scale_ = j.at("scale").get<double>();
    good_ = whole("good_steps");
    streak_ = whole("streak");
    overflows_ = whole("overflows");
    skipped_ = whole("skipped");
    window_amax_ = j.at("window_amax").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(
        fmt::format("the loss-scaler state in state.json is malformed ({}); the checkpoint is "
                    "damaged: resume from another one",
                    e.what()));
  }
  BRIGADE_CHECK(scale_ > 0 && std::isfinite(scale_), CheckpointError,
                "the loss-scaler state in state.json has scale {}; the checkpoint is damaged", scale_);
}

}  // namespace brigade::amp
