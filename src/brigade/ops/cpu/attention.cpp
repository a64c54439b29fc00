// Fused causal/full attention for f32 (Vaswani et al. 2017), tiled as in FlashAttention
// (Dao et al. 2022), here on the CPU: a tile is kQ query rows against kK keys, and every
// product inside it is a small GEMM (oneDNN's dnnl_sgemm, run single-threaded inside our
// OpenMP region): S = scale Q K^T, then O += P V. The forward walks a query tile's key
// tiles with an online softmax (running max m and sum l per row), so no T x T matrix ever
// exists, only one kQ x kK tile per thread; it saves lse = m + log l per row. The backward
// recomputes P from lse tile by tile: dP = dO V^T, dS = scale P (dP - D) with
// D_i = dO_i . O_i, then dV += P^T dO, dK += dS^T Q, dQ += dS K.
// Memory: per thread O(kQ kK + T + kQ HS) scratch from the caching allocator; nothing T x T.
// Each output element is produced by one thread in a fixed tile order (thread-count independent).
// Oracle: ops/ref/attention.h. Native 16-bit variants at the end of the file.
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

#include "brigade/core/error.h"
#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/cpu/vec_math.h"
#include "brigade/ops/cpu/workspace.h"

namespace brigade::ops::cpu {

namespace {
constexpr int64_t kQ = 64;   // query rows per tile
constexpr int64_t kK = 128;  // keys per tile (one online-softmax step)

// C (M, N) = alpha op(A) op(B) + beta C, row-major, through oneDNN's sgemm. Called inside
// an active OpenMP region, where oneDNN runs it on the calling thread.
inline void sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  BRIGADE_CHECK(st == dnnl_success, Error, "attention: dnnl_sgemm({}, {}, M={}, N={}, K={}) failed with status {}", ta,
                tb, M, N, K, int(st));
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Keys row r of a query tile starting at i0 may see inside the key tile [j0, j0 + w).
inline int64_t visible(bool causal, int64_t i0, int64_t r, int64_t j0, int64_t w) {
  return causal ? std::clamp<int64_t>(i0 + r + 1 - j0, 0, w) : w;
}

inline int64_t fwd_scratch_elems(int64_t HS) { return kQ * kK + kQ * HS + 2 * kQ; }
inline int64_t bwd_scratch_elems(int64_t T) { return 2 * kQ * kK + T; }

// Per-thread scratch of the forward: the score tile, the output accumulator, m and l.
struct FwdScratch {
  Workspace<float> buf;
  float *s, *acc, *m, *l;
  explicit FwdScratch(int64_t HS) : buf(fwd_scratch_elems(HS)) {
    s = buf.data();
    acc = s + kQ * kK;
    m = acc + kQ * HS;
    l = m + kQ;
  }
};

// One query tile of one head: rows [i0, i0 + nq) of q (row stride ld, as k and v; the head's
// T rows start at q, k, v). Writes those rows of out (row stride ldo) and their lse.
void forward_tile(int64_t T, int64_t HS, int64_t i0, int64_t nq, const float* q, const float* k, const float* v,
                  int64_t ld, bool causal, float sc, float* out, int64_t ldo, float* lse, FwdScratch& w) {
  const int64_t nk = causal ? std::min(T, i0 + nq) : T;
  std::fill(w.m, w.m + nq, -std::numeric_limits<float>::infinity());
  std::fill(w.l, w.l + nq, 0.f);
  for (int64_t j0 = 0; j0 < nk; j0 += kK) {
    const int64_t wk = std::min(kK, nk - j0);
    sgemm('N', 'T', nq, wk, HS, sc, q + i0 * ld, ld, k + j0 * ld, ld, 0.f, w.s, kK);  // S = sc Q K^T
    for (int64_t r = 0; r < nq; ++r) {
      float* sr = w.s + r * kK;
      float* ar = w.acc + r * HS;
      const int64_t n = visible(causal, i0, r, j0, wk);
      float bm = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : bm)
      for (int64_t j = 0; j < n; ++j) bm = std::max(bm, sr[j]);
      const float mn = std::max(w.m[r], bm);     // finite: the first key tile gives every row key 0
      const float corr = fast_exp(w.m[r] - mn);  // 0 on the first tile (m = -inf)
      float bl = 0.f;
#pragma omp simd reduction(+ : bl)
      for (int64_t j = 0; j < n; ++j) {
        sr[j] = fast_exp(sr[j] - mn);
        bl += sr[j];
      }
      std::fill(sr + n, sr + wk, 0.f);  // masked keys
      w.l[r] = w.l[r] * corr + bl;
      w.m[r] = mn;
      if (j0 == 0) {
        std::fill(ar, ar + HS, 0.f);
      } else {
#pragma omp simd
        for (int64_t d = 0; d < HS; ++d) ar[d] *= corr;
      }
    }
    sgemm('N', 'N', nq, HS, wk, 1.f, w.s, kK, v + j0 * ld, ld, 1.f, w.acc, HS);  // acc += P V
  }
  for (int64_t r = 0; r < nq; ++r) {
    const float inv = 1.0f / w.l[r];
    const float* ar = w.acc + r * HS;
    float* o = out + (i0 + r) * ldo;
#pragma omp simd
    for (int64_t d = 0; d < HS; ++d) o[d] = ar[d] * inv;
    lse[i0 + r] = w.m[r] + std::log(w.l[r]);
  }
}

// Per-thread scratch of the backward: P and dP tiles, D (T).
struct BwdScratch {
  Workspace<float> buf;
  float *p, *dp, *D;
  explicit BwdScratch(int64_t T) : buf(bwd_scratch_elems(T)) {
    p = buf.data();
    dp = p + kQ * kK;
    D = dp + kQ * kK;
  }
};

// The backward of one head; every pointer at the head's first row, row stride ld for q, k,
// v, gout, out and the outputs gq, gk, gv (written, not accumulated); lse (T).
void backward_head(int64_t T, int64_t HS, const float* q, const float* k, const float* v, const float* gout,
                   const float* out, int64_t ld, const float* lse, bool causal, float sc, float* gq, float* gk,
                   float* gv, BwdScratch& w) {
  for (int64_t i = 0; i < T; ++i) {
    w.D[i] = dot(gout + i * ld, out + i * ld, HS);
    std::fill(gk + i * ld, gk + i * ld + HS, 0.f);
    std::fill(gv + i * ld, gv + i * ld + HS, 0.f);
  }
  for (int64_t i0 = 0; i0 < T; i0 += kQ) {
    const int64_t nq = std::min(kQ, T - i0);
    const int64_t nk = causal ? std::min(T, i0 + nq) : T;
    for (int64_t j0 = 0; j0 < nk; j0 += kK) {
      const int64_t wk = std::min(kK, nk - j0);
      sgemm('N', 'T', nq, wk, HS, sc, q + i0 * ld, ld, k + j0 * ld, ld, 0.f, w.p, kK);       // S = sc Q K^T
      sgemm('N', 'T', nq, wk, HS, 1.f, gout + i0 * ld, ld, v + j0 * ld, ld, 0.f, w.dp, kK);  // dP = dO V^T
      for (int64_t r = 0; r < nq; ++r) {
        float* pr = w.p + r * kK;
        float* gr = w.dp + r * kK;
        const int64_t n = visible(causal, i0, r, j0, wk);
        const float l = lse[i0 + r], D = w.D[i0 + r];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          pr[j] = fast_exp(pr[j] - l);
          gr[j] = sc * pr[j] * (gr[j] - D);
        }
        std::fill(pr + n, pr + wk, 0.f);
        std::fill(gr + n, gr + wk, 0.f);
      }
      sgemm('T', 'N', wk, HS, nq, 1.f, w.p, kK, gout + i0 * ld, ld, 1.f, gv + j0 * ld, ld);  // dV += P^T dO
      sgemm('T', 'N', wk, HS, nq, 1.f, w.dp, kK, q + i0 * ld, ld, 1.f, gk + j0 * ld, ld);    // dK += dS^T Q
      sgemm('N', 'N', nq, HS, wk, 1.f, w.dp, kK, k + j0 * ld, ld, j0 == 0 ? 0.f : 1.f, gq + i0 * ld,
            ld);  // dQ (+)= dS K
    }
  }
}
}  // namespace

