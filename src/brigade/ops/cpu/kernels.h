// Optimised f32 CPU kernels, with the same raw-pointer signatures as the oracle in
// ops/ref/kernels.h (see there for the maths and conventions of each). Matmul and
// linear go through oneDNN (cpu/matmul.cpp, the only file that includes dnnl.hpp),
// also with bf16 operands; dtype conversions (cpu/convert.cpp) are AVX-512 intrinsics;
// the rest is OpenMP + auto-vectorised loops. Not a front-end: no shape checks here.
// Other 16-bit work is widened to f32 by the front-end (ops.cpp) around these kernels.
// Determinism: every kernel is bitwise reproducible run to run for a fixed thread
// count (static schedules, fixed reduction order, no atomics).
#pragma once
#include <cstdint>
#include <string>

#include "brigade/core/dtype.h"
#include "brigade/ops/ref/kernels.h"

namespace brigade::ops::cpu {

using ref::BinaryOp;
using ref::UnaryOp;

void binary(BinaryOp op, int nd, const int64_t* shape, const float* a, const int64_t* sa, const float* b,
            const int64_t* sb, float* out);
void unary(UnaryOp op, double s, int nd, const int64_t* shape, const float* a, const int64_t* sa, float* out);
void axpy(int nd, const int64_t* shape, float* dst, const int64_t* sd, const float* src, const int64_t* ss,
          double alpha);
void scale(int nd, const int64_t* shape, float* dst, const int64_t* sd, double s);
void reduce_sum(int nd, const int64_t* shape, const float* in, const int64_t* si, float* out, const int64_t* so,
                int64_t out_numel);
double sum_squares(int nd, const int64_t* shape, const float* in, const int64_t* si);

// cpu/matmul.cpp (oneDNN, cached primitives)
void matmul(int nbd, const int64_t* bshape, const float* a, const int64_t* a_bst, int64_t sam, int64_t sak,
            const float* b, const int64_t* b_bst, int64_t sbk, int64_t sbn, float* c, int64_t M, int64_t N,
            int64_t K);
void linear(int64_t N, int64_t IN, int64_t OUT, const float* x, int64_t sxn, int64_t sxi, const float* w,
            int64_t swo, int64_t swi, const float* bias, float* y);
void linear_backward(int64_t N, int64_t IN, int64_t OUT, const float* gy, const float* x, int64_t sxn, int64_t sxi,
                     const float* w, int64_t swo, int64_t swi, float* gx, float* gw, int64_t sgo, int64_t sgi,
                     float* gb);
// 16-bit GEMMs (same layouts as above; a, b, x, w, gy hold bf16 or f16 bits of dtype `ab`):
// oneDNN with 16-bit memory descriptors, f32 accumulation, the destination in `cd`/`yd`
// (`ab` or F32) rounded once; the bias is F32 or `ab` (`bd`), or null. Only call them when
// gemm16_available(ab); linear16 / linear_backward16 need N, IN, OUT > 0.
bool gemm16_available(DType ab);  // oneDNN has a non-reference kernel for ab on this CPU (probed once)
void matmul16(DType ab, DType cd, int nbd, const int64_t* bshape, const uint16_t* a, const int64_t* a_bst,
              int64_t sam, int64_t sak, const uint16_t* b, const int64_t* b_bst, int64_t sbk, int64_t sbn, void* c,
              int64_t M, int64_t N, int64_t K);
void linear16(DType ab, DType yd, int64_t N, int64_t IN, int64_t OUT, const uint16_t* x, int64_t sxn, int64_t sxi,
              const uint16_t* w, int64_t swo, int64_t swi, const void* bias, DType bd, void* y);
// gx, gw (either may be null) in dtype `dt` like gy, x, w; the bias grad is the caller's.
void linear_backward16(DType dt, int64_t N, int64_t IN, int64_t OUT, const uint16_t* gy, const uint16_t* x,
                       int64_t sxn, int64_t sxi, const uint16_t* w, int64_t swo, int64_t swi, uint16_t* gx,
                       uint16_t* gw, int64_t sgo, int64_t sgi);
// For tests: "<oneDNN implementation> <ab>-><c>" of the most recent GEMM run here (any
// dtype), and how many oneDNN primitives have been created (cache misses) so far.
std::string last_matmul_impl();
int64_t matmul_primitives_created();

// Column sums of a contiguous (N, C) matrix: out[c] = sum_n x[n, c] (fixed row-block order).
void column_sum(int64_t N, int64_t C, const float* x, float* out);

void embedding(int64_t N, int64_t C, const float* w, int64_t swv, int64_t swc, const int64_t* ids, float* y);
void embedding_backward(int64_t N, int64_t C, int64_t V, const float* gy, const int64_t* ids, float* gw);

void layer_norm(int64_t N, int64_t C, const float* x, const float* w, const float* b, double eps, float* y,
                float* mean, float* rstd);
void layer_norm_backward(int64_t N, int64_t C, const float* gy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* gx, float* gw, float* gb);

void gelu(int64_t n, const float* x, float* y);
void gelu_backward(int64_t n, const float* gy, const float* x, float* gx);

void softmax(int64_t N, int64_t C, const float* x, float* y);
void softmax_backward(int64_t N, int64_t C, const float* gy, const float* y, float* gx);

void attention(int64_t BH, int64_t T, int64_t HS, const float* q, const float* k, const float* v, bool causal,
               double scale, float* out, float* lse);
void attention_backward(int64_t BH, int64_t T, int64_t HS, const float* gout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, bool causal, double scale, float* gq,
                        float* gk, float* gv);

int64_t cross_entropy(int64_t N, int64_t V, const float* logits, const int64_t* targets, int64_t ignore_index,
                      float* loss, float* lse);
void cross_entropy_backward(int64_t N, int64_t V, double gloss, const float* logits, const int64_t* targets,
                            const float* lse, int64_t ignore_index, float* glogits);

void dropout_apply(int64_t n, const float* x, const float* mask, float* y);

// 16-bit embedding rows (a bit copy: y = weight[ids], as `embedding` above).
void embedding16(int64_t N, int64_t C, const uint16_t* w, int64_t swv, int64_t swc, const int64_t* ids, uint16_t* y);

// cpu/convert.cpp: out (contiguous, dtype `to`) = in (dtype `from`, strided), bitwise equal to
// ref::cast (the scalar conversions of core/dtype.h); vectorised, OpenMP for large tensors.
void cast(DType from, DType to, int nd, const int64_t* shape, const void* in, const int64_t* si, void* out);

}  // namespace brigade::ops::cpu
