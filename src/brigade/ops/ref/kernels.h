// Reference kernels: plain scalar loops over raw pointers + sizes + strides, the
// in-repo oracle that ops/cpu is tested against. Templates over the scalar type S
// (float for the Ref backend, double for the finite-difference path of the op
// harness); every sum accumulates in S. Never optimised: clarity over speed.
// The fast versions live in ops/cpu/kernels.h; the front-end (argument checks,
// output allocation, broadcasting) lives in ops/ops.cpp.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstring>
#include <vector>

#include "brigade/core/dtype.h"

namespace brigade::ops::ref {

// Gradient convention: every *_backward kernel writes (=) its outputs; nothing here
// accumulates into caller memory except add_ (documented as +=).

enum class BinaryOp { Add, Sub, Mul, Div };
enum class UnaryOp { Neg, Exp, Log, Tanh, Sqrt, AddScalar, MulScalar };

// Offset of the linear (row-major) index i of an nd-shape under the given strides.
inline int64_t strided_offset(int64_t i, int nd, const int64_t* shape, const int64_t* strides) {
  int64_t off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    const int64_t n = shape[d];
    off += (i % n) * strides[d];
    i /= n;
  }
  return off;
}
inline int64_t numel_of(int nd, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < nd; ++d) n *= shape[d];
  return n;
}

template <typename S>
S apply_binary(BinaryOp op, S x, S y) {
  switch (op) {
    case BinaryOp::Add: return x + y;
    case BinaryOp::Sub: return x - y;
    case BinaryOp::Mul: return x * y;
    case BinaryOp::Div: return x / y;
  }
  return S(0);
}

template <typename S>
S apply_unary(UnaryOp op, S x, double s) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::AddScalar: return x + S(s);
    case UnaryOp::MulScalar: return x * S(s);
  }
  return S(0);
}

// out (contiguous, shape) = a op b; a and b are read through strides over `shape`
// (stride 0 on broadcast dims).
template <typename S>
void binary(BinaryOp op, int nd, const int64_t* shape, const S* a, const int64_t* sa, const S* b,
            const int64_t* sb, S* out) {
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i)
    out[i] = apply_binary(op, a[strided_offset(i, nd, shape, sa)], b[strided_offset(i, nd, shape, sb)]);
}

// out (contiguous) = f(a), a read through strides.
template <typename S>
void unary(UnaryOp op, double s, int nd, const int64_t* shape, const S* a, const int64_t* sa, S* out) {
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i) out[i] = apply_unary(op, a[strided_offset(i, nd, shape, sa)], s);
}

// dst += alpha * src over `shape`, both strided (src may broadcast with stride 0).
template <typename S>
void axpy(int nd, const int64_t* shape, S* dst, const int64_t* sd, const S* src, const int64_t* ss, double alpha) {
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i)
    dst[strided_offset(i, nd, shape, sd)] += S(alpha) * src[strided_offset(i, nd, shape, ss)];
}

// dst *= s over `shape`, strided.
template <typename S>
void scale(int nd, const int64_t* shape, S* dst, const int64_t* sd, double s) {
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i) dst[strided_offset(i, nd, shape, sd)] *= S(s);
}

// Sum reduction: out[so . idx] += in[si . idx] over every idx of `shape` (so has
// stride 0 on the reduced dims). out (out_numel, contiguous) is zeroed first.
// Accumulation order: row-major order of the input index space.
template <typename S>
void reduce_sum(int nd, const int64_t* shape, const S* in, const int64_t* si, S* out, const int64_t* so,
                int64_t out_numel) {
  for (int64_t i = 0; i < out_numel; ++i) out[i] = S(0);
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i) out[strided_offset(i, nd, shape, so)] += in[strided_offset(i, nd, shape, si)];
}

// sum of in^2, accumulated in double.
template <typename S>
double sum_squares(int nd, const int64_t* shape, const S* in, const int64_t* si) {
  const int64_t n = numel_of(nd, shape);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = double(in[strided_offset(i, nd, shape, si)]);
    acc += x * x;
  }
  return acc;
}

