// Flamingo's differentiable functions (see ext_flamingo.h).
#include "brigade/autograd/ext_flamingo.h"

#include "brigade/autograd/engine.h"
#include "brigade/autograd/rules.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

namespace {

// forward: y = tanh(x), so gx = g * (1 - y^2).
Tensor tanh_backward(const Tensor& g, const Tensor& y) {
  return ops::mul(g, ops::add_scalar(ops::neg(ops::mul(y, y)), 1.0));
}

struct ConcatBackward : autograd::Node {
  int64_t dim = 0, na = 0, nb = 0;
  const char* name() const override { return "ConcatBackward"; }
  // forward: out = cat([a, b], dim); a = out.narrow(dim, 0, na), b = out.narrow(dim, na, nb)
  std::vector<Tensor> backward(const Tensor& g) override {
    std::vector<Tensor> out(2);
    if (rules::wants(*this, 0)) out[0] = g.narrow(dim, 0, na).contiguous();   // a's shape
    if (rules::wants(*this, 1)) out[1] = g.narrow(dim, na, nb).contiguous();  // b's shape
    return out;
  }
};

}  // namespace

Tensor tanh(const Tensor& x0) {
  const Tensor x = cast(x0, rules::policy_dtype(amp::Op::Elementwise, {&x0}));
  Tensor y = ops::tanh(x);  // x's shape
  return rules::record_saving<tanh_backward>("TanhBackward", y, x, y.detach());
}

Tensor concat(const Tensor& a0, const Tensor& b0, int64_t dim) {
  BRIGADE_CHECK(a0.defined() && b0.defined() && a0.dim() == b0.dim() && a0.dim() > 0, ShapeError,
                "concat: a and b must be defined tensors of the same rank, got {} and {}",
                a0.defined() ? a0.str() : "undefined", b0.defined() ? b0.str() : "undefined");
  const int64_t D = a0.dim();
  const int64_t d = dim < 0 ? dim + D : dim;
  BRIGADE_CHECK(0 <= d && d < D, ShapeError, "concat: dim {} is outside a {}-d tensor", dim, D);
  Shape s = a0.shape();
  for (int64_t i = 0; i < D; ++i)
    BRIGADE_CHECK(i == d || a0.size(i) == b0.size(i), ShapeError, "concat: {} and {} differ outside dim {}",
                  a0.str(), b0.str(), d);
  BRIGADE_CHECK(is_floating(a0.dtype()) == is_floating(b0.dtype()) &&
                    (is_floating(a0.dtype()) || a0.dtype() == b0.dtype()),
                ShapeError, "concat: dtypes {} and {} do not mix", dtype_name(a0.dtype()), dtype_name(b0.dtype()));
  const bool promote = a0.dtype() != b0.dtype();
  const Tensor a = promote ? cast(a0, DType::F32) : a0, b = promote ? cast(b0, DType::F32) : b0;
  const int64_t na = a.size(d), nb = b.size(d);
  s[size_t(d)] = na + nb;
  Tensor out = Tensor::empty(s, a.dtype());  // (..., na + nb, ...)
  out.narrow(d, 0, na).copy_(a);
  out.narrow(d, na, nb).copy_(b);
  auto n = std::make_shared<ConcatBackward>();
  n->dim = d;
  n->na = na;
  n->nb = nb;
  return autograd::record(out, n, {a, b});
}

}  // namespace brigade::fn
