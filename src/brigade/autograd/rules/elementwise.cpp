// Derivative rules of the elementwise functions and activations.
#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct AddBackward : Node {
  Shape a_shape, b_shape;
  double b_sign = 1.0;
  const char* name() const override { return "AddBackward"; }
  // forward: out = a + b_sign * b   (broadcast)
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor ga, gb;
    if (wants(*this, 0)) ga = ops::sum_to(g, a_shape);
    if (wants(*this, 1)) {
      gb = ops::sum_to(g, b_shape);
      if (b_sign != 1.0) gb = ops::mul_scalar(gb, b_sign);
    }
    return {ga, gb};
  }
};

struct MulBackward : Node {
  Tensor a, b;
  const char* name() const override { return "MulBackward"; }
  // forward: out = a * b   (broadcast)
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor ga, gb;
    if (wants(*this, 0)) ga = ops::sum_to(ops::mul(g, b), a.shape());
    if (wants(*this, 1)) gb = ops::sum_to(ops::mul(g, a), b.shape());
    return {ga, gb};
  }
  void release() override { a = b = Tensor(); }
};

struct ScaleBackward : Node {
  double s = 1.0;
  const char* name() const override { return "ScaleBackward"; }
  // forward: out = a * s (+ const)
  std::vector<Tensor> backward(const Tensor& g) override { return {s == 1.0 ? g : ops::mul_scalar(g, s)}; }
};

struct AddReluBackward : Node {
  Tensor y;  // the output, detached
  const char* name() const override { return "AddReluBackward"; }
  // forward: y = relu(a + b)  ->  ga = gb = g where y > 0 (one tensor for both: the engine sums
  // gradients out of place)
  std::vector<Tensor> backward(const Tensor& g) override {
    const Tensor gs = ops::relu_backward(g, y);
    return {wants(*this, 0) ? gs : Tensor(), wants(*this, 1) ? gs : Tensor()};
  }
  void release() override { y = Tensor(); }
};

// a + b (b_sign 1, ops::add) or a - b (b_sign -1, ops::sub), recorded with an AddBackward.
Tensor add_signed(const Tensor& a0, const Tensor& b0, double b_sign) {
  const DType dt = policy_dtype(amp::Op::Elementwise, {&a0, &b0});
  const Tensor a = cast(a0, dt), b = cast(b0, dt);
  auto n = std::make_shared<AddBackward>();
  n->a_shape = a.shape();
  n->b_shape = b.shape();
  n->b_sign = b_sign;
  return record(b_sign == 1.0 ? ops::add(a, b) : ops::sub(a, b), n, {a, b});
}

}  // namespace

Tensor add(const Tensor& a0, const Tensor& b0) { return add_signed(a0, b0, 1.0); }

Tensor sub(const Tensor& a0, const Tensor& b0) { return add_signed(a0, b0, -1.0); }

Tensor mul(const Tensor& a0, const Tensor& b0) {
  const DType dt = policy_dtype(amp::Op::Elementwise, {&a0, &b0});
  const Tensor a = cast(a0, dt), b = cast(b0, dt);
  auto n = std::make_shared<MulBackward>();
  if (needs_grad({a, b})) {
    n->a = a;
    n->b = b;
  }
  return record(ops::mul(a, b), n, {a, b});
}

Tensor mul_scalar(const Tensor& a0, double s) {
  const Tensor a = cast(a0, policy_dtype(amp::Op::Elementwise, {&a0}));
  auto n = std::make_shared<ScaleBackward>();
  n->s = s;
  return record(ops::mul_scalar(a, s), n, {a});
}

Tensor add_scalar(const Tensor& a0, double s) {
  const Tensor a = cast(a0, policy_dtype(amp::Op::Elementwise, {&a0}));
  auto n = std::make_shared<ScaleBackward>();
  return record(ops::add_scalar(a, s), n, {a});
}

// forward: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); the node keeps x
Tensor gelu(const Tensor& x0) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Gelu, {&x0}));
  return rules::record_saving<ops::gelu_backward>("GeluBackward", ops::gelu(x), x, x);
}

// forward: y = 0.5 x (1 + erf(x / sqrt 2)); the node keeps x
Tensor gelu_erf(const Tensor& x0) {
  const Tensor x = cast(x0, rules::policy_dtype(amp::Op::Gelu, {&x0}));
  return rules::record_saving<ops::gelu_erf_backward>("GeluErfBackward", ops::gelu_erf(x), x, x);
}

// forward: y = x * sigmoid(x); the node keeps x
Tensor silu(const Tensor& x0) {
  const Tensor x = fn::cast(x0, policy_dtype(amp::Op::Gelu, {&x0}));
  return rules::record_saving<ops::silu_backward>("SiluBackward", ops::silu(x), x, x);
}

// The node keeps the output, detached.
Tensor relu(const Tensor& x0) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::relu(x);  // x's shape
  return rules::record_saving<ops::relu_backward>("ReluBackward", y, x, y.detach());
}

Tensor add_relu(const Tensor& a0, const Tensor& b0) {
  const DType dt = policy_dtype(amp::Op::Elementwise, {&a0, &b0});
  const Tensor a = cast(a0, dt), b = cast(b0, dt);
  Tensor y = ops::add_relu(a, b);  // a's shape
  auto n = std::make_shared<AddReluBackward>();
  if (needs_grad({a, b})) n->y = y.detach();
  return record(y, n, {a, b});
}

// The node keeps the output, detached.
Tensor sigmoid(const Tensor& x0) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::sigmoid(x);  // x's shape
  return rules::record_saving<ops::sigmoid_backward>("SigmoidBackward", y, x, y.detach());
}

// The node keeps the output, detached.
Tensor reciprocal(const Tensor& x0) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::reciprocal(x);  // x's shape
  return rules::record_saving<ops::reciprocal_backward>("ReciprocalBackward", y, x, y.detach());
}

// forward: y = exp(x), so gx = g * y; the node keeps the output, detached.
Tensor exp(const Tensor& x) {
  const Tensor y = ops::exp(x);
  return rules::record_saving<ops::mul>("ExpBackward", y, x, y.detach());
}

Tensor quick_gelu(const Tensor& x) {
  constexpr double k = 1.702;
  return mul_scalar(silu(mul_scalar(x, k)), 1.0 / k);
}

namespace {

// forward: y = tanh(x), so gx = g * (1 - y^2).
Tensor tanh_backward(const Tensor& g, const Tensor& y) {
  return ops::mul(g, ops::add_scalar(ops::neg(ops::mul(y, y)), 1.0));
}

}  // namespace

Tensor tanh(const Tensor& x0) {
  const Tensor x = cast(x0, rules::policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::tanh(x);  // x's shape
  return rules::record_saving<tanh_backward>("TanhBackward", y, x, y.detach());
}

}  // namespace brigade::fn
