// Loss scaling for low-precision gradients (Micikevicius et al. 2018, "Mixed
// Precision Training"; torch.cuda.amp.GradScaler numerics for `dynamic`).
// The trainer multiplies the loss by scale() before the backward, so small
// gradients stay representable in fp16; unscale_() then divides the fp32
// gradients by the scale and, in the same pass, looks for Inf/NaN; every rank
// agrees on the result (a max-allreduce of UnscaleResult) and update() decides:
// skip the optimizer step on overflow and adjust the scale.
//   none      scale 1, nothing checked (bf16 has fp32's range and needs no scaling)
//   static    fixed scale; an overflowing step is skipped, the scale never moves
//   dynamic   start at init_scale; x growth after growth_interval clean steps in a
//             row; x backoff on an overflow (the step is skipped); within [min, max]
//   adaptive  dynamic with hysteresis (k overflows in a row are tolerated: skipped
//             without backing off; the (k+1)-th and later back off) and growth to a target set from
//             the observed gradient magnitudes: after growth_interval clean steps the
//             scale jumps to the largest power of two at which the largest gradient
//             seen in that interval stays kHeadroom below the dtype's max finite value.
// State (scale, counters) is saved in checkpoints as a JSON string (state()).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::amp {

enum class ScaleMode : uint8_t { None, Static, Dynamic, Adaptive };
std::string_view scale_mode_name(ScaleMode m);
ScaleMode scale_mode_from_name(std::string_view s);  // ValueError naming the accepted values

struct LossScalerOptions {
  ScaleMode mode = ScaleMode::None;
  double init_scale = 65536.0;     // static: the scale; dynamic/adaptive: the start (2^16)
  double growth = 2.0;             // dynamic: factor after growth_interval clean steps
  double backoff = 0.5;            // factor on overflow
  int64_t growth_interval = 1000;  // clean steps in a row before growing
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
  int64_t hysteresis = 2;         // adaptive: consecutive overflows tolerated before backing off (k)
  DType dtype = DType::F16;       // adaptive: whose max finite value the target keeps clear of
};

// Adaptive growth keeps the largest observed (unscaled) gradient x scale this far below
// the dtype's largest finite value: room for activation gradients, which can be larger.
inline constexpr double kHeadroom = 256.0;

struct UnscaleResult {
  double found_inf = 0.0;  // 1 when any gradient element was Inf or NaN (max-reduce across ranks)
  double amax = 0.0;       // largest |gradient| after unscaling (max-reduce across ranks)
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions o = {});

  bool enabled() const { return o_.mode != ScaleMode::None; }
  ScaleMode mode() const { return o_.mode; }
  double scale() const { return scale_; }  // 1 when disabled

  // Multiplies every gradient by 1 / scale() and checks each element for Inf/NaN in the
  // same pass (this rank's gradients: whole parameters or ZeRO shards). Gradients must be
  // contiguous f32 (InternalError otherwise); undefined ones are skipped. Deterministic.
  UnscaleResult unscale_(const std::vector<Tensor>& grads) const;

  // After every rank agreed on `r`: updates the scale and counters; true = skip this step.
  bool update(const UnscaleResult& r);

  // Totals since the run started (they travel in checkpoints).
  int64_t overflows() const { return overflows_; }
  int64_t skipped() const { return skipped_; }

  std::string state() const;                // JSON
  void set_state(const std::string& json);  // "" keeps the initial state; CheckpointError on bad JSON

 private:
  LossScalerOptions o_;
  double scale_ = 1.0;
  int64_t good_ = 0;    // clean steps in a row since the last change of scale
  int64_t streak_ = 0;  // overflows in a row
  int64_t overflows_ = 0;
  int64_t skipped_ = 0;
  double window_amax_ = 0;  // adaptive: largest unscaled |gradient| since the last change of scale
};

// The largest finite value of a floating dtype (f16: 65504).
double max_finite(DType dt);

}  // namespace brigade::amp
