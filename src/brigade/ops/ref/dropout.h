// Scalar oracle of dropout's apply step (ops/dropout.h).
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// Dropout apply (Srivastava et al. 2014, inverted): y = x * mask, elementwise, contiguous.
template <typename S>
void dropout_apply(int64_t n, const S* x, const S* mask, S* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * mask[i];
}

}  // namespace brigade::ops::ref
