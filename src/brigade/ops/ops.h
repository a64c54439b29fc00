// The raw ops: every family's front-end header, the backend switch, and the dtype contract every
// op keeps (stated here once; the family headers and kernels refer to it). Families, each with the
// same stem in every folder (CONTRIBUTING.md, "Add an op"): cast, elementwise, reduce, gemm,
// embedding, norm, attention, loss, dropout, conv, position. Ops record no autograd; each backward
// is an op of its own. Inputs may be non-contiguous views; outputs are fresh contiguous tensors,
// allocated under the current MemTagScope. Shape letters B T C V NH HS; "(..., C)": any leading dims.
//
// Dtype contract (autocast relies on it). Every floating op takes f32, bf16 and f16 on both
// backends; an integer or undefined tensor where a float is expected is a ShapeError / ValueError
// naming the op and the argument.
//  - Kernels compute in f32. 16-bit inputs widen exactly; 16-bit outputs round once, to nearest
//    even (NaN stays NaN, +-Inf and denormals kept, above the f16 max -> Inf), as the scalar
//    conversions of core/dtype.h define and the vectorised cast matches bitwise.
//  - Outputs: the input's dtype (x's; q's for attention; weight's for embedding); binary ops,
//    matmul, linear and conv2d: the operands' dtype when they agree, else f32 (a bias may be any
//    floating dtype). A backward's gradient has the dtype of what it differentiates (linear's and
//    conv2d's gb: gy's; embedding_backward: gy's). Statistics, log-sum-exps and losses are f32
//    (layer_norm / rms_norm / batch_norm2d mean and rstd, attention's and cross_entropy's lse and
//    loss), sum_squares is double, max_pool2d's idx i64. dropout's mask is x's dtype (0 or 1/(1-p)
//    rounded to it, y = x * mask, so dropout_backward reproduces y bitwise). add_(dst, src) and
//    mul_scalar_(dst) take any floating dtypes and store rounded into dst. roll2d and the other
//    copies move 16-bit values without rounding.
//  - Cost on the cpu backend. An op whose floating inputs are all one 16-bit dtype runs a native
//    16-bit kernel (cpu/kernels.h): pieces, rows or heads widened into per-thread f32 buffers, the
//    f32 arithmetic, one rounding on store; bitwise the widened path. Also native with mixed
//    inputs: add_ / mul_scalar_, layer_norm's w and b, dropout_backward's gy, batch_norm2d's f32
//    weights and statistics. bf16 matmul / linear run oneDNN bf16 GEMMs (f32 accumulation,
//    rounded once); bf16 conv2d with groups 1 runs oneDNN's bf16 convolutions where it has a
//    non-reference kernel (within one bf16 rounding of the widened definition, not bitwise).
//    Everything else with 16-bit inputs (the ref backend, mixed dtypes, f16 GEMMs and
//    convolutions: oneDNN 2.6 has none without AVX512-FP16) widens to f32 copies (ops::cast)
//    around the f32 kernels.
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
