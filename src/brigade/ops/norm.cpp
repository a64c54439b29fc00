// Normalisation front-ends (ops/norm.h).
#include "brigade/ops/norm.h"

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

// ---------------------------------------------------------------- layer norm

namespace {
void check_vec(const Tensor& t, int64_t C, const char* op, const char* name, const Tensor& x) {
  check_float(t, op, name);
  BRIGADE_CHECK(t.dim() == 1 && t.size(0) == C, ShapeError,
                "{}: '{}' must be ({}) to match the last dim of x {}, got {}", op, name, C, shape_str(x.shape()),
                shape_str(t.shape()));
}
}  // namespace

LayerNormOut layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  check_float(x, "layer_norm", "x");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "layer_norm: x must have at least 1 dim");
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  check_vec(w, C, "layer_norm", "w", x);
  Tensor bc = b.defined() ? b : Tensor::zeros({C});  // (C); an undefined bias means no bias
  check_vec(bc, C, "layer_norm", "b", x);
  BRIGADE_CHECK(eps >= 0, ValueError, "layer_norm: eps must be >= 0, got {}", eps);
  if (native16({&x})) {  // w and b: any floating dtype, widened ((C) each)
    const Tensor wf = f32_contiguous(w), bf = f32_contiguous(bc);
    LayerNormOut o;
    o.y = Tensor::empty(x.shape(), x.dtype());  // (..., C)
    o.mean = Tensor::empty({N});                // (N)
    o.rstd = Tensor::empty({N});                // (N)
    cpu::layer_norm16(N, C, strided(x), wf.data<float>(), bf.data<float>(), eps, x.dtype(), o.y.raw_data(),
                      o.mean.data<float>(), o.rstd.data<float>());
    return o;
  }
  if (auto r = via_f32(
          {x.dtype(), DType::F32, DType::F32},
          [&](const Tensor& x_, const Tensor& w_, const Tensor& b_) { return layer_norm(x_, w_, b_, eps); }, x, w, b))
    return *r;
  Tensor xc = x.contiguous(), wc = w.contiguous();
  bc = bc.contiguous();
  LayerNormOut o;
  o.y = Tensor::empty(x.shape());  // (..., C)
  o.mean = Tensor::empty({N});     // (N)
  o.rstd = Tensor::empty({N});     // (N)
  BRIGADE_DISPATCH(layer_norm, N, C, xc.data<float>(), wc.data<float>(), bc.data<float>(), eps, o.y.data<float>(),
                   o.mean.data<float>(), o.rstd.data<float>());
  return o;
}

LayerNormGrads layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                   const Tensor& rstd) {
  check_float(x, "layer_norm_backward", "x");
  check_float(gy, "layer_norm_backward", "gy");
  check_same_shape(gy, x, "layer_norm_backward", "gy", "x");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "layer_norm_backward: x must have at least 1 dim");
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  check_vec(w, C, "layer_norm_backward", "w", x);
  check_vec(mean, N, "layer_norm_backward", "mean", x);
  check_vec(rstd, N, "layer_norm_backward", "rstd", x);
  if (native16({&gy, &x}) && mean.dtype() == DType::F32 && rstd.dtype() == DType::F32) {  // w: any floating dtype
    const Tensor wf = f32_contiguous(w), mc = mean.contiguous(), rc = rstd.contiguous();
    LayerNormGrads g;
    g.gx = Tensor::empty(x.shape(), x.dtype());  // (..., C)
    g.gw = Tensor::empty({C});                   // (C)
    g.gb = Tensor::empty({C});                   // (C)
    cpu::layer_norm_backward16(N, C, strided(gy), strided(x), wf.data<float>(), mc.data<float>(), rc.data<float>(),
                               x.dtype(), g.gx.raw_data(), g.gw.data<float>(), g.gb.data<float>());
    g.gw = round_to(g.gw, w.dtype());
    g.gb = round_to(g.gb, w.dtype());
    return g;
  }
  if (auto r = via_f32(
          {x.dtype(), w.dtype(), w.dtype()},
          [](const Tensor& gy_, const Tensor& x_, const Tensor& w_, const Tensor& m_, const Tensor& r_) {
            return layer_norm_backward(gy_, x_, w_, m_, r_);
          },
          gy, x, w, mean, rstd))
    return *r;
  Tensor gyc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous(), mc = mean.contiguous(),
         rc = rstd.contiguous();
  LayerNormGrads g;
  g.gx = Tensor::empty(x.shape());  // (..., C)
  g.gw = Tensor::empty({C});        // (C)
  g.gb = Tensor::empty({C});        // (C)
  BRIGADE_DISPATCH(layer_norm_backward, N, C, gyc.data<float>(), xc.data<float>(), wc.data<float>(), mc.data<float>(),
                   rc.data<float>(), g.gx.data<float>(), g.gw.data<float>(), g.gb.data<float>());
  return g;
}

