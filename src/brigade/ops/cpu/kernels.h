// Optimised CPU kernels, with the raw-pointer signatures of the oracle (ops/ref/<family>.h, where
// the maths of each is). GEMMs and convolutions run oneDNN (cpu/gemm.cpp, cpu/conv.cpp), casts
// AVX-512 intrinsics, the rest OpenMP and auto-vectorised loops. No shape checks (the front-ends
// do them). Every kernel is bitwise reproducible for a thread count: static schedules, a fixed
// reduction order, no atomics.
#pragma once
#include <cstdint>
#include <string>

#include "brigade/core/dtype.h"
#include "brigade/ops/position.h"
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

// cpu/gemm.cpp (oneDNN, cached primitives)
void matmul(int nbd, const int64_t* bshape, const float* a, const int64_t* a_bst, int64_t sam, int64_t sak,
            const float* b, const int64_t* b_bst, int64_t sbk, int64_t sbn, float* c, int64_t M, int64_t N, int64_t K);
void linear(int64_t N, int64_t IN, int64_t OUT, const float* x, int64_t sxn, int64_t sxi, const float* w, int64_t swo,
            int64_t swi, const float* bias, float* y);
void linear_backward(int64_t N, int64_t IN, int64_t OUT, const float* gy, const float* x, int64_t sxn, int64_t sxi,
                     const float* w, int64_t swo, int64_t swi, float* gx, float* gw, int64_t sgo, int64_t sgi,
                     float* gb);
// 16-bit GEMMs (same layouts as above; a, b, x, w, gy hold bf16 or f16 bits of dtype `ab`):
// oneDNN with 16-bit memory descriptors, f32 accumulation, the destination in `cd`/`yd`
// (`ab` or F32) rounded once; the bias is F32 or `ab` (`bd`), or null. Only call them when
// gemm16_available(ab); linear16 / linear_backward16 need N, IN, OUT > 0.
bool gemm16_available(DType ab);  // oneDNN has a non-reference kernel for ab on this CPU (probed once)
void matmul16(DType ab, DType cd, int nbd, const int64_t* bshape, const uint16_t* a, const int64_t* a_bst, int64_t sam,
              int64_t sak, const uint16_t* b, const int64_t* b_bst, int64_t sbk, int64_t sbn, void* c, int64_t M,
              int64_t N, int64_t K);
void linear16(DType ab, DType yd, int64_t N, int64_t IN, int64_t OUT, const uint16_t* x, int64_t sxn, int64_t sxi,
              const uint16_t* w, int64_t swo, int64_t swi, const void* bias, DType bd, void* y);
// gx, gw (either may be null) in dtype `dt` like gy, x, w; the bias grad is the caller's.
void linear_backward16(DType dt, int64_t N, int64_t IN, int64_t OUT, const uint16_t* gy, const uint16_t* x, int64_t sxn,
                       int64_t sxi, const uint16_t* w, int64_t swo, int64_t swi, uint16_t* gx, uint16_t* gw,
                       int64_t sgo, int64_t sgi);
// For tests: "<oneDNN implementation> <ab>-><c>" of the most recent GEMM run here (any
// dtype), and how many oneDNN primitives have been created (cache misses) so far.
std::string last_matmul_impl();
int64_t matmul_primitives_created();

// Column sums of a contiguous (N, C) matrix: out[c] = sum_n x[n, c] (fixed row-block order).
void column_sum(int64_t N, int64_t C, const float* x, float* out);

void embedding(int64_t N, int64_t C, const float* w, int64_t swv, int64_t swc, const int64_t* ids, float* y);
void embedding_backward(int64_t N, int64_t C, int64_t V, const float* gy, const int64_t* ids, float* gw);

