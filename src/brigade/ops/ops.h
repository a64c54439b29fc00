// Op front-end: shape/dtype checks, output allocation and dispatch to a backend
// (ref = scalar oracle in ops/ref, cpu = optimised kernels in ops/cpu). These are
// raw ops with no autograd; each backward is an op of its own, used by the
// derivative rules in autograd/functions.cpp.
// Conventions: shape letters B T C V NH HS; "(..., C)" means any leading dims.
// Inputs may be non-contiguous views; outputs are always fresh contiguous tensors,
// allocated under the current MemTagScope.
//
// Dtypes. Every floating op takes f32, bf16 and f16 inputs, on both backends; integer
// or undefined tensors where floats are expected are a ShapeError / ValueError naming
// the op and the argument. The contract (autocast relies on it):
//  - Compute is always f32 inside the kernels (f32 accumulation). 16-bit inputs are
//    widened exactly; 16-bit outputs are rounded once, round-to-nearest-even, NaN stays
//    NaN, +-Inf and denormals preserved, f16 values above the f16 max round to Inf as
//    IEEE says. The scalar conversions of core/dtype.h are the definition; the
//    vectorised ones (cast on the cpu backend) match them bitwise.
//  - Output dtypes:
//      add sub mul div: the operands' dtype when equal, else f32.
//      add_scalar mul_scalar neg exp log tanh sqrt gelu softmax sum mean sum_all sum_to
//      cross_entropy_backward: the input's dtype (glogits: logits'). sum_squares: double.
//      A backward's gradient has the dtype of the tensor it differentiates:
//      gelu_backward -> x's, softmax_backward -> y's, dropout_backward -> mask's (= x's).
//      matmul(a, b): a's dtype when a and b agree, else f32.
//      linear(x, w, bias): x's dtype when x and w agree, else f32 (bias: any floating or
//      undefined). linear_backward: gx x's, gw w's, gb gy's dtype.
//      embedding: weight's; embedding_backward: gy's.
//      layer_norm: y x's; mean, rstd always f32. layer_norm_backward: gx x's, gw gb w's.
//      attention: out q's, lse always f32; attention_backward: gq gk gv q's k's v's.
//      cross_entropy: loss and lse always f32.
//      dropout: y and mask x's dtype (mask holds 0 or 1/(1-p) rounded to it; y = x * mask
//      with that rounded mask, so dropout_backward(x, mask) reproduces y bitwise).
//      add_(dst, src) and mul_scalar_(dst): any floating dtypes; computed in f32 and stored
//      rounded into dst.
//  - Cost. On the cpu backend, an op whose floating inputs are all of one 16-bit dtype runs
//    a native 16-bit kernel: pieces, rows or attention heads are widened into per-thread f32
//    buffers, computed with the f32 kernel's arithmetic and rounded once on store, with no
//    f32 copy of a whole tensor; the result is bitwise the widened path below. Also native:
//    add_ / mul_scalar_ with a 16-bit dst or src (any mix), layer_norm's w and b and
//    dropout_backward's gy in any floating dtype. matmul, linear and linear_backward with
//    bf16 operands (all of one dtype) run oneDNN bf16 GEMMs directly (f32 accumulation,
//    rounded once). Everything else with 16-bit inputs (the ref backend, mixed dtypes, f16
//    GEMMs, as oneDNN 2.6 has no f16 matmul without AVX512-FP16, and sum_squares) widens
//    the inputs to f32 copies (ops::cast) around the f32 kernels.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/core/tensor.h"

namespace brigade::ops {

enum class Backend { Ref, Cpu };
Backend current_backend();               // thread-local; Cpu by default
void set_backend(Backend b);
class BackendScope {                     // RAII switch, used by the op harness
 public:
  explicit BackendScope(Backend b) : prev_(current_backend()) { set_backend(b); }
  ~BackendScope() { set_backend(prev_); }
 private:
  Backend prev_;
};

// ---------------- dtype conversion
// A fresh contiguous tensor of dtype dt (any floating dtype) with x's values converted as
// the contract above says; a same-dtype cast is a copy. x may be a strided view.
Tensor cast(const Tensor& x, DType dt);

// ---------------- elementwise with numpy/torch broadcasting
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& a, double s);
Tensor mul_scalar(const Tensor& a, double s);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
// In place, same shape (or src broadcastable to dst): dst += alpha * src.
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);
void mul_scalar_(const Tensor& dst, double s);
Shape broadcast_shapes(const Shape& a, const Shape& b);  // ShapeError if incompatible
// Sums g (shape broadcast_shapes(shape, ...)) down to `shape`: the backward of broadcasting.
Tensor sum_to(const Tensor& g, const Shape& shape);