int64_t attention_workspace_per_thread(int64_t T, int64_t HS) {
  return int64_t(std::max(Allocator::round_size(size_t(fwd_scratch_elems(HS)) * sizeof(float)),
                          Allocator::round_size(size_t(bwd_scratch_elems(T)) * sizeof(float))));
}

void attention(int64_t BH, int64_t T, int64_t HS, const float* q, const float* k, const float* v, bool causal,
               double scale, float* out, float* lse) {
  const float sc = float(scale);
  const int64_t nqt = (T + kQ - 1) / kQ;  // query tiles per head
  // Tiles are independent: parallel over all (head, query tile) pairs; dynamic, as causal
  // tiles grow with their row index. Always an active region, so dnnl_sgemm stays on one thread.
#pragma omp parallel
  {
    FwdScratch w(HS);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < BH * nqt; ++t) {
      const int64_t bh = t / nqt, i0 = (t % nqt) * kQ, o = bh * T * HS;
      forward_tile(T, HS, i0, std::min(kQ, T - i0), q + o, k + o, v + o, HS, causal, sc, out + o, HS, lse + bh * T, w);
    }
  }
}

void attention_backward(int64_t BH, int64_t T, int64_t HS, const float* gout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, bool causal, double scale, float* gq,
                        float* gk, float* gv) {
  // One head per iteration, so a head's gk/gv are accumulated by one thread in a fixed order.
  const float sc = float(scale);
#pragma omp parallel
  {
    BwdScratch w(T);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t o = bh * T * HS;
      backward_head(T, HS, q + o, k + o, v + o, gout + o, out + o, HS, lse + bh * T, causal, sc, gq + o, gk + o, gv + o,
                    w);
    }
  }
}