void layer_norm(int64_t N, int64_t C, const float* x, const float* w, const float* b, double eps, float* y, float* mean,
                float* rstd);
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
// Bytes of caching-allocator workspace (MemTag::Workspace) each OpenMP thread holds inside
// the f32 attention kernels above: the larger of the forward's and the backward's tiles. For
// memory planning (train/memory_plan.cpp).
int64_t attention_workspace_per_thread(int64_t T, int64_t HS);
// The same for sum_squares over n contiguous elements (its per-block partial sums).
int64_t sum_squares_workspace(int64_t n);

int64_t cross_entropy(int64_t N, int64_t V, const float* logits, const int64_t* targets, int64_t ignore_index,
                      float* loss, float* lse);
void cross_entropy_backward(int64_t N, int64_t V, double gloss, const float* logits, const int64_t* targets,
                            const float* lse, int64_t ignore_index, float* glogits);

void dropout_apply(int64_t n, const float* x, const float* mask, float* y);

// 16-bit embedding rows (a bit copy: y = weight[ids], as `embedding` above).
void embedding16(int64_t N, int64_t C, const uint16_t* w, int64_t swv, int64_t swc, const int64_t* ids, uint16_t* y);

// ---------------- native 16-bit kernels
// For ops whose floating inputs are one 16-bit dtype (the front-end decides): the 16-bit values
// are widened into per-thread f32 buffers (a piece, a row or a head, never a whole tensor), run
// through the f32 kernel's arithmetic in its order and split, and rounded once on store to `ot`
// (bf16, f16, or f32 where the contract keeps an output f32): bitwise the widened path (ops.h).
// One caveat: where a sum adds two NaNs, which one comes out may differ (x86 keeps the first
// operand's, and the operand order is the compiler's per loop); NaN stays NaN.
// Inputs are `Strided` views (dtype, data, logical shape, strides; a broadcast operand has stride
// 0); outputs are contiguous unless said otherwise.
struct Strided {
  DType dt;
  const void* p;
  int nd;
  const int64_t* shape;
  const int64_t* st;
  bool contiguous() const;  // row-major without gaps (size-1 dims ignored)
};

// Test hook (thread-local, on by default): `Native16Scope off(false)` sends this thread's ops down
// the widened path, which the tests compare against bitwise.
bool native16_enabled();
class Native16Scope {
 public:
  explicit Native16Scope(bool on);
  ~Native16Scope();
  Native16Scope(const Native16Scope&) = delete;
  Native16Scope& operator=(const Native16Scope&) = delete;

 private:
  bool prev_;
};

// cpu/elementwise.cpp. a, b, dst, src: views over one shape (a.shape; broadcast strides).
void binary16(BinaryOp op, const Strided& a, const Strided& b, DType ot, void* out);
void unary16(UnaryOp op, double s, const Strided& a, DType ot, void* out);
// In place (dst.p is written through its strides): dst += alpha * src; dst *= s.
void axpy16(const Strided& dst, const Strided& src, double alpha);
void scale16(const Strided& dst, double s);
void gelu16(const Strided& x, DType ot, void* y);
void gelu_backward16(const Strided& gy, const Strided& x, DType ot, void* gx);
// cpu/reduce.cpp: reduce_sum above on the logical elements of `in` (so: output strides over
// in.shape, 0 on reduced dims), out (out_numel values) in dtype ot. x, gy, y: logical (N, C).
void reduce_sum16(const Strided& in, const int64_t* so, int64_t out_numel, DType ot, void* out);
void softmax16(int64_t N, int64_t C, const Strided& x, DType ot, void* y);
void softmax_backward16(int64_t N, int64_t C, const Strided& gy, const Strided& y, DType ot, void* gx);
// cpu/embedding.cpp. gy: logical (N, C); gw (V, C) in dtype ot.
void embedding_backward16(int64_t N, int64_t C, int64_t V, const Strided& gy, const int64_t* ids, DType ot, void* gw);

