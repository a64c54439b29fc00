// Differentiable functions: each runs a raw op from ops/ops.h and, when grad
// mode is on and an input needs a gradient, records a Node whose backward is
// the derivative rule. ALL derivative rules live in functions.cpp, written with
// ops:: calls so they run on every backend. Model code calls these (via
// `namespace F = brigade::fn`), never ops:: directly.
#pragma once
#include <functional>

#include "brigade/core/rng.h"
#include "brigade/core/tensor.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

using ops::WeightLayout;

// Precision: every function below computes in the dtype the active precision policy
// (amp/policy.h, amp::AutocastScope) gives its kind of op, casting its floating inputs
// first with recorded casts; outside any scope (O0) it runs in its inputs' dtype, with
// inputs of different floating dtypes promoted to f32. Gradients come back in each
// input's own dtype.

// x converted to dtype dt (x itself when it already is); differentiable: the backward
// converts the gradient back. A cast of a parameter is allocated as MemTag::Params.
Tensor cast(const Tensor& x, DType dt);

// ---- elementwise (broadcasting) and scalar
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul_scalar(const Tensor& a, double s);
Tensor add_scalar(const Tensor& a, double s);

// ---- shape (views in the forward, copies in the backward)
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);

// Identity in the forward (a view of x); in the backward, calls on_backward() once
// before passing the gradient through. Placed on a block's output, it runs before
// any node inside the block (they all depend on it): ZeRO-3 gathers the block's
// parameters there.
Tensor backward_hook(const Tensor& x, std::function<void()> on_backward);

// ---- reductions
Tensor sum_all(const Tensor& a);
Tensor mean_all(const Tensor& a);

// ---- layers
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout);
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
Tensor gelu(const Tensor& x);
Tensor softmax(const Tensor& x);
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
// Multi-head scaled dot-product attention on q, k, v (B, NH, T, HS).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);
// GPT-style fused input: qkv (B, T, 3C) laid out [q | k | v], heads split inside;
// returns (B, T, C). One node: no per-head copies kept for the backward.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head);
// Mean cross-entropy of logits (N, V) against targets (N), ignoring ignore_index.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

// ---- activation recompute (checkpointing)

// What a checkpointed region keeps from its forward pass besides its inputs.
enum class CheckpointKeep : uint8_t {
  Inputs,       // nothing else: the backward re-runs the whole region ("full" recompute)
  GemmOutputs,  // also the outputs of linear(), matmul() and conv2d() inside the region: the
                // recompute takes them instead of running the GEMMs again, and re-runs everything
                // else (norms, attention, activations, dropout, adds) ("selective" recompute)
};

struct CheckpointOptions {
  CheckpointKeep keep = CheckpointKeep::Inputs;
  // The generator the region's dropout draws from (nullptr: the region draws nothing).
  // Its state is copied before the forward, set back for the recompute (so the same
  // masks come out) and restored afterwards (so the backward does not move the stream).
  Generator* rng = nullptr;
};

using CheckpointFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn(inputs) without recording a graph and records one node instead, which keeps
// only the inputs (plus what `options.keep` says, plus the rng state). Its backward
// re-runs fn with recording on, on detached copies of the inputs, backpropagates the
// incoming gradient through that recomputed graph (an inner autograd::backward) and
// returns the inputs' gradients. Parameters that fn reads (captured, not passed in
// `inputs`) get their gradients in that inner backward, through their usual
// AccumulateGrad nodes, so .grad accumulates and grad-ready hooks fire as without
// recompute. Gradients are bitwise those of fn run directly (same kernels, same
// reduction order, same dropout masks), given fn is deterministic.
// Rules: fn must read every tensor that needs a gradient and is not a leaf through
// `inputs` (a captured non-leaf would make the recompute backpropagate into the
// surrounding graph: a ValueError); the output is recorded even when no input needs
// a gradient (fn may read parameters that do). Under no_grad, and inside another
// region (nested checkpoints), fn simply runs: the outermost region decides.
// autograd::recomputing() is true while the backward re-runs fn.
Tensor checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs, const CheckpointOptions& options = {});

// For GEMM-shaped differentiable functions defined outside functions.cpp (conv2d in
// ext_vision.cpp): the op's output, compute() unless the innermost checkpointed region keeps
// GEMM outputs (CheckpointKeep::GemmOutputs), in which case its forward stores the result and
// its recompute hands the stored tensor back instead of calling compute(). linear() and
// matmul() go through the same function.
Tensor gemm_output(const std::function<Tensor()>& compute);

}  // namespace brigade::fn
