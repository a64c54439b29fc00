// Activation recompute: checkpointed regions, fn::checkpoint and the GEMM outputs a region keeps.
#include <unordered_set>

#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

// A checkpointed region while fn runs in it: in its forward (record) or its recompute
// (replay). Under CheckpointKeep::GemmOutputs the forward appends every GEMM output to
// `kept` and the recompute takes them back in the same order.
struct Region {
  CheckpointKeep keep = CheckpointKeep::Inputs;
  bool replay = false;
  std::vector<Tensor>* kept = nullptr;
  size_t next = 0;
};
thread_local std::vector<Region*> g_regions;  // innermost last

struct RegionScope {
  explicit RegionScope(Region* r) { g_regions.push_back(r); }
  ~RegionScope() { g_regions.pop_back(); }
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;
};

// The output of a GEMM, `compute()` unless a region keeps GEMM outputs (fn::gemm_output).
template <typename F>
Tensor kept_gemm_output(F&& compute) {
  Region* r = g_regions.empty() ? nullptr : g_regions.back();
  if (!r || r->keep != CheckpointKeep::GemmOutputs) return compute();
  if (r->replay) {
    BRIGADE_CHECK(r->next < r->kept->size(), ValueError,
                  "checkpoint(): the recompute runs more GEMMs than the forward did ({}); the checkpointed "
                  "function must do the same work every time it runs",
                  r->kept->size());
    return std::move((*r->kept)[r->next++]);  // the region no longer holds it: freed with the recomputed graph
  }
  Tensor y = compute();
  r->kept->push_back(y.detach());
  return y;
}

}  // namespace

Tensor gemm_output(const std::function<Tensor()>& compute) { return kept_gemm_output(compute); }

namespace {

// Where the gradient of a recomputed region's (detached) input ends up.
struct CheckpointInput : Node {
  Tensor grad;
  const char* name() const override { return "CheckpointInput"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    grad = g;
    return {};
  }
};

// Restores a generator when the recompute ends, also by an exception.
struct RngRestore {
  Generator* gen = nullptr;
  Generator saved;
  ~RngRestore() {
    if (gen) *gen = saved;
  }
};

struct CheckpointBackward : Node {
  CheckpointFn fn;
  std::vector<Tensor> inputs;  // detached
  CheckpointKeep keep = CheckpointKeep::Inputs;
  std::vector<Tensor> kept;  // GEMM outputs (CheckpointKeep::GemmOutputs)
  Generator* rng = nullptr;
  std::unique_ptr<Generator> rng_state;  // *rng before the forward
  amp::Policy policy;                    // the precision policy of the forward, re-applied in the recompute
  const char* name() const override { return "CheckpointBackward"; }

  // forward: out = fn(inputs), recorded as one node; backward: recompute fn with
  // recording on, then backward through the recomputed graph with gradient g
  std::vector<Tensor> backward(const Tensor& g) override {
    std::vector<Tensor> ins(inputs.size());
    std::vector<std::shared_ptr<CheckpointInput>> sinks(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      ins[i] = inputs[i];
      if (!wants(*this, i) || !inputs[i].defined()) continue;
      ins[i] = inputs[i].detach();
      sinks[i] = std::make_shared<CheckpointInput>();
      ins[i].meta().grad_fn = sinks[i];
      ins[i].meta().requires_grad = true;
    }
    const uint64_t first = autograd::next_node_seq();
    Tensor out;
    {
      autograd::EnableGradGuard grad_on;
      autograd::RecomputeScope recompute;
      amp::AutocastScope autocast(policy);
      RngRestore restore;
      if (rng) {
        restore.saved = *rng;
        restore.gen = rng;
        *rng = *rng_state;
      }
      Region region{keep, /*replay=*/true, &kept, 0};
      RegionScope scope(&region);
      out = fn(ins);
      BRIGADE_CHECK(region.next == kept.size(), ValueError,
                    "checkpoint(): the forward ran {} GEMMs but the recompute only {}; the checkpointed function "
                    "must do the same work every time it runs",
                    kept.size(), region.next);
    }
    kept.clear();
    std::vector<Tensor> grads(inputs.size());
    if (!out.defined() || !out.requires_grad()) return grads;  // nothing in the region needs a gradient
    std::shared_ptr<Node> root = autograd::gradient_edge(out);
    out = Tensor();  // its values are not needed for the backward: free them now
    check_self_contained(root.get(), first);
    autograd::backward(std::move(root), g);
    for (size_t i = 0; i < sinks.size(); ++i)
      if (sinks[i]) grads[i] = std::move(sinks[i]->grad);
    return grads;
  }

  // The recomputed graph must end in its own inputs and in leaves: a node recorded
  // before the recompute means fn read a non-leaf of the surrounding graph that was
  // not passed in `inputs`, and the inner backward would run (and free) that graph.
  static void check_self_contained(Node* root, uint64_t first) {
    std::vector<Node*> stack{root};
    std::unordered_set<Node*> seen;
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (!n || !seen.insert(n).second) continue;
      if (dynamic_cast<autograd::AccumulateGrad*>(n) || dynamic_cast<CheckpointInput*>(n)) continue;
      BRIGADE_CHECK(n->seq >= first, ValueError,
                    "checkpoint(): the checkpointed function reads a tensor computed outside it ({} output) "
                    "that needs a gradient; pass that tensor in the checkpoint's inputs",
                    n->name());
      for (auto& c : n->next) stack.push_back(c.get());
    }
  }

  void release() override {
    fn = nullptr;
    inputs.clear();
    kept.clear();
    rng_state.reset();
  }
};

}  // namespace

Tensor checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs, const CheckpointOptions& options) {
  if (!autograd::grad_enabled() || !g_regions.empty()) return fn(inputs);
  auto n = std::make_shared<CheckpointBackward>();
  n->keep = options.keep;
  n->policy = amp::current_policy();
  if (options.rng) {
    n->rng = options.rng;
    n->rng_state = std::make_unique<Generator>(*options.rng);
  }
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    Region region{options.keep, /*replay=*/false, &n->kept, 0};
    RegionScope scope(&region);
    out = fn(inputs);
  }
  BRIGADE_CHECK(out.defined(), ValueError, "checkpoint(): the checkpointed function returned an undefined tensor");
  n->inputs.reserve(inputs.size());
  n->next.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    n->inputs.push_back(t.defined() ? t.detach() : Tensor());
    n->next.push_back(autograd::gradient_edge(t));
  }
  n->fn = std::move(fn);
  // Recorded even when no input needs a gradient: fn may read parameters that do.
  out = out.detach();
  AutogradMeta& m = out.meta();
  m.grad_fn = std::move(n);
  m.requires_grad = true;
  return out;
}

}  // namespace brigade::fn
