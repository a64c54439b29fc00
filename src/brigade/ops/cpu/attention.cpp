// Fused causal/full attention for f32 (Vaswani et al. 2017; the row-wise online
// softmax of FlashAttention, Dao et al. 2022, here on CPU): the forward walks each
// query row over key blocks of kBlock keys, keeping a running max and sum, so no
// T x T matrix exists; it saves lse per row. The backward recomputes p from lse.
// Maths and the scalar oracle: ops/ref/kernels.h (attention, attention_backward).
// Native 16-bit variants at the end of the file.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/cpu/vec_math.h"

namespace brigade::ops::cpu {

namespace {
constexpr int64_t kBlock = 64;  // keys per online-softmax step

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}
}  // namespace

namespace {
// kt (BH, HS, T) = k (BH, T, HS) transposed per head, so that the scores of one query
// against a run of keys are axpys over contiguous keys (16 keys per AVX-512 FMA).
std::vector<float> transpose_heads(int64_t BH, int64_t T, int64_t HS, const float* k) {
  std::vector<float> kt(static_cast<size_t>(BH * T * HS));
#pragma omp parallel for schedule(static) if (BH * T * HS > (1 << 15))
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t j = 0; j < T; ++j)
      for (int64_t d = 0; d < HS; ++d) kt[size_t((bh * HS + d) * T + j)] = k[(bh * T + j) * HS + d];
  return kt;
}

// s[0:w] = sum_d q[d] * kt[d, j0:j0+w] (d in order: a fixed summation order per score).
inline void scores(const float* q, const float* kt, int64_t T, int64_t HS, int64_t j0, int64_t w, float* s) {
  std::fill(s, s + w, 0.f);
  for (int64_t d = 0; d < HS; ++d) {
    const float qd = q[d];
    const float* kr = kt + d * T + j0;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) s[j] += qd * kr[j];
  }
}

// Query row i of one head: ktb (HS, T) the head's keys transposed, vb (T, HS) its values,
// acc (HS) and s (kBlock) scratch. Writes the output row o (HS) and returns the row's lse.
inline float attention_row(const float* qi, const float* ktb, const float* vb, int64_t T, int64_t HS, int64_t i,
                           bool causal, float sc, float* acc, float* s, float* o) {
  const int64_t nj = causal ? i + 1 : T;
  float m = -std::numeric_limits<float>::infinity(), l = 0.f;
  std::fill(acc, acc + HS, 0.f);
  for (int64_t j0 = 0; j0 < nj; j0 += kBlock) {  // online softmax over key blocks
    const int64_t w = std::min(kBlock, nj - j0);
    float* sb = s;
    scores(qi, ktb, T, HS, j0, w, sb);
    float bm = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : bm)
    for (int64_t j = 0; j < w; ++j) {
      sb[j] *= sc;
      bm = std::max(bm, sb[j]);
    }
    const float mn = std::max(m, bm);
    const float corr = fast_exp(m - mn);  // 0 on the first block (m = -inf)
    float bl = 0.f;
#pragma omp simd reduction(+ : bl)
    for (int64_t j = 0; j < w; ++j) {
      sb[j] = fast_exp(sb[j] - mn);
      bl += sb[j];
    }
    l = l * corr + bl;
    float* a = acc;
#pragma omp simd
    for (int64_t d = 0; d < HS; ++d) a[d] *= corr;
    for (int64_t j = 0; j < w; ++j) {
      const float p = sb[j];
      const float* vj = vb + (j0 + j) * HS;
#pragma omp simd
      for (int64_t d = 0; d < HS; ++d) a[d] += p * vj[d];
    }
    m = mn;
  }
  const float inv = 1.0f / l;
#pragma omp simd
  for (int64_t d = 0; d < HS; ++d) o[d] = acc[d] * inv;
  return m + std::log(l);
}

