// Optimised f32 elementwise kernels, reductions, GELU, embedding and dropout
// (maths and conventions in ops/ref/kernels.h). Contiguous fast paths are flat
// `omp parallel for simd` loops; strided inputs go row by row over the last dim.
// Determinism: static schedules, and every reduction sums in a fixed order
// (fixed-size blocks combined serially), independent of the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/cpu/vec_math.h"

namespace brigade::ops::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // below this many elements, stay serial

bool is_contig(int nd, const int64_t* shape, const int64_t* st) {
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
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner;
  const int64_t ia = sa[nd - 1], ib = sb[nd - 1];
#pragma omp parallel for schedule(static) if (n > kParallelMin)
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
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i]);
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner, ia = sa[nd - 1];
#pragma omp parallel for schedule(static) if (n > kParallelMin)
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
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) dst[i] += al * src[i];
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner, id = sd[nd - 1], is = ss[nd - 1];
#pragma omp parallel for schedule(static) if (n > kParallelMin)
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
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) dst[i] *= sf;
    return;
  }
  const int64_t inner = shape[nd - 1], rows = n / inner, id = sd[nd - 1];
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + row_offset(r, nd, shape, sd);
    for (int64_t i = 0; i < inner; ++i) d[i * id] *= sf;
  }
}

void column_sum(int64_t N, int64_t C, const float* x, float* out) {
  // Column chunks of kW are independent; within a chunk rows are summed in order.
  constexpr int64_t kW = 64;
  const int64_t nchunks = (C + kW - 1) / kW;
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t c0 = ch * kW, w = std::min(kW, C - c0);
    float acc[kW] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) acc[c] += xr[c];
    }
    for (int64_t c = 0; c < w; ++c) out[c0 + c] = acc[c];
  }
}

namespace {
// Sum of term(i) over [0, n) in fixed blocks of kBlock (each summed with a fixed
// SIMD split), the block sums then added serially: the order never depends on threads.
template <typename Acc, typename Term>
Acc blocked_sum(int64_t n, Term term) {
  constexpr int64_t kBlock = 4096;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<Acc> part(static_cast<size_t>(nb));
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
    Acc s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) s += term(i);
    part[size_t(b)] = s;
  }
  Acc s = 0;
  for (Acc p : part) s += p;
  return s;
}
}  // namespace

void reduce_sum(int nd, const int64_t* shape, const float* in, const int64_t* si, float* out, const int64_t* so,
                int64_t out_numel) {
  const int64_t n = ref::numel_of(nd, shape);
  if (n == 0 || out_numel == 0) {
    std::fill(out, out + out_numel, 0.f);
    return;
  }
  if (is_contig(nd, shape, si)) {
    if (out_numel == 1) {
      out[0] = blocked_sum<float>(n, [in](int64_t i) { return in[i]; });
      return;
    }
    // Split dims into a reduced prefix / kept suffix or a kept prefix / reduced suffix.
    int p = 0;
    while (p < nd && (so[p] == 0 || shape[p] == 1)) ++p;
    int64_t lead = 1;
    for (int d = 0; d < p; ++d) lead *= shape[d];
    bool suffix_kept = true;
    for (int d = p; d < nd; ++d) suffix_kept &= (so[d] != 0 || shape[d] == 1);
    if (suffix_kept) {  // (lead, rest) -> (rest): column sums
      column_sum(lead, n / lead, in, out);
      return;
    }
    int q = nd;
    while (q > 0 && (so[q - 1] == 0 || shape[q - 1] == 1)) --q;
    bool prefix_kept = true;
    for (int d = 0; d < q; ++d) prefix_kept &= (so[d] != 0 || shape[d] == 1);
    if (prefix_kept) {  // (rows, inner) -> (rows): row sums
      int64_t inner = 1;
      for (int d = q; d < nd; ++d) inner *= shape[d];
      const int64_t rows = n / inner;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
      for (int64_t r = 0; r < rows; ++r) {
        float s = 0.f;
        const float* x = in + r * inner;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < inner; ++i) s += x[i];
        out[r] = s;
      }
      return;
    }
  }
  ref::reduce_sum<float>(nd, shape, in, si, out, so, out_numel);
}

double sum_squares(int nd, const int64_t* shape, const float* in, const int64_t* si) {
  const int64_t n = ref::numel_of(nd, shape);
  if (!(nd == 0 || is_contig(nd, shape, si))) return ref::sum_squares<float>(nd, shape, in, si);
  return blocked_sum<double>(n, [in](int64_t i) { return double(in[i]) * double(in[i]); });
}

// ---------------------------------------------------------------- GELU (tanh approximation)

void gelu(int64_t n, const float* x, float* y) {
  const float k = 0.7978845608028654f, a = 0.044715f;
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    y[i] = 0.5f * xi * (1.0f + fast_tanh(k * (xi + a * xi * xi * xi)));
  }
}

void gelu_backward(int64_t n, const float* gy, const float* x, float* gx) {
  // d/dx [0.5 x (1 + tanh(u))] = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2)
  const float k = 0.7978845608028654f, a = 0.044715f;
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float t = fast_tanh(k * (xi + a * xi * xi * xi));
    gx[i] = gy[i] * (0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * k * (1.0f + 3.0f * a * xi * xi));
  }
}

// ---------------------------------------------------------------- embedding

namespace {
template <typename T>
void embedding_rows(int64_t N, int64_t C, const T* w, int64_t swv, int64_t swc, const int64_t* ids, T* y) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* wr = w + ids[n] * swv;
    T* yr = y + n * C;
    if (swc == 1)
      std::copy(wr, wr + C, yr);
    else
      for (int64_t c = 0; c < C; ++c) yr[c] = wr[c * swc];
  }
}
}  // namespace

void embedding(int64_t N, int64_t C, const float* w, int64_t swv, int64_t swc, const int64_t* ids, float* y) {
  embedding_rows(N, C, w, swv, swc, ids, y);
}

void embedding16(int64_t N, int64_t C, const uint16_t* w, int64_t swv, int64_t swc, const int64_t* ids, uint16_t* y) {
  embedding_rows(N, C, w, swv, swc, ids, y);
}

void embedding_backward(int64_t N, int64_t C, int64_t V, const float* gy, const int64_t* ids, float* gw) {
  // Backward of `y[n, c] = w[ids[n], c]`. Each thread owns a disjoint column range and
  // scatters every row n in order: no races, the same sum order for any thread count.
  const int64_t total = V * C;
#pragma omp parallel for simd schedule(static) if (total > kParallelMin)
  for (int64_t i = 0; i < total; ++i) gw[i] = 0.f;
  constexpr int64_t kW = 16;
  const int64_t nchunks = (C + kW - 1) / kW;
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t c0 = ch * kW, c1 = std::min(C, c0 + kW);
    for (int64_t n = 0; n < N; ++n) {
      float* g = gw + ids[n] * C;
      const float* s = gy + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) g[c] += s[c];
    }
  }
}

// ---------------------------------------------------------------- dropout

void dropout_apply(int64_t n, const float* x, const float* mask, float* y) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * mask[i];
}

}  // namespace brigade::ops::cpu
