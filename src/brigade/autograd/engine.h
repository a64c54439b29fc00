// Reverse-mode autograd: the Nodes the differentiable functions record (functions.h; their rules in
// rules/<family>.cpp) and the engine that walks them backwards in topological order. Gradients of
// leaves accumulate (+=) into tensor.grad() (MemTag::Grads); node outputs are fresh. Not
// thread-safe across concurrent backward calls on one graph.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::autograd {

// One recorded operation with a single output. `next[i]` produces input i
// (nullptr when input i needs no gradient).
struct Node {
  Node();
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // Gradient of the output -> gradients of the inputs (same order as `next`;
  // an undefined Tensor where next[i] is null or the gradient is zero).
  virtual std::vector<Tensor> backward(const Tensor& grad_out) = 0;
  // Drops saved tensors once backward has run (frees activations early).
  virtual void release() {}
  std::vector<std::shared_ptr<Node>> next;
  bool released = false;  // backward has run and saved tensors are gone
  // Creation order on this thread (increasing). fn::checkpoint uses it to tell the
  // nodes its recompute recorded from nodes of the surrounding graph.
  uint64_t seq = 0;
};

// The seq the next Node created on this thread will get.
uint64_t next_node_seq();

// Sink node of a leaf that requires grad: accumulates into the leaf's .grad.
struct AccumulateGrad final : Node {
  explicit AccumulateGrad(const Tensor& leaf) : leaf_(leaf.impl_ptr()) {}
  const char* name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> backward(const Tensor& grad_out) override;
  std::weak_ptr<TensorImpl> leaf_;
  // Runs after the leaf's gradient for this backward pass is complete (the engine
  // sums every consumer's contribution first, so it runs once per backward). By
  // then every node that read the leaf in this backward has run. Used by data
  // parallelism to launch gradient communication during the backward pass.
  std::function<void()> grad_ready_hook;
};

// Installs (or, with an empty function, removes) the grad-ready hook of a leaf
// that requires grad.
void set_grad_ready_hook(const Tensor& leaf, std::function<void()> hook);

// Whether operations are recorded (thread-local; on by default).
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
// Turns recording back on inside a NoGradGuard (the recompute of fn::checkpoint).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// True while fn::checkpoint re-runs a region's forward inside the backward pass
// (thread-local; not during the inner backward that follows). Forward hooks of plans
// consult it: when a region contains a ZeRO-3 unit's hooks, the recomputed forward
// neither prefetches the next unit (already backpropagated) nor releases the unit
// the inner backward is about to read (data_parallel.cpp).
bool recomputing();
// Marks the scope as a recompute (nests).
class RecomputeScope {
 public:
  RecomputeScope();
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

// Zero-bubble pipeline schedules split a backward into the input gradient (now: the
// previous stage waits for it) and the weight gradients (later, in what would be idle
// time; Qi et al. 2023). Inside a DeferWeightGradScope, the GEMM nodes (linear, matmul)
// whose weight operand is a parameter (a leaf that requires grad, possibly read through
// a recorded autocast) compute only their other gradients and append one task per node
// to the sink; a task computes that node's weight (and bias) gradients with the same
// kernels and feeds them to their gradient edges (so .grad accumulates, through any
// cast, as without deferral). Running every task gives bitwise the gradients of an
// undeferred backward, up to the order in which contributions to one .grad are summed.
// Everything else (norms, embeddings, biases added outside a linear) is not deferred.
using DeferredGrads = std::vector<std::function<void()>>;
class DeferWeightGradScope {
 public:
  explicit DeferWeightGradScope(DeferredGrads* sink);
  ~DeferWeightGradScope();
  DeferWeightGradScope(const DeferWeightGradScope&) = delete;
  DeferWeightGradScope& operator=(const DeferWeightGradScope&) = delete;

 private:
  DeferredGrads* prev_;
};
// The current scope's sink (thread-local), or nullptr outside any scope.
DeferredGrads* deferred_weight_grads();

// The node that receives the gradient of `t`: its grad_fn, its AccumulateGrad
// (leaves with requires_grad), or nullptr.
std::shared_ptr<Node> gradient_edge(const Tensor& t);

// Records `node` as the producer of `out` if grad mode is on and any input needs
// a gradient; sets node->next from `inputs`. Returns out.
Tensor record(Tensor out, std::shared_ptr<Node> node, const std::vector<Tensor>& inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Runs the backward pass from `root`. A scalar root gets gradient 1 unless
// `grad` is given. The graph is released as it is consumed.
void backward(const Tensor& root, const Tensor& grad = Tensor());
// Same, from the node that produced a tensor (gradient_edge) and that tensor's
// gradient: lets the caller drop the tensor's values first (fn::checkpoint does).
void backward(std::shared_ptr<Node> root_node, const Tensor& grad);

}  // namespace brigade::autograd