// ---------------------------------------------------------------- RMSNorm

RMSNormOut rms_norm(const Tensor& x, const Tensor& w, double eps) {
  check_float(x, "rms_norm", "x");
  check_float(w, "rms_norm", "w");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "rms_norm: x must have at least 1 dim, got a 0-d tensor");
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  BRIGADE_CHECK(w.dim() == 1 && w.size(0) == C, ShapeError, "rms_norm: w must be ({}) to match x {}, got {}", C,
                shape_str(x.shape()), shape_str(w.shape()));
  BRIGADE_CHECK(eps >= 0.0, ValueError, "rms_norm: eps must be >= 0, got {}", eps);
  if (any_not_f32({&x, &w})) {
    RMSNormOut o = rms_norm(f32_of(x), f32_of(w), eps);
    o.y = round_to(o.y, x.dtype());
    return o;
  }
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  RMSNormOut o;
  o.y = Tensor::empty(x.shape());  // (..., C)
  o.rstd = Tensor::empty({N});     // (N)
  BRIGADE_DISPATCH(rms_norm, N, C, xc.data<float>(), wc.data<float>(), eps, o.y.data<float>(), o.rstd.data<float>());
  return o;
}

RMSNormGrads rms_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  check_float(gy, "rms_norm_backward", "gy");
  check_float(x, "rms_norm_backward", "x");
  check_float(w, "rms_norm_backward", "w");
  check_float(rstd, "rms_norm_backward", "rstd");
  check_same_shape(gy, x, "rms_norm_backward", "gy", "x");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "rms_norm_backward: x must have at least 1 dim");
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  BRIGADE_CHECK(w.dim() == 1 && w.size(0) == C, ShapeError, "rms_norm_backward: w must be ({}), got {}", C,
                shape_str(w.shape()));
  BRIGADE_CHECK(rstd.dim() == 1 && rstd.size(0) == N, ShapeError,
                "rms_norm_backward: rstd must be ({}) (one per row of x {}), got {}", N, shape_str(x.shape()),
                shape_str(rstd.shape()));
  if (any_not_f32({&gy, &x, &w, &rstd})) {
    RMSNormGrads g = rms_norm_backward(f32_of(gy), f32_of(x), f32_of(w), f32_of(rstd));
    g.gx = round_to(g.gx, x.dtype());
    g.gw = round_to(g.gw, w.dtype());
    return g;
  }
  const Tensor gc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous(), rc = rstd.contiguous();
  RMSNormGrads g;
  g.gx = Tensor::empty(x.shape());  // (..., C)
  g.gw = Tensor::empty({C});        // (C)
  BRIGADE_DISPATCH(rms_norm_backward, N, C, gc.data<float>(), xc.data<float>(), wc.data<float>(), rc.data<float>(),
                   g.gx.data<float>(), g.gw.data<float>());
  return g;
}

// ---------------------------------------------------------------- batch norm

namespace {

// Batch norm's (N, C, HW) problem: channels-last (N, H, W, C) is the NCHW problem (N H W, C, 1),
// the same bytes.
struct BnDims {
  int64_t N, C, HW;
};
BnDims bn_dims(const Tensor& x, bool channels_last) {
  if (channels_last) return {x.size(0) * x.size(1) * x.size(2), x.size(3), 1};
  return {x.size(0), x.size(1), x.size(2) * x.size(3)};
}

}  // namespace