// Batched matmul (torch.matmul): c[bi] (M, N) = A[bi] (M, K) @ B[bi] (K, N), with
// nbd batch dims of sizes bshape, batch strides a_bst / b_bst (0 where broadcast),
// element (m, k) of A at a[sam*m + sak*k], element (k, n) of B at b[sbk*k + sbn*n]
// (transposes are stride swaps). c is contiguous (batch..., M, N).
template <typename S>
void matmul(int nbd, const int64_t* bshape, const S* a, const int64_t* a_bst, int64_t sam, int64_t sak, const S* b,
            const int64_t* b_bst, int64_t sbk, int64_t sbn, S* c, int64_t M, int64_t N, int64_t K) {
  const int64_t batch = numel_of(nbd, bshape);
  for (int64_t bi = 0; bi < batch; ++bi) {
    const S* ab = a + strided_offset(bi, nbd, bshape, a_bst);
    const S* bb = b + strided_offset(bi, nbd, bshape, b_bst);
    S* cb = c + bi * M * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        S acc = S(0);
        for (int64_t k = 0; k < K; ++k) acc += ab[m * sam + k * sak] * bb[k * sbk + n * sbn];
        cb[m * N + n] = acc;
      }
  }
}

// Linear layer (torch.nn.functional.linear): y (N, OUT) = x (N, IN) @ W^T + bias.
// x(n, i) at x[sxn*n + sxi*i]; W(o, i) at w[swo*o + swi*i] (the front-end maps both
// weight layouts onto these strides); bias (OUT) contiguous or null; y contiguous.
template <typename S>
void linear(int64_t N, int64_t IN, int64_t OUT, const S* x, int64_t sxn, int64_t sxi, const S* w, int64_t swo,
            int64_t swi, const S* bias, S* y) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      S acc = bias ? bias[o] : S(0);
      for (int64_t i = 0; i < IN; ++i) acc += x[n * sxn + i * sxi] * w[o * swo + i * swi];
      y[n * OUT + o] = acc;
    }
}

// Backward of `y = x @ W^T + bias`:
//   gx (N, IN) = gy @ W;  gw(o, i) = sum_n gy(n, o) x(n, i) written at gw[sgo*o + sgi*i];
//   gb (OUT) = sum_n gy(n, :). gy contiguous (N, OUT); any output pointer may be null.
template <typename S>
void linear_backward(int64_t N, int64_t IN, int64_t OUT, const S* gy, const S* x, int64_t sxn, int64_t sxi,
                     const S* w, int64_t swo, int64_t swi, S* gx, S* gw, int64_t sgo, int64_t sgi, S* gb) {
  if (gx)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < IN; ++i) {
        S acc = S(0);
        for (int64_t o = 0; o < OUT; ++o) acc += gy[n * OUT + o] * w[o * swo + i * swi];
        gx[n * IN + i] = acc;
      }
  if (gw)
    for (int64_t o = 0; o < OUT; ++o)
      for (int64_t i = 0; i < IN; ++i) {
        S acc = S(0);
        for (int64_t n = 0; n < N; ++n) acc += gy[n * OUT + o] * x[n * sxn + i * sxi];
        gw[o * sgo + i * sgi] = acc;
      }
  if (gb)
    for (int64_t o = 0; o < OUT; ++o) {
      S acc = S(0);
      for (int64_t n = 0; n < N; ++n) acc += gy[n * OUT + o];
      gb[o] = acc;
    }
}