// cpu/norm.cpp, cpu/loss.cpp. x, gy, logits: logical (N, C) / (N, V). w, b, mean, rstd, lse: f32.
void layer_norm16(int64_t N, int64_t C, const Strided& x, const float* w, const float* b, double eps, DType ot, void* y,
                  float* mean, float* rstd);
// gx in dtype ot; gw, gb f32 (C).
void layer_norm_backward16(int64_t N, int64_t C, const Strided& gy, const Strided& x, const float* w, const float* mean,
                           const float* rstd, DType ot, void* gx, float* gw, float* gb);
int64_t cross_entropy16(int64_t N, int64_t V, const Strided& logits, const int64_t* targets, int64_t ignore_index,
                        float* loss, float* lse);
void cross_entropy_backward16(int64_t N, int64_t V, double gloss, const Strided& logits, const int64_t* targets,
                              const float* lse, int64_t ignore_index, DType ot, void* glogits);

// cpu/attention.cpp. q, k, v, gout, out: (B, NH, T, HS) views, BH = B * NH; lse f32
// contiguous (BH, T); out, gq, gk, gv contiguous in dtype ot.
void attention16(int64_t BH, int64_t T, int64_t HS, const Strided& q, const Strided& k, const Strided& v, bool causal,
                 double scale, DType ot, void* out, float* lse);
void attention_backward16(int64_t BH, int64_t T, int64_t HS, const Strided& gout, const Strided& q, const Strided& k,
                          const Strided& v, const Strided& out, const float* lse, bool causal, double scale, DType ot,
                          void* gq, void* gk, void* gv);

// cpu/cast.cpp: out (contiguous, dtype `to`) = in (dtype `from`, strided), bitwise equal to
// ref::cast (the scalar conversions of core/dtype.h); vectorised, OpenMP for large tensors.
void cast(DType from, DType to, int nd, const int64_t* shape, const void* in, const int64_t* si, void* out);

// ---------------- the other families' kernels (f32 unless a dtype is passed)

// cpu/elementwise.cpp: exact GELU (libmvec's vector erff / expf where glibc has them), SiLU,
// and ReLU on 16-bit bit patterns (inf: the dtype's +Inf bits, inf_bits(dt); bitwise the
// widened definition, as the result is one of the input's values or +0).
void gelu_erf(int64_t n, const float* x, float* y);
void gelu_erf_backward(int64_t n, const float* gy, const float* x, float* gx);
void silu(int64_t n, const float* x, float* y);
void silu_backward(int64_t n, const float* gy, const float* x, float* gx);
uint16_t inf_bits(DType dt);
void relu16(int64_t n, uint16_t inf, const uint16_t* x, uint16_t* y);
// y = relu(x) (NaN passes), gx = y > 0 ? gy : 0 on f32 (strided) into contiguous f32.
void relu(const Strided& x, float* y);
void relu_backward(const Strided& gy, const Strided& y, float* gx);
// y = max(a + b, 0) (NaN passes) on a and b of one shape and any floating dtypes (strided), into
// ot, the sum rounded once on store.
void add_relu(const Strided& a, const Strided& b, DType ot, void* y);
void relu_backward16(int64_t n, uint16_t inf, const uint16_t* gy, const uint16_t* y, uint16_t* gx);

// cpu/norm.cpp: RMSNorm over contiguous rows; batch norm over NCHW planes (N, C, HW) or
// channels-last rows (M = N H W, C), x / y / gy / gx in their own dtypes (widened in pieces),
// w, b, statistics and running stats f32 (see ops::batch_norm2d for the maths).
void rms_norm(int64_t N, int64_t C, const float* x, const float* w, double eps, float* y, float* rstd);
void rms_norm_backward(int64_t N, int64_t C, const float* gy, const float* x, const float* w, const float* rstd,
                       float* gx, float* gw);
void batch_norm_planes(int64_t N, int64_t C, int64_t HW, DType dt, const void* x, const float* w, const float* b,
                       bool training, const float* rmean, const float* rvar, double eps, void* y, float* mean,
                       float* rstd, float* var_out);
