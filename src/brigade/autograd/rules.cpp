// What the derivative rules share (rules.h): the precision policy's dtype for an op.
#include "brigade/autograd/rules.h"

#include "brigade/amp/policy.h"

namespace brigade::fn {

DType rules::policy_dtype(amp::Op op, std::initializer_list<const Tensor*> inputs) {
  DType ds[4] = {DType::F32, DType::F32, DType::F32, DType::F32};
  size_t k = 0;
  for (const Tensor* t : inputs)
    if (t->defined() && is_floating(t->dtype()) && k < 4) ds[k++] = t->dtype();
  switch (k) {
    case 0: return amp::compute_dtype(op, {});
    case 1: return amp::compute_dtype(op, {ds[0]});
    case 2: return amp::compute_dtype(op, {ds[0], ds[1]});
    case 3: return amp::compute_dtype(op, {ds[0], ds[1], ds[2]});
    default: return amp::compute_dtype(op, {ds[0], ds[1], ds[2], ds[3]});
  }
}

bool rules::policy_mixed(amp::Op op) { return amp::rule(op, amp::current_policy().level) == amp::Rule::Mixed; }

}  // namespace brigade::fn
