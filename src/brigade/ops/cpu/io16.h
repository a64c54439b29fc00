// Loads and stores of the native 16-bit cpu kernels (implemented in cpu/convert.cpp with
// the same vectorised conversions as cast, so bitwise the scalar definitions of
// core/dtype.h): 16-bit (or f32) values are widened exactly into small f32 buffers, the
// f32 arithmetic runs there, and results are rounded once on the way out. All serial:
// the kernels call them inside their own parallel loops. Internal to ops/cpu.
#pragma once
#include <cstdint>

#include "brigade/ops/cpu/kernels.h"

namespace brigade::ops::cpu {

// out[0:n] = the n contiguous values of dtype dt at in, widened exactly.
void load_f32(DType dt, int64_t n, const void* in, float* out);
// The same with an element stride s (in elements; 0 repeats one value).
void load_f32_strided(DType dt, int64_t n, const void* in, int64_t s, float* out);
// The n values in[0:n] stored into dtype dt at out (contiguous / with element stride s),
// rounded once to nearest even (a copy when dt is f32).
void store_f32(DType dt, int64_t n, const float* in, void* out);
void store_f32_strided(DType dt, int64_t n, const float* in, void* out, int64_t s);
// out[0:m] = the logical elements [i0, i0 + m) of x (row-major over x.shape), widened.
void gather_f32(const Strided& x, int64_t i0, int64_t m, float* out);

// Stride walking shared by the elementwise and conversion kernels (shapes and strides
// in elements). True when the strides are row-major contiguous (size-1 dims ignored).
inline bool is_contig(int nd, const int64_t* shape, const int64_t* st) {
  int64_t acc = 1;
  for (int d = nd - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (st[d] != acc) return false;
    acc *= shape[d];
  }
  return true;
}

// Offset of row r (row-major over all dims but the last) under strides st.
inline int64_t row_offset(int64_t r, int nd, const int64_t* shape, const int64_t* st) {
  int64_t off = 0;
  for (int d = nd - 2; d >= 0; --d) {
    off += (r % shape[d]) * st[d];
    r /= shape[d];
  }
  return off;
}

}  // namespace brigade::ops::cpu
