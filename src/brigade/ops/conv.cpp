// Convolution-family front-ends (ops/conv.h): geometry checks, the native bf16 / widened /
// f32 routes, and dispatch to the cpu kernels (cpu/conv.cpp: oneDNN convolutions, the direct
// depthwise kernel, channels-last max-pool) or the oracle (ref/conv.h). The ref backend has the
// NCHW oracle only: channels-last ops run it on permuted copies. Average pooling runs the
// oracle's per-plane code on both backends, one plane per OpenMP iteration on the cpu backend.
#include "brigade/ops/conv.h"

#include <string>

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

namespace {

// Output size of a window with padding lo and hi: (in + lo + hi - k) / stride + 1.
int64_t conv_out_size2(int64_t in, int64_t k, int64_t stride, int64_t lo, int64_t hi, const char* op) {
  const int64_t span = in + lo + hi - k;
  const int64_t o = span >= 0 ? span / stride + 1 : 0;
  BRIGADE_CHECK(o >= 1, ShapeError,
                "{}: a window of {} with padding {} + {} does not fit an input of size {}; use a larger input or "
                "padding",
                op, k, lo, hi, in);
  return o;
}

ref::ConvGeom conv_geom(const Tensor& x, const Tensor& w, const Conv2dParams& p, const char* op) {
  check_nchw(x, op, "x");
  check_nchw(w, op, "w");
  BRIGADE_CHECK(p.stride >= 1 && p.pad_top >= 0 && p.pad_bottom >= 0 && p.pad_left >= 0 && p.pad_right >= 0, ValueError,
                "{}: stride {} must be >= 1 and padding (top {}, bottom {}, left {}, right {}) >= 0", op, p.stride,
                p.pad_top, p.pad_bottom, p.pad_left, p.pad_right);
  // channels-last x is (N, H, W, C)
  const int64_t C = p.channels_last ? x.size(3) : x.size(1), H = p.channels_last ? x.size(1) : x.size(2),
                W = p.channels_last ? x.size(2) : x.size(3);
  const char* layout = p.channels_last ? "channels-last (N, H, W, C)" : "(N, C, H, W)";
  BRIGADE_CHECK(p.groups >= 1 && C % p.groups == 0 && w.size(0) % p.groups == 0, ShapeError,
                "{}: groups {} must be >= 1 and divide the input channels of x {} {} and the output channels of w {}",
                op, p.groups, layout, shape_str(x.shape()), shape_str(w.shape()));
  BRIGADE_CHECK(w.size(1) * p.groups == C, ShapeError,
                "{}: w {} expects {} input channels per group but x {} {} has {} in {} group(s); w must be "
                "(O, C / groups, KH, KW)",
                op, shape_str(w.shape()), w.size(1), layout, shape_str(x.shape()), C, p.groups);
  ref::ConvGeom g{x.size(0),    C,          H,           W,        w.size(0), w.size(2), w.size(3), p.stride, p.pad_top,
                  p.pad_bottom, p.pad_left, p.pad_right, p.groups, 0,         0};
  g.OH = conv_out_size2(g.H, g.KH, p.stride, p.pad_top, p.pad_bottom, op);
  g.OW = conv_out_size2(g.W, g.KW, p.stride, p.pad_left, p.pad_right, op);
  return g;
}

struct PoolGeom {
  int64_t P, H, W, OH, OW;
};
PoolGeom pool_geom(const Shape& xs, int64_t k, int64_t s, int64_t p, const char* op) {
  check_window(k, s, p, op);
  BRIGADE_CHECK(xs.size() == 4, ShapeError, "{}: x must be 4-D (N, C, H, W), got {}", op, shape_str(xs));
  BRIGADE_CHECK(2 * p <= k, ValueError, "{}: padding {} must be at most half the kernel {} (as torch requires)", op, p,
                k);
  return {xs[0] * xs[1], xs[2], xs[3], conv_out_size(xs[2], k, s, p, op), conv_out_size(xs[3], k, s, p, op)};
}

struct PatchDims {
  int64_t N, C, H, W, P, F;
};
PatchDims patch_dims(const Shape& s, int64_t p, const char* op) {
  BRIGADE_CHECK(s.size() == 4, ShapeError, "{}: x must be (N, C, H, W), got {}", op, shape_str(s));
  BRIGADE_CHECK(p >= 1, ValueError, "{}: patch size must be >= 1, got {}", op, p);
  BRIGADE_CHECK(s[2] % p == 0 && s[3] % p == 0, ShapeError,
                "{}: image height and width {}x{} must be multiples of the patch size {}", op, s[2], s[3], p);
  return {s[0], s[1], s[2], s[3], (s[2] / p) * (s[3] / p), s[1] * p * p};
}

}  // namespace

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, const char* op) {
  const int64_t o = in + 2 * pad - k >= 0 ? (in + 2 * pad - k) / stride + 1 : 0;
  BRIGADE_CHECK(o >= 1, ShapeError,
                "{}: a window of {} with padding {} does not fit an input of size {}; use a larger input or padding",
                op, k, pad, in);
  return o;
}

