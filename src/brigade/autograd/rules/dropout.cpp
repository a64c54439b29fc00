// The derivative rule of dropout.
#include "brigade/autograd/rules.h"

namespace brigade::fn {

// forward: y = x * mask   (mask in {0, 1/(1-p)}); the node keeps the mask
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  if (!training || p == 0.0) return x;
  ops::DropoutOut r = ops::dropout(x, p, gen);
  return rules::record_saving<ops::dropout_backward>("DropoutBackward", r.y, x, r.mask);
}

}  // namespace brigade::fn
