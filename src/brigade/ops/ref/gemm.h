// Scalar oracle of matmul and linear (ops/gemm.h).
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

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
void linear_backward(int64_t N, int64_t IN, int64_t OUT, const S* gy, const S* x, int64_t sxn, int64_t sxi, const S* w,
                     int64_t swo, int64_t swi, S* gx, S* gw, int64_t sgo, int64_t sgi, S* gb) {
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

}  // namespace brigade::ops::ref
