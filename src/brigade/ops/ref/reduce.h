// Scalar oracle of the reductions (ops/reduce.h): strided sums, sum of squares, softmax over
// rows and the spatial mean of planes.
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// Sum reduction: out[so . idx] += in[si . idx] over every idx of `shape` (so has
// stride 0 on the reduced dims). out (out_numel, contiguous) is zeroed first.
// Accumulation order: row-major order of the input index space.
template <typename S>
void reduce_sum(int nd, const int64_t* shape, const S* in, const int64_t* si, S* out, const int64_t* so,
                int64_t out_numel) {
  for (int64_t i = 0; i < out_numel; ++i) out[i] = S(0);
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i) out[strided_offset(i, nd, shape, so)] += in[strided_offset(i, nd, shape, si)];
}

// sum of in^2, accumulated in double.
template <typename S>
double sum_squares(int nd, const int64_t* shape, const S* in, const int64_t* si) {
  const int64_t n = numel_of(nd, shape);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = double(in[strided_offset(i, nd, shape, si)]);
    acc += x * x;
  }
  return acc;
}

// Softmax over rows of x (N, C) (torch.softmax(dim=-1)): y = exp(x - max) / sum exp(x - max).
template <typename S>
void softmax(int64_t N, int64_t C, const S* x, S* y) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S* yr = y + n * C;
    S m = -std::numeric_limits<S>::infinity();
    for (int64_t c = 0; c < C; ++c) m = std::max(m, xr[c]);
    S s = S(0);
    for (int64_t c = 0; c < C; ++c) s += (yr[c] = std::exp(xr[c] - m));
    for (int64_t c = 0; c < C; ++c) yr[c] /= s;
  }
}
// Backward of `y = softmax(x)`: gx = y * (gy - sum_c(gy * y)).
template <typename S>
void softmax_backward(int64_t N, int64_t C, const S* gy, const S* y, S* gx) {
  for (int64_t n = 0; n < N; ++n) {
    S d = S(0);
    for (int64_t c = 0; c < C; ++c) d += gy[n * C + c] * y[n * C + c];
    for (int64_t c = 0; c < C; ++c) gx[n * C + c] = y[n * C + c] * (gy[n * C + c] - d);
  }
}

// P planes of HW values: y[p] = sum of plane p (double, in order) / HW.
template <typename T>
void spatial_mean(int64_t P, int64_t HW, const T* x, T* y) {
  for (int64_t p = 0; p < P; ++p) {
    double s = 0;
    for (int64_t i = 0; i < HW; ++i) s += double(x[p * HW + i]);
    y[p] = T(s / double(HW));
  }
}
template <typename T>
void spatial_mean_backward(int64_t P, int64_t HW, const T* gy, T* gx) {
  for (int64_t p = 0; p < P; ++p) {
    const T g = T(double(gy[p]) / double(HW));
    for (int64_t i = 0; i < HW; ++i) gx[p * HW + i] = g;
  }
}

}  // namespace brigade::ops::ref
