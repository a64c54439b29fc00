// Bulk dtype conversions (ops::cast on the cpu backend), bitwise equal to the scalar
// conversions of core/dtype.h (the definition; ref::cast applies them one at a time):
//   f32 -> bf16  AVX512-BF16 vcvtneps2bf16 (round to nearest even; NaN -> (bits >> 16) | 0x40,
//                the quiet NaN of float_to_bf16). The instruction treats f32 denormal inputs
//                as zero, while float_to_bf16 keeps them (as bf16 denormals), so lanes holding
//                an f32 denormal are redone with the integer rounding of float_to_bf16.
//                Without AVX512-BF16 the integer rounding is used for every lane.
//   f32 -> f16   vcvtps2ph with _MM_FROUND_TO_NEAREST_INT (IEEE: f16 denormals kept, >= 65520
//                -> Inf, NaN -> quiet NaN with the top mantissa bits kept, as float_to_f16).
//   bf16 -> f32  zero-extend and shift left by 16 (exact).
//   f16 -> f32   vcvtph2ps (exact, denormals included; signalling NaN made quiet as f16_to_float).
//   bf16 <-> f16 through f32 in blocks (exactly the scalar float_to_X(Y_to_float(v))).
// Builds without AVX-512 (BRIGADE_NATIVE=OFF on an older host) use the scalar functions.
// Contiguous inputs are converted in fixed chunks (OpenMP above kParallelMin elements);
// strided inputs row by row over the last dim. Every output element depends only on its
// input element, so results are independent of the thread count.
// GCC 12's AVX-512 headers build their "undefined" pass-through vectors from
// self-initialised locals, which -Wmaybe-uninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define BRIGADE_CVT_AVX512 1
#endif

namespace brigade::ops::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 16;  // below this many elements, stay serial
constexpr int64_t kChunk = 1 << 13;        // elements per parallel work item (contiguous path)

#ifdef BRIGADE_CVT_AVX512
// float_to_bf16 on 16 lanes with integer arithmetic: (u + 0x7fff + lsb) >> 16, NaN -> (u >> 16) | 0x40.
inline __m256i bf16_round_int(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i au = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(au, _mm512_set1_epi32(0x7f800000));
  const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}

inline __m256i bf16_from_f32x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
#ifdef __AVX512BF16__
  __m256i r = (__m256i)_mm512_cvtneps_pbh(v);
  const __m512i au = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  // Nonzero f32 denormals: the instruction flushes them, float_to_bf16 does not.
  const __mmask16 den = _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(au, au), au, _mm512_set1_epi32(0x00800000));
  if (den) r = _mm256_mask_blend_epi16(den, r, bf16_round_int(u));
  return r;
#else
  return bf16_round_int(u);
#endif
}

// The other 16-lane conversions: f32 -> f16 (vcvtps2ph, round to nearest even), bf16 -> f32
// (zero-extend, shift left by 16), f16 -> f32 (vcvtph2ps).
inline __m256i f16_from_f32x16(__m512 v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline __m512 f32_from_bf16x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 f32_from_f16x16(__m256i h) { return _mm512_cvtph_ps(h); }

// 16 lanes of f32 or of 16-bit values loaded or stored, all of them or those in mask m.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m256i load16(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i load16(const uint16_t* p, __mmask16 m) { return _mm256_maskz_loadu_epi16(m, p); }
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline void store16(uint16_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
inline void store16(uint16_t* p, __m256i v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, v); }
#define BRIGADE_CVT_LANES(f) f
#else
#define BRIGADE_CVT_LANES(f) nullptr  // no 16-lane form: the scalar loop only
#endif

// The loop of the four conversions: 16 lanes at a time through lanes(), then the tail as one
// masked block; without AVX-512, scalar() on every element (the definition, core/dtype.h).
template <auto scalar, class In, class Out, class Lanes>
void convert_loop(int64_t n, const In* x, Out* y, Lanes lanes) {
  int64_t i = 0;
#ifdef BRIGADE_CVT_AVX512
  for (; i + 16 <= n; i += 16) store16(y + i, lanes(load16(x + i)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1u);
    store16(y + i, lanes(load16(x + i, m)), m);
    return;
  }
#endif
  for (; i < n; ++i) y[i] = scalar(x[i]);
}

void f32_to_bf16(int64_t n, const float* x, uint16_t* y) {
  convert_loop<float_to_bf16>(n, x, y, BRIGADE_CVT_LANES(bf16_from_f32x16));
}
void f32_to_f16(int64_t n, const float* x, uint16_t* y) {
  convert_loop<float_to_f16>(n, x, y, BRIGADE_CVT_LANES(f16_from_f32x16));
}
void bf16_to_f32(int64_t n, const uint16_t* x, float* y) {
  convert_loop<bf16_to_float>(n, x, y, BRIGADE_CVT_LANES(f32_from_bf16x16));
}
void f16_to_f32(int64_t n, const uint16_t* x, float* y) {
  convert_loop<f16_to_float>(n, x, y, BRIGADE_CVT_LANES(f32_from_f16x16));
}

// n contiguous elements, serial.
void convert_contig(DType from, DType to, int64_t n, const void* in, void* out) {
  if (from == to) {
    std::memcpy(out, in, size_t(n) * dtype_size(from));
    return;
  }
  if (from == DType::F32) {
    const float* x = static_cast<const float*>(in);
    if (to == DType::BF16) return f32_to_bf16(n, x, static_cast<uint16_t*>(out));
    return f32_to_f16(n, x, static_cast<uint16_t*>(out));
  }
  const uint16_t* h = static_cast<const uint16_t*>(in);
  auto widen = [from](int64_t m, const uint16_t* a, float* b) {
    if (from == DType::BF16)
      bf16_to_f32(m, a, b);
    else
      f16_to_f32(m, a, b);
  };
  if (to == DType::F32) return widen(n, h, static_cast<float*>(out));
  // bf16 <-> f16 through a float block.
  constexpr int64_t kB = 512;
  float buf[kB];
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; i += kB) {
    const int64_t m = std::min(kB, n - i);
    widen(m, h + i, buf);
    if (to == DType::BF16)
      f32_to_bf16(m, buf, o + i);
    else
      f32_to_f16(m, buf, o + i);
  }
}

}  // namespace

