// Dtype conversion between the floating dtypes (the rounding rules: ops.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// A fresh contiguous tensor of dtype dt (any floating dtype) with x's values converted as
// the contract above says; a same-dtype cast is a copy. x may be a strided view.
Tensor cast(const Tensor& x, DType dt);

}  // namespace brigade::ops
