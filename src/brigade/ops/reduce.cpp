// Reduction front-ends (ops/reduce.h).
#include "brigade/ops/reduce.h"

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

// ---------------------------------------------------------------- reductions

namespace {
// Reduced-dims mask for sum/mean; an empty dims list reduces every dim (as torch.sum(x, dim=[])).
std::vector<bool> reduce_mask(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  std::vector<bool> red(size_t(a.dim()), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, a.dim(), op);
    if (a.dim() == 0) continue;
    BRIGADE_CHECK(!red[size_t(w)], ShapeError, "{}: dimension {} appears twice in dims", op, d);
    red[size_t(w)] = true;
  }
  return red;
}

// sum over the dims marked in red, stored in dtype ot: the f32 kernel (ot f32, a f32) or the
// native 16-bit one (a 16-bit; ot a's dtype, or f32 for mean).
Tensor sum_dims(const Tensor& a, const std::vector<bool>& red, bool keepdim, DType ot) {
  Shape out_keep, out;
  for (size_t i = 0; i < red.size(); ++i) {
    out_keep.push_back(red[i] ? 1 : a.shape()[i]);
    if (!red[i]) out.push_back(a.shape()[i]);
  }
  Tensor y = Tensor::empty(keepdim ? out_keep : out, ot);  // a's shape without (or with size 1 at) the reduced dims
  Shape so = contiguous_strides(out_keep);
  for (size_t i = 0; i < red.size(); ++i)
    if (red[i]) so[i] = 0;
  if (is_half(a)) {
    cpu::reduce_sum16(strided(a), so.data(), y.numel(), ot, y.raw_data());
    return y;
  }
  BRIGADE_DISPATCH(reduce_sum, int(a.dim()), a.shape().data(), a.data<float>(), a.strides().data(), y.data<float>(),
                   so.data(), y.numel());
  return y;
}
}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  check_float(a, "sum", "a");
  const std::vector<bool> red = reduce_mask(a, dims, "sum");
  if (native16({&a})) return sum_dims(a, red, keepdim, a.dtype());
  if (auto r = via_f32(
          {a.dtype()}, [&](const Tensor& x) { return sum(x, dims, keepdim); }, a))
    return *r;
  return sum_dims(a, red, keepdim, DType::F32);
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  check_float(a, "mean", "a");
  // 16-bit: sum and scale in f32, one rounding at the end.
  if (native16({&a})) {
    Tensor s = sum_dims(a, reduce_mask(a, dims, "mean"), keepdim, DType::F32);  // the native sums, kept in f32
    const int64_t count = s.numel() ? a.numel() / s.numel() : 0;
    mul_scalar_(s, 1.0 / double(count));
    return cast(s, a.dtype());
  }
  if (auto r = via_f32(
          {a.dtype()}, [&](const Tensor& x) { return mean(x, dims, keepdim); }, a))
    return *r;
  Tensor s = sum(a, dims, keepdim);
  const int64_t count = s.numel() ? a.numel() / s.numel() : 0;
  mul_scalar_(s, 1.0 / double(count));
  return s;
}

Tensor sum_all(const Tensor& a) { return sum(a, {}, false); }

int64_t sum_squares_workspace(int64_t n) { return cpu::sum_squares_workspace(n); }

double sum_squares(const Tensor& a) {
  check_float(a, "sum_squares", "a");
  if (is_half(a)) return sum_squares(cast(a, DType::F32));
  return on_cpu() ? cpu::sum_squares(int(a.dim()), a.shape().data(), a.data<float>(), a.strides().data())
                  : ref::sum_squares<float>(int(a.dim()), a.shape().data(), a.data<float>(), a.strides().data());
}

Tensor softmax(const Tensor& x) {
  check_float(x, "softmax", "x");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "softmax: x must have at least 1 dim, got a 0-d tensor");
  if (native16({&x})) {
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    Tensor y = Tensor::empty(x.shape(), x.dtype());  // (..., C)
    cpu::softmax16(N, C, strided(x), x.dtype(), y.raw_data());
    return y;
  }
  if (auto r = via_f32(
          {x.dtype()}, [](const Tensor& x_) { return softmax(x_); }, x))
    return *r;
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape());  // (..., C)
  BRIGADE_DISPATCH(softmax, N, C, xc.data<float>(), y.data<float>());
  return y;
}

Tensor softmax_backward(const Tensor& gy, const Tensor& y) {
  check_float(gy, "softmax_backward", "gy");
  check_float(y, "softmax_backward", "y");
  check_same_shape(gy, y, "softmax_backward", "gy", "y");
  BRIGADE_CHECK(y.dim() >= 1, ShapeError, "softmax_backward: y must have at least 1 dim");
  if (native16({&gy, &y})) {
    const int64_t C = y.size(-1), N = C ? y.numel() / C : 0;
    Tensor gx = Tensor::empty(y.shape(), y.dtype());  // (..., C)
    cpu::softmax_backward16(N, C, strided(gy), strided(y), y.dtype(), gx.raw_data());
    return gx;
  }
  if (auto r = via_f32(
          {y.dtype()}, [](const Tensor& g_, const Tensor& y_) { return softmax_backward(g_, y_); }, gy, y))
    return *r;
  const int64_t C = y.size(-1), N = C ? y.numel() / C : 0;
  Tensor gyc = gy.contiguous(), yc = y.contiguous();
  Tensor gx = Tensor::empty(y.shape());  // (..., C)
  BRIGADE_DISPATCH(softmax_backward, N, C, gyc.data<float>(), yc.data<float>(), gx.data<float>());
  return gx;
}

// ---------------------------------------------------------------- spatial mean

Tensor spatial_mean(const Tensor& x, bool keepdim) {
  check_nchw(x, "spatial_mean", "x");
  if (is_half(x)) return round_to(spatial_mean(f32_of(x), keepdim), x.dtype());
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  BRIGADE_CHECK(HW > 0, ShapeError, "spatial_mean: x {} has no spatial positions", shape_str(x.shape()));
  // the oracle's own code, one plane per iteration: cpu and ref agree bitwise
  return map_planes(x, keepdim ? Shape{N, C, 1, 1} : Shape{N, C}, HW,  // (N, C[, 1, 1])
                    [&](int64_t, const float* xp, float* yp) { ref::spatial_mean<float>(1, HW, xp, yp); });
}

Tensor spatial_mean_backward(const Tensor& gy, const Shape& x_shape) {
  check_float(gy, "spatial_mean_backward", "gy");
  BRIGADE_CHECK(x_shape.size() == 4, ShapeError, "spatial_mean_backward: x must be 4-D (N, C, H, W), got {}",
                shape_str(x_shape));
  const int64_t N = x_shape[0], C = x_shape[1], HW = x_shape[2] * x_shape[3];
  BRIGADE_CHECK(gy.shape() == Shape({N, C}) || gy.shape() == Shape({N, C, 1, 1}), ShapeError,
                "spatial_mean_backward: gy must be ({}, {}) or ({}, {}, 1, 1) for x {}, got {}", N, C, N, C,
                shape_str(x_shape), shape_str(gy.shape()));
  if (is_half(gy)) return round_to(spatial_mean_backward(f32_of(gy), x_shape), gy.dtype());
  return map_planes(gy, x_shape, HW,  // (N, C, H, W)
                    [&](int64_t, const float* gp, float* gxp) { ref::spatial_mean_backward<float>(1, HW, gp, gxp); });
}

}  // namespace brigade::ops
