// Op-harness cases of the conv family (src/brigade/ops/conv.h): conv2d (bias or not, stride,
// padding, 1x1 downsample, a transposed input view; grouped, depthwise with "same" and
// EfficientNet's asymmetric correct_pad padding, a depthwise multiplier, an asymmetric stem),
// max_pool2d, avg_pool2d and patchify. The bf16 and channels-last convolutions and the
// PyTorch fixture are tested in tests/ops/test_conv_norm_ops.cpp.
#include "ops/harness.h"

#include <string>

namespace brigade::optest {

namespace {

OpCase conv2d_case(Input x, Shape ws, bool bias, ops::Conv2dParams p, std::string name = "") {
  OpCase c;
  c.name = name.empty() ? fmt::format("conv2d_{}{}_{}_s{}_p{}{}{}{}_g{}_{}", shape_str(x.shape), layout_name(x.layout),
                                      shape_str(ws), p.stride, p.pad_top, p.pad_bottom, p.pad_left, p.pad_right,
                                      p.groups, bias ? "bias" : "nobias")
                        : name;
  c.inputs = {x, in(ws)};
  if (bias) c.inputs.push_back(in({ws[0]}));
  c.fwd = [=](const TVec& v) -> TVec { return {ops::conv2d(v[0], v[1], bias ? v[2] : Tensor(), p)}; };
  c.bwd = [=](const TVec& v, const TVec&, const Tensor& g) -> TVec {
    ops::Conv2dGrads r = ops::conv2d_backward(g, v[0], v[1], p, true, true, bias);
    if (bias) return {r.gx, r.gw, r.gb};
    return {r.gx, r.gw};
  };
  ref::ConvGeom geo{x.shape[0], x.shape[1],   x.shape[2], x.shape[3],  ws[0],    ws[2], ws[3], p.stride,
                    p.pad_top,  p.pad_bottom, p.pad_left, p.pad_right, p.groups, 0,     0};
  geo.OH = (geo.H + p.pad_top + p.pad_bottom - geo.KH) / p.stride + 1;
  geo.OW = (geo.W + p.pad_left + p.pad_right - geo.KW) / p.stride + 1;
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(geo.N * geo.O * geo.OH * geo.OW));
    ref::conv2d<double>(geo, v[0].data(), v[1].data(), bias ? v[2].data() : nullptr, y.data());
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    DVec gx(v[0].size()), gw(v[1].size()), gb(static_cast<size_t>(geo.O));
    ref::conv2d_backward<double>(geo, g.data(), v[0].data(), v[1].data(), gx.data(), gw.data(),
                                 bias ? gb.data() : nullptr);
    if (bias) return {gx, gw, gb};
    return {gx, gw};
  };
  c.tol_cpu = 1e-5;  // oneDNN's (or the depthwise kernel's) f32 summation order vs the oracle's double
  return c;
}
// Symmetric padding, groups 1: the original cases and names.
OpCase conv2d_case(Input x, Shape ws, bool bias, int64_t stride, int64_t pad) {
  const std::string name = fmt::format("conv2d_{}{}_{}_s{}_p{}_{}", shape_str(x.shape), layout_name(x.layout),
                                       shape_str(ws), stride, pad, bias ? "bias" : "nobias");
  return conv2d_case(x, ws, bias, ops::Conv2dParams::symmetric(stride, pad), name);
}
// HF EfficientNet's padding of a stride-2 depthwise convolution: nn.ZeroPad2d(correct_pad(k)),
// (left, right, top, bottom) = (k/2 - 1, k/2, k/2 - 1, k/2).
ops::Conv2dParams correct_pad(int64_t k, int64_t groups) { return {2, k / 2 - 1, k / 2, k / 2 - 1, k / 2, groups}; }

OpCase max_pool_case(Input x, int64_t k, int64_t s, int64_t p) {
  OpCase c;
  c.name = fmt::format("max_pool2d_{}{}_k{}_s{}_p{}", shape_str(x.shape), layout_name(x.layout), k, s, p);
  c.inputs = {x};
  c.fwd = [=](const TVec& v) -> TVec { return {ops::max_pool2d(v[0], k, s, p).y}; };
  c.bwd = [=](const TVec& v, const TVec&, const Tensor& g) -> TVec {
    return {ops::max_pool2d_backward(g, ops::max_pool2d(v[0], k, s, p).idx, v[0].shape())};
  };
  const int64_t P = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t OH = (H + 2 * p - k) / s + 1, OW = (W + 2 * p - k) / s + 1;
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(P * OH * OW));
    std::vector<int64_t> idx(y.size());
    for (int64_t q = 0; q < P; ++q)
      ref::max_pool2d_plane<double>(H, W, k, s, p, OH, OW, v[0].data() + q * H * W, y.data() + q * OH * OW,
                                    idx.data() + q * OH * OW);
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(P * OH * OW)), gx(v[0].size());
    std::vector<int64_t> idx(y.size());
    for (int64_t q = 0; q < P; ++q) {
      ref::max_pool2d_plane<double>(H, W, k, s, p, OH, OW, v[0].data() + q * H * W, y.data() + q * OH * OW,
                                    idx.data() + q * OH * OW);
      ref::max_pool2d_backward_plane<double>(H * W, OH * OW, g.data() + q * OH * OW, idx.data() + q * OH * OW,
                                             gx.data() + q * H * W);
    }
    return {gx};
  };
  return c;
}