BatchNormOut batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                          const Tensor& running_var, bool training, double momentum, double eps, bool channels_last) {
  const char* op = "batch_norm2d";
  check_nchw(x, op, "x");
  const auto [N, C, HW] = bn_dims(x, channels_last);
  check_per_channel(w, C, op, "w");
  if (b.defined()) check_per_channel(b, C, op, "b");
  BRIGADE_CHECK(running_mean.defined() == running_var.defined(), ValueError,
                "{}: give both running_mean and running_var, or neither", op);
  for (const Tensor* r : {&running_mean, &running_var})
    if (r->defined()) {
      check_per_channel(*r, C, op, r == &running_mean ? "running_mean" : "running_var");
      BRIGADE_CHECK(r->dtype() == DType::F32 && r->is_contiguous(), ValueError,
                    "{}: running statistics must be contiguous f32 tensors, got {}", op, r->str());
    }
  BRIGADE_CHECK(training || running_mean.defined(), ValueError,
                "{}: eval mode normalises with the running statistics, but none were given", op);
  BRIGADE_CHECK(!training || N * HW > 1, ValueError,
                "{}: training needs more than one value per channel to compute a variance, got x {}", op,
                shape_str(x.shape()));
  BRIGADE_CHECK(eps >= 0 && momentum >= 0 && momentum <= 1, ValueError,
                "{}: eps {} must be >= 0 and momentum {} in [0, 1]", op, eps, momentum);
  // The ref backend runs the oracle on widened copies; the cpu kernels read and write 16-bit
  // x and y themselves (the same f32 arithmetic on the same values: bitwise the widened result).
  if (is_half(w) || is_half(b) || (is_half(x) && !on_cpu())) {
    BatchNormOut o = batch_norm2d(on_cpu() ? x : f32_of(x), f32_of(w), f32_of(b), running_mean, running_var, training,
                                  momentum, eps, channels_last);
    o.y = round_to(o.y, x.dtype());
    return o;
  }
  const Tensor xc = x.contiguous(), wc = w.contiguous(), bc = contig(b);
  BatchNormOut o;
  o.y = Tensor::empty(x.shape(), x.dtype());  // x's shape, layout and dtype
  o.mean = Tensor::empty({C});                // (C)
  o.rstd = Tensor::empty({C});                // (C)
  Tensor var = Tensor::empty({C});            // (C) the variance used (biased, in training)
  const float* rm = training ? nullptr : running_mean.data<float>();
  const float* rv = training ? nullptr : running_var.data<float>();
  const float *wp = wc.data<float>(), *bp = fptr(bc);
  float *mp = o.mean.data<float>(), *sp = o.rstd.data<float>(), *vp = var.data<float>();
  if (on_cpu() && channels_last) {
    cpu::batch_norm_rows(N, C, x.dtype(), xc.raw_data(), wp, bp, training, rm, rv, eps, o.y.raw_data(), mp, sp, vp);
  } else if (on_cpu()) {
    cpu::batch_norm_planes(N, C, HW, x.dtype(), xc.raw_data(), wp, bp, training, rm, rv, eps, o.y.raw_data(), mp, sp,
                           vp);
  } else {
    ref::batch_norm2d<float, float>(N, C, HW, 0, C, xc.data<float>(), wp, bp, training, rm, rv, eps, o.y.data<float>(),
                                    mp, sp, vp);
  }
  if (training && running_mean.defined()) {
    const double M = double(N * HW), unbias = M / (M - 1);
    float *rmp = running_mean.data<float>(), *rvp = running_var.data<float>();
    for (int64_t c = 0; c < C; ++c) {
      rmp[c] = float((1 - momentum) * double(rmp[c]) + momentum * double(mp[c]));
      rvp[c] = float((1 - momentum) * double(rvp[c]) + momentum * double(vp[c]) * unbias);
    }
  }
  return o;
}

BatchNormGrads batch_norm2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                     const Tensor& rstd, bool training, bool channels_last) {
  const char* op = "batch_norm2d_backward";
  check_nchw(x, op, "x");
  check_nchw(gy, op, "gy");
  BRIGADE_CHECK(gy.shape() == x.shape(), ShapeError, "{}: gy {} must have x's shape {}", op, shape_str(gy.shape()),
                shape_str(x.shape()));
  const auto [N, C, HW] = bn_dims(x, channels_last);
  check_per_channel(w, C, op, "w");
  check_per_channel(mean, C, op, "mean");
  check_per_channel(rstd, C, op, "rstd");
  // As in the forward: 16-bit gy and x are read by the cpu kernels themselves.
  const bool widen_acts = (is_half(gy) || is_half(x)) && !on_cpu();
  if (widen_acts || is_half(w) || is_half(mean) || is_half(rstd)) {
    BatchNormGrads r = batch_norm2d_backward(widen_acts ? f32_of(gy) : gy, widen_acts ? f32_of(x) : x, f32_of(w),
                                             f32_of(mean), f32_of(rstd), training, channels_last);
    r.gx = round_to(r.gx, x.dtype());
    r.gw = round_to(r.gw, w.dtype());
    r.gb = round_to(r.gb, w.dtype());
    return r;
  }
  const Tensor gyc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous(), mc = mean.contiguous(),
               rc = rstd.contiguous();
  BatchNormGrads r;
  r.gx = Tensor::empty(x.shape(), x.dtype());  // x's shape, layout and dtype
  r.gw = Tensor::empty({C});                   // (C)
  r.gb = Tensor::empty({C});                   // (C)
  const float *wp = wc.data<float>(), *mp = mc.data<float>(), *sp = rc.data<float>();
  float *gwp = r.gw.data<float>(), *gbp = r.gb.data<float>();
  if (on_cpu() && channels_last) {
    cpu::batch_norm_rows_backward(N, C, gy.dtype(), gyc.raw_data(), x.dtype(), xc.raw_data(), wp, mp, sp, training,
                                  r.gx.raw_data(), gwp, gbp);
  } else if (on_cpu()) {
    cpu::batch_norm_planes_backward(N, C, HW, gy.dtype(), gyc.raw_data(), x.dtype(), xc.raw_data(), wp, mp, sp,
                                    training, r.gx.raw_data(), gwp, gbp);
  } else {
    ref::batch_norm2d_backward<float, float>(N, C, HW, 0, C, gyc.data<float>(), xc.data<float>(), wp, mp, sp, training,
                                             r.gx.data<float>(), gwp, gbp);
  }
  return r;
}