// ---------------------------------------------------------------- native 16-bit variants (see kernels.h)
// The same tile and head functions on per-thread f32 buffers: one head per iteration, its
// q, k, v (and gout, out) widened exactly into f32, the f32 arithmetic above run on them
// with the same shapes and strides, and each output rounded once as it is stored.

namespace {

// A thread's f32 copies of one head (T x HS elements each), `n` slices of one workspace:
// load() widens head o of each input into the leading slices, in order; store() rounds
// slice i into head o of a 16-bit output.
struct HeadCopies {
  Workspace<float> buf;
  int64_t TH;
  HeadCopies(int n, int64_t TH) : buf(n * TH), TH(TH) {}
  float* operator[](int i) const { return buf.data() + i * TH; }
  void load(int64_t o, std::initializer_list<const Strided*> in) const {
    float* dst = buf.data();
    for (const Strided* x : in) {
      gather_f32(*x, o, TH, dst);
      dst += TH;
    }
  }
  void store(int i, DType ot, int64_t o, void* out) const {
    store_f32(ot, TH, (*this)[i], static_cast<char*>(out) + size_t(o) * dtype_size(ot));
  }
};

}  // namespace

void attention16(int64_t BH, int64_t T, int64_t HS, const Strided& q, const Strided& k, const Strided& v, bool causal,
                 double scale, DType ot, void* out, float* lse) {
  const float sc = float(scale);
  const int64_t TH = T * HS;
#pragma omp parallel
  {
    HeadCopies h(4, TH);  // q, k, v, out
    FwdScratch w(HS);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t o = bh * TH;
      h.load(o, {&q, &k, &v});
      for (int64_t i0 = 0; i0 < T; i0 += kQ)
        forward_tile(T, HS, i0, std::min(kQ, T - i0), h[0], h[1], h[2], HS, causal, sc, h[3], HS, lse + bh * T, w);
      h.store(3, ot, o, out);
    }
  }
}

void attention_backward16(int64_t BH, int64_t T, int64_t HS, const Strided& gout, const Strided& q, const Strided& k,
                          const Strided& v, const Strided& out, const float* lse, bool causal, double scale, DType ot,
                          void* gq, void* gk, void* gv) {
  const float sc = float(scale);
  const int64_t TH = T * HS;
#pragma omp parallel
  {
    HeadCopies h(8, TH);  // q, k, v, gout, out, gq, gk, gv
    BwdScratch w(T);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t o = bh * TH;
      h.load(o, {&q, &k, &v, &gout, &out});
      backward_head(T, HS, h[0], h[1], h[2], h[3], h[4], HS, lse + bh * T, causal, sc, h[5], h[6], h[7], w);
      h.store(5, ot, o, gq);
      h.store(6, ot, o, gk);
      h.store(7, ot, o, gv);
    }
  }
}

}  // namespace brigade::ops::cpu

