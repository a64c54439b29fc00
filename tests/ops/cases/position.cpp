// Op-harness cases of the position family (src/brigade/ops/position.h): rope (two thetas, a
// nonzero first position, a (B, T, NH, HS)-stored view, the linear and llama3 frequency scalings)
// and roll2d, Swin's cyclic shift (torch.roll over dims 1, 2 of (B, H, W, C)), on contiguous and
// strided inputs with negative and wrapping shifts; roll2d's backward is roll2d by the opposite
// shifts. The relative position index is tested in tests/ops/test_window_ops.cpp.
#include "ops/harness.h"

#include <string>

namespace brigade::optest {

namespace {

OpCase rope_case(Input x, const ops::RopeSpec& spec, int64_t pos0) {
  const int64_t B = x.shape[0], NH = x.shape[1], T = x.shape[2], HS = x.shape[3];
  OpCase c;
  c.name = fmt::format(
      "rope_{}{}_theta{}_pos{}{}", shape_str(x.shape), layout_name(x.layout), int64_t(spec.theta), pos0,
      spec.scaling == ops::RopeScaling::None ? "" : std::string("_") + ops::rope_scaling_name(spec.scaling));
  c.inputs = {x.Range(-2, 2)};
  c.fwd = [=](const TVec& v) -> TVec { return {ops::rope(v[0], spec, pos0)}; };
  c.bwd = [=](const TVec&, const TVec&, const Tensor& g) -> TVec { return {ops::rope_backward(g, spec, pos0)}; };
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(v[0].size());
    ref::rope<double>(B * NH, T, HS, spec, pos0, 1.0, v[0].data(), y.data());
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>&, const DVec& g) -> std::vector<DVec> {
    DVec gx(g.size());
    ref::rope<double>(B * NH, T, HS, spec, pos0, -1.0, g.data(), gx.data());
    return {gx};
  };
  c.tol_f32 = 1e-6;  // the f32 kernel's cos/sin are the double ones rounded once
  return c;
}
OpCase rope_case(Input x, double theta, int64_t pos0) { return rope_case(x, ops::RopeSpec{.theta = theta}, pos0); }

OpCase roll2d_case(Input x, int64_t sh, int64_t sw) {
  OpCase c;
  c.name = fmt::format("roll2d_{}{}_{}_{}", shape_str(x.shape), layout_name(x.layout), sh, sw);
  c.inputs = {x};
  const int64_t B = x.shape[0], H = x.shape[1], W = x.shape[2], C = x.shape[3];
  c.fwd = [=](const TVec& v) -> TVec { return {ops::roll2d(v[0], sh, sw)}; };
  c.bwd = [=](const TVec&, const TVec&, const Tensor& g) -> TVec { return {ops::roll2d(g, -sh, -sw)}; };
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(v[0].size());
    ops::ref::roll2d<double>(B, H, W, C, sh, sw, v[0].data(), y.data());
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    DVec gx(v[0].size());
    ops::ref::roll2d<double>(B, H, W, C, -sh, -sw, g.data(), gx.data());
    return {gx};
  };
  return c;
}

}  // namespace

std::vector<OpCase> position_cases() {
  std::vector<OpCase> cs;
  // ---- rope
  cs.push_back(rope_case(in({2, 3, 7, 8}), 10000.0, 0));
  cs.push_back(rope_case(in({1, 2, 5, 6}).Swap(1, 2), 10000.0, 0));  // (B, T, NH, HS) storage
  cs.push_back(rope_case(in({2, 1, 4, 10}).Sliced(), 500.0, 9));
  // Scaled frequencies. Linear: every inv_freq / 4. Llama3 with HS = 16, theta = 10000 and
  // original_max_positions = 128, low 1, high 4: the wavelengths 2 pi / inv_freq of pairs 0-1
  // are below 128 / 4 (kept), pair 2's (62.8) lies between 32 and 128 (smoothed), pairs 3-7's
  // exceed 128 (divided by the factor): every branch of the rule runs.
  cs.push_back(rope_case(in({2, 3, 7, 8}), {.theta = 10000.0, .scaling = ops::RopeScaling::Linear, .factor = 4.0}, 0));
  cs.push_back(rope_case(in({1, 2, 5, 16}).Swap(1, 2),
                         {.theta = 10000.0, .scaling = ops::RopeScaling::Linear, .factor = 2.5}, 11));
  const ops::RopeSpec l3{.theta = 10000.0,
                         .scaling = ops::RopeScaling::Llama3,
                         .factor = 8.0,
                         .low_freq_factor = 1.0,
                         .high_freq_factor = 4.0,
                         .original_max_positions = 128};
  cs.push_back(rope_case(in({2, 2, 6, 16}), l3, 0));
  cs.push_back(rope_case(in({1, 3, 5, 16}).Sliced(), l3, 40));

  // ---- roll2d
  cs.push_back(roll2d_case(in({2, 4, 4, 3}), -2, -2));           // Swin's shift by ws/2 (ws = 4)
  cs.push_back(roll2d_case(in({1, 6, 5, 2}), 3, -7));            // uneven grid, a shift wider than W
  cs.push_back(roll2d_case(in({2, 4, 6, 3}).Swap(1, 2), 1, 2));  // a transposed (strided) view
  cs.push_back(roll2d_case(in({2, 4, 4, 5}).Sliced(), 0, 0));    // the identity on a sliced view
  return cs;
}

}  // namespace brigade::optest