// ---------------------------------------------------------------- synchronised batch norm pieces

namespace {

// Double sums of u(i) and v(i) over a row's n elements in 8 lanes (fixed order: lane l takes
// i = l mod 8, then the lanes in order, then the tail), so the cpu loop vectorises and stays
// reproducible.
template <class U, class V>
inline void lane_sums_d(int64_t n, double& s1, double& s2, U u, V v) {
  double a[8] = {0}, b[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
#pragma omp simd
    for (int l = 0; l < 8; ++l) {
      a[l] += u(i + l);
      b[l] += v(i + l);
    }
  double p = 0, q = 0;
  for (int l = 0; l < 8; ++l) p += a[l], q += b[l];
  for (; i < n; ++i) p += u(i), q += v(i);
  s1 += p, s2 += q;
}

void check_bn_stats(const Tensor& x, const Tensor& mean, const Tensor& rstd, const char* op) {
  check_nchw(x, op, "x");
  check_per_channel(mean, x.size(1), op, "mean");
  check_per_channel(rstd, x.size(1), op, "rstd");
}

}  // namespace

ChannelSums batch_norm2d_sums(const Tensor& x0) {
  check_nchw(x0, "batch_norm2d_sums", "x");
  const Tensor x = f32_of(x0).contiguous();
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  ChannelSums r{std::vector<double>(static_cast<size_t>(C)), std::vector<double>(static_cast<size_t>(C))};
  const float* xp = x.data<float>();
  double *s1 = r.s1.data(), *s2 = r.s2.data();
  if (on_cpu()) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 15))
    for (int64_t c = 0; c < C; ++c) {
      double a = 0, b = 0;
      for (int64_t n = 0; n < N; ++n) {
        const float* xr = xp + (n * C + c) * HW;
        const auto v = [xr](int64_t i) { return double(xr[i]); };
        lane_sums_d(HW, a, b, v, [v](int64_t i) { return v(i) * v(i); });
      }
      s1[c] = a, s2[c] = b;
    }
  } else {
    ref::batch_norm2d_sums<float>(N, C, HW, 0, C, xp, s1, s2);
  }
  return r;
}

ChannelSums batch_norm2d_grad_sums(const Tensor& gy0, const Tensor& x0, const Tensor& mean0, const Tensor& rstd0) {
  const char* op = "batch_norm2d_grad_sums";
  check_bn_stats(x0, mean0, rstd0, op);
  check_nchw(gy0, op, "gy");
  BRIGADE_CHECK(gy0.shape() == x0.shape(), ShapeError, "{}: gy {} must have x's shape {}", op, shape_str(gy0.shape()),
                shape_str(x0.shape()));
  const Tensor gy = f32_of(gy0).contiguous(), x = f32_of(x0).contiguous(), mean = f32_of(mean0).contiguous(),
               rstd = f32_of(rstd0).contiguous();
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  ChannelSums r{std::vector<double>(static_cast<size_t>(C)), std::vector<double>(static_cast<size_t>(C))};
  const float *gp = gy.data<float>(), *xp = x.data<float>(), *mp = mean.data<float>(), *sp = rstd.data<float>();
  double *s1 = r.s1.data(), *s2 = r.s2.data();
  if (on_cpu()) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 15))
    for (int64_t c = 0; c < C; ++c) {
      double a = 0, b = 0;  // sum gy, sum gy (x - m)
      for (int64_t n = 0; n < N; ++n) {
        const float *gr = gp + (n * C + c) * HW, *xr = xp + (n * C + c) * HW;
        const double m = mp[c];
        const auto g = [gr](int64_t i) { return double(gr[i]); };
        lane_sums_d(HW, a, b, g, [&](int64_t i) { return g(i) * (double(xr[i]) - m); });
      }
      s1[c] = a, s2[c] = b * double(sp[c]);
    }
  } else {
    ref::batch_norm2d_grad_sums<float, float>(N, C, HW, 0, C, gp, xp, mp, sp, s1, s2);
  }
  return r;
}

