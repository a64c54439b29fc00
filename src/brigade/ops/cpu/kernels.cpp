// Optimised f32 CPU kernels (see kernels.h). TEMPORARY: forwards to the scalar
// oracle in ops/ref while the fast kernels are written one by one.
#include "brigade/ops/cpu/kernels.h"

namespace brigade::ops::cpu {

void binary(BinaryOp op, int nd, const int64_t* shape, const float* a, const int64_t* sa, const float* b,
            const int64_t* sb, float* out) { ref::binary(op, nd, shape, a, sa, b, sb, out); }
void unary(UnaryOp op, double s, int nd, const int64_t* shape, const float* a, const int64_t* sa, float* out) {
  ref::unary(op, s, nd, shape, a, sa, out);
}
void axpy(int nd, const int64_t* shape, float* dst, const int64_t* sd, const float* src, const int64_t* ss,
          double alpha) { ref::axpy(nd, shape, dst, sd, src, ss, alpha); }
void scale(int nd, const int64_t* shape, float* dst, const int64_t* sd, double s) { ref::scale(nd, shape, dst, sd, s); }
void reduce_sum(int nd, const int64_t* shape, const float* in, const int64_t* si, float* out, const int64_t* so,
                int64_t out_numel) { ref::reduce_sum(nd, shape, in, si, out, so, out_numel); }
double sum_squares(int nd, const int64_t* shape, const float* in, const int64_t* si) {
  return ref::sum_squares(nd, shape, in, si);
}
void matmul(int nbd, const int64_t* bshape, const float* a, const int64_t* a_bst, int64_t sam, int64_t sak,
            const float* b, const int64_t* b_bst, int64_t sbk, int64_t sbn, float* c, int64_t M, int64_t N,
            int64_t K) { ref::matmul(nbd, bshape, a, a_bst, sam, sak, b, b_bst, sbk, sbn, c, M, N, K); }
void linear(int64_t N, int64_t IN, int64_t OUT, const float* x, int64_t sxn, int64_t sxi, const float* w,
            int64_t swo, int64_t swi, const float* bias, float* y) {
  ref::linear(N, IN, OUT, x, sxn, sxi, w, swo, swi, bias, y);
}
void linear_backward(int64_t N, int64_t IN, int64_t OUT, const float* gy, const float* x, int64_t sxn, int64_t sxi,
                     const float* w, int64_t swo, int64_t swi, float* gx, float* gw, int64_t sgo, int64_t sgi,
                     float* gb) { ref::linear_backward(N, IN, OUT, gy, x, sxn, sxi, w, swo, swi, gx, gw, sgo, sgi, gb); }
void column_sum(int64_t N, int64_t C, const float* x, float* out) {
  for (int64_t c = 0; c < C; ++c) out[c] = 0.f;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[c] += x[n * C + c];
}
void embedding(int64_t N, int64_t C, const float* w, int64_t swv, int64_t swc, const int64_t* ids, float* y) {
  ref::embedding(N, C, w, swv, swc, ids, y);
}
void embedding_backward(int64_t N, int64_t C, int64_t V, const float* gy, const int64_t* ids, float* gw) {
  ref::embedding_backward(N, C, V, gy, ids, gw);
}
void layer_norm(int64_t N, int64_t C, const float* x, const float* w, const float* b, double eps, float* y,
                float* mean, float* rstd) { ref::layer_norm(N, C, x, w, b, eps, y, mean, rstd); }
void layer_norm_backward(int64_t N, int64_t C, const float* gy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* gx, float* gw, float* gb) {
  ref::layer_norm_backward(N, C, gy, x, w, mean, rstd, gx, gw, gb);
}
void gelu(int64_t n, const float* x, float* y) { ref::gelu(n, x, y); }
void gelu_backward(int64_t n, const float* gy, const float* x, float* gx) { ref::gelu_backward(n, gy, x, gx); }
void softmax(int64_t N, int64_t C, const float* x, float* y) { ref::softmax(N, C, x, y); }
void softmax_backward(int64_t N, int64_t C, const float* gy, const float* y, float* gx) {
  ref::softmax_backward(N, C, gy, y, gx);
}
void attention(int64_t BH, int64_t T, int64_t HS, const float* q, const float* k, const float* v, bool causal,
               double scale, float* out, float* lse) { ref::attention(BH, T, HS, q, k, v, causal, scale, out, lse); }
void attention_backward(int64_t BH, int64_t T, int64_t HS, const float* gout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, bool causal, double scale, float* gq,
                        float* gk, float* gv) {
  ref::attention_backward(BH, T, HS, gout, q, k, v, out, lse, causal, scale, gq, gk, gv);
}
int64_t cross_entropy(int64_t N, int64_t V, const float* logits, const int64_t* targets, int64_t ignore_index,
                      float* loss, float* lse) { return ref::cross_entropy(N, V, logits, targets, ignore_index, loss, lse); }
void cross_entropy_backward(int64_t N, int64_t V, double gloss, const float* logits, const int64_t* targets,
                            const float* lse, int64_t ignore_index, float* glogits) {
  ref::cross_entropy_backward(N, V, gloss, logits, targets, lse, ignore_index, glogits);
}
void dropout_apply(int64_t n, const float* x, const float* mask, float* y) { ref::dropout_apply(n, x, mask, y); }

}  // namespace brigade::ops::cpu