// ---------------------------------------------------------------- conv2d

bool conv2d_native_bf16() { return cpu::conv2d_bf16_available(); }

std::string last_conv2d_impl() { return cpu::last_conv2d_impl(); }

// A channels-last tensor (N, H, W, C) as an NCHW view, and back (contiguous).
Tensor nchw_view(const Tensor& t) { return t.permute({0, 3, 1, 2}); }
Tensor nhwc_of(const Tensor& t) { return t.defined() ? t.permute({0, 2, 3, 1}).contiguous() : t; }
Conv2dParams nchw_params(Conv2dParams p) {
  p.channels_last = false;
  return p;
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  const ref::ConvGeom g = conv_geom(x, w, p, "conv2d");
  if (bias.defined()) check_per_channel(bias, g.O, "conv2d", "bias");
  const bool cl = p.channels_last;
  // the ref backend has the NCHW oracle only: the same convolution on permuted copies
  if (cl && !on_cpu()) return nhwc_of(conv2d(nchw_view(x), w, bias, nchw_params(p)));
  const Shape ys = cl ? Shape{g.N, g.OH, g.OW, g.O} : Shape{g.N, g.O, g.OH, g.OW};
  if (on_cpu() && g.groups == 1 && x.dtype() == DType::BF16 && w.dtype() == DType::BF16 &&
      cpu::conv2d_bf16_available()) {
    // native: oneDNN's bf16 convolution, f32 accumulation, the output rounded once to bf16
    const Tensor xc = x.contiguous(), wc = w.contiguous(), bc = contig(f32_of(bias));
    Tensor y = Tensor::empty(ys, DType::BF16);  // (N, O, OH, OW) or channels-last (N, OH, OW, O)
    cpu::conv2d(g, xc.raw_data(), wc.raw_data(), fptr(bc), y.raw_data(), DType::BF16, cl);
    return y;
  }
  if (is_half(x) || is_half(w) || is_half(bias)) {
    const DType ot = x.dtype() == w.dtype() ? x.dtype() : DType::F32;
    return round_to(conv2d(f32_of(x), f32_of(w), f32_of(bias), p), ot);
  }
  const Tensor xc = x.contiguous(), wc = w.contiguous(), bc = contig(bias);
  Tensor y = Tensor::empty(ys);  // (N, O, OH, OW) or channels-last (N, OH, OW, O)
  if (cl) {                      // oneDNN has depthwise kernels of its own for NHWC
    cpu::conv2d(g, xc.data<float>(), wc.data<float>(), fptr(bc), y.data<float>(), DType::F32, true);
  } else if (on_cpu() && ref::is_depthwise(g)) {
    cpu::depthwise_conv2d(g, xc.data<float>(), wc.data<float>(), fptr(bc), y.data<float>());
    cpu::set_last_conv2d_impl("direct_depthwise f32");
  } else if (on_cpu()) {
    cpu::conv2d(g, xc.data<float>(), wc.data<float>(), fptr(bc), y.data<float>());
  } else {
    ref::conv2d<float>(g, xc.data<float>(), wc.data<float>(), fptr(bc), y.data<float>());
  }
  return y;
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding) {
  return conv2d(x, w, bias, Conv2dParams::symmetric(stride, padding));
}

Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dParams& p, bool need_gx,
                            bool need_gw, bool need_gb) {
  const ref::ConvGeom g = conv_geom(x, w, p, "conv2d_backward");
  check_nchw(gy, "conv2d_backward", "gy");
  const bool cl = p.channels_last;
  const Shape ys = cl ? Shape{g.N, g.OH, g.OW, g.O} : Shape{g.N, g.O, g.OH, g.OW};
  BRIGADE_CHECK(gy.shape() == ys, ShapeError, "conv2d_backward: gy must be the output's shape {}, got {}",
                shape_str(ys), shape_str(gy.shape()));
  if (cl && !on_cpu()) {  // the NCHW oracle on permuted copies, as the forward
    Conv2dGrads r = conv2d_backward(nchw_view(gy), nchw_view(x), w, nchw_params(p), need_gx, need_gw, need_gb);
    r.gx = nhwc_of(r.gx);
    return r;
  }
  if (on_cpu() && g.groups == 1 && gy.dtype() == DType::BF16 && x.dtype() == DType::BF16 && w.dtype() == DType::BF16 &&
      cpu::conv2d_bf16_available()) {
    // native: bf16 operands, f32 accumulation; gx written in bf16 by oneDNN, gw and gb
    // computed in f32 and rounded once to bf16
    const Tensor gyc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous();
    Conv2dGrads r;
    Tensor gw32, gb32;
    if (need_gx) r.gx = Tensor::empty(x.shape(), DType::BF16);  // x's shape and layout
    if (need_gw) gw32 = Tensor::empty(w.shape());               // (O, C, KH, KW) f32
    if (need_gb) gb32 = Tensor::empty({g.O});                   // (O) f32
    if (!need_gx && !need_gw && !need_gb) return r;
    cpu::conv2d_backward(g, gyc.raw_data(), xc.raw_data(), wc.raw_data(), need_gx ? r.gx.raw_data() : nullptr,
                         fptr_mut(gw32), fptr_mut(gb32), DType::BF16, cl);
    r.gw = round_to(gw32, DType::BF16);
    r.gb = round_to(gb32, DType::BF16);
    return r;
  }
  if (is_half(gy) || is_half(x) || is_half(w)) {
    Conv2dGrads r = conv2d_backward(f32_of(gy), f32_of(x), f32_of(w), p, need_gx, need_gw, need_gb);
    r.gx = round_to(r.gx, x.dtype());
    r.gw = round_to(r.gw, w.dtype());
    r.gb = round_to(r.gb, gy.dtype());
    return r;
  }
  const Tensor gyc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous();
  Conv2dGrads r;
  if (need_gx) r.gx = Tensor::empty(x.shape());  // x's shape and layout
  if (need_gw) r.gw = Tensor::empty(w.shape());  // (O, C / G, KH, KW)
  if (need_gb) r.gb = Tensor::empty({g.O});      // (O)
  if (!need_gx && !need_gw && !need_gb) return r;
  if (cl) {
    cpu::conv2d_backward(g, gyc.data<float>(), xc.data<float>(), wc.data<float>(), fptr_mut(r.gx), fptr_mut(r.gw),
                         fptr_mut(r.gb), DType::F32, true);
  } else if (on_cpu() && ref::is_depthwise(g)) {
    if (need_gx) cpu::depthwise_conv2d_backward_data(g, gyc.data<float>(), wc.data<float>(), r.gx.data<float>());
    if (need_gw || need_gb)
      cpu::depthwise_conv2d_backward_weights(g, gyc.data<float>(), xc.data<float>(), fptr_mut(r.gw), fptr_mut(r.gb));
  } else if (on_cpu()) {
    cpu::conv2d_backward(g, gyc.data<float>(), xc.data<float>(), wc.data<float>(), fptr_mut(r.gx), fptr_mut(r.gw),
                         fptr_mut(r.gb));
  } else {
    ref::conv2d_backward<float>(g, gyc.data<float>(), xc.data<float>(), wc.data<float>(), fptr_mut(r.gx),
                                fptr_mut(r.gw), fptr_mut(r.gb));
  }
  return r;
}

Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, int64_t stride, int64_t padding,
                            bool need_gx, bool need_gw, bool need_gb) {
  return conv2d_backward(gy, x, w, Conv2dParams::symmetric(stride, padding), need_gx, need_gw, need_gb);
}