Tensor batch_norm2d_backward_input(const Tensor& gy0, const Tensor& x0, const Tensor& w0, const Tensor& mean0,
                                   const Tensor& rstd0, const ChannelSums& sums, double M) {
  const char* op = "batch_norm2d_backward_input";
  check_bn_stats(x0, mean0, rstd0, op);
  check_nchw(gy0, op, "gy");
  BRIGADE_CHECK(gy0.shape() == x0.shape(), ShapeError, "{}: gy {} must have x's shape {}", op, shape_str(gy0.shape()),
                shape_str(x0.shape()));
  const int64_t N = x0.size(0), C = x0.size(1), HW = x0.size(2) * x0.size(3);
  check_per_channel(w0, C, op, "w");
  BRIGADE_CHECK(int64_t(sums.s1.size()) == C && int64_t(sums.s2.size()) == C, ShapeError,
                "{}: the gradient sums must hold C = {} values each, got {} and {}", op, C, sums.s1.size(),
                sums.s2.size());
  BRIGADE_CHECK(M > 0, ValueError, "{}: the count M = {} must be positive", op, M);
  const Tensor gy = f32_of(gy0).contiguous(), x = f32_of(x0).contiguous(), w = f32_of(w0).contiguous(),
               mean = f32_of(mean0).contiguous(), rstd = f32_of(rstd0).contiguous();
  Tensor gx = Tensor::empty(x.shape());  // (N, C, H, W)
  const float *gp = gy.data<float>(), *xp = x.data<float>(), *wp = w.data<float>(), *mp = mean.data<float>(),
              *sp = rstd.data<float>();
  float* gxp = gx.data<float>();
  const double *s1 = sums.s1.data(), *s2 = sums.s2.data();
  if (on_cpu()) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 15))
    for (int64_t c = 0; c < C; ++c) {
      // gx = w r (gy - s1/M - xhat s2/M) = k1 gy + k2 (x - m) + k3
      const double r = double(sp[c]), wc = double(wp[c]);
      const float m = mp[c];
      const float k1 = float(wc * r), k2 = float(-wc * r * r * s2[c] / M), k3 = float(-wc * r * s1[c] / M);
      for (int64_t n = 0; n < N; ++n) {
        const float* g = gp + (n * C + c) * HW;
        const float* xr = xp + (n * C + c) * HW;
        float* o = gxp + (n * C + c) * HW;
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) o[i] = k1 * g[i] + k2 * (xr[i] - m) + k3;
      }
    }
  } else {
    ref::batch_norm2d_backward_input<float, float>(N, C, HW, 0, C, gp, xp, wp, mp, sp, s1, s2, M, gxp);
  }
  return round_to(gx, x0.dtype());
}

void batch_norm2d_update_running(const Tensor& running_mean, const Tensor& running_var, const std::vector<double>& mean,
                                 const std::vector<double>& var_unbiased, double momentum) {
  const char* op = "batch_norm2d_update_running";
  const int64_t C = int64_t(mean.size());
  BRIGADE_CHECK(int64_t(var_unbiased.size()) == C, ShapeError, "{}: {} means but {} variances", op, C,
                var_unbiased.size());
  for (const Tensor* r : {&running_mean, &running_var}) {
    check_per_channel(*r, C, op, r == &running_mean ? "running_mean" : "running_var");
    BRIGADE_CHECK(r->dtype() == DType::F32 && r->is_contiguous(), ValueError,
                  "{}: running statistics must be contiguous f32 tensors, got {}", op, r->str());
  }
  BRIGADE_CHECK(momentum >= 0 && momentum <= 1, ValueError, "{}: momentum {} must be in [0, 1]", op, momentum);
  float *rmp = running_mean.data<float>(), *rvp = running_var.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    rmp[c] = float((1 - momentum) * double(rmp[c]) + momentum * mean[size_t(c)]);
    rvp[c] = float((1 - momentum) * double(rvp[c]) + momentum * var_unbiased[size_t(c)]);
  }
}

}  // namespace brigade::ops
