// Reduction kernels: column and dim sums, the sum of squares and softmax over the last dim
// (oracle: ops/ref/reduce.h), each with its native 16-bit variant. Sums add fixed-size blocks
// combined serially, so results do not depend on the thread count.
#include <algorithm>
#include <vector>

#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/vec_math.h"
#include "brigade/ops/cpu/workspace.h"

namespace brigade::ops::cpu {

namespace {
// Sum of term(i) over [0, n) in fixed blocks of kBlock (each summed with a fixed
// SIMD split), the block sums then added serially: the order never depends on threads.
template <typename Acc, typename Term>
Acc blocked_sum(int64_t n, Term term) {
  constexpr int64_t kBlock = 4096;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<Acc> part(static_cast<size_t>(nb));
#pragma omp parallel for schedule(static) if (n > kMapParallelMin)
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

void column_sum(int64_t N, int64_t C, const float* x, float* out) {
  // Column chunks of kW are independent; within a chunk rows are summed in order.
  constexpr int64_t kW = 64;
  const int64_t nchunks = (C + kW - 1) / kW;
#pragma omp parallel for schedule(static) if (N * C > kMapParallelMin)
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
#pragma omp parallel for schedule(static) if (n > kMapParallelMin)
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
constexpr int64_t kSumSquaresBlock = 4096;
}  // namespace

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
#pragma omp parallel for schedule(static) if (n > kMapParallelMin)
  for (int64_t b = 0; b < nb; ++b) pp[b] = sum_squares_block(in + b * kBlock, std::min(kBlock, n - b * kBlock));
  double s = 0;
  for (int64_t b = 0; b < nb; ++b) s += pp[b];
  return s;
}

// ---------------------------------------------------------------- softmax (last dim)

namespace {
inline void softmax_row(int64_t C, const float* xr, float* yr) {
  const float m = row_max(C, xr);
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < C; ++c) {
    yr[c] = fast_exp(xr[c] - m);
    s += yr[c];
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) yr[c] *= inv;
}

inline void softmax_backward_row(int64_t C, const float* gr, const float* yr, float* gxr) {
  float d = 0.f;
#pragma omp simd reduction(+ : d)
  for (int64_t c = 0; c < C; ++c) d += gr[c] * yr[c];
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) gxr[c] = yr[c] * (gr[c] - d);
}
}  // namespace

void softmax(int64_t N, int64_t C, const float* x, float* y) {
#pragma omp parallel for schedule(static) if (N * C > kRowParallelMin)
  for (int64_t n = 0; n < N; ++n) softmax_row(C, x + n * C, y + n * C);
}

void softmax_backward(int64_t N, int64_t C, const float* gy, const float* y, float* gx) {
  // Backward of `y = softmax(x)`: gx = y * (gy - sum(gy * y)).
#pragma omp parallel for schedule(static) if (N * C > kRowParallelMin)
  for (int64_t n = 0; n < N; ++n) softmax_backward_row(C, gy + n * C, y + n * C, gx + n * C);
}

// ---------------------------------------------------------------- native 16-bit variants (see kernels.h)

namespace {
// column_sum on the logical (N, C) matrix `in`, the sums stored in dtype ot.
void column_sum16(int64_t N, int64_t C, const Strided& in, DType ot, void* out) {
  constexpr int64_t kW = 64;
  const int64_t nchunks = (C + kW - 1) / kW;
  const size_t eo = dtype_size(ot);
  const bool contig = in.contiguous();
#pragma omp parallel for schedule(static) if (N * C > kMapParallelMin)
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
#pragma omp parallel for schedule(static) if (n > kMapParallelMin)
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
#pragma omp parallel if (n > kMapParallelMin)
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

void softmax16(int64_t N, int64_t C, const Strided& x, DType ot, void* y) {
  map_rows16(
      N, C, ot, y, [&](int64_t, const float* xr, float* yr) { softmax_row(C, xr, yr); }, x);
}

void softmax_backward16(int64_t N, int64_t C, const Strided& gy, const Strided& y, DType ot, void* gx) {
  map_rows16(
      N, C, ot, gx,
      [&](int64_t, const float* gr, const float* yr, float* gxr) { softmax_backward_row(C, gr, yr, gxr); }, gy, y);
}

}  // namespace brigade::ops::cpu
