// Embedding kernels: row gathers (f32 and 16-bit bit copies) and the scatter-add backward
// (oracle: ops/ref/embedding.h). The backward gives each thread its own columns and adds the
// rows in order, so results do not depend on the thread count.
#include <algorithm>
#include <vector>

#include "brigade/ops/cpu/io16.h"

namespace brigade::ops::cpu {

namespace {
template <typename T>
void embedding_rows(int64_t N, int64_t C, const T* w, int64_t swv, int64_t swc, const int64_t* ids, T* y) {
#pragma omp parallel for schedule(static) if (N * C > kMapParallelMin)
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
#pragma omp parallel for simd schedule(static) if (total > kMapParallelMin)
  for (int64_t i = 0; i < total; ++i) gw[i] = 0.f;
  constexpr int64_t kW = 16;
  const int64_t nchunks = (C + kW - 1) / kW;
#pragma omp parallel for schedule(static) if (N * C > kMapParallelMin)
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

void embedding_backward16(int64_t N, int64_t C, int64_t V, const Strided& gy, const int64_t* ids, DType ot, void* gw) {
  // embedding_backward's sums (each gw[v, c] = 0 + the rows with id v, in row order) in a
  // per-thread f32 block of 64 columns of all V rows, stored rounded once complete (the
  // column split does not change any sum).
  constexpr int64_t kW = 64;
  const int64_t nchunks = (C + kW - 1) / kW;
  const size_t eo = dtype_size(ot);
  const bool contig = gy.contiguous();
  char* o = static_cast<char*>(gw);
#pragma omp parallel if (N * C > kMapParallelMin || V * C > kMapParallelMin)
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