// Embedding (torch.nn.functional.embedding): y (N, C) = weight[ids] ; weight(v, c)
// at w[swv*v + swc*c]. Ids are already range-checked by the front-end.
template <typename S>
void embedding(int64_t N, int64_t C, const S* w, int64_t swv, int64_t swc, const int64_t* ids, S* y) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = w[ids[n] * swv + c * swc];
}
// Backward of `y[n, c] = w[ids[n], c]`: gw (V, C) = scatter-add of gy rows, in order of n.
template <typename S>
void embedding_backward(int64_t N, int64_t C, int64_t V, const S* gy, const int64_t* ids, S* gw) {
  for (int64_t i = 0; i < V * C; ++i) gw[i] = S(0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) gw[ids[n] * C + c] += gy[n * C + c];
}

// Layer norm over rows of x (N, C) (Ba et al. 2016; torch.nn.LayerNorm, biased variance):
//   mean = sum(x)/C; rstd = 1/sqrt(sum((x-mean)^2)/C + eps); y = (x-mean)*rstd*w + b.
template <typename S>
void layer_norm(int64_t N, int64_t C, const S* x, const S* w, const S* b, double eps, S* y, S* mean, S* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S m = S(0);
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= S(C);
    S v = S(0);
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= S(C);
    const S rs = S(1) / std::sqrt(v + S(eps));
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = (xr[c] - m) * rs * w[c] + b[c];
    mean[n] = m;
    rstd[n] = rs;
  }
}
// Backward of `y = (x - mean) * rstd * w + b` with xhat = (x - mean) * rstd:
//   gb = sum_n gy; gw = sum_n gy * xhat; g = gy * w;
//   gx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)).
template <typename S>
void layer_norm_backward(int64_t N, int64_t C, const S* gy, const S* x, const S* w, const S* mean, const S* rstd,
                         S* gx, S* gw, S* gb) {
  for (int64_t c = 0; c < C; ++c) gw[c] = gb[c] = S(0);
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    const S* gr = gy + n * C;
    S mg = S(0), mgx = S(0);
    for (int64_t c = 0; c < C; ++c) {
      const S xh = (xr[c] - mean[n]) * rstd[n];
      const S g = gr[c] * w[c];
      mg += g;
      mgx += g * xh;
      gw[c] += gr[c] * xh;
      gb[c] += gr[c];
    }
    mg /= S(C);
    mgx /= S(C);
    for (int64_t c = 0; c < C; ++c) {
      const S xh = (xr[c] - mean[n]) * rstd[n];
      gx[n * C + c] = rstd[n] * (gr[c] * w[c] - mg - xh * mgx);
    }
  }
}

// GELU, tanh approximation (Hendrycks & Gimpel 2016; torch gelu(approximate='tanh')):
//   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <typename S>
void gelu(int64_t n, const S* x, S* y) {
  const S k = S(0.7978845608028654), a = S(0.044715);
  for (int64_t i = 0; i < n; ++i) {
    const S u = k * (x[i] + a * x[i] * x[i] * x[i]);
    y[i] = S(0.5) * x[i] * (S(1) + std::tanh(u));
  }
}
// Backward of the line above: dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2), t = tanh(u).
template <typename S>
void gelu_backward(int64_t n, const S* gy, const S* x, S* gx) {
  const S k = S(0.7978845608028654), a = S(0.044715);
  for (int64_t i = 0; i < n; ++i) {
    const S xi = x[i];
    const S t = std::tanh(k * (xi + a * xi * xi * xi));
    const S d = S(0.5) * (S(1) + t) + S(0.5) * xi * (S(1) - t * t) * k * (S(1) + S(3) * a * xi * xi);
    gx[i] = gy[i] * d;
  }
}

