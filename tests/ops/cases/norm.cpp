// Op-harness cases of the norm family (src/brigade/ops/norm.h): layer_norm, rms_norm, and
// batch_norm2d in training (batch statistics) and eval (running statistics); the big layer_norm
// cases above norm.cpp's OpenMP threshold. The synchronised batch norm's pieces and the
// channels-last layout are tested in tests/ops/test_conv_norm_ops.cpp.
#include "ops/harness.h"

#include <tuple>
#include <utility>

namespace brigade::optest {

namespace {

OpCase rms_norm_case(Input x) {
  const int64_t C = x.shape.back(), N = shape_numel(x.shape) / C;
  const double eps = 1e-6;
  OpCase c;
  c.name = fmt::format("rms_norm_{}{}", shape_str(x.shape), layout_name(x.layout));
  c.inputs = {x, in({C}).Range(0.5, 1.5)};
  c.fwd = [=](const TVec& v) -> TVec {
    ops::RMSNormOut o = ops::rms_norm(v[0], v[1], eps);
    return {o.y, o.rstd};
  };
  c.bwd = [](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
    ops::RMSNormGrads r = ops::rms_norm_backward(g, v[0], v[1], o[1]);
    return {r.gx, r.gw};
  };
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(N * C)), r(static_cast<size_t>(N));
    ref::rms_norm<double>(N, C, v[0].data(), v[1].data(), eps, y.data(), r.data());
    return {y, r};
  };
  c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(N * C)), r(static_cast<size_t>(N)), gx(y.size()), gw(static_cast<size_t>(C));
    ref::rms_norm<double>(N, C, v[0].data(), v[1].data(), eps, y.data(), r.data());
    ref::rms_norm_backward<double>(N, C, g.data(), v[0].data(), v[1].data(), r.data(), gx.data(), gw.data());
    return {gx, gw};
  };
  c.tol_cpu = 1e-5;
  c.tol_fd_f = 2e-4;              // rstd amplifies the f32 rounding of the row sums, as for layer_norm
  c.f32_outputs = {false, true};  // rstd
  return c;
}

OpCase batch_norm_case(Input x, bool training) {
  const int64_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3];
  OpCase c;
  c.name = fmt::format("batch_norm2d_{}{}_{}", shape_str(x.shape), layout_name(x.layout), training ? "train" : "eval");
  c.inputs = {x, in({C}).Range(0.5, 1.5), in({C})};
  if (!training) {  // running mean and variance: inputs the op reads, not differentiated
    c.inputs.push_back(in({C}).NoDiff());
    c.inputs.push_back(in({C}).NoDiff().Range(0.5, 1.5));
  }
  // The harness rounds every input to the case's dtype; running statistics are f32 state.
  auto stats = [training](const TVec& v) -> std::pair<Tensor, Tensor> {
    if (training) return {Tensor(), Tensor()};
    return {v[3].to(DType::F32).contiguous(), v[4].to(DType::F32).contiguous()};
  };
  c.fwd = [=](const TVec& v) -> TVec {
    auto [rm, rv] = stats(v);
    ops::BatchNormOut o = ops::batch_norm2d(v[0], v[1], v[2], rm, rv, training, 0.1, 1e-5);
    return {o.y, o.mean, o.rstd};
  };
  c.bwd = [=](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
    ops::BatchNormGrads r = ops::batch_norm2d_backward(g, v[0], v[1], o[1], o[2], training);
    return {r.gx, r.gw, r.gb};
  };
  auto fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(N * C * HW)), m(static_cast<size_t>(C)), r(static_cast<size_t>(C));
    ref::batch_norm2d<double, double>(N, C, HW, 0, C, v[0].data(), v[1].data(), v[2].data(), training,
                                      training ? nullptr : v[3].data(), training ? nullptr : v[4].data(), 1e-5,
                                      y.data(), m.data(), r.data(), nullptr);
    return {y, m, r};
  };
  c.fwd_d = fwd_d;
  c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    const std::vector<DVec> o = fwd_d(v);
    DVec gx(v[0].size()), gw(static_cast<size_t>(C)), gb(static_cast<size_t>(C));
    ref::batch_norm2d_backward<double, double>(N, C, HW, 0, C, g.data(), v[0].data(), v[1].data(), o[1].data(),
                                               o[2].data(), training, gx.data(), gw.data(), gb.data());
    return {gx, gw, gb};
  };
  c.tol_cpu = 1e-5;
  c.tol_fd_f = 2e-4;  // rstd amplifies f32 rounding of (x - mean), as in layer_norm
  c.f32_outputs = {false, true, true};
  return c;
}

}  // namespace