// ---------------------------------------------------------------- pooling

MaxPoolOut max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool channels_last) {
  check_nchw(x, "max_pool2d", "x");
  if (channels_last) {
    const int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
    const PoolGeom g = pool_geom({N, C, H, W}, kernel, stride, padding, "max_pool2d");
    if (!on_cpu()) {  // the NCHW oracle on permuted copies
      MaxPoolOut o = max_pool2d(nchw_view(x), kernel, stride, padding);
      return {nhwc_of(o.y), nhwc_of(o.idx)};
    }
    const Tensor xc = x.contiguous();
    MaxPoolOut o;
    o.y = Tensor::empty({N, g.OH, g.OW, C}, x.dtype());     // (N, OH, OW, C)
    o.idx = Tensor::empty({N, g.OH, g.OW, C}, DType::I64);  // (N, OH, OW, C)
    cpu::max_pool_rows(g.H, g.W, g.OH, g.OW, N, C, kernel, stride, padding, x.dtype(), xc.raw_data(), o.y.raw_data(),
                       o.idx.data<int64_t>());
    return o;
  }
  const PoolGeom g = pool_geom(x.shape(), kernel, stride, padding, "max_pool2d");
  if (is_half(x)) {
    MaxPoolOut o = max_pool2d(f32_of(x), kernel, stride, padding);
    o.y = round_to(o.y, x.dtype());
    return o;
  }
  const Tensor xc = x.contiguous();
  MaxPoolOut o;
  o.y = Tensor::empty({x.size(0), x.size(1), g.OH, g.OW});                // (N, C, OH, OW)
  o.idx = Tensor::empty({x.size(0), x.size(1), g.OH, g.OW}, DType::I64);  // (N, C, OH, OW)
  const float* xp = xc.data<float>();
  float* yp = o.y.data<float>();
  int64_t* ip = o.idx.data<int64_t>();
  const int64_t HW = g.H * g.W, OHW = g.OH * g.OW;
  for_each_plane(g.P, HW, [&](int64_t p) {
    ref::max_pool2d_plane<float>(g.H, g.W, kernel, stride, padding, g.OH, g.OW, xp + p * HW, yp + p * OHW,
                                 ip + p * OHW);
  });
  return o;
}

