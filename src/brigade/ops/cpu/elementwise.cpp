// Elementwise kernels: binary and unary maps, axpy / scale, GELU, SiLU and ReLU, f32 and native
// 16-bit (oracle: ops/ref/elementwise.h). Contiguous inputs: flat `omp parallel for simd` loops;
// strided: row by row over the last dim, or in pieces through f32 buffers for 16-bit operands.
#include <algorithm>
#include <cmath>
#include <vector>

#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/vec_math.h"

#if defined(__AVX512F__) && defined(BRIGADE_HAVE_LIBMVEC)
#include <immintrin.h>
// glibc's libmvec (>= 2.35): 16-lane AVX-512 erff / expf (the vector ABI names GCC emits for
// `#pragma omp declare simd` math; within 4 ulp, like the scalar functions).
extern "C" __m512 _ZGVeN16v_erff(__m512);
extern "C" __m512 _ZGVeN16v_expf(__m512);
#define BRIGADE_GELU_AVX512 1
#endif

namespace brigade::ops::cpu {

namespace {

template <typename F>
void binary_impl(F f, int nd, const int64_t* shape, const float* a, const int64_t* sa, const float* b,
                 const int64_t* sb, float* out) {
  const int64_t n = ref::numel_of(nd, shape);
  if (n == 0) return;
  if (nd == 0) {
    out[0] = f(a[0], b[0]);
    return;
  }
  if (is_contig(nd, shape, sa) && is_contig(nd, shape, sb)) {
#pragma omp parallel for simd schedule(static) if (n > kMapParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner;
  const int64_t ia = sa[nd - 1], ib = sb[nd - 1];
#pragma omp parallel for schedule(static) if (n > kMapParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + row_offset(r, nd, shape, sa);
    const float* br = b + row_offset(r, nd, shape, sb);
    float* o = out + r * inner;
    if (ia == 1 && ib == 1) {
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) o[i] = f(ar[i], br[i]);
    } else if (ia == 1 && ib == 0) {
      const float bv = br[0];
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) o[i] = f(ar[i], bv);
    } else if (ia == 0 && ib == 1) {
      const float av = ar[0];
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) o[i] = f(av, br[i]);
    } else {
      for (int64_t i = 0; i < inner; ++i) o[i] = f(ar[i * ia], br[i * ib]);
    }
  }
}

template <typename F>
void unary_impl(F f, int nd, const int64_t* shape, const float* a, const int64_t* sa, float* out) {
  const int64_t n = ref::numel_of(nd, shape);
  if (n == 0) return;
  if (nd == 0 || is_contig(nd, shape, sa)) {
#pragma omp parallel for simd schedule(static) if (n > kMapParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i]);
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner, ia = sa[nd - 1];
#pragma omp parallel for schedule(static) if (n > kMapParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + row_offset(r, nd, shape, sa);
    float* o = out + r * inner;
    for (int64_t i = 0; i < inner; ++i) o[i] = f(ar[i * ia]);
  }
}

}  // namespace

void binary(BinaryOp op, int nd, const int64_t* shape, const float* a, const int64_t* sa, const float* b,
            const int64_t* sb, float* out) {
  switch (op) {
    case BinaryOp::Add: return binary_impl([](float x, float y) { return x + y; }, nd, shape, a, sa, b, sb, out);
    case BinaryOp::Sub: return binary_impl([](float x, float y) { return x - y; }, nd, shape, a, sa, b, sb, out);
    case BinaryOp::Mul: return binary_impl([](float x, float y) { return x * y; }, nd, shape, a, sa, b, sb, out);
    case BinaryOp::Div: return binary_impl([](float x, float y) { return x / y; }, nd, shape, a, sa, b, sb, out);
  }
}

