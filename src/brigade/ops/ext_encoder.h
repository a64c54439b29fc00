// Raw ops for bidirectional encoders (ViT, BERT; issue 8), beside ops/ops.h:
//   gelu_erf               exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (torch's default
//                          gelu, what Hugging Face ViT and BERT use; ops::gelu is the tanh form);
//   attention_key_mask     non-causal scaled dot-product attention where key j of batch row b
//                          takes part only when key_mask[b, j] == 1 (BERT's attention_mask:
//                          masked keys get -inf before the softmax);
//   patchify               (N, C, H, W) -> (N, H/p * W/p, C*p*p), patches in row-major order
//                          (ph, pw) and features in (c, i, j) order, so a Conv2d(C, D, p, stride p)
//                          weight (D, C, p, p) viewed as (D, C*p*p) is the weight of a linear
//                          layer on the patches (ViT's patch embedding);
// each with its backward. The dtype contract is ops.h's: f32 / bf16 / f16 inputs, f32 compute
// (16-bit inputs widened exactly, outputs rounded once, round to nearest even), outputs in
// the input's dtype (attention: out q's, lse always f32; gradients in their input's dtype).
// These ops have no native 16-bit kernels: 16-bit inputs always take the widened path.
// Design: the scalar oracle kernels are the templates in ops::ref below (also instantiated
// in double by the op harness, tests/ops/cases_encoder.inc); the optimised cpu kernels
// (OpenMP, static schedules, a fixed reduction order, so bitwise reproducible for a thread
// count) and the front-ends live in ext_encoder.cpp; Backend::Ref runs the templates in float.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "brigade/ops/ops.h"
#include "brigade/ops/ref/kernels.h"

namespace brigade::ops {

// ---------------- exact GELU: y = 0.5 x (1 + erf(x / sqrt 2)), same shape and dtype as x.
Tensor gelu_erf(const Tensor& x);
// gx = gy * (Phi(x) + x phi(x)), Phi the standard normal cdf, phi its density.
Tensor gelu_erf_backward(const Tensor& gy, const Tensor& x);

// ---------------- attention with a key padding mask (never causal).
// q, k, v: (B, NH, T, HS); key_mask: (B, T) of 0 / 1 in any dtype (i32, i64, f32, bf16, f16);
// a value other than 0 or 1, or a batch row with no key at 1 (its softmax would be 0/0), is a
// ValueError. out: (B, NH, T, HS) = softmax(scale q k^T + (-inf where key_mask == 0)) v;
// lse: (B, NH, T) f32, the log-sum-exp over the unmasked keys, saved for the backward.
AttentionOut attention_key_mask(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask,
                                double scale);
AttentionGrads attention_key_mask_backward(const Tensor& gout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& out, const Tensor& lse, const Tensor& key_mask,
                                           double scale);
// key_mask (B, T) as bytes (1 = attend), checked as above; for tests and the autograd node.
std::vector<uint8_t> key_mask_bytes(const Tensor& key_mask, int64_t B, int64_t T, const char* op);

// ---------------- patch extraction
// x (N, C, H, W), H and W multiples of p -> (N, (H/p) * (W/p), C*p*p), x's dtype:
// out[n, ph * (W/p) + pw, (c * p + i) * p + j] = x[n, c, ph * p + i, pw * p + j].
Tensor patchify(const Tensor& x, int64_t p);
// The inverse permutation: g (N, (H/p) * (W/p), C*p*p) -> (N, C, H, W) for x_shape (N, C, H, W).
Tensor patchify_backward(const Tensor& g, const Shape& x_shape, int64_t p);

// ---------------- the scalar oracle (contiguous inputs; S = float or double)
namespace ref {

template <class S>
void gelu_erf(int64_t n, const S* x, S* y) {
  const S r = S(0.7071067811865476);  // 1 / sqrt 2
  for (int64_t i = 0; i < n; ++i) y[i] = S(0.5) * x[i] * (S(1) + std::erf(x[i] * r));
}
template <class S>
void gelu_erf_backward(int64_t n, const S* gy, const S* x, S* gx) {
  const S r = S(0.7071067811865476), c = S(0.3989422804014327);  // 1 / sqrt 2, 1 / sqrt(2 pi)
  for (int64_t i = 0; i < n; ++i) {
    const S cdf = S(0.5) * (S(1) + std::erf(x[i] * r));
    const S pdf = c * std::exp(S(-0.5) * x[i] * x[i]);
    gx[i] = gy[i] * (cdf + x[i] * pdf);
  }
}

// q, k, v, out: (B*NH, T, HS) contiguous; keep: (B, T) bytes, head bh belongs to row bh / NH.
// ref::attention_rows (ops/ref/kernels.h) over all T keys, those with keep == 0 left out.
template <class S>
void attention_key_mask(int64_t B, int64_t NH, int64_t T, int64_t HS, const S* q, const S* k, const S* v,
                        const uint8_t* keep, double scale, S* out, S* lse) {
  attention_rows(
      B * NH, T, HS, q, k, v, scale, [T](int64_t) { return T; },
      [=](int64_t bh, int64_t j) { return keep[(bh / NH) * T + j] != 0; }, out, lse);
}

template <class S>
void attention_key_mask_backward(int64_t B, int64_t NH, int64_t T, int64_t HS, const S* gout, const S* q,
                                 const S* k, const S* v, const S* out, const S* lse, const uint8_t* keep,
                                 double scale, S* gq, S* gk, S* gv) {
  attention_rows_backward(
      B * NH, T, HS, gout, q, k, v, out, lse, scale, [T](int64_t) { return T; },
      [=](int64_t bh, int64_t j) { return keep[(bh / NH) * T + j] != 0; }, gq, gk, gv);
}

// x (N, C, H, W) contiguous -> y (N, P, C*p*p); patchify_backward runs the inverse (y -> x).
// patchify_map calls move(x index, y index) for every element, in y's order.
template <class Move>
void patchify_map(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, Move move) {
  const int64_t PW = W / p, P = (H / p) * PW, F = C * p * p;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t pi = 0; pi < P; ++pi)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < p; ++i)
          for (int64_t j = 0; j < p; ++j)
            move(((n * C + c) * H + (pi / PW) * p + i) * W + (pi % PW) * p + j, (n * P + pi) * F + (c * p + i) * p + j);
}
template <class S>
void patchify(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const S* x, S* y) {
  patchify_map(N, C, H, W, p, [=](int64_t xi, int64_t yi) { y[yi] = x[xi]; });
}
template <class S>
void patchify_backward(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const S* g, S* gx) {
  patchify_map(N, C, H, W, p, [=](int64_t xi, int64_t yi) { gx[xi] = g[yi]; });
}

}  // namespace ref
}  // namespace brigade::ops
