// Differentiable vision functions (the fn:: side of ops/ext_vision.h): conv2d,
// batch_norm2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d (output size 1) and relu.
// Each runs its raw op and records one Node whose backward is the op's backward, as the
// rules in functions.cpp do. Precision: the active policy (amp/policy.h) decides the
// compute dtype: conv2d is amp::Op::Conv (a GEMM: low from O1, like linear), batch_norm2d
// amp::Op::BatchNorm (precision-sensitive: f32 under O1/O2, low at O3, like LayerNorm),
// max_pool2d / avg_pool2d amp::Op::Pool (elementwise rules), relu amp::Op::Elementwise,
// adaptive_avg_pool2d (a mean over the plane) amp::Op::Reduction; outside any AutocastScope
// (O0) they run in their inputs' dtype. Gradients come back in each input's own dtype
// (recorded casts, fn::cast), so fp32 parameters get fp32 gradients.
#pragma once
#include "brigade/core/tensor.h"

namespace brigade::fn {

// x (N, C, H, W), w (O, C, KH, KW), bias (O) or undefined -> (N, O, OH, OW).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding);
// x (N, C, H, W) -> (N, C, H, W). Training: batch statistics, and running_mean /
// running_var (f32 (C), may be undefined) updated in place with `momentum` (torch's rule);
// the backward differentiates through the batch statistics. Eval: the running statistics
// (required), an affine map. The running statistics are state, never differentiated, and
// are left alone while autograd::recomputing() (a checkpointed block re-run in the
// backward): they move once per real forward. conv2d is a GEMM for selective recompute:
// its output is kept (CheckpointKeep::GemmOutputs).
Tensor batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                    const Tensor& running_var, bool training, double momentum, double eps);
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);  // (N, C, OH, OW)
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);  // (N, C, OH, OW)
// torch.nn.AdaptiveAvgPool2d(1): the mean over (H, W); (N, C, H, W) -> (N, C, 1, 1).
Tensor adaptive_avg_pool2d(const Tensor& x);
Tensor relu(const Tensor& x);

}  // namespace brigade::fn