// ---------------- reductions
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor sum_all(const Tensor& a);          // 0-d
double sum_squares(const Tensor& a);      // sum of a^2 in double (for global-norm clipping)
// Caching-allocator workspace (MemTag::Workspace) the cpu kernels take, for memory planning:
// per OpenMP thread inside f32 attention / attention_backward (T keys, head size HS), and
// sum_squares over n contiguous f32 elements (once).
int64_t attention_workspace_per_thread(int64_t T, int64_t HS);
int64_t sum_squares_workspace(int64_t n);

// ---------------- matmul / linear (oneDNN in cpu, cached primitives)
// a (..., M, K) @ b (..., K, N) -> (..., M, N); batch dims broadcast; trans_a/trans_b
// transpose the last two dims of a/b first. 1-D inputs are not accepted.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// Weight layout of a linear layer: OutIn is torch.nn.Linear (out, in);
// InOut is Hugging Face GPT-2 Conv1D (in, out).
enum class WeightLayout { OutIn, InOut };
// y (..., out) = x (..., in) @ W (+ bias (out))
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout);
struct LinearGrads { Tensor gx, gw, gb; };  // gb undefined when need_gb is false
LinearGrads linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, WeightLayout layout,
                            bool need_gx = true, bool need_gw = true, bool need_gb = true);

// ---------------- embedding: ids (...) i32/i64, weight (V, C) -> (..., C)
// Ids outside [0, V) are a ValueError naming the id and V.
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor embedding_backward(const Tensor& gy, const Tensor& ids, int64_t V);  // (V, C)

// ---------------- layer norm over the last dim (Ba et al. 2016; torch.nn.LayerNorm)
struct LayerNormOut { Tensor y, mean, rstd; };  // mean, rstd: (N) with N = numel / C
LayerNormOut layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
struct LayerNormGrads { Tensor gx, gw, gb; };
LayerNormGrads layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                   const Tensor& rstd);

// ---------------- GELU, tanh approximation (Hendrycks & Gimpel 2016; torch approximate='tanh')
Tensor gelu(const Tensor& x);
Tensor gelu_backward(const Tensor& gy, const Tensor& x);

// ---------------- softmax over the last dim
Tensor softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& gy, const Tensor& y);

// ---------------- scaled dot-product attention (Vaswani et al. 2017), optionally causal.
// q, k, v: (B, NH, T, HS). out: (B, NH, T, HS); lse: (B, NH, T) log-sum-exp of the scaled
// scores of each query row, saved for the backward (which recomputes probabilities).
struct AttentionOut { Tensor out, lse; };
AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale);
struct AttentionGrads {
  Tensor gq, gk, gv;
  // Fresh uninitialised gradients of q's shape s (all three alike) in dtype dt, for a kernel to fill.
  static AttentionGrads empty(const Shape& s, DType dt = DType::F32);
};
AttentionGrads attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, bool causal, double scale);

// ---------------- fused log-softmax + cross-entropy (torch.nn.functional.cross_entropy,
// reduction='mean' over targets != ignore_index). logits (N, V); targets (N) i32/i64.
struct CrossEntropyOut { Tensor loss, lse; };  // loss: 0-d; lse: (N)
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// glogits (N, V) = gloss * (softmax(logits) - onehot(target)) / count
Tensor cross_entropy_backward(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index = -100);
// The same gradient, written over `logits` when this call holds the only reference to them
// (Tensor::sole_owner), they are contiguous and the cpu backend runs (f32 or a native 16-bit
// dtype): no second (N, V) buffer, which for a 50k vocabulary is the step's largest. Otherwise
// as cross_entropy_backward. The autograd rule passes its saved logits here.
Tensor cross_entropy_backward_(double gloss, Tensor logits, const Tensor& targets, const Tensor& lse,
                               int64_t ignore_index = -100);

// ---------------- dropout (inverted): mask holds 0 or 1/(1-p), drawn from gen in
// element order; y = x * mask. p = 0 returns x's values and an all-ones mask.
struct DropoutOut { Tensor y, mask; };
DropoutOut dropout(const Tensor& x, double p, Generator& gen);
Tensor dropout_backward(const Tensor& gy, const Tensor& mask);

}  // namespace brigade::ops
