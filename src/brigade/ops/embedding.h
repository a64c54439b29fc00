// Embedding lookup: ids (...) i32/i64, weight (V, C) -> (..., C).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// Ids outside [0, V) are a ValueError naming the id and V.
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor embedding_backward(const Tensor& gy, const Tensor& ids, int64_t V);  // (V, C)

}  // namespace brigade::ops