Tensor max_pool2d_backward(const Tensor& gy, const Tensor& idx, const Shape& x_shape, bool channels_last) {
  check_nchw(gy, "max_pool2d_backward", "gy");
  BRIGADE_CHECK(idx.defined() && idx.dtype() == DType::I64 && idx.shape() == gy.shape(), ShapeError,
                "max_pool2d_backward: idx must be i64 of gy's shape {} (max_pool2d's idx), got {}",
                shape_str(gy.shape()), idx.defined() ? idx.str() : "undefined");
  const int64_t cdim = channels_last ? 3 : 1;
  BRIGADE_CHECK(x_shape.size() == 4 && x_shape[0] == gy.size(0) && x_shape[cdim] == gy.size(cdim), ShapeError,
                "max_pool2d_backward: x shape {} does not match gy {}", shape_str(x_shape), shape_str(gy.shape()));
  const int64_t HW = channels_last ? x_shape[1] * x_shape[2] : x_shape[2] * x_shape[3];
  const Tensor ic = idx.contiguous();
  const int64_t* ip = ic.data<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    BRIGADE_CHECK(ip[i] >= -1 && ip[i] < HW, ValueError, "max_pool2d_backward: index {} outside a plane of {}", ip[i],
                  HW);
  if (channels_last) {
    if (!on_cpu()) {
      const Shape xs{x_shape[0], x_shape[3], x_shape[1], x_shape[2]};
      return nhwc_of(max_pool2d_backward(nchw_view(gy), nchw_view(idx), xs));
    }
    const Tensor gyc = gy.contiguous();
    Tensor gx = Tensor::empty(x_shape, gy.dtype());  // (N, H, W, C)
    cpu::max_pool_rows_backward(x_shape[0], HW, gy.size(1) * gy.size(2), x_shape[3], gy.dtype(), gyc.raw_data(), ip,
                                gx.raw_data());
    return gx;
  }
  if (is_half(gy)) return round_to(max_pool2d_backward(f32_of(gy), idx, x_shape), gy.dtype());
  const int64_t OHW = gy.size(2) * gy.size(3);
  return map_planes(gy, x_shape, HW, [&](int64_t p, const float* gp, float* gxp) {  // (N, C, H, W)
    ref::max_pool2d_backward_plane<float>(HW, OHW, gp, ip + p * OHW, gxp);
  });
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  check_nchw(x, "avg_pool2d", "x");
  const PoolGeom g = pool_geom(x.shape(), kernel, stride, padding, "avg_pool2d");
  if (is_half(x)) return round_to(avg_pool2d(f32_of(x), kernel, stride, padding), x.dtype());
  return map_planes(x, {x.size(0), x.size(1), g.OH, g.OW}, g.H * g.W, [&](int64_t, const float* xp, float* yp) {
    ref::avg_pool2d_plane<float>(g.H, g.W, kernel, stride, padding, g.OH, g.OW, xp, yp);  // (N, C, OH, OW)
  });
}

