// Inverted dropout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/core/tensor.h"

namespace brigade::ops {

// ---------------- dropout (inverted): mask holds 0 or 1/(1-p), drawn from gen in
// element order; y = x * mask. p = 0 returns x's values and an all-ones mask.
struct DropoutOut {
  Tensor y, mask;
};
DropoutOut dropout(const Tensor& x, double p, Generator& gen);
Tensor dropout_backward(const Tensor& gy, const Tensor& mask);

}  // namespace brigade::ops
