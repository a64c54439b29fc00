// Precision policies (AMP levels O0..O3) as data: one table gives, per op kind and
// level, the dtype the op computes in. The differentiable functions (autograd/
// rules/) read the active policy and cast their floating inputs before
// running the raw op; the casts are recorded, so gradients flow back in each
// input's own dtype (fp32 parameters get fp32 gradients). Model code never sees
// any of this. What each level means and when to use it: docs/mixed-precision.md.
// Not here: loss scaling (loss_scaler.h), the kernels (ops/, which compute in fp32
// internally and round 16-bit outputs once).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "brigade/core/dtype.h"

namespace brigade::amp {

enum class Level : uint8_t {
  O0,  // everything as given (fp32 model: fp32 everywhere)
  O1,  // autocast: an allow-list (linear, matmul, attention, conv) in low precision, everything else fp32
  O2,  // the model in low precision except precision-sensitive ops (norms, softmax, loss, reductions);
       // fp32 master weights, gradients accumulated in fp32
  O3,  // pure low precision: every op, and no fp32 master weights (unstable; for comparison)
};

// The kinds of op the table distinguishes (each fn:: function maps to one).
enum class Op : uint8_t {
  // clang-format off
  Linear, Matmul, Attention, Conv,      // GEMM-shaped: the allow-list (conv: conv2d, grouped and depthwise too)
  Embedding, Gelu, Elementwise,         // gelu: gelu, gelu_erf, silu; elementwise: add/sub/mul, relu, add_relu,
                                        // sigmoid, tanh, rope and scalar ops
  Pool,                                 // max_pool2d, avg_pool2d (elementwise rules)
  LayerNorm, BatchNorm, Softmax, CrossEntropy, Reduction,  // precision-sensitive (layer_norm: rms_norm
                                        // too; batch_norm: sync too; cross_entropy: with label smoothing
                                        // too; reduction: sums, means, spatial_mean, adaptive_avg_pool2d)
  Dropout,
  kCount
  // clang-format on
};

enum class Rule : uint8_t {
  Keep,   // run in the inputs' dtype; inputs of different floating dtypes are promoted to f32
  F32,    // cast floating inputs to f32
  Low,    // cast floating inputs to the policy's low dtype (bf16 or f16)
  Mixed,  // no casts: a 16-bit activation stays 16-bit beside fp32 parameters; the kernel widens
          // it exactly, computes in f32 and rounds its output once to the activation's dtype
          // (batch norm at O2: its statistics are f32, its input and output are not, and no
          // cast passes run around it)
};

// The table (policy.cpp): rule(op, level).
Rule rule(Op op, Level level);

std::string_view level_name(Level l);       // "O0".."O3"
Level level_from_name(std::string_view s);  // ValueError naming the accepted values
std::string_view op_name(Op op);            // "linear", ...
std::string_view rule_name(Rule r);         // "keep", "f32", "low"

struct Policy {
  Level level = Level::O0;
  DType low = DType::BF16;  // BF16 or F16
  bool operator==(const Policy&) const = default;
};

// The policy of the calling thread (O0 by default).
const Policy& current_policy();

// Sets the calling thread's policy for its lifetime (nests; restores the previous one).
class AutocastScope {
 public:
  explicit AutocastScope(const Policy& p);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  Policy prev_;
};

// The dtype an op of kind `op` computes in under the current policy, given the dtypes
// of its floating inputs. Rule::Mixed: f32 (the op's inputs are not cast; see Rule).
DType compute_dtype(Op op, std::initializer_list<DType> inputs);

// The table as a Markdown table (ops x levels), for docs and `--dry-run` style reports.
std::string policy_table_markdown();

}  // namespace brigade::amp
