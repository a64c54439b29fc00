// Elementwise kernels, reductions, GELU, embedding and dropout (oracles: ops/ref/<family>.h).
// Contiguous inputs: flat `omp parallel for simd` loops; strided: row by row over the last dim.
// Reductions sum fixed-size blocks combined serially, so results do not depend on the threads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/cpu/vec_math.h"
#include "brigade/ops/cpu/workspace.h"

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

constexpr int64_t kParallelMin = 1 << 15;  // below this many elements, stay serial

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

// The fast shapes of a contiguous reduction (out strides so: 0 on reduced dims; size-1 dims go
// either way): Columns, a reduced prefix and a kept suffix, (lead, n / lead) -> (n / lead);
// Rows, a kept prefix and a reduced suffix, (n / inner, inner) -> (n / inner); else General.
struct ReduceSplit {
  enum Kind { Columns, Rows, General } kind = General;
  int64_t lead = 1, inner = 1;
};
ReduceSplit reduce_split(int nd, const int64_t* shape, const int64_t* so) {
  int p = 0;
  while (p < nd && (so[p] == 0 || shape[p] == 1)) ++p;
  int64_t lead = 1;
  for (int d = 0; d < p; ++d) lead *= shape[d];
  bool suffix_kept = true;
  for (int d = p; d < nd; ++d) suffix_kept &= (so[d] != 0 || shape[d] == 1);
  if (suffix_kept) return {ReduceSplit::Columns, lead, 1};
  int q = nd;
  while (q > 0 && (so[q - 1] == 0 || shape[q - 1] == 1)) --q;
  bool prefix_kept = true;
  for (int d = 0; d < q; ++d) prefix_kept &= (so[d] != 0 || shape[d] == 1);
  if (!prefix_kept) return {};
  int64_t inner = 1;
  for (int d = q; d < nd; ++d) inner *= shape[d];
  return {ReduceSplit::Rows, 1, inner};
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
    const ReduceSplit split = reduce_split(nd, shape, so);
    if (split.kind == ReduceSplit::Columns) {  // (lead, rest) -> (rest): column sums
      column_sum(split.lead, n / split.lead, in, out);
      return;
    }
    if (split.kind == ReduceSplit::Rows) {  // (rows, inner) -> (rows): row sums
      const int64_t inner = split.inner, rows = n / inner;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
      for (int64_t r = 0; r < rows; ++r) {
        // in blocks of 4096 (as blocked_sum), the block sums added in order: a long row's error
        // stays that of a 4096-term sum whatever SIMD split this build's compiler chose
        constexpr int64_t kRowBlock = 4096;
        const float* x = in + r * inner;
        float s = 0.f;
        for (int64_t b0 = 0; b0 < inner; b0 += kRowBlock) {
          const int64_t b1 = std::min(inner, b0 + kRowBlock);
          float bs = 0.f;
#pragma omp simd reduction(+ : bs)
          for (int64_t i = b0; i < b1; ++i) bs += x[i];
          s += bs;
        }
        out[r] = s;
      }
      return;
    }
  }
  ref::reduce_sum<float>(nd, shape, in, si, out, so, out_numel);
}

namespace {
// sum of x[i]^2 over [0, n) in double, with four independent 8-lane accumulators (one
// accumulator is latency-bound: a step of the global-norm clip over every gradient ran at a
// tenth of memory speed). Fixed order for a given n.
inline double sum_squares_block(const float* x, int64_t n) {
  constexpr int64_t L = 8, U = 4;
  double acc[U][L] = {};
  int64_t i = 0;
  for (; i + U * L <= n; i += U * L)
    for (int64_t u = 0; u < U; ++u) {
#pragma omp simd
      for (int64_t l = 0; l < L; ++l) {
        const double v = double(x[i + u * L + l]);
        acc[u][l] += v * v;
      }
    }
  double s = 0;
  for (int64_t l = 0; l < L; ++l) s += (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
  for (; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}
}  // namespace

namespace {
constexpr int64_t kSumSquaresBlock = 4096;
}

int64_t sum_squares_workspace(int64_t n) {
  const int64_t nb = (n + kSumSquaresBlock - 1) / kSumSquaresBlock;
  return nb <= 1 ? 0 : int64_t(Allocator::round_size(size_t(nb) * sizeof(double)));
}

double sum_squares(int nd, const int64_t* shape, const float* in, const int64_t* si) {
  const int64_t n = ref::numel_of(nd, shape);
  if (!(nd == 0 || is_contig(nd, shape, si))) return ref::sum_squares<float>(nd, shape, in, si);
  // blocks of 4096 (any thread), block sums added in order: independent of the thread count
  constexpr int64_t kBlock = kSumSquaresBlock;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  if (nb <= 1) return sum_squares_block(in, n);
  Workspace<double> part(nb);
  double* pp = part.data();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < nb; ++b) pp[b] = sum_squares_block(in + b * kBlock, std::min(kBlock, n - b * kBlock));
  double s = 0;
  for (int64_t b = 0; b < nb; ++b) s += pp[b];
  return s;
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
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = gelu1(x[i]);
}

void gelu_backward(int64_t n, const float* gy, const float* x, float* gx) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) gx[i] = gelu_grad1(gy[i], x[i]);
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

// ---------------------------------------------------------------- native 16-bit kernels (see kernels.h)

namespace {
thread_local bool t_native16 = true;
}  // namespace

