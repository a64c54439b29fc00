// Backward engine; see engine.h. Topological order by DFS from the root, then one
// pass in reverse: each node runs once, after all gradients flowing into it are summed.
#include "brigade/autograd/engine.h"

#include <unordered_map>

#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::autograd {

namespace {
thread_local bool g_grad_enabled = true;
thread_local int g_recompute_depth = 0;
thread_local uint64_t g_node_seq = 0;
thread_local DeferredGrads* g_deferred = nullptr;
}  // namespace

DeferWeightGradScope::DeferWeightGradScope(DeferredGrads* sink) : prev_(g_deferred) { g_deferred = sink; }
DeferWeightGradScope::~DeferWeightGradScope() { g_deferred = prev_; }
DeferredGrads* deferred_weight_grads() { return g_deferred; }

Node::Node() : seq(g_node_seq++) {}
uint64_t next_node_seq() { return g_node_seq; }

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(g_grad_enabled) { g_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { g_grad_enabled = prev_; }

bool recomputing() { return g_recompute_depth > 0; }
RecomputeScope::RecomputeScope() { ++g_recompute_depth; }
RecomputeScope::~RecomputeScope() { --g_recompute_depth; }

std::vector<Tensor> AccumulateGrad::backward(const Tensor& grad_out) {
  auto impl = leaf_.lock();
  if (!impl) return {};
  Tensor leaf(impl);
  BRIGADE_ASSERT(grad_out.shape() == leaf.shape(), "gradient {} for leaf {} '{}'", grad_out.str(), leaf.str(),
                 leaf.name());
  Tensor g = leaf.grad();
  if (!g.defined()) {
    Tensor fresh = Tensor::empty(leaf.shape(), leaf.dtype(), MemTag::Grads);  // same shape as the leaf
    fresh.copy_(grad_out);
    leaf.set_grad(fresh);
  } else {
    ops::add_(g, grad_out);  // gradients accumulate: leaf.grad += grad_out
  }
  if (grad_ready_hook) grad_ready_hook();
  return {};
}

void set_grad_ready_hook(const Tensor& leaf, std::function<void()> hook) {
  BRIGADE_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(), ValueError,
                "set_grad_ready_hook(): {} is not a leaf that requires grad",
                leaf.defined() ? leaf.str() : "undefined");
  auto node = std::dynamic_pointer_cast<AccumulateGrad>(gradient_edge(leaf));
  BRIGADE_ASSERT(node != nullptr, "no AccumulateGrad for leaf {}", leaf.str());
  node->grad_ready_hook = std::move(hook);
}

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.impl()->meta) return nullptr;
  AutogradMeta& m = t.meta();
  if (m.grad_fn) return m.grad_fn;
  if (!m.requires_grad) return nullptr;
  if (!m.grad_accumulator) m.grad_accumulator = std::make_shared<AccumulateGrad>(t);
  return m.grad_accumulator;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.impl()->meta && (t.impl()->meta->requires_grad || t.impl()->meta->grad_fn)) return true;
  return false;
}

Tensor record(Tensor out, std::shared_ptr<Node> node, const std::vector<Tensor>& inputs) {
  if (!needs_grad(inputs)) return out;
  node->next.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next.push_back(gradient_edge(t));
  AutogradMeta& m = out.meta();
  m.grad_fn = std::move(node);
  m.requires_grad = true;
  return out;
}

void backward(const Tensor& root, const Tensor& grad) {
  BRIGADE_CHECK(root.defined(), ValueError, "backward(): the root tensor is undefined");
  std::shared_ptr<Node> root_node = gradient_edge(root);
  BRIGADE_CHECK(root_node != nullptr, ValueError,
                "backward(): tensor {} does not require grad (was it computed under no_grad, or from "
                "parameters without requires_grad?)",
                root.str());
  Tensor g = grad;
  if (!g.defined()) {
    BRIGADE_CHECK(root.numel() == 1, ValueError,
                  "backward(): root {} is not a scalar; pass the gradient of the output explicitly", root.str());
    g = Tensor::ones(root.shape(), root.dtype());
  }
  backward(std::move(root_node), g);
}

void backward(std::shared_ptr<Node> root_node, const Tensor& g) {
  BRIGADE_CHECK(root_node != nullptr && g.defined(), ValueError,
                "backward(): needs a graph node and the gradient of its output");
  // Topological order (iterative DFS post-order), counting incoming edges.
  std::vector<Node*> order;
  std::unordered_map<Node*, int> visited;
  std::vector<std::pair<Node*, size_t>> stack{{root_node.get(), 0}};
  visited[root_node.get()] = 1;
  while (!stack.empty()) {
    auto& [n, i] = stack.back();
    if (i < n->next.size()) {
      Node* c = n->next[i++].get();
      if (c && !visited.count(c)) {
        visited[c] = 1;
        stack.push_back({c, 0});
      }
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }

  std::unordered_map<Node*, Tensor> pending;
  pending[root_node.get()] = g;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    auto found = pending.find(n);
    if (found == pending.end()) continue;  // no gradient reached this node
    Tensor gout = std::move(found->second);
    pending.erase(found);
    BRIGADE_CHECK(!n->released, ValueError,
                  "backward(): the graph through {} was already freed by a previous backward(); run the forward "
                  "again before a second backward",
                  n->name());
    std::vector<Tensor> gins = n->backward(gout);
    BRIGADE_ASSERT(gins.size() == n->next.size(), "node {} returned {} grads for {} inputs", n->name(), gins.size(),
                   n->next.size());
    for (size_t i = 0; i < gins.size(); ++i) {
      Node* c = n->next[i].get();
      if (!c || !gins[i].defined()) continue;
      auto p = pending.find(c);
      if (p == pending.end())
        pending.emplace(c, std::move(gins[i]));
      else
        p->second = ops::add(p->second, gins[i]);  // several consumers: sum their gradients
    }
    if (!dynamic_cast<AccumulateGrad*>(n)) {
      n->release();
      n->released = true;
    }
  }
}

}  // namespace brigade::autograd