// The backward of one head (every pointer at the head's start: q, k, gout, out, gq, gk, gv
// (T, HS); kt, vt (HS, T); lse (T)); p, gs: (T) scratch. Writes gq, gk, gv.
inline void attention_backward_head(int64_t T, int64_t HS, const float* q, const float* k, const float* kt,
                                    const float* vt, const float* gout, const float* out, const float* lse,
                                    bool causal, float sc, float* gq, float* gk, float* gv, float* p, float* gs) {
  std::fill(gk, gk + T * HS, 0.f);
  std::fill(gv, gv + T * HS, 0.f);
  for (int64_t i = 0; i < T; ++i) {
    const float* qi = q + i * HS;
    const float* gi = gout + i * HS;
    float* gqi = gq + i * HS;
    const int64_t nj = causal ? i + 1 : T;
    const float D = dot(gi, out + i * HS, HS);
    const float l = lse[i];
    float* pb = p;
    float* gb = gs;
    scores(qi, kt, T, HS, 0, nj, pb);  // q_i . k_j
    scores(gi, vt, T, HS, 0, nj, gb);  // gout_i . v_j
#pragma omp simd
    for (int64_t j = 0; j < nj; ++j) {
      pb[j] = fast_exp(sc * pb[j] - l);
      gb[j] = sc * pb[j] * (gb[j] - D);
    }
    std::fill(gqi, gqi + HS, 0.f);
    for (int64_t j = 0; j < nj; ++j) {
      const float pj = pb[j], g = gb[j];
      const float* kj = k + j * HS;
      float* gkj = gk + j * HS;
      float* gvj = gv + j * HS;
#pragma omp simd
      for (int64_t d = 0; d < HS; ++d) {
        gqi[d] += g * kj[d];
        gkj[d] += g * qi[d];
        gvj[d] += pj * gi[d];
      }
    }
  }
}
}  // namespace

void attention(int64_t BH, int64_t T, int64_t HS, const float* q, const float* k, const float* v, bool causal,
               double scale, float* out, float* lse) {
  const float sc = float(scale);
  const std::vector<float> kt = transpose_heads(BH, T, HS, k);  // (BH, HS, T)
  // Query rows are independent: parallel over all BH * T rows.
#pragma omp parallel if (BH * T * T * HS > (1 << 16))
  {
    std::vector<float> acc(static_cast<size_t>(HS)), s(static_cast<size_t>(kBlock));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < BH * T; ++row) {
      const int64_t bh = row / T, i = row % T;
      lse[row] = attention_row(q + row * HS, kt.data() + bh * HS * T, v + bh * T * HS, T, HS, i, causal, sc,
                               acc.data(), s.data(), out + row * HS);
    }
  }
}

void attention_backward(int64_t BH, int64_t T, int64_t HS, const float* gout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, bool causal, double scale, float* gq,
                        float* gk, float* gv) {
  // Backward of `out = softmax(scale q k^T) v` with p[i, j] = exp(scale q_i.k_j - lse[i]):
  //   gv_j += p gout_i;  gs = p (gout_i.v_j - gout_i.out_i);  gq_i += scale gs k_j;  gk_j += scale gs q_i.
  // One (b, h) per iteration, so gk/gv of a head are written by one thread in a fixed order.
  const float sc = float(scale);
  const std::vector<float> kt = transpose_heads(BH, T, HS, k);  // (BH, HS, T)
  const std::vector<float> vt = transpose_heads(BH, T, HS, v);  // (BH, HS, T)
#pragma omp parallel if (BH * T * T * HS > (1 << 16))
  {
    std::vector<float> p(static_cast<size_t>(T)), gs(static_cast<size_t>(T));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t o = bh * T * HS;
      attention_backward_head(T, HS, q + o, k + o, kt.data() + bh * HS * T, vt.data() + bh * HS * T, gout + o,
                              out + o, lse + bh * T, causal, sc, gq + o, gk + o, gv + o, p.data(), gs.data());
    }
  }
}