bool native16_enabled() { return t_native16; }
Native16Scope::Native16Scope(bool on) : prev_(t_native16) { t_native16 = on; }
Native16Scope::~Native16Scope() { t_native16 = prev_; }

namespace {

constexpr int64_t kPiece = 1024;  // elements per piece (per-thread f32 buffers on the stack)

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

// Runs body(r, c0, m) on every piece, in parallel above kParallelMin elements (static split).
template <typename Body>
void for_pieces(const Walk& w, Body body) {
  if (w.n == 0) return;
  const int64_t items = w.rows * w.per_row;
#pragma omp parallel for schedule(static) if (w.n > kParallelMin)
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

namespace {
// acc[0:w] += the logical elements [i0, i0 + w) of x: contiguous bf16 is widened in the loop
// (a shift), anything else through the buffer t (kW floats).
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

// column_sum on the logical (N, C) matrix `in`, the sums stored in dtype ot.
void column_sum16(int64_t N, int64_t C, const Strided& in, DType ot, void* out) {
  constexpr int64_t kW = 64;
  const int64_t nchunks = (C + kW - 1) / kW;
  const size_t eo = dtype_size(ot);
  const bool contig = in.contiguous();
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t c0 = ch * kW, w = std::min(kW, C - c0);
    float acc[kW] = {};
    alignas(64) float xr[kW];
    for (int64_t n = 0; n < N; ++n) accumulate(in, contig, n * C + c0, w, acc, xr);
    store_f32(ot, w, acc, static_cast<char*>(out) + size_t(c0) * eo);
  }
}
}  // namespace

void reduce_sum16(const Strided& in, const int64_t* so, int64_t out_numel, DType ot, void* out) {
  // The branches of reduce_sum for a contiguous input (the widened copy always is one),
  // taken on the logical element order of `in`.
  const int nd = in.nd;
  const int64_t* shape = in.shape;
  const int64_t n = ref::numel_of(nd, shape);
  const size_t eo = dtype_size(ot);
  char* o = static_cast<char*>(out);
  if (n == 0 || out_numel == 0) {
    const float zero = 0.f;
    for (int64_t i = 0; i < out_numel; ++i) store_f32(ot, 1, &zero, o + size_t(i) * eo);
    return;
  }
  if (out_numel == 1) {  // blocked_sum: fixed blocks, each widened into a buffer
    constexpr int64_t kBlock = 4096;
    const int64_t nb = (n + kBlock - 1) / kBlock;
    std::vector<float> part(static_cast<size_t>(nb));
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t b = 0; b < nb; ++b) {
      alignas(64) float buf[kBlock];
      const int64_t i0 = b * kBlock, m = std::min(n, i0 + kBlock) - i0;
      gather_f32(in, i0, m, buf);
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < m; ++i) s += buf[i];
      part[size_t(b)] = s;
    }
    float s = 0;
    for (float p : part) s += p;
    store_f32(ot, 1, &s, o);
    return;
  }
  const ReduceSplit split = reduce_split(nd, shape, so);
  if (split.kind == ReduceSplit::Columns) return column_sum16(split.lead, n / split.lead, in, ot, out);
  if (split.kind == ReduceSplit::Rows) {  // row sums, each row widened into a per-thread buffer
    const int64_t inner = split.inner, rows = n / inner;
#pragma omp parallel if (n > kParallelMin)
    {
      std::vector<float> row(static_cast<size_t>(inner));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const float* x = row.data();
        gather_f32(in, r * inner, inner, row.data());
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < inner; ++i) s += x[i];
        store_f32(ot, 1, &s, o + size_t(r) * eo);
      }
    }
    return;
  }
  // ref::reduce_sum's element order, serially, widening kPiece elements at a time.
  std::vector<float> acc(static_cast<size_t>(out_numel), 0.f);
  alignas(64) float buf[kPiece];
  for (int64_t i0 = 0; i0 < n; i0 += kPiece) {
    const int64_t m = std::min(kPiece, n - i0);
    gather_f32(in, i0, m, buf);
    for (int64_t j = 0; j < m; ++j) acc[size_t(ref::strided_offset(i0 + j, nd, shape, so))] += buf[j];
  }
  store_f32(ot, out_numel, acc.data(), o);
}

void embedding_backward16(int64_t N, int64_t C, int64_t V, const Strided& gy, const int64_t* ids, DType ot, void* gw) {
  // embedding_backward's sums (each gw[v, c] = 0 + the rows with id v, in row order) in a
  // per-thread f32 block of 64 columns of all V rows, stored rounded once complete (the
  // column split does not change any sum).
  constexpr int64_t kW = 64;
  const int64_t nchunks = (C + kW - 1) / kW;
  const size_t eo = dtype_size(ot);
  const bool contig = gy.contiguous();
  char* o = static_cast<char*>(gw);
#pragma omp parallel if (N * C > kParallelMin || V * C > kParallelMin)
  {
    std::vector<float> acc(static_cast<size_t>(V * kW));
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < nchunks; ++ch) {
      const int64_t c0 = ch * kW, w = std::min(kW, C - c0);
      std::fill(acc.begin(), acc.end(), 0.f);
      alignas(64) float s[kW];
      for (int64_t n = 0; n < N; ++n) accumulate(gy, contig, n * C + c0, w, acc.data() + ids[n] * kW, s);
      for (int64_t v = 0; v < V; ++v) store_f32(ot, w, acc.data() + v * kW, o + size_t(v * C + c0) * eo);
    }
  }
}

}  // namespace brigade::ops::cpu

namespace brigade::ops::cpu {

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
