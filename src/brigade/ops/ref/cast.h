// Scalar oracle of dtype conversion (ops/cast.h).
#pragma once
#include "brigade/core/dtype.h"
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// Dtype conversion (ops::cast) between floating dtypes: out (contiguous, dtype `to`) = in (dtype
// `from`, read through strides), one element at a time with the scalar conversions of
// core/dtype.h, which define the rounding (nearest-even; NaN stays quiet NaN; Inf and
// denormals preserved; f16 overflow to Inf). Same dtype: a bit copy. Not a template: the
// element types are runtime dtypes.
inline float load_float(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
inline void store_float(DType dt, void* p, int64_t i, float v) {
  switch (dt) {
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}
inline void cast(DType from, DType to, int nd, const int64_t* shape, const void* in, const int64_t* si, void* out) {
  const int64_t n = numel_of(nd, shape);
  const size_t esz = dtype_size(from);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t off = strided_offset(i, nd, shape, si);
    if (from == to)
      std::memcpy(static_cast<char*>(out) + size_t(i) * esz, static_cast<const char*>(in) + size_t(off) * esz, esz);
    else
      store_float(to, out, i, load_float(from, in, off));
  }
}

}  // namespace brigade::ops::ref
