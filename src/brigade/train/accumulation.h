// Gradient accumulation policy: how many micro-steps (of train.batch_size rows per
// rank) make optimizer step `step`.
//   static       train.accumulation every step
//   ramp         grows linearly from train.accumulation to train.accumulation_max
//                over train.ramp_steps steps (a pure function of the step)
//   noise_scale  grows towards the measured gradient noise scale (McCandlish et al.
//                2018, "An Empirical Model of Large-Batch Training", appendix A.1):
//                from the squared gradient norm of one micro-batch (B_small rows) and
//                of the whole step (B_big rows),
//                  |G|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
//                  S     = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
//                both smoothed by an exponential moving average, B_simple = S / |G|^2
//                (rows), and the accumulation becomes ceil(B_simple / rows per
//                micro-step over all ranks), never decreasing, within
//                [train.accumulation, train.accumulation_max].
// The noise-scale state travels in checkpoints (state()), so a resumed run makes the
// same decisions as an uninterrupted one.
#pragma once
#include <cstdint>
#include <string>

#include "brigade/train/config.h"

namespace brigade::train {

class AccumulationPolicy {
 public:
  // rows_per_micro: rows one micro-step covers over all ranks (batch_size x dp).
  AccumulationPolicy(const TrainConfig& t, int64_t rows_per_micro);
  int64_t at(int64_t step) const;
  bool measures_noise() const { return mode_ == Mode::NoiseScale; }
  // noise_scale: one step's measurement (squared L2 norms of the mean gradient over
  // b_small and b_big rows, b_small < b_big). Updates the accumulation of later steps.
  void observe(double g_small_sq, int64_t b_small, double g_big_sq, int64_t b_big);
  double noise_scale() const;  // smoothed B_simple in rows; 0 before any measurement
  std::string state() const;   // JSON, for state.json
  void set_state(const std::string& json);

 private:
  enum class Mode { Static, Ramp, NoiseScale } mode_;
  int64_t start_, max_, ramp_steps_, rows_per_micro_;
  double ema_;
  // noise_scale state
  int64_t current_;
  double ema_s_ = 0.0, ema_g_ = 0.0;
  int64_t observations_ = 0;
};

}  // namespace brigade::train