// ---------------------------------------------------------------- native 16-bit variants (see kernels.h)
// The same row and head functions on per-thread f32 buffers: the forward widens a head's
// keys (transposed) and values when its static row range enters a new head, and each query
// row as it comes; the backward widens one head's q, k (and k^T), v^T, gout and out, and
// accumulates its gq, gk, gv in f32 before rounding them once.

namespace {
// dst (HS, T) = src (T, HS) transposed.
inline void transpose_head(int64_t T, int64_t HS, const float* src, float* dst) {
  for (int64_t j = 0; j < T; ++j)
    for (int64_t d = 0; d < HS; ++d) dst[d * T + j] = src[j * HS + d];
}
}  // namespace

void attention16(int64_t BH, int64_t T, int64_t HS, const Strided& q, const Strided& k, const Strided& v,
                 bool causal, double scale, DType ot, void* out, float* lse) {
  const float sc = float(scale);
  const size_t eo = dtype_size(ot);
  const int64_t TH = T * HS;
#pragma omp parallel if (BH * T * T * HS > (1 << 16))
  {
    std::vector<float> buf(static_cast<size_t>(3 * TH + 3 * HS + kBlock));
    float* kh = buf.data();  // (T, HS)
    float* kt = kh + TH;     // (HS, T)
    float* vh = kt + TH;     // (T, HS)
    float* qi = vh + TH;     // (HS)
    float* o = qi + HS;      // (HS)
    float* acc = o + HS;     // (HS)
    float* s = acc + HS;     // (kBlock)
    int64_t cur = -1;
#pragma omp for schedule(static)
    for (int64_t row = 0; row < BH * T; ++row) {
      const int64_t bh = row / T, i = row % T;
      if (bh != cur) {
        gather_f32(k, bh * TH, TH, kh);
        transpose_head(T, HS, kh, kt);
        gather_f32(v, bh * TH, TH, vh);
        cur = bh;
      }
      gather_f32(q, row * HS, HS, qi);
      lse[row] = attention_row(qi, kt, vh, T, HS, i, causal, sc, acc, s, o);
      store_f32(ot, HS, o, static_cast<char*>(out) + size_t(row * HS) * eo);
    }
  }
}

void attention_backward16(int64_t BH, int64_t T, int64_t HS, const Strided& gout, const Strided& q,
                          const Strided& k, const Strided& v, const Strided& out, const float* lse, bool causal,
                          double scale, DType ot, void* gq, void* gk, void* gv) {
  const float sc = float(scale);
  const size_t eo = dtype_size(ot);
  const int64_t TH = T * HS;
#pragma omp parallel if (BH * T * T * HS > (1 << 16))
  {
    std::vector<float> buf(static_cast<size_t>(10 * TH + 2 * T));
    float* qh = buf.data();  // each (T, HS) unless said
    float* kh = qh + TH;
    float* kt = kh + TH;     // (HS, T)
    float* vt = kt + TH;     // (HS, T)
    float* gh = vt + TH;
    float* oh = gh + TH;
    float* gqh = oh + TH;
    float* gkh = gqh + TH;
    float* gvh = gkh + TH;
    float* tmp = gvh + TH;
    float* p = tmp + TH;     // (T)
    float* gs = p + T;       // (T)
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t o = bh * TH;
      gather_f32(q, o, TH, qh);
      gather_f32(k, o, TH, kh);
      transpose_head(T, HS, kh, kt);
      gather_f32(v, o, TH, tmp);
      transpose_head(T, HS, tmp, vt);
      gather_f32(gout, o, TH, gh);
      gather_f32(out, o, TH, oh);
      attention_backward_head(T, HS, qh, kh, kt, vt, gh, oh, lse + bh * T, causal, sc, gqh, gkh, gvh, p, gs);
      store_f32(ot, TH, gqh, static_cast<char*>(gq) + size_t(o) * eo);
      store_f32(ot, TH, gkh, static_cast<char*>(gk) + size_t(o) * eo);
      store_f32(ot, TH, gvh, static_cast<char*>(gv) + size_t(o) * eo);
    }
  }
}

}  // namespace brigade::ops::cpu