namespace brigade::ops::cpu {

// One (head, query) row per iteration: scores over the unmasked keys (d in order), their
// max and sum of exponentials, then out = sum_j p_j v_j accumulated over j in order.
void attention_key_mask(int64_t B, int64_t NH, int64_t T, int64_t HS, const float* q, const float* k, const float* v,
                        const uint8_t* keep, double scale, float* out, float* lse) {
  const int64_t rows = B * NH * T;
  const float sc = float(scale);
#pragma omp parallel if (rows * T * HS > (1 << 15))
  {
    std::vector<float> s(static_cast<size_t>(T));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bh = r / T;
      const uint8_t* kp = keep + (bh / NH) * T;
      const float* qi = q + r * HS;
      const float* kb = k + bh * T * HS;
      const float* vb = v + bh * T * HS;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < T; ++j) {
        if (!kp[j]) continue;
        float acc = 0.f;
        for (int64_t d = 0; d < HS; ++d) acc += qi[d] * kb[j * HS + d];
        s[size_t(j)] = acc * sc;
        m = std::max(m, s[size_t(j)]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < T; ++j)
        if (kp[j]) {
          s[size_t(j)] = std::exp(s[size_t(j)] - m);
          sum += s[size_t(j)];
        }
      lse[r] = m + std::log(sum);
      float* o = out + r * HS;
      std::fill(o, o + HS, 0.f);
      for (int64_t j = 0; j < T; ++j) {
        if (!kp[j]) continue;
        const float pj = s[size_t(j)] / sum;
        const float* vj = vb + j * HS;
#pragma omp simd
        for (int64_t d = 0; d < HS; ++d) o[d] += pj * vj[d];
      }
    }
  }
}

// One head per iteration (gk, gv sum over the head's queries, in query order).
void attention_key_mask_backward(int64_t B, int64_t NH, int64_t T, int64_t HS, const float* gout, const float* q,
                                 const float* k, const float* v, const float* out, const float* lse,
                                 const uint8_t* keep, double scale, float* gq, float* gk, float* gv) {
  const float sc = float(scale);
#pragma omp parallel for schedule(static) if (B * NH * T * T * HS > (1 << 15))
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const uint8_t* kp = keep + (bh / NH) * T;
    const int64_t o = bh * T * HS;
    std::fill(gq + o, gq + o + T * HS, 0.f);
    std::fill(gk + o, gk + o + T * HS, 0.f);
    std::fill(gv + o, gv + o + T * HS, 0.f);
    for (int64_t i = 0; i < T; ++i) {
      const float* gi = gout + o + i * HS;
      const float* qi = q + o + i * HS;
      float D = 0.f;
      for (int64_t d = 0; d < HS; ++d) D += gi[d] * out[o + i * HS + d];
      const float l = lse[bh * T + i];
      float* gqi = gq + o + i * HS;
      for (int64_t j = 0; j < T; ++j) {
        if (!kp[j]) continue;
        const float* kj = k + o + j * HS;
        const float* vj = v + o + j * HS;
        float sij = 0.f, gp = 0.f;
        for (int64_t d = 0; d < HS; ++d) {
          sij += qi[d] * kj[d];
          gp += gi[d] * vj[d];
        }
        const float p = std::exp(sij * sc - l);
        const float gs = p * (gp - D) * sc;
        float* gvj = gv + o + j * HS;
        float* gkj = gk + o + j * HS;
#pragma omp simd
        for (int64_t d = 0; d < HS; ++d) {
          gvj[d] += p * gi[d];
          gqi[d] += gs * kj[d];
          gkj[d] += gs * qi[d];
        }
      }
    }
  }
}

void repeat_kv_backward(int64_t B, int64_t NKV, int64_t n_rep, int64_t THS, const float* gy, float* gx) {
#pragma omp parallel for schedule(static) if (B * NKV * n_rep * THS >= (int64_t(1) << 14))
  for (int64_t bk = 0; bk < B * NKV; ++bk) {
    float* dst = gx + bk * THS;
    for (int64_t e = 0; e < THS; ++e) dst[e] = 0.f;
    for (int64_t r = 0; r < n_rep; ++r) {
      const float* src = gy + (bk * n_rep + r) * THS;
#pragma omp simd
      for (int64_t e = 0; e < THS; ++e) dst[e] += src[e];
    }
  }
}

}  // namespace brigade::ops::cpu
