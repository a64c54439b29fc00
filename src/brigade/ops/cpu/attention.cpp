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

void attention(int64_t BH, int64_t T, int64_t HS, const float* q, const float* k, const float* v, bool causal,
               double scale, float* out, float* lse) {
  const float sc = float(scale);
  // Query rows are independent: parallel over all BH * T rows.
#pragma omp parallel if (BH * T * T * HS > (1 << 16))
  {
    std::vector<float> acc(static_cast<size_t>(HS)), s(static_cast<size_t>(kBlock));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < BH * T; ++row) {
      const int64_t bh = row / T, i = row % T;
      const float* qi = q + row * HS;
      const float* kb = k + bh * T * HS;
      const float* vb = v + bh * T * HS;
      const int64_t nj = causal ? i + 1 : T;
      float m = -std::numeric_limits<float>::infinity(), l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j0 = 0; j0 < nj; j0 += kBlock) {
        const int64_t w = std::min(kBlock, nj - j0);
        float bm = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < w; ++j) {
          s[size_t(j)] = sc * dot(qi, kb + (j0 + j) * HS, HS);
          bm = std::max(bm, s[size_t(j)]);
        }
        const float mn = std::max(m, bm);
        const float corr = fast_exp(m - mn);  // 0 on the first block (m = -inf)
        float bl = 0.f;
#pragma omp simd reduction(+ : bl)
        for (int64_t j = 0; j < w; ++j) {
          s[size_t(j)] = fast_exp(s[size_t(j)] - mn);
          bl += s[size_t(j)];
        }
        l = l * corr + bl;
        float* a = acc.data();
#pragma omp simd
        for (int64_t d = 0; d < HS; ++d) a[d] *= corr;
        for (int64_t j = 0; j < w; ++j) {
          const float p = s[size_t(j)];
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
        for (int64_t j = 0; j < nj; ++j) {
          const float pj = fast_exp(sc * dot(qi, k + o + j * HS, HS) - l);
          p[size_t(j)] = pj;
          gs[size_t(j)] = sc * pj * (dot(gi, v + o + j * HS, HS) - D);
        }
        std::fill(gqi, gqi + HS, 0.f);
        for (int64_t j = 0; j < nj; ++j) {
          const float pj = p[size_t(j)], g = gs[size_t(j)];
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
