// CLIP's differentiable functions (see ext_clip.h).
#include "brigade/autograd/ext_clip.h"

#include <cmath>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/ext_llama.h"
#include "brigade/autograd/rules.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

// forward: y = exp(x), so gx = g * y; the node keeps the output, detached.
Tensor exp(const Tensor& x) {
  const Tensor y = ops::exp(x);
  return rules::record_saving<ops::mul>("ExpBackward", y, x, y.detach());
}

Tensor quick_gelu(const Tensor& x) {
  constexpr double k = 1.702;
  return mul_scalar(silu(mul_scalar(x, k)), 1.0 / k);
}

Tensor l2_normalize(const Tensor& x) {
  BRIGADE_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) > 0, ShapeError,
                "l2_normalize: x must have a non-empty last dim, got {}", shape_str(x.shape()));
  const int64_t C = x.size(x.dim() - 1);
  const Tensor ones = Tensor::ones({C}, x.dtype());  // (C), constant
  return mul_scalar(rms_norm(x, ones, 0.0), 1.0 / std::sqrt(double(C)));
}

}  // namespace brigade::fn
