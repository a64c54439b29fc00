// The derivative rule of dtype casts (autocast's recorded casts).
#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct CastBackward : Node {
  DType from = DType::F32;
  const char* name() const override { return "CastBackward"; }
  // forward: out = x.to(to)   -> the gradient goes back in x's dtype
  std::vector<Tensor> backward(const Tensor& g) override { return {g.dtype() == from ? g : ops::cast(g, from)}; }
};

// x in dtype dt: x itself when it already is (or is not floating), else a recorded cast.
// A cast of a parameter is the low-precision working copy of a weight: it is allocated
// as MemTag::Params (it lives as long as the op that saved it, i.e. until the backward).
Tensor as_dtype(const Tensor& x, DType dt) {
  if (!x.defined() || x.dtype() == dt || !is_floating(x.dtype())) return x;
  const bool weight = x.tag() == MemTag::Params;
  MemTagScope tag(weight ? MemTag::Params : MemTagScope::current());
  auto n = std::make_shared<CastBackward>();
  n->from = x.dtype();
  return record(ops::cast(x, dt), n, {x});
}

}  // namespace

Tensor cast(const Tensor& x, DType dt) { return as_dtype(x, dt); }

}  // namespace brigade::fn