// Softmax over rows of x (N, C) (torch.softmax(dim=-1)): y = exp(x - max) / sum exp(x - max).
template <typename S>
void softmax(int64_t N, int64_t C, const S* x, S* y) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S* yr = y + n * C;
    S m = -std::numeric_limits<S>::infinity();
    for (int64_t c = 0; c < C; ++c) m = std::max(m, xr[c]);
    S s = S(0);
    for (int64_t c = 0; c < C; ++c) s += (yr[c] = std::exp(xr[c] - m));
    for (int64_t c = 0; c < C; ++c) yr[c] /= s;
  }
}
// Backward of `y = softmax(x)`: gx = y * (gy - sum_c(gy * y)).
template <typename S>
void softmax_backward(int64_t N, int64_t C, const S* gy, const S* y, S* gx) {
  for (int64_t n = 0; n < N; ++n) {
    S d = S(0);
    for (int64_t c = 0; c < C; ++c) d += gy[n * C + c] * y[n * C + c];
    for (int64_t c = 0; c < C; ++c) gx[n * C + c] = y[n * C + c] * (gy[n * C + c] - d);
  }
}

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
void attention(int64_t BH, int64_t T, int64_t HS, const S* q, const S* k, const S* v, bool causal, double scale,
               S* out, S* lse) {
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

// Fused log-softmax + cross-entropy (torch.nn.functional.cross_entropy, reduction='mean'):
//   lse[n] = log sum_v exp(logits[n, v]); loss = sum_{n: t != ignore} (lse[n] - logits[n, t[n]]) / count.
// Returns count; loss is NaN when count == 0 (as torch). lse is written for every row.
template <typename S>
int64_t cross_entropy(int64_t N, int64_t V, const S* logits, const int64_t* targets, int64_t ignore_index, S* loss,
                      S* lse) {
  S total = S(0);
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = logits + n * V;
    S m = -std::numeric_limits<S>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, xr[j]);
    S s = S(0);
    for (int64_t j = 0; j < V; ++j) s += std::exp(xr[j] - m);
    lse[n] = m + std::log(s);
    if (targets[n] == ignore_index) continue;
    total += lse[n] - xr[targets[n]];
    ++count;
  }
  *loss = count ? total / S(count) : std::numeric_limits<S>::quiet_NaN();
  return count;
}
// Backward of the loss above: glogits[n, :] = gloss * (exp(logits - lse[n]) - onehot(t[n])) / count,
// zero rows where t[n] == ignore_index (and everywhere when count == 0).
template <typename S>
void cross_entropy_backward(int64_t N, int64_t V, double gloss, const S* logits, const int64_t* targets,
                            const S* lse, int64_t ignore_index, S* glogits) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != ignore_index;
  for (int64_t n = 0; n < N; ++n) {
    const bool skip = targets[n] == ignore_index || count == 0;
    const S g = skip ? S(0) : S(gloss) / S(count);
    for (int64_t j = 0; j < V; ++j) {
      const S p = skip ? S(0) : std::exp(logits[n * V + j] - lse[n]);
      glogits[n * V + j] = g * (p - (j == targets[n] ? S(1) : S(0)));
    }
  }
}

// Dropout apply (Srivastava et al. 2014, inverted): y = x * mask, elementwise, contiguous.
template <typename S>
void dropout_apply(int64_t n, const S* x, const S* mask, S* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * mask[i];
}

// Dtype conversion (ops::cast) between floating dtypes: out (contiguous, dtype `to`) = in (dtype
// `from`, read through strides), one element at a time with the scalar conversions of
// core/dtype.h, which define the rounding (nearest-even; NaN stays quiet NaN; Inf and
// denormals preserved; f16 overflow to Inf). Same dtype: a bit copy. Not a template: the
// element types are runtime dtypes.
inline float load_float(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
inline void store_float(DType dt, void* p, int64_t i, float v) {
  switch (dt) {
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}
inline void cast(DType from, DType to, int nd, const int64_t* shape, const void* in, const int64_t* si, void* out) {
  const int64_t n = numel_of(nd, shape);
  const size_t esz = dtype_size(from);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t off = strided_offset(i, nd, shape, si);
    if (from == to)
      std::memcpy(static_cast<char*>(out) + size_t(i) * esz, static_cast<const char*>(in) + size_t(off) * esz, esz);
    else
      store_float(to, out, i, load_float(from, in, off));
  }
}

}  // namespace brigade::ops::ref