std::vector<OpCase> norm_cases() {
  std::vector<OpCase> cs;
  // ---- layer norm
  for (auto x : {in({2, 3, 16}), in({16, 6}).T(), in({5, 9}).Sliced()}) {
    const int64_t C = x.shape.back(), N = shape_numel(x.shape) / C;
    OpCase c;
    c.name = fmt::format("layer_norm_{}{}", shape_str(x.shape), layout_name(x.layout));
    c.inputs = {x, in({C}).Range(0.5, 1.5), in({C})};
    c.fwd = [](const TVec& v) -> TVec {
      ops::LayerNormOut o = ops::layer_norm(v[0], v[1], v[2], 1e-5);
      return {o.y, o.mean, o.rstd};
    };
    c.bwd = [](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
      ops::LayerNormGrads r = ops::layer_norm_backward(g, v[0], v[1], o[1], o[2]);
      return {r.gx, r.gw, r.gb};
    };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(N * C)), m(static_cast<size_t>(N)), r(static_cast<size_t>(N));
      ref::layer_norm<double>(N, C, v[0].data(), v[1].data(), v[2].data(), 1e-5, y.data(), m.data(), r.data());
      return {y, m, r};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(N * C)), m(static_cast<size_t>(N)), r(static_cast<size_t>(N)),
          gx(static_cast<size_t>(N * C)), gw(static_cast<size_t>(C)), gb(static_cast<size_t>(C));
      ref::layer_norm<double>(N, C, v[0].data(), v[1].data(), v[2].data(), 1e-5, y.data(), m.data(), r.data());
      ref::layer_norm_backward<double>(N, C, g.data(), v[0].data(), v[1].data(), m.data(), r.data(), gx.data(),
                                       gw.data(), gb.data());
      return {gx, gw, gb};
    };
    c.tol_cpu = 1e-5;
    c.tol_fd_f = 2e-4;                    // rstd amplifies f32 rounding of (x - mean)
    c.f32_outputs = {false, true, true};  // mean, rstd
    cs.push_back(c);
  }

  // ---- rms norm
  for (auto x : {in({2, 3, 16}), in({16, 6}).T(), in({5, 9}).Sliced()}) cs.push_back(rms_norm_case(x));

  // ---- batch norm, training and eval
  cs.push_back(batch_norm_case(in({4, 3, 5, 5}), true));
  cs.push_back(batch_norm_case(in({3, 4, 2, 3}).Swap(1, 3), true));
  cs.push_back(batch_norm_case(in({4, 3, 5, 5}), false));
  return cs;
}

std::vector<BigCase> norm_big_cases() {
  std::vector<BigCase> cs;
  {  // layer norm: N * C = 200 * 130 > 1 << 14; backward has 7 blocks of 32 rows (the last partial).
    const int64_t N = 200, LC = 130;
    const Tensor x = randn({N, LC}, 111, -2, 2), w = randn({LC}, 112, 0.5, 1.5), bb = randn({LC}, 113);
    const Tensor gy = randn({N, LC}, 114);
    cs.push_back({"layer_norm",
                  [=] {
                    ops::LayerNormOut o = ops::layer_norm(x, w, bb, 1e-5);
                    ops::LayerNormGrads g = ops::layer_norm_backward(gy, x, w, o.mean, o.rstd);
                    return TVec{o.y, o.mean, o.rstd, g.gx, g.gw, g.gb};
                  },
                  1e-5});
  }
  return cs;
}

std::vector<Big16Case> norm_big16_cases() {
  std::vector<Big16Case> cs;
  cs.push_back(
      {"layer_norm", [=](DType dt) {
         const int64_t N = 200, LC = 130;  // N * C > 1 << 14; 7 blocks of 32 rows
         const Tensor x = randn({N, LC}, 113, -2, 2).to(dt), gy = randn({N, LC}, 114).to(dt);
         const Tensor xt = randn({LC, N}, 115, -2, 2).to(dt).transpose(0, 1);  // (N, LC) strided
         const Tensor w = randn({LC}, 116, 0.5, 1.5), b = randn({LC}, 117);
         TVec r;
         for (const auto& [xx, ww, bb] : {std::tuple{x, w, b}, {xt, w.to(dt), b.to(dt)}, {x, w.to(dt), Tensor()}}) {
           const ops::LayerNormOut o = ops::layer_norm(xx, ww, bb, 1e-5);
           const ops::LayerNormGrads g = ops::layer_norm_backward(gy, xx, ww, o.mean, o.rstd);
           r.insert(r.end(), {o.y, o.mean, o.rstd, g.gx, g.gw, g.gb});
         }
         return r;
       }});
  return cs;
}

}  // namespace brigade::optest