void unary(UnaryOp op, double s, int nd, const int64_t* shape, const float* a, const int64_t* sa, float* out) {
  const float sf = float(s);
  switch (op) {
    case UnaryOp::Neg: return unary_impl([](float x) { return -x; }, nd, shape, a, sa, out);
    case UnaryOp::Exp: return unary_impl([](float x) { return std::exp(x); }, nd, shape, a, sa, out);
    case UnaryOp::Log: return unary_impl([](float x) { return std::log(x); }, nd, shape, a, sa, out);
    case UnaryOp::Tanh: return unary_impl([](float x) { return std::tanh(x); }, nd, shape, a, sa, out);
    case UnaryOp::Sqrt: return unary_impl([](float x) { return std::sqrt(x); }, nd, shape, a, sa, out);
    case UnaryOp::AddScalar: return unary_impl([sf](float x) { return x + sf; }, nd, shape, a, sa, out);
    case UnaryOp::MulScalar: return unary_impl([sf](float x) { return x * sf; }, nd, shape, a, sa, out);
  }
}

void axpy(int nd, const int64_t* shape, float* dst, const int64_t* sd, const float* src, const int64_t* ss,
          double alpha) {
  const int64_t n = ref::numel_of(nd, shape);
  const float al = float(alpha);
  if (n == 0) return;
  if (nd == 0 || (is_contig(nd, shape, sd) && is_contig(nd, shape, ss))) {
#pragma omp parallel for simd schedule(static) if (n > kMapParallelMin)
    for (int64_t i = 0; i < n; ++i) dst[i] += al * src[i];
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner, id = sd[nd - 1], is = ss[nd - 1];
#pragma omp parallel for schedule(static) if (n > kMapParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + row_offset(r, nd, shape, sd);
    const float* s = src + row_offset(r, nd, shape, ss);
    if (id == 1 && is == 1) {
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) d[i] += al * s[i];
    } else {
      for (int64_t i = 0; i < inner; ++i) d[i * id] += al * s[i * is];
    }
  }
}

void scale(int nd, const int64_t* shape, float* dst, const int64_t* sd, double s) {
  const int64_t n = ref::numel_of(nd, shape);
  const float sf = float(s);
  if (n == 0) return;
  if (nd == 0 || is_contig(nd, shape, sd)) {
#pragma omp parallel for simd schedule(static) if (n > kMapParallelMin)
    for (int64_t i = 0; i < n; ++i) dst[i] *= sf;
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner, id = sd[nd - 1];
#pragma omp parallel for schedule(static) if (n > kMapParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + row_offset(r, nd, shape, sd);
    for (int64_t i = 0; i < inner; ++i) d[i * id] *= sf;
  }
}

// ---------------------------------------------------------------- GELU (tanh approximation)

namespace {
// One element of each (shared by the f32 and the native 16-bit kernels).
inline float gelu1(float xi) {
  const float k = 0.7978845608028654f, a = 0.044715f;
  return 0.5f * xi * (1.0f + fast_tanh(k * (xi + a * xi * xi * xi)));
}
// d/dx [0.5 x (1 + tanh(u))] = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2)
inline float gelu_grad1(float g, float xi) {
  const float k = 0.7978845608028654f, a = 0.044715f;
  const float t = fast_tanh(k * (xi + a * xi * xi * xi));
  return g * (0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * k * (1.0f + 3.0f * a * xi * xi));
}
}  // namespace

void gelu(int64_t n, const float* x, float* y) {
#pragma omp parallel for simd schedule(static) if (n > kMapParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = gelu1(x[i]);
}

void gelu_backward(int64_t n, const float* gy, const float* x, float* gx) {
#pragma omp parallel for simd schedule(static) if (n > kMapParallelMin)
  for (int64_t i = 0; i < n; ++i) gx[i] = gelu_grad1(gy[i], x[i]);
}

// ---------------------------------------------------------------- native 16-bit kernels (see kernels.h)

namespace {
thread_local bool t_native16 = true;
}  // namespace

bool native16_enabled() { return t_native16; }
Native16Scope::Native16Scope(bool on) : prev_(t_native16) { t_native16 = on; }
Native16Scope::~Native16Scope() { t_native16 = prev_; }

