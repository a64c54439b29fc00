// Reductions: sums and means over dims, the sum of squares, softmax over the last dim and
// the spatial mean of NCHW planes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor sum_all(const Tensor& a);      // 0-d
double sum_squares(const Tensor& a);  // sum of a^2 in double (for global-norm clipping)
// Caching-allocator workspace (MemTag::Workspace) the cpu kernel of sum_squares takes over n
// contiguous f32 elements (once), for memory planning.
int64_t sum_squares_workspace(int64_t n);

// ---------------- softmax over the last dim
Tensor softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& gy, const Tensor& y);

// ---------------- spatial mean: x (N, C, H, W) -> the mean over (H, W) of each plane,
// (N, C), or (N, C, 1, 1) with keepdim (torch's x.mean((2, 3), keepdim)). Summed in double
// in plane order. Its backward: gx (x_shape) = gy / (H W) over each plane; gy (N, C) or
// (N, C, 1, 1).
Tensor spatial_mean(const Tensor& x, bool keepdim = false);
Tensor spatial_mean_backward(const Tensor& gy, const Shape& x_shape);

}  // namespace brigade::ops