OpCase avg_pool_case(Input x, int64_t k, int64_t s, int64_t p) {
  OpCase c;
  c.name = fmt::format("avg_pool2d_{}{}_k{}_s{}_p{}", shape_str(x.shape), layout_name(x.layout), k, s, p);
  c.inputs = {x};
  c.fwd = [=](const TVec& v) -> TVec { return {ops::avg_pool2d(v[0], k, s, p)}; };
  c.bwd = [=](const TVec& v, const TVec&, const Tensor& g) -> TVec {
    return {ops::avg_pool2d_backward(g, v[0].shape(), k, s, p)};
  };
  const int64_t P = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t OH = (H + 2 * p - k) / s + 1, OW = (W + 2 * p - k) / s + 1;
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(P * OH * OW));
    for (int64_t q = 0; q < P; ++q)
      ref::avg_pool2d_plane<double>(H, W, k, s, p, OH, OW, v[0].data() + q * H * W, y.data() + q * OH * OW);
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>&, const DVec& g) -> std::vector<DVec> {
    DVec gx(static_cast<size_t>(P * H * W));
    for (int64_t q = 0; q < P; ++q)
      ref::avg_pool2d_backward_plane<double>(H, W, k, s, p, OH, OW, g.data() + q * OH * OW, gx.data() + q * H * W);
    return {gx};
  };
  return c;
}

}  // namespace

std::vector<OpCase> conv_cases() {
  std::vector<OpCase> cs;
  // ---- conv2d
  cs.push_back(conv2d_case(in({2, 3, 7, 7}), {4, 3, 3, 3}, true, 1, 1));
  cs.push_back(conv2d_case(in({2, 2, 8, 8}).Swap(2, 3), {3, 2, 3, 3}, false, 2, 1));
  cs.push_back(conv2d_case(in({2, 4, 6, 6}), {5, 4, 1, 1}, false, 2, 0));          // ResNet downsample
  cs.push_back(conv2d_case(in({1, 2, 9, 9}).Sliced(), {2, 2, 7, 7}, true, 2, 3));  // ImageNet stem shape
  // grouped and depthwise (groups == C == O: the cpu backend's direct kernel), padding per side
  cs.push_back(conv2d_case(in({2, 4, 7, 7}), {4, 1, 3, 3}, true, ops::Conv2dParams::symmetric(1, 1, 4)));
  cs.push_back(conv2d_case(in({2, 3, 9, 8}), {3, 1, 5, 5}, true, correct_pad(5, 3)));  // k5 s2, odd/even
  cs.push_back(conv2d_case(in({1, 4, 8, 8}).Swap(2, 3), {4, 1, 3, 3}, false, correct_pad(3, 4)));
  cs.push_back(conv2d_case(in({2, 3, 6, 7}).Sliced(), {3, 1, 3, 3}, false, {1, 2, 0, 1, 3, 3}));  // t2 b0 l1 r3
  cs.push_back(conv2d_case(in({1, 2, 10, 10}), {2, 1, 5, 5}, false, ops::Conv2dParams::symmetric(1, 2, 2)));
  cs.push_back(conv2d_case(in({2, 4, 6, 6}), {6, 2, 3, 3}, true, ops::Conv2dParams::symmetric(1, 1, 2)));  // oneDNN
  cs.push_back(conv2d_case(in({2, 3, 5, 5}), {6, 1, 3, 3}, false, correct_pad(3, 3)));   // multiplier 2: oneDNN
  cs.push_back(conv2d_case(in({2, 3, 9, 9}), {4, 3, 3, 3}, false, {2, 0, 1, 0, 1, 1}));  // EfficientNet stem

  // ---- max and average pooling
  cs.push_back(max_pool_case(in({2, 3, 7, 7}), 3, 2, 1));  // ResNet stem max-pool
  cs.push_back(max_pool_case(in({2, 2, 6, 6}).Swap(2, 3), 2, 2, 0));
  cs.push_back(avg_pool_case(in({2, 3, 7, 7}), 3, 2, 1));
  cs.push_back(avg_pool_case(in({2, 2, 6, 5}).Sliced(), 2, 2, 0));

  // ---- patchify: a permutation, so forward and backward are exact
  struct PatchShape {
    int64_t N, C, H, W, p;
    Layout layout;
  };
  for (auto s : {PatchShape{2, 3, 8, 12, 4, Layout::Contig}, PatchShape{1, 2, 6, 6, 3, Layout::Swap},
                 PatchShape{2, 1, 4, 6, 2, Layout::Sliced}, PatchShape{3, 2, 5, 5, 1, Layout::Contig}}) {
    Input x = in({s.N, s.C, s.H, s.W});
    if (s.layout == Layout::Swap) x.T();
    if (s.layout == Layout::Sliced) x.Sliced();
    OpCase c;
    c.name = fmt::format("patchify_{}p{}{}", shape_str(x.shape), s.p, layout_name(x.layout));
    c.inputs = {x};
    const int64_t N = s.N, C = s.C, H = s.H, W = s.W, p = s.p;
    const Shape xs = x.shape;
    c.fwd = [=](const TVec& v) -> TVec { return {ops::patchify(v[0], p)}; };
    c.bwd = [=](const TVec&, const TVec&, const Tensor& g) -> TVec { return {ops::patchify_backward(g, xs, p)}; };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(v[0].size());
      ref::patchify<double>(N, C, H, W, p, v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>&, const DVec& g) -> std::vector<DVec> {
      DVec gx(g.size());
      ref::patchify_backward<double>(N, C, H, W, p, g.data(), gx.data());
      return {gx};
    };
    c.tol_cpu = 0;
    c.tol_f32 = 0;
    cs.push_back(c);
  }
  return cs;
}

}  // namespace brigade::optest