namespace {

// The pieces of an elementwise op over the logical shape of its operands (one or two views
// of one shape): size-1 dims dropped, and neighbouring dims merged wherever every operand
// steps through them as one dim (so a contiguous operand set is one flat row, and a row
// broadcast over leading dims gives long rows); then the rows of the last merged dim, each
// cut into pieces of at most kPiece elements. The output (contiguous) of piece (r, c0)
// starts at r * inner + c0.
struct Walk {
  int nops, nd = 0;
  std::vector<int64_t> shape, st[2];  // merged, outermost first; st[k]: operand k
  int64_t n, inner, rows, per_row;
  Walk(const Strided& a, const Strided* b) : nops(b ? 2 : 1) {
    const Strided* ops[2] = {&a, b};
    n = ref::numel_of(a.nd, a.shape);
    for (int d = a.nd - 1; d >= 0; --d) {  // innermost first, reversed at the end
      if (a.shape[d] == 1) continue;
      bool merge = nd > 0;
      for (int k = 0; k < nops && merge; ++k) merge = ops[k]->st[d] == shape.back() * st[k].back();
      if (merge) {
        shape.back() *= a.shape[d];
        continue;
      }
      shape.push_back(a.shape[d]);
      for (int k = 0; k < nops; ++k) st[k].push_back(ops[k]->st[d]);
      ++nd;
    }
    if (nd == 0) {  // one element
      shape.push_back(1);
      for (int k = 0; k < nops; ++k) st[k].push_back(1);
      nd = 1;
    }
    std::reverse(shape.begin(), shape.end());
    for (int k = 0; k < nops; ++k) std::reverse(st[k].begin(), st[k].end());
    inner = shape.back();
    rows = inner ? n / inner : 0;
    per_row = (inner + kPiece - 1) / kPiece;
  }
  int64_t offset(int k, int64_t r, int64_t c0) const {
    return row_offset(r, nd, shape.data(), st[k].data()) + c0 * st[k].back();
  }
  int64_t stride(int k) const { return st[k].back(); }
};

// Runs body(r, c0, m) on every piece, in parallel above kMapParallelMin elements (static split).
template <typename Body>
void for_pieces(const Walk& w, Body body) {
  if (w.n == 0) return;
  const int64_t items = w.rows * w.per_row;
#pragma omp parallel for schedule(static) if (w.n > kMapParallelMin)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t r = it / w.per_row, c0 = (it % w.per_row) * kPiece;
    body(r, c0, std::min(kPiece, w.inner - c0));
  }
}

// The f32 values of piece (r, c0, m) of operand k (x): read in place when x is f32 with unit
// stride, else widened into buf.
inline const float* load_piece(const Strided& x, const Walk& w, int k, int64_t r, int64_t c0, int64_t m, float* buf) {
  const int64_t s = w.stride(k);
  const char* p = static_cast<const char*>(x.p) + size_t(w.offset(k, r, c0)) * dtype_size(x.dt);
  if (x.dt == DType::F32 && s == 1) return reinterpret_cast<const float*>(p);
  load_f32_strided(x.dt, m, p, s, buf);
  return buf;
}

// out (contiguous, dtype ot) = f(a) or f(a, b) per element, through f32 buffers.
template <typename F>
void map1(F f, const Strided& a, DType ot, void* out) {
  const Walk w(a, nullptr);
  char* o = static_cast<char*>(out);
  const size_t eo = dtype_size(ot);
  for_pieces(w, [&](int64_t r, int64_t c0, int64_t m) {
    alignas(64) float ba[kPiece], bo[kPiece];
    const float* x = load_piece(a, w, 0, r, c0, m, ba);
    char* op = o + size_t(r * w.inner + c0) * eo;
    float* z = ot == DType::F32 ? reinterpret_cast<float*>(op) : bo;
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) z[i] = f(x[i]);
    if (ot != DType::F32) store_f32(ot, m, bo, op);
  });
}

template <typename F>
void map2(F f, const Strided& a, const Strided& b, DType ot, void* out) {
  const Walk w(a, &b);
  char* o = static_cast<char*>(out);
  const size_t eo = dtype_size(ot);
  for_pieces(w, [&](int64_t r, int64_t c0, int64_t m) {
    alignas(64) float ba[kPiece], bb[kPiece], bo[kPiece];
    const float* x = load_piece(a, w, 0, r, c0, m, ba);
    const float* y = load_piece(b, w, 1, r, c0, m, bb);
    char* op = o + size_t(r * w.inner + c0) * eo;
    float* z = ot == DType::F32 ? reinterpret_cast<float*>(op) : bo;
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) z[i] = f(x[i], y[i]);
    if (ot != DType::F32) store_f32(ot, m, bo, op);
  });
}

