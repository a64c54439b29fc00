// Dropout kernel: y = x * mask, the mask drawn beforehand by the front-end (ops/dropout.cpp)
// serially from the Generator (oracle: ops/ref/dropout.h).
#include "brigade/ops/cpu/io16.h"

namespace brigade::ops::cpu {

void dropout_apply(int64_t n, const float* x, const float* mask, float* y) {
#pragma omp parallel for simd schedule(static) if (n > kMapParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * mask[i];
}

}  // namespace brigade::ops::cpu