void batch_norm_planes_backward(int64_t N, int64_t C, int64_t HW, DType dg, const void* gy, DType dx, const void* x,
                                const float* w, const float* mean, const float* rstd, bool training, void* gx,
                                float* gw, float* gb);
void batch_norm_rows(int64_t M, int64_t C, DType dt, const void* x, const float* w, const float* b, bool training,
                     const float* rmean, const float* rvar, double eps, void* y, float* mean, float* rstd,
                     float* var_out);
void batch_norm_rows_backward(int64_t M, int64_t C, DType dg, const void* gy, DType dx, const void* x, const float* w,
                              const float* mean, const float* rstd, bool training, void* gx, float* gw, float* gb);

// cpu/attention.cpp: attention with a key padding mask (keep: (B, T) bytes) on contiguous
// (B*NH, T, HS) heads; repeat_kv's backward (the sum over each group of n_rep heads).
void attention_key_mask(int64_t B, int64_t NH, int64_t T, int64_t HS, const float* q, const float* k, const float* v,
                        const uint8_t* keep, double scale, float* out, float* lse);
void attention_key_mask_backward(int64_t B, int64_t NH, int64_t T, int64_t HS, const float* gout, const float* q,
                                 const float* k, const float* v, const float* out, const float* lse,
                                 const uint8_t* keep, double scale, float* gq, float* gk, float* gv);
void repeat_kv_backward(int64_t B, int64_t NKV, int64_t n_rep, int64_t THS, const float* gy, float* gx);

// cpu/conv.cpp: oneDNN convolutions (x, w, y, gy, gx of element type t: F32 or BF16; b, gw, gb
// f32, any may be null; channels_last: NHWC x, y), primitives cached per geometry; the direct
// depthwise kernels (groups == C == O, NCHW f32); the channels-last max-pool (rows of C
// channels in dtype dt); patch copies. last_conv2d_impl: "<oneDNN implementation> <f32|bf16>"
// of the latest forward, for tests.
void conv2d(const ref::ConvGeom& g, const void* x, const void* w, const float* b, void* y, DType t = DType::F32,
            bool channels_last = false);
void conv2d_backward(const ref::ConvGeom& g, const void* gy, const void* x, const void* w, void* gx, float* gw,
                     float* gb, DType t = DType::F32, bool channels_last = false);
bool conv2d_bf16_available();  // a non-reference bf16 convolution on this CPU (probed once)
std::string last_conv2d_impl();
void set_last_conv2d_impl(const char* impl);
void depthwise_conv2d(const ref::ConvGeom& g, const float* x, const float* w, const float* b, float* y);
void depthwise_conv2d_backward_data(const ref::ConvGeom& g, const float* gy, const float* w, float* gx);
void depthwise_conv2d_backward_weights(const ref::ConvGeom& g, const float* gy, const float* x, float* gw, float* gb);
void max_pool_rows(int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t N, int64_t C, int64_t k, int64_t s, int64_t p,
                   DType dt, const void* x, void* y, int64_t* idx);
void max_pool_rows_backward(int64_t N, int64_t HW, int64_t OHW, int64_t C, DType dt, const void* gy, const int64_t* idx,
                            void* gx);
void patchify(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const float* x, float* y);
void patchify_backward(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const float* g, float* gx);

// cpu/position.cpp: RoPE on BH contiguous (T, HS) heads (sign +1 forward, -1 backward);
// roll2d on contiguous (B, H, W, C) of esize-byte elements (row copies).
void rope(int64_t BH, int64_t T, int64_t HS, const RopeSpec& spec, int64_t pos0, double sign, const float* x, float* y);
void roll2d(int64_t B, int64_t H, int64_t W, int64_t C, int64_t sh, int64_t sw, size_t esize, const char* x, char* out);

}  // namespace brigade::ops::cpu