// dst (strided, any floating dtype) updated in place by f(d) or f(d, s) through f32 buffers.
template <typename F>
void update(F f, const Strided& dst, const Strided* src) {
  const Walk w(dst, src);
  const size_t ed = dtype_size(dst.dt);
  for_pieces(w, [&](int64_t r, int64_t c0, int64_t m) {
    alignas(64) float bd[kPiece], bs[kPiece];
    const int64_t sd = w.stride(0);
    char* dp = const_cast<char*>(static_cast<const char*>(dst.p)) + size_t(w.offset(0, r, c0)) * ed;
    const bool direct = dst.dt == DType::F32 && sd == 1;
    float* d = direct ? reinterpret_cast<float*>(dp) : bd;
    if (!direct) load_f32_strided(dst.dt, m, dp, sd, bd);
    if (src) {
      const float* x = load_piece(*src, w, 1, r, c0, m, bs);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) d[i] = f(d[i], x[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) d[i] = f(d[i], 0.f);
    }
    if (!direct) store_f32_strided(dst.dt, m, bd, dp, sd);
  });
}

}  // namespace

void binary16(BinaryOp op, const Strided& a, const Strided& b, DType ot, void* out) {
  switch (op) {
    case BinaryOp::Add: return map2([](float x, float y) { return x + y; }, a, b, ot, out);
    case BinaryOp::Sub: return map2([](float x, float y) { return x - y; }, a, b, ot, out);
    case BinaryOp::Mul: return map2([](float x, float y) { return x * y; }, a, b, ot, out);
    case BinaryOp::Div: return map2([](float x, float y) { return x / y; }, a, b, ot, out);
  }
}

void relu(const Strided& x, float* y) {
  map1([](float v) { return (v > 0.f || v != v) ? v : 0.f; }, x, DType::F32, y);
}
void relu_backward(const Strided& gy, const Strided& y, float* gx) {
  map2([](float g, float v) { return v > 0.f ? g : 0.f; }, gy, y, DType::F32, gx);
}

void add_relu(const Strided& a, const Strided& b, DType ot, void* y) {
  map2([](float x, float z) { return (x + z > 0.f || x + z != x + z) ? x + z : 0.f; }, a, b, ot, y);
}

void unary16(UnaryOp op, double s, const Strided& a, DType ot, void* out) {
  const float sf = float(s);
  switch (op) {
    case UnaryOp::Neg: return map1([](float x) { return -x; }, a, ot, out);
    case UnaryOp::Exp: return map1([](float x) { return std::exp(x); }, a, ot, out);
    case UnaryOp::Log: return map1([](float x) { return std::log(x); }, a, ot, out);
    case UnaryOp::Tanh: return map1([](float x) { return std::tanh(x); }, a, ot, out);
    case UnaryOp::Sqrt: return map1([](float x) { return std::sqrt(x); }, a, ot, out);
    case UnaryOp::AddScalar: return map1([sf](float x) { return x + sf; }, a, ot, out);
    case UnaryOp::MulScalar: return map1([sf](float x) { return x * sf; }, a, ot, out);
  }
}

void axpy16(const Strided& dst, const Strided& src, double alpha) {
  const float al = float(alpha);
  update([al](float d, float x) { return d + al * x; }, dst, &src);
}

void scale16(const Strided& dst, double s) {
  const float sf = float(s);
  update([sf](float d, float) { return d * sf; }, dst, nullptr);
}

void gelu16(const Strided& x, DType ot, void* y) {
  map1([](float v) { return gelu1(v); }, x, ot, y);
}

void gelu_backward16(const Strided& gy, const Strided& x, DType ot, void* gx) {
  map2([](float g, float v) { return gelu_grad1(g, v); }, gy, x, ot, gx);
}

