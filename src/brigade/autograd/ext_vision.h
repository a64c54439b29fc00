// Differentiable vision functions (the fn:: side of ops/ext_vision.h): conv2d (also grouped /
// depthwise with padding per side), batch_norm2d, sync_batch_norm2d (statistics over a process
// group, through a reducer interface), max_pool2d, avg_pool2d, adaptive_avg_pool2d (output
// size 1), relu, sigmoid, spatial_mean and cross_entropy_smoothed (label smoothing).
// Each runs its raw op and records one Node whose backward is the op's backward, as the
// rules in functions.cpp do. Precision: the active policy (amp/policy.h) decides the
// compute dtype: conv2d is amp::Op::Conv (a GEMM: low from O1, like linear), batch_norm2d
// amp::Op::BatchNorm (precision-sensitive: f32 at O1; mixed at O2, its 16-bit input taken
// uncast and its output in that dtype, computed in f32 by the kernel; low at O3),
// max_pool2d / avg_pool2d amp::Op::Pool (elementwise rules), relu amp::Op::Elementwise,
// adaptive_avg_pool2d and spatial_mean (means over the plane) amp::Op::Reduction, sigmoid
// amp::Op::Elementwise (like relu; the squeeze-and-excitation gate x * sigmoid(s) is fn::mul,
// which broadcasts (N, C, 1, 1) over (N, C, H, W)), cross_entropy_smoothed
// amp::Op::CrossEntropy (f32 from O1, like cross_entropy); outside any AutocastScope
// (O0) they run in their inputs' dtype. Gradients come back in each input's own dtype
// (recorded casts, fn::cast), so fp32 parameters get fp32 gradients.
#pragma once
#include <cstdint>
#include <memory>

#include "brigade/core/tensor.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

// x (N, C, H, W), w (O, C, KH, KW), bias (O) or undefined -> (N, O, OH, OW). With
// p.channels_last, x (N, H, W, C) -> (N, OH, OW, O) (ops::Conv2dParams).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding);
// Grouped / depthwise, padding per side (ops::Conv2dParams): w (O, C / groups, KH, KW).
// conv2d(x, w, b, stride, padding) is this with Conv2dParams::symmetric(stride, padding).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const ops::Conv2dParams& p);
// x (N, C, H, W) -> (N, C, H, W). Training: batch statistics, and running_mean /
// running_var (f32 (C), may be undefined) updated in place with `momentum` (torch's rule);
// the backward differentiates through the batch statistics. Eval: the running statistics
// (required), an affine map. The running statistics are state, never differentiated, and
// are left alone while autograd::recomputing() (a checkpointed block re-run in the
// backward): they move once per real forward. conv2d is a GEMM for selective recompute:
// its output is kept (CheckpointKeep::GemmOutputs).
// channels_last: x is (N, H, W, C) (ops::batch_norm2d's channels-last form).
Tensor batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                    const Tensor& running_var, bool training, double momentum, double eps,
                    bool channels_last = false);

// Synchronised batch norm (torch.nn.SyncBatchNorm): the batch statistics of a training
// batch_norm2d taken over every rank of a group (data parallelism: each rank holds some rows
// of one global batch), not over this rank's rows. autograd knows no process groups: the
// reducer is an interface a plan implements (parallel/sync_batch_norm.h wraps a
// dist::ProcessGroup); a group of one is the identity.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // Sums `data` (n doubles) over the group's ranks, in place. Every rank calls it the same
  // number of times in the same order with the same n (once in each forward, once in each
  // backward of every synchronised batch norm; a recompute's forward calls it again, on every
  // rank alike).
  virtual void allreduce_sum(double* data, int64_t n) const = 0;
};

// Training batch norm with statistics over the group:
//   forward: per channel, this rank's count, sum x and sum x^2 (double) are summed over the
//     group (one allreduce of 2C + 1 doubles); mean = S1 / M and the biased variance
//     S2 / M - mean^2 over the global count M normalise x, y = (x - mean) rstd w + b;
//     running_mean / running_var (f32 (C), may be undefined) move with the global mean and
//     the unbiased global variance var M / (M - 1), as torch's SyncBatchNorm (not while
//     autograd::recomputing()).
//   backward: this rank's sum gy and sum gy xhat (double) are summed over the group (one
//     allreduce of 2C doubles) and gx = w rstd (gy - SG / M - xhat SGX / M): the gradient of
//     the SUM over ranks of every rank's loss with respect to this rank's rows, i.e. of one
//     batch norm over the global batch whose upstream gradient is every rank's gy.
//   Gradient convention for w and b: each rank gets its LOCAL part (sum gy xhat, sum gy
//     over its own rows); the full gradient is their sum over ranks. Data parallelism's
//     gradient reduction completes them with every other parameter: summed over ranks they
//     are the global-batch gradient; averaged (DDP's mean, with the per-rank losses being
//     means over equal local batches) they are the gradient of the global mean loss, exactly
//     like the conv weights upstream, whose gradients also come from this gx. (torch's
//     SyncBatchNorm does the same: local weight/bias gradients, DDP averages.)
// Precision: amp::Op::BatchNorm, like batch_norm2d; the sums are double whatever the dtype.
Tensor sync_batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                         const Tensor& running_var, double momentum, double eps,
                         const std::shared_ptr<const BatchNormSync>& sync);

// (N, C, OH, OW); channels_last: x (N, H, W, C) -> (N, OH, OW, C)
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool channels_last = false);
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);  // (N, C, OH, OW)
// torch.nn.AdaptiveAvgPool2d(1): the mean over (H, W); (N, C, H, W) -> (N, C, 1, 1).
Tensor adaptive_avg_pool2d(const Tensor& x);
Tensor relu(const Tensor& x);
// torch.sigmoid; the backward reads the output (saved detached): g y (1 - y).
Tensor sigmoid(const Tensor& x);
// torch.reciprocal, 1 / x; the backward reads the output (saved detached): -g y^2.
Tensor reciprocal(const Tensor& x);
// x (N, C, H, W) -> the mean over (H, W): (N, C), or (N, C, 1, 1) with keepdim.
Tensor spatial_mean(const Tensor& x, bool keepdim = false);
// torch's F.cross_entropy(logits (N, V), targets (N), ignore_index, label_smoothing=eps),
// the mean over the rows not ignored.
Tensor cross_entropy_smoothed(const Tensor& logits, const Tensor& targets, double eps, int64_t ignore_index = -100);

}  // namespace brigade::fn