// ---------------------------------------------------------------- helpers of the native 16-bit kernels (io16.h)

void load_f32(DType dt, int64_t n, const void* in, float* out) {
  if (n <= 0) return;
  switch (dt) {
    case DType::F32: std::memcpy(out, in, size_t(n) * 4); return;
    case DType::BF16: return bf16_to_f32(n, static_cast<const uint16_t*>(in), out);
    default: return f16_to_f32(n, static_cast<const uint16_t*>(in), out);
  }
}

void load_f32_strided(DType dt, int64_t n, const void* in, int64_t s, float* out) {
  if (s == 1) return load_f32(dt, n, in, out);
  if (n <= 0) return;
  if (dt == DType::F32) {
    const float* x = static_cast<const float*>(in);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i * s];
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(in);
  if (s == 0) {
    std::fill(out, out + n, dt == DType::BF16 ? bf16_to_float(h[0]) : f16_to_float(h[0]));
    return;
  }
  if (dt == DType::BF16)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(h[i * s]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_float(h[i * s]);
}

void store_f32(DType dt, int64_t n, const float* in, void* out) {
  if (n <= 0) return;
  switch (dt) {
    case DType::F32: std::memcpy(out, in, size_t(n) * 4); return;
    case DType::BF16: return f32_to_bf16(n, in, static_cast<uint16_t*>(out));
    default: return f32_to_f16(n, in, static_cast<uint16_t*>(out));
  }
}

void store_f32_strided(DType dt, int64_t n, const float* in, void* out, int64_t s) {
  if (s == 1) return store_f32(dt, n, in, out);
  if (dt == DType::F32) {
    float* y = static_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) y[i * s] = in[i];
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(out);
  if (dt == DType::BF16)
    for (int64_t i = 0; i < n; ++i) h[i * s] = float_to_bf16(in[i]);
  else
    for (int64_t i = 0; i < n; ++i) h[i * s] = float_to_f16(in[i]);
}

bool Strided::contiguous() const { return nd == 0 || is_contig(nd, shape, st); }

void gather_f32(const Strided& x, int64_t i0, int64_t m, float* out) {
  const size_t es = dtype_size(x.dt);
  const char* p = static_cast<const char*>(x.p);
  if (x.contiguous()) return load_f32(x.dt, m, p + size_t(i0) * es, out);
  const int64_t inner = x.shape[x.nd - 1], s = x.st[x.nd - 1];
  int64_t r = i0 / inner, c = i0 % inner;
  while (m > 0) {
    const int64_t k = std::min(m, inner - c);
    load_f32_strided(x.dt, k, p + size_t(row_offset(r, x.nd, x.shape, x.st) + c * s) * es, s, out);
    out += k;
    m -= k;
    ++r;
    c = 0;
  }
}

void cast(DType from, DType to, int nd, const int64_t* shape, const void* in, const int64_t* si, void* out) {
  const int64_t n = ref::numel_of(nd, shape);
  if (n == 0) return;
  const size_t ei = dtype_size(from), eo = dtype_size(to);
  const char* ip = static_cast<const char*>(in);
  char* op = static_cast<char*>(out);
  if (nd == 0 || is_contig(nd, shape, si)) {
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i0 = c * kChunk, m = std::min(kChunk, n - i0);
      convert_contig(from, to, m, ip + size_t(i0) * ei, op + size_t(i0) * eo);
    }
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner, is = si[nd - 1];
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const char* ir = ip + size_t(row_offset(r, nd, shape, si)) * ei;
    char* orow = op + size_t(r * inner) * eo;
    if (is == 1) {
      convert_contig(from, to, inner, ir, orow);
    } else {
      const int64_t one = 1;  // element by element through the scalar definition
      for (int64_t i = 0; i < inner; ++i)
        ref::cast(from, to, 1, &one, ir + size_t(i * is) * ei, &one, orow + size_t(i) * eo);
    }
  }
}

}  // namespace brigade::ops::cpu
