// The scalar oracle's shared pieces. The oracle (ops/ref/<family>.h) is plain scalar loops over
// raw pointers + sizes + strides, the in-repo reference that ops/cpu is tested against:
// templates over the scalar type S (float for the Ref backend, double for the finite-difference
// path of the op harness). Never optimised: clarity over speed. Accumulation: the core ops
// (elementwise, reduce, gemm, embedding, layer norm, attention, cross-entropy) sum in S; the
// convolution, batch-norm, pooling, spatial-mean and smoothed cross-entropy kernels sum in
// double whatever S (so ref<float> and ref<double> differ there only by input/output
// rounding). Gradient convention: every *_backward kernel writes (=) its outputs; nothing
// accumulates into caller memory except axpy (documented as +=).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "brigade/core/dtype.h"

namespace brigade::ops::ref {

enum class BinaryOp { Add, Sub, Mul, Div };
enum class UnaryOp { Neg, Exp, Log, Tanh, Sqrt, AddScalar, MulScalar };

// Offset of the linear (row-major) index i of an nd-shape under the given strides.
inline int64_t strided_offset(int64_t i, int nd, const int64_t* shape, const int64_t* strides) {
  int64_t off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    const int64_t n = shape[d];
    off += (i % n) * strides[d];
    i /= n;
  }
  return off;
}
inline int64_t numel_of(int nd, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < nd; ++d) n *= shape[d];
  return n;
}

}  // namespace brigade::ops::ref
