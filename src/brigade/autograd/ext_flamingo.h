// Differentiable functions for Flamingo (models/flamingo), beside autograd/functions.h and with
// its conventions. tanh records one node on the existing raw op ops::tanh (its op-harness case
// is in tests/ops/test_ops.cpp); concat only moves values (a copy into two slices of a fresh
// tensor), so it needs no raw op of its own. Their rules are checked against finite
// differences in tests/models/test_flamingo.cpp.
#pragma once
#include "brigade/autograd/functions.h"

namespace brigade::fn {

// torch.tanh, elementwise (amp::Op::Elementwise, like sigmoid). Flamingo's gates tanh(alpha).
// Backward: g (1 - y^2), from the output (saved detached).
Tensor tanh(const Tensor& x);

// torch.cat([a, b], dim): a and b agree in every dim but `dim` (negative counts from the end);
// the result is a fresh contiguous tensor. Moves values: runs in the inputs' dtype (inputs of
// two floating dtypes are promoted to f32 with recorded casts). Backward: each input gets its
// slice of the gradient (an input that wants no gradient gets none computed).
Tensor concat(const Tensor& a, const Tensor& b, int64_t dim);

}  // namespace brigade::fn
