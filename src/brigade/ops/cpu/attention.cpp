// Fused causal/full attention for f32 (Vaswani et al. 2017; the row-wise online
// softmax of FlashAttention, Dao et al. 2022, here on CPU): the forward walks each
// query row over key blocks of kBlock keys, keeping a running max and sum, so no
// T x T matrix exists; it saves lse per row. The backward recomputes p from lse.
// Maths and the scalar oracle: ops/ref/kernels.h (attention, attention_backward).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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
      const float* qi = q + row * HS;
      const float* ktb = kt.data() + bh * HS * T;
      const float* vb = v + bh * T * HS;
      const int64_t nj = causal ? i + 1 : T;
      float m = -std::numeric_limits<float>::infinity(), l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j0 = 0; j0 < nj; j0 += kBlock) {  // online softmax over key blocks
        const int64_t w = std::min(kBlock, nj - j0);
        float* sb = s.data();
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
        float* a = acc.data();
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
      float* o = out + row * HS;
#pragma omp simd
      for (int64_t d = 0; d < HS; ++d) o[d] = acc[size_t(d)] * inv;
      lse[row] = m + std::log(l);
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
      std::fill(gk + o, gk + o + T * HS, 0.f);
      std::fill(gv + o, gv + o + T * HS, 0.f);
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = q + o + i * HS;
        const float* gi = gout + o + i * HS;
        float* gqi = gq + o + i * HS;
        const int64_t nj = causal ? i + 1 : T;
        const float D = dot(gi, out + o + i * HS, HS);
        const float l = lse[bh * T + i];
        float* pb = p.data();
        float* gb = gs.data();
        scores(qi, kt.data() + bh * HS * T, T, HS, 0, nj, pb);  // q_i . k_j
        scores(gi, vt.data() + bh * HS * T, T, HS, 0, nj, gb);  // gout_i . v_j
#pragma omp simd
        for (int64_t j = 0; j < nj; ++j) {
          pb[j] = fast_exp(sc * pb[j] - l);
          gb[j] = sc * pb[j] * (gb[j] - D);
        }
        std::fill(gqi, gqi + HS, 0.f);
        for (int64_t j = 0; j < nj; ++j) {
          const float pj = pb[j], g = gb[j];
          const float* kj = k + o + j * HS;
          float* gkj = gk + o + j * HS;
          float* gvj = gv + o + j * HS;
#pragma omp simd
          for (int64_t d = 0; d < HS; ++d) {
            gqi[d] += g * kj[d];
            gkj[d] += g * qi[d];
            gvj[d] += pj * gi[d];
          }
        }
      }
    }
  }
}

}  // namespace brigade::ops::cpu
