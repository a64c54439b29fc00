// Pieces shared by the derivative rules (rules/<family>.cpp): the wants-a-gradient test, the
// precision policy's dtype for an op, the one-saved-tensor node of the activations and the node of
// the normalisations. Internal to brigade_autograd: model code calls the fn:: functions of
// functions.h instead.
#pragma once
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::fn::rules {

// A tensor's shape for an error message ("an undefined tensor" when it is undefined).
inline std::string shape_of(const Tensor& t) { return t.defined() ? shape_str(t.shape()) : "an undefined tensor"; }

// A parameter that does not train, stored in another floating dtype than the op computes in
// (LoRA's frozen base: stored in bf16 and computed in f32 at O0, or stored in f32 and computed in
// 16 bits at O1/O2). It outlives the graph anyway, so a GEMM's node saves it as stored and casts it
// again in its backward instead of holding the working copy from the forward to the backward.
inline bool frozen_cast(const Tensor& p, DType dt) {
  return p.defined() && is_floating(p.dtype()) && p.dtype() != dt && !p.requires_grad() && p.tag() == MemTag::Params;
}

// Whether input i of n's op wants a gradient (its edge was recorded).
inline bool wants(const autograd::Node& n, size_t i) { return i < n.next.size() && n.next[i] != nullptr; }

// The dtype the active precision policy (amp/policy.h) gives an op of kind `op` with these
// inputs; only the defined floating ones count, in order (at most 4).
DType policy_dtype(amp::Op op, std::initializer_list<const Tensor*> inputs);
// True when the active policy's rule for `op` is amp::Rule::Mixed: the op takes its inputs
// uncast (its kernel widens 16-bit ones and rounds its output to the activation's dtype).
bool policy_mixed(amp::Op op);

// The node of an op whose backward reads one saved tensor (an activation's input or output, a
// dropout mask): backward = {Backward(g, saved)}.
template <Tensor (*Backward)(const Tensor&, const Tensor&)>
struct SavedOneBackward : autograd::Node {
  explicit SavedOneBackward(const char* node_name) : node_name_(node_name) {}
  Tensor saved;
  const char* name() const override { return node_name_; }
  std::vector<Tensor> backward(const Tensor& g) override { return {Backward(g, saved)}; }
  void release() override { saved = Tensor(); }

 private:
  const char* node_name_;
};

// Records y = op(x) with a SavedOneBackward<Backward> node named `node_name`, which keeps `saved`
// when x needs a gradient (an output must come in detached: a node may not own its own output).
template <Tensor (*Backward)(const Tensor&, const Tensor&)>
Tensor record_saving(const char* node_name, const Tensor& y, const Tensor& x, const Tensor& saved) {
  auto n = std::make_shared<SavedOneBackward<Backward>>(node_name);
  if (autograd::needs_grad({x})) n->saved = saved;
  return autograd::record(y, n, {x});
}

// What the backward of a normalisation reads: its input, its weight and the statistics the forward
// normalised with (per row or per channel); save() stores them when an input needs a gradient.
struct NormNode : autograd::Node {
  Tensor x, w, mean, rstd;
  void save(const Tensor& x_, const Tensor& w_, const Tensor& mean_, const Tensor& rstd_) {
    x = x_;
    w = w_;
    mean = mean_;
    rstd = rstd_;
  }
  void release() override { x = w = mean = rstd = Tensor(); }
};

}  // namespace brigade::fn::rules

// The rules' sources (rules/<family>.cpp) use these unqualified.
namespace brigade::fn {
using autograd::needs_grad;
using autograd::Node;
using autograd::record;
using rules::frozen_cast;
using rules::policy_dtype;
using rules::shape_of;
using rules::wants;
}  // namespace brigade::fn
