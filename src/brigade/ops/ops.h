// The raw ops: every op family's front-end header (ops/<family>.h), the backend switch, and the
// dtype contract every op keeps. Each family has the same stem in every folder: the front-end
// ops/<family>.h/.cpp (shape/dtype checks, output allocation, dispatch), the scalar oracle
// ops/ref/<family>.h, the optimised kernels ops/cpu/<family>.cpp (declared in ops/cpu/kernels.h),
// the derivative rules autograd/rules/<family>.cpp and the op-harness cases
// tests/ops/cases/<family>.cpp. Families: cast, elementwise, reduce, gemm, embedding, norm,
// attention, loss, dropout, conv, position. Ops have no autograd; each backward is an op of its
// own.
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
//  - The other families' output dtypes follow the same rule: outputs in the input's dtype
//    (x's, or q's for attention), gradients in the dtype of what they differentiate, and
//    statistics, log-sum-exps and losses always f32. So: rms_norm y x's, rstd f32; batch_norm2d
//    y x's, mean and rstd f32 (running stats f32, updated in place), its backward gx x's, gw gb
//    w's; conv2d x's dtype when x and w agree, else f32, its backward gx x's, gw w's, gb gy's;
//    max_pool2d y x's, idx i64; cross_entropy_smoothed loss and lse f32; roll2d moves 16-bit
//    values without rounding them (a permutation).
//  - Cost. On the cpu backend, an op whose floating inputs are all of one 16-bit dtype runs
//    a native 16-bit kernel: pieces, rows or attention heads are widened into per-thread f32
//    buffers, computed with the f32 kernel's arithmetic and rounded once on store, with no
//    f32 copy of a whole tensor; the result is bitwise the widened path below. Also native:
//    add_ / mul_scalar_ with a 16-bit dst or src (any mix), layer_norm's w and b and
//    dropout_backward's gy in any floating dtype. matmul, linear and linear_backward with
//    bf16 operands (all of one dtype) run oneDNN bf16 GEMMs directly (f32 accumulation,
//    rounded once); conv2d and conv2d_backward with bf16 x, w (and gy) and groups 1 run
//    oneDNN's bf16 convolutions where it has a non-reference kernel (conv2d_native_bf16()):
//    f32 accumulation, within one bf16 rounding of the widened definition but not bitwise it.
//    batch_norm2d, max_pool2d, relu and their backwards read and write 16-bit activations
//    themselves (f32 weights and statistics beside them), bitwise the widened path.
//    Everything else with 16-bit inputs (the ref backend, mixed dtypes, f16 GEMMs and
//    convolutions, as oneDNN 2.6 has no f16 kernels without AVX512-FP16, sum_squares, and the
//    ops without a native kernel) widens the inputs to f32 copies (ops::cast) around the f32
//    kernels.
#pragma once
#include "brigade/ops/attention.h"
#include "brigade/ops/cast.h"
#include "brigade/ops/conv.h"
#include "brigade/ops/dropout.h"
#include "brigade/ops/elementwise.h"
#include "brigade/ops/embedding.h"
#include "brigade/ops/gemm.h"
#include "brigade/ops/loss.h"
#include "brigade/ops/norm.h"
#include "brigade/ops/position.h"
#include "brigade/ops/reduce.h"

namespace brigade::ops {

enum class Backend { Ref, Cpu };
Backend current_backend();  // thread-local; Cpu by default
void set_backend(Backend b);
class BackendScope {  // RAII switch, used by the op harness
 public:
  explicit BackendScope(Backend b) : prev_(current_backend()) { set_backend(b); }
  ~BackendScope() { set_backend(prev_); }

 private:
  Backend prev_;
};

}  // namespace brigade::ops
