// Internal to ops/cpu: the loads and stores of the native 16-bit kernels (implemented in
// cpu/cast.cpp with the vectorised conversions of cast, so bitwise the scalar definitions of
// core/dtype.h: 16-bit values are widened exactly into small f32 buffers, the f32 arithmetic
// runs there, results are rounded once on the way out), the piece and row walks built on them,
// and the parallel thresholds that several kernel files share. The loads and stores are serial.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "brigade/ops/cpu/kernels.h"

namespace brigade::ops::cpu {

// Below these many elements a kernel stays serial: elementwise maps, sums and gathers; row
// kernels (norms, softmax, losses), whose rows carry more work per element.
constexpr int64_t kMapParallelMin = 1 << 15;
constexpr int64_t kRowParallelMin = 1 << 14;
// Elements per piece of the 16-bit piece walks (per-thread f32 buffers on the stack).
constexpr int64_t kPiece = 1024;

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

// ---- f32 views of rows in any floating dtype, for kernels that widen pieces of 16-bit rows

// 16-bit (or f32) values seen as f32: f32 is read in place, bf16 and f16 are widened exactly
// into a buffer (cpu::load_f32, the conversions of ops::cast), so the arithmetic below is the
// f32 kernel's on the same values and a 16-bit input gives bitwise the widened result.
inline const float* f32_view(DType dt, const void* p, int64_t off, int64_t n, float* buf) {
  if (dt == DType::F32) return static_cast<const float*>(p) + off;
  cpu::load_f32(dt, n, static_cast<const char*>(p) + size_t(off) * dtype_size(dt), buf);
  return buf;
}
// Where a result of n values at element offset off goes: in place for f32, else a buffer that
// store_out then rounds once into dt.
inline float* f32_out(DType dt, void* p, int64_t off, float* buf) {
  return dt == DType::F32 ? static_cast<float*>(p) + off : buf;
}
inline void store_out(DType dt, void* p, int64_t off, int64_t n, const float* buf) {
  if (dt != DType::F32) cpu::store_f32(dt, n, buf, static_cast<char*>(p) + size_t(off) * dtype_size(dt));
}
// A per-thread scratch row of n floats, for 16-bit rows only (f32 rows are read in place).
inline std::vector<float> scratch_row(DType dt, int64_t n) {
  return std::vector<float>(dt == DType::F32 ? 0 : static_cast<size_t>(n));
}

// 16-bit rows are widened kWidenChunk channels at a time (a stack buffer; each channel's arithmetic
// is independent of the chunking).
constexpr int64_t kWidenChunk = 256;

// f(c0, n, ...) on the channel chunks [c0, c0 + n) of row r (C channels per row).
template <class F>
inline void for_chunks(int64_t C, F&& f) {
  for (int64_t c0 = 0; c0 < C; c0 += kWidenChunk) f(c0, std::min(kWidenChunk, C - c0));
}

// acc[0:w] += the logical elements [i0, i0 + w) of x: contiguous bf16 is widened in the loop
// (a shift), anything else through the buffer t (w floats).
inline void accumulate(const Strided& x, bool contig, int64_t i0, int64_t w, float* acc, float* t) {
  if (contig && x.dt == DType::BF16) {
    const uint16_t* h = static_cast<const uint16_t*>(x.p) + i0;
#pragma omp simd
    for (int64_t c = 0; c < w; ++c) acc[c] += bf16_to_float(h[c]);
    return;
  }
  if (contig)
    load_f32(x.dt, w, static_cast<const char*>(x.p) + size_t(i0) * dtype_size(x.dt), t);
  else
    gather_f32(x, i0, w, t);
#pragma omp simd
  for (int64_t c = 0; c < w; ++c) acc[c] += t[c];
}

inline float row_max(int64_t C, const float* x) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t c = 0; c < C; ++c) m = std::max(m, x[c]);
  return m;
}

// For each of the N rows of C elements: row n of every input widened into per-thread f32
// buffers, row(n, inputs..., out) computing the f32 output row, which is stored rounded to
// dtype ot at row n of y. Parallel over rows above kRowParallelMin elements, static schedule.
template <typename Row, typename... In>
void map_rows16(int64_t N, int64_t C, DType ot, void* y, Row row, const In&... in) {
  constexpr size_t K = sizeof...(In);
  const size_t eo = dtype_size(ot);
#pragma omp parallel if (N * C > kRowParallelMin)
  {
    std::vector<float> buf(static_cast<size_t>((K + 1) * C));
    float* out = buf.data() + K * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      size_t k = 0;
      (gather_f32(in, n * C, C, buf.data() + (k++) * C), ...);
      [&]<size_t... I>(std::index_sequence<I...>) { row(n, (buf.data() + I * C)..., out); }
      (std::make_index_sequence<K>{});
      store_f32(ot, C, out, static_cast<char*>(y) + size_t(n * C) * eo);
    }
  }
}

}  // namespace brigade::ops::cpu
