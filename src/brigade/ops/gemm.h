// Matmul and the linear layer (oneDNN on the cpu backend, cached primitives).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// a (..., M, K) @ b (..., K, N) -> (..., M, N); batch dims broadcast; trans_a/trans_b
// transpose the last two dims of a/b first. 1-D inputs are not accepted.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// Weight layout of a linear layer: OutIn is torch.nn.Linear (out, in);
// InOut is Hugging Face GPT-2 Conv1D (in, out).
enum class WeightLayout { OutIn, InOut };
// y (..., out) = x (..., in) @ W (+ bias (out))
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout);
struct LinearGrads {
  Tensor gx, gw, gb;
};  // gb undefined when need_gb is false
LinearGrads linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, WeightLayout layout,
                            bool need_gx = true, bool need_gw = true, bool need_gb = true);

}  // namespace brigade::ops
