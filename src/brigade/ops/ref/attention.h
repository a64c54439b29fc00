// Scalar oracle of attention (ops/attention.h): causal / full, key-padding masked, and the
// head expansion of grouped-query attention.
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// Scaled dot-product attention (Vaswani et al. 2017; torch scaled_dot_product_attention),
// BH = B*NH independent (T, HS) problems, all contiguous:
//   s = scale * q k^T (causal: s[i, j] = -inf for j > i); p = softmax(s); out = p v;
//   lse[i] = log sum_j exp(s[i, j]).
// The reference forms each full score row explicitly. attention_rows is the form every
// attention here shares: in row i of head bh, key j takes part when j < end(i) and
// key(bh, j) (the other scores are -inf: left out of the max and the sums).
template <typename S, class End, class Key>
void attention_rows(int64_t BH, int64_t T, int64_t HS, const S* q, const S* k, const S* v, double scale, End end,
                    Key key, S* out, S* lse) {
  std::vector<S> s(static_cast<size_t>(T));
  for (int64_t bh = 0; bh < BH; ++bh) {
    const S* qb = q + bh * T * HS;
    const S* kb = k + bh * T * HS;
    const S* vb = v + bh * T * HS;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t nj = end(i);
      S m = -std::numeric_limits<S>::infinity();
      for (int64_t j = 0; j < nj; ++j) {
        if (!key(bh, j)) continue;
        S acc = S(0);
        for (int64_t d = 0; d < HS; ++d) acc += qb[i * HS + d] * kb[j * HS + d];
        s[size_t(j)] = acc * S(scale);
        m = std::max(m, s[size_t(j)]);
      }
      S sum = S(0);
      for (int64_t j = 0; j < nj; ++j)
        if (key(bh, j)) sum += std::exp(s[size_t(j)] - m);
      lse[bh * T + i] = m + std::log(sum);
      for (int64_t d = 0; d < HS; ++d) {
        S acc = S(0);
        for (int64_t j = 0; j < nj; ++j)
          if (key(bh, j)) acc += std::exp(s[size_t(j)] - m) / sum * vb[j * HS + d];
        out[(bh * T + i) * HS + d] = acc;
      }
    }
  }
}
// Backward of `out = softmax(scale * q k^T) v`, recomputing p[i, j] = exp(s[i, j] - lse[i]):
//   gv = p^T gout; gp = gout v^T; gs = p * (gp - rowsum(gout * out)); gq = scale gs k; gk = scale gs^T q.
// Over the keys attention_rows lets take part (end, key as there).
template <typename S, class End, class Key>
void attention_rows_backward(int64_t BH, int64_t T, int64_t HS, const S* gout, const S* q, const S* k, const S* v,
                             const S* out, const S* lse, double scale, End end, Key key, S* gq, S* gk, S* gv) {
  for (int64_t i = 0; i < BH * T * HS; ++i) gq[i] = gk[i] = gv[i] = S(0);
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t o = bh * T * HS;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t nj = end(i);
      S D = S(0);
      for (int64_t d = 0; d < HS; ++d) D += gout[o + i * HS + d] * out[o + i * HS + d];
      for (int64_t j = 0; j < nj; ++j) {
        if (!key(bh, j)) continue;
        S sij = S(0), gp = S(0);
        for (int64_t d = 0; d < HS; ++d) {
          sij += q[o + i * HS + d] * k[o + j * HS + d];
          gp += gout[o + i * HS + d] * v[o + j * HS + d];
        }
        const S p = std::exp(sij * S(scale) - lse[bh * T + i]);
        const S gs = p * (gp - D) * S(scale);
        for (int64_t d = 0; d < HS; ++d) {
          gv[o + j * HS + d] += p * gout[o + i * HS + d];
          gq[o + i * HS + d] += gs * k[o + j * HS + d];
          gk[o + j * HS + d] += gs * q[o + i * HS + d];
        }
      }
    }
  }
}
// Causal (keys j <= i) or full attention: every key of the row's range takes part.
template <typename S>
void attention(int64_t BH, int64_t T, int64_t HS, const S* q, const S* k, const S* v, bool causal, double scale, S* out,
               S* lse) {
  attention_rows(
      BH, T, HS, q, k, v, scale, [=](int64_t i) { return causal ? i + 1 : T; }, [](int64_t, int64_t) { return true; },
      out, lse);
}
template <typename S>
void attention_backward(int64_t BH, int64_t T, int64_t HS, const S* gout, const S* q, const S* k, const S* v,
                        const S* out, const S* lse, bool causal, double scale, S* gq, S* gk, S* gv) {
  attention_rows_backward(
      BH, T, HS, gout, q, k, v, out, lse, scale, [=](int64_t i) { return causal ? i + 1 : T; },
      [](int64_t, int64_t) { return true; }, gq, gk, gv);
}

// q, k, v, out: (B*NH, T, HS) contiguous; keep: (B, T) bytes, head bh belongs to row bh / NH.
// ref::attention_rows (above) over all T keys, those with keep == 0 left out.
template <class S>
void attention_key_mask(int64_t B, int64_t NH, int64_t T, int64_t HS, const S* q, const S* k, const S* v,
                        const uint8_t* keep, double scale, S* out, S* lse) {
  attention_rows(
      B * NH, T, HS, q, k, v, scale, [T](int64_t) { return T; },
      [=](int64_t bh, int64_t j) { return keep[(bh / NH) * T + j] != 0; }, out, lse);
}

template <class S>
void attention_key_mask_backward(int64_t B, int64_t NH, int64_t T, int64_t HS, const S* gout, const S* q, const S* k,
                                 const S* v, const S* out, const S* lse, const uint8_t* keep, double scale, S* gq,
                                 S* gk, S* gv) {
  attention_rows_backward(
      B * NH, T, HS, gout, q, k, v, out, lse, scale, [T](int64_t) { return T; },
      [=](int64_t bh, int64_t j) { return keep[(bh / NH) * T + j] != 0; }, gq, gk, gv);
}

// repeat_kv on contiguous x (B, NKV, T*HS rows): y (B, NKV*n_rep, T*HS).
template <typename S>
void repeat_kv(int64_t B, int64_t NKV, int64_t n_rep, int64_t THS, const S* x, S* y) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < NKV * n_rep; ++j)
      for (int64_t e = 0; e < THS; ++e) y[(b * NKV * n_rep + j) * THS + e] = x[(b * NKV + j / n_rep) * THS + e];
}
// Its backward: gx[b, kv] = sum_{r < n_rep} gy[b, kv * n_rep + r], in order of r.
template <typename S>
void repeat_kv_backward(int64_t B, int64_t NKV, int64_t n_rep, int64_t THS, const S* gy, S* gx) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kv = 0; kv < NKV; ++kv)
      for (int64_t e = 0; e < THS; ++e) {
        S acc = S(0);
        for (int64_t r = 0; r < n_rep; ++r) acc += gy[((b * NKV + kv) * n_rep + r) * THS + e];
        gx[(b * NKV + kv) * THS + e] = acc;
      }
}

}  // namespace brigade::ops::ref