Tensor avg_pool2d_backward(const Tensor& gy, const Shape& x_shape, int64_t kernel, int64_t stride, int64_t padding) {
  check_nchw(gy, "avg_pool2d_backward", "gy");
  const PoolGeom g = pool_geom(x_shape, kernel, stride, padding, "avg_pool2d_backward");
  BRIGADE_CHECK(gy.shape() == Shape({x_shape[0], x_shape[1], g.OH, g.OW}), ShapeError,
                "avg_pool2d_backward: gy {} must be the output's shape {}", shape_str(gy.shape()),
                shape_str({x_shape[0], x_shape[1], g.OH, g.OW}));
  if (is_half(gy)) return round_to(avg_pool2d_backward(f32_of(gy), x_shape, kernel, stride, padding), gy.dtype());
  return map_planes(gy, x_shape, g.H * g.W, [&](int64_t, const float* gp, float* gxp) {  // (N, C, H, W)
    ref::avg_pool2d_backward_plane<float>(g.H, g.W, kernel, stride, padding, g.OH, g.OW, gp, gxp);
  });
}

// ---------------------------------------------------------------- patchify

Tensor patchify(const Tensor& x, int64_t p) {
  check_float(x, "patchify", "x");
  const PatchDims d = patch_dims(x.shape(), p, "patchify");
  if (is_half(x)) return round_to(patchify(f32_of(x), p), x.dtype());
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty({d.N, d.P, d.F});  // (N, P, C*p*p)
  BRIGADE_DISPATCH(patchify, d.N, d.C, d.H, d.W, p, xc.data<float>(), y.data<float>());
  return y;
}

Tensor patchify_backward(const Tensor& g, const Shape& x_shape, int64_t p) {
  check_float(g, "patchify_backward", "g");
  const PatchDims d = patch_dims(x_shape, p, "patchify_backward");
  BRIGADE_CHECK(g.shape() == Shape({d.N, d.P, d.F}), ShapeError,
                "patchify_backward: g must be (N, P, C*p*p) = {} for x {}, got {}", shape_str({d.N, d.P, d.F}),
                shape_str(x_shape), shape_str(g.shape()));
  if (is_half(g)) return round_to(patchify_backward(f32_of(g), x_shape, p), g.dtype());
  Tensor gc = g.contiguous();
  Tensor gx = Tensor::empty(x_shape);  // (N, C, H, W)
  BRIGADE_DISPATCH(patchify_backward, d.N, d.C, d.H, d.W, p, gc.data<float>(), gx.data<float>());
  return gx;
}

}  // namespace brigade::ops
