// Derivative rules of matmul and linear (with deferrable weight gradients, engine.h).
#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

// The working copy of a frozen parameter that frozen_cast saved as stored (tagged params, as the
// forward's cast of a weight is).
Tensor recast(const Tensor& stored, DType dt) {
  MemTagScope tag(MemTag::Params);
  return ops::cast(stored, dt);
}

// Feeds a deferred weight gradient to its edge (a parameter's AccumulateGrad, or the recorded
// cast in front of it): a small backward of its own.
void feed(const std::shared_ptr<Node>& edge, const Tensor& g) {
  if (edge && g.defined()) autograd::backward(edge, g);
}

struct MatmulBackward : Node {
  Tensor a, b;
  bool ta = false, tb = false;
  bool param_a = false, param_b = false;  // the operand is a parameter (deferrable, engine.h)
  // an operand that is a frozen parameter cast for the op (frozen_cast): saved as stored, in place
  // of a / b, and cast to dt again in the backward
  Tensor a_stored, b_stored;
  DType dt = DType::F32;
  const char* name() const override { return "MatmulBackward"; }
  // forward: out = op(a) @ op(b), op = transpose of the last two dims when ta / tb
  static Tensor grad_a(const Tensor& g, const Tensor& a, const Tensor& b, bool ta, bool tb) {
    // d op(a) = g @ op(b)^T ; if ta, da = (g @ op(b)^T)^T = op(b) @ g^T
    Tensor ga = ta ? ops::matmul(b, g, tb, true) : ops::matmul(g, b, false, !tb);
    return ops::sum_to(ga, a.shape());
  }
  static Tensor grad_b(const Tensor& g, const Tensor& a, const Tensor& b, bool ta, bool tb) {
    // d op(b) = op(a)^T @ g ; if tb, db = g^T @ op(a)
    Tensor gb = tb ? ops::matmul(g, a, true, ta) : ops::matmul(a, g, !ta, false);
    return ops::sum_to(gb, b.shape());
  }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor ga, gb;
    if (a_stored.defined()) a = recast(a_stored, dt);
    if (b_stored.defined()) b = recast(b_stored, dt);
    autograd::DeferredGrads* sink = autograd::deferred_weight_grads();
    const bool defer_a = sink && param_a && wants(*this, 0), defer_b = sink && param_b && wants(*this, 1);
    if (wants(*this, 0) && !defer_a) ga = grad_a(g, a, b, ta, tb);
    if (wants(*this, 1) && !defer_b) gb = grad_b(g, a, b, ta, tb);
    if (defer_a || defer_b)
      sink->push_back([g, a = a, b = b, ta = ta, tb = tb, defer_a, defer_b, ea = next[0], eb = next[1]] {
        if (defer_a) feed(ea, grad_a(g, a, b, ta, tb));
        if (defer_b) feed(eb, grad_b(g, a, b, ta, tb));
      });
    return {ga, gb};
  }
  void release() override { a = b = a_stored = b_stored = Tensor(); }
};

struct LinearBackward : Node {
  Tensor x, w;
  WeightLayout layout = WeightLayout::OutIn;
  bool has_bias = false;
  bool param_w = false;  // the weight is a parameter (deferrable, engine.h)
  Tensor w_stored;       // a frozen weight cast for the op (frozen_cast), saved as stored in place of w
  DType dt = DType::F32;
  const char* name() const override { return "LinearBackward"; }
  // forward: y = x @ W^T + bias (OutIn) or y = x @ W + bias (InOut)
  std::vector<Tensor> backward(const Tensor& g) override {
    if (w_stored.defined()) w = recast(w_stored, dt);
    autograd::DeferredGrads* sink = autograd::deferred_weight_grads();
    const bool want_w = wants(*this, 1), want_b = has_bias && wants(*this, 2);
    if (sink && param_w && want_w) {  // the input gradient now, the weight and bias gradients later
      ops::LinearGrads r = ops::linear_backward(g, x, w, layout, wants(*this, 0), false, false);
      sink->push_back(
          [g, x = x, w = w, layout = layout, want_b, ew = next[1], eb = has_bias ? next[2] : std::shared_ptr<Node>()] {
            ops::LinearGrads d = ops::linear_backward(g, x, w, layout, false, true, want_b);
            feed(ew, d.gw);
            if (want_b) feed(eb, d.gb);
          });
      std::vector<Tensor> out{r.gx, Tensor()};
      if (has_bias) out.push_back(Tensor());
      return out;
    }
    ops::LinearGrads r = ops::linear_backward(g, x, w, layout, wants(*this, 0), want_w, want_b);
    std::vector<Tensor> out{r.gx, r.gw};
    if (has_bias) out.push_back(r.gb);
    return out;
  }
  void release() override { x = w = w_stored = Tensor(); }
};

}  // namespace

Tensor matmul(const Tensor& a0, const Tensor& b0, bool trans_a, bool trans_b) {
  const DType dt = policy_dtype(amp::Op::Matmul, {&a0, &b0});
  const Tensor a = cast(a0, dt), b = cast(b0, dt);
  auto n = std::make_shared<MatmulBackward>();
  if (needs_grad({a, b})) {
    n->dt = dt;
    if (frozen_cast(a0, dt))
      n->a_stored = a0;
    else
      n->a = a;
    if (frozen_cast(b0, dt))
      n->b_stored = b0;
    else
      n->b = b;
    n->ta = trans_a;
    n->tb = trans_b;
    n->param_a = a0.is_leaf() && a0.requires_grad();
    n->param_b = b0.is_leaf() && b0.requires_grad();
  }
  return record(gemm_output([&] { return ops::matmul(a, b, trans_a, trans_b); }), n, {a, b});
}

Tensor linear(const Tensor& x0, const Tensor& w0, const Tensor& b0, WeightLayout layout) {
  const DType dt = policy_dtype(amp::Op::Linear, {&x0, &w0});
  const Tensor x = cast(x0, dt), w = cast(w0, dt), bias = cast(b0, dt);
  auto n = std::make_shared<LinearBackward>();
  std::vector<Tensor> inputs{x, w};
  if (bias.defined()) inputs.push_back(bias);
  if (needs_grad(inputs)) {
    n->x = x;
    n->dt = dt;
    if (frozen_cast(w0, dt))
      n->w_stored = w0;
    else
      n->w = w;
    n->layout = layout;
    n->has_bias = bias.defined();
    n->param_w = w0.is_leaf() && w0.requires_grad();
  }
  return record(gemm_output([&] { return ops::linear(x, w, bias, layout); }), n, inputs);
}

}  // namespace brigade::fn
