// Dtype conversion front-end (ops/cast.h).
#include "brigade/ops/cast.h"

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

// ---------------------------------------------------------------- cast

Tensor cast(const Tensor& x, DType dt) {
  check_float(x, "cast", "x");
  BRIGADE_CHECK(is_floating(dt), ShapeError,
                "cast: the target dtype is {}, but cast converts between floating "
                "dtypes (f32, bf16, f16); use Tensor::to for integers",
                dtype_name(dt));
  Tensor y = Tensor::empty(x.shape(), dt);  // same as x
  if (x.numel() == 0) return y;
  if (on_cpu())
    cpu::cast(x.dtype(), dt, int(x.dim()), x.shape().data(), x.raw_data(), x.strides().data(), y.raw_data());
  else
    ref::cast(x.dtype(), dt, int(x.dim()), x.shape().data(), x.raw_data(), x.strides().data(), y.raw_data());
  return y;
}

}  // namespace brigade::ops