// Exact GELU and its backward.
// GELU (exact): 0.5 x (1 + erf(x / sqrt 2)). With AVX-512 and libmvec, 16 lanes at a time through
// the vector erff / expf (the scalar loop finishes the tail); the result differs from the scalar
// erff path by at most a few ulp (the op harness bounds both against the double oracle).
void gelu_erf(int64_t n, const float* x, float* y) {
  const float r = 0.7071067811865476f;
#ifdef BRIGADE_GELU_AVX512
  const int64_t nv = n / 16;
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t b = 0; b < nv; ++b) {
    const __m512 v = _mm512_loadu_ps(x + b * 16);
    const __m512 e = _ZGVeN16v_erff(_mm512_mul_ps(v, _mm512_set1_ps(r)));
    const __m512 h = _mm512_mul_ps(_mm512_set1_ps(0.5f), v);
    _mm512_storeu_ps(y + b * 16, _mm512_fmadd_ps(h, e, h));  // 0.5x + 0.5x erf
  }
  for (int64_t i = nv * 16; i < n; ++i) y[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * r));
#else
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * r));
#endif
}

// d/dx GELU = Phi(x) + x phi(x), times gy.
void gelu_erf_backward(int64_t n, const float* gy, const float* x, float* gx) {
  const float r = 0.7071067811865476f, c = 0.3989422804014327f;
  auto one = [&](int64_t i) {
    const float cdf = 0.5f * (1.f + std::erf(x[i] * r));
    const float pdf = c * std::exp(-0.5f * x[i] * x[i]);
    gx[i] = gy[i] * (cdf + x[i] * pdf);
  };
#ifdef BRIGADE_GELU_AVX512
  const int64_t nv = n / 16;
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t b = 0; b < nv; ++b) {
    const __m512 v = _mm512_loadu_ps(x + b * 16);
    const __m512 cdf = _mm512_fmadd_ps(_mm512_set1_ps(0.5f), _ZGVeN16v_erff(_mm512_mul_ps(v, _mm512_set1_ps(r))),
                                       _mm512_set1_ps(0.5f));
    const __m512 pdf =
        _mm512_mul_ps(_mm512_set1_ps(c), _ZGVeN16v_expf(_mm512_mul_ps(_mm512_set1_ps(-0.5f), _mm512_mul_ps(v, v))));
    _mm512_storeu_ps(gx + b * 16, _mm512_mul_ps(_mm512_loadu_ps(gy + b * 16), _mm512_fmadd_ps(v, pdf, cdf)));
  }
  for (int64_t i = nv * 16; i < n; ++i) one(i);
#else
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) one(i);
#endif
}

// SiLU and its backward.
void silu(int64_t n, const float* x, float* y) {
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 14))
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void silu_backward(int64_t n, const float* gy, const float* x, float* gx) {
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 14))
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-x[i]));
    gx[i] = gy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

// ReLU on 16-bit bit patterns, bitwise the widened definition (widening is exact and the result
// is one of the input's values or +0): for bits h, inf is the dtype's +Inf pattern, h & 0x7fff
// the magnitude; x > 0 when the sign is clear and the magnitude is nonzero and not NaN.
namespace {
inline bool bits_nan(uint16_t h, uint16_t inf) { return (h & 0x7fffu) > inf; }
inline bool bits_pos(uint16_t h, uint16_t inf) { return !(h & 0x8000u) && h != 0 && h <= inf; }
}  // namespace

uint16_t inf_bits(DType dt) { return dt == DType::BF16 ? 0x7f80u : 0x7c00u; }

// y = relu(x) (NaN passes) on n 16-bit values; gx = y > 0 ? gy : 0 on n 16-bit values.
void relu16(int64_t n, uint16_t inf, const uint16_t* x, uint16_t* y) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) y[i] = (bits_pos(x[i], inf) || bits_nan(x[i], inf)) ? x[i] : uint16_t(0);
}
void relu_backward16(int64_t n, uint16_t inf, const uint16_t* gy, const uint16_t* y, uint16_t* gx) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) gx[i] = bits_pos(y[i], inf) ? gy[i] : uint16_t(0);
}

}  // namespace brigade::ops::cpu
