// Op-harness cases of the reduce family (src/brigade/ops/reduce.h): sum and mean over dims,
// softmax and its backward, the spatial mean of NCHW planes; the big cases (partial and long sums,
// softmax) above the OpenMP thresholds; sum_squares, which returns a double, at 1, 2 and 3 threads.
#include "ops/harness.h"

#include <gtest/gtest.h>

#include <vector>

namespace brigade::optest {

std::vector<OpCase> reduce_cases() {
  std::vector<OpCase> cs;
  // ---- sum / mean / sum_all
  cs.push_back(reduce_case("sum_dim0", in({4, 5}), {0}, false, false));
  cs.push_back(reduce_case("sum_dim_last_keep", in({3, 4, 5}).T(), {-1}, true, false));
  cs.push_back(reduce_case("sum_dims_0_2", in({3, 4, 5}).Sliced(), {0, 2}, false, false));
  cs.push_back(reduce_case("sum_all", in({3, 7}).Swap(0, 1), {}, false, false));
  cs.push_back(reduce_case("mean_dim1", in({3, 4, 5}), {1}, false, true));
  cs.push_back(reduce_case("mean_all_keep", in({6, 5}).Expand(0), {0, 1}, true, true));

  // ---- softmax
  for (auto x : {in({3, 17}).Range(-3, 3), in({2, 9, 4}).T().Range(-3, 3), in({4, 8}).Sliced().Range(-20, 20)}) {
    const int64_t C = x.shape.back(), N = shape_numel(x.shape) / C;
    OpCase c;
    c.name = fmt::format("softmax_{}{}", shape_str(x.shape), layout_name(x.layout));
    c.inputs = {x};
    c.fwd = [](const TVec& v) -> TVec { return {ops::softmax(v[0])}; };
    c.bwd = [](const TVec&, const TVec& y, const Tensor& g) -> TVec { return {ops::softmax_backward(g, y[0])}; };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(N * C));
      ref::softmax<double>(N, C, v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(N * C)), gx(static_cast<size_t>(N * C));
      ref::softmax<double>(N, C, v[0].data(), y.data());
      ref::softmax_backward<double>(N, C, g.data(), y.data(), gx.data());
      return {gx};
    };
    c.tol_cpu = 1e-5;
    cs.push_back(c);
  }

  // ---- the spatial mean of NCHW planes
  for (auto [x, keepdim] : {std::pair{in({2, 3, 5, 7}), false}, std::pair{in({3, 2, 4, 4}).Swap(1, 2), true},
                            std::pair{in({2, 2, 3, 6}).Sliced(), false}}) {
    const int64_t P = x.shape[0] * x.shape[1], HW = x.shape[2] * x.shape[3];
    const Shape xs = x.shape;
    OpCase c;
    c.name = fmt::format("spatial_mean_{}{}{}", shape_str(x.shape), layout_name(x.layout), keepdim ? "_keep" : "");
    c.inputs = {x};
    c.fwd = [=](const TVec& v) -> TVec { return {ops::spatial_mean(v[0], keepdim)}; };
    c.bwd = [=](const TVec&, const TVec&, const Tensor& g) -> TVec { return {ops::spatial_mean_backward(g, xs)}; };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(P));
      ref::spatial_mean<double>(P, HW, v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>&, const DVec& g) -> std::vector<DVec> {
      DVec gx(static_cast<size_t>(P * HW));
      ref::spatial_mean_backward<double>(P, HW, g.data(), gx.data());
      return {gx};
    };
    cs.push_back(c);
  }
  return cs;
}

std::vector<BigCase> reduce_big_cases() {
  std::vector<BigCase> cs;
  const int64_t R = kBigR, C = kBigC;
  const BigInputs big = big_inputs();
  const Tensor a = big.a, at = big.at, as = big.as, a3 = big.a3;
  // Reductions with short sums (<= 520 terms): column_sum (64-column chunks) and row sums.
  cs.push_back({"partial_sums", [=] {
                  return TVec{ops::sum(a, {0}),       ops::sum(a, {1}, true), ops::sum_to(a, {C}),
                              ops::sum_to(a, {R, 1}), ops::mean(a, {0}),      ops::sum(a3, {0}),
                              ops::sum(a3, {0, 1}),   ops::sum(at, {0}),      ops::sum_to(as, {1, C})};
                }});
  {  // Long sums (33410 terms and more): contiguous_sum's 4096-blocks and row sums of whole
     // slices (also summed in 4096-blocks). The ref kernel sums in f32 in one sequential chain (measured 1.5e-5 off on
     // these sizes), so the oracle here is the sum in double. Positive values: no cancellation, so the f32 result must
     // be within a few ulp per block of the exact sum.
    const Tensor p = randn({R, C}, 128, 0, 1), p3 = randn({4, R, C}, 129, 0, 1);
    auto exact = [](const Tensor& t, int64_t parts) {  // sums of `parts` equal contiguous slices
      const std::vector<float> v = t.to_vector();
      DVec s(static_cast<size_t>(parts), 0.0);
      const size_t len = v.size() / size_t(parts);
      for (size_t i = 0; i < v.size(); ++i) s[i / len] += double(v[i]);
      return s;
    };
    DVec mean3 = exact(p3, 1);
    mean3[0] /= double(p3.numel());
    cs.push_back({"long_sums",
                  [=] {
                    return TVec{ops::sum_all(p), ops::sum_all(p3), ops::mean(p3, {}), ops::sum(p3, {1, 2}),
                                ops::sum_to(p3, {4, 1, 1})};
                  },
                  2e-6,
                  {},
                  [=] {
                    return std::vector<DVec>{exact(p, 1), exact(p3, 1), mean3, exact(p3, 4), exact(p3, 4)};
                  }});
  }
  {  // softmax: N * C = 150 * 130 > 1 << 14
    const Tensor x = randn({150, 130}, 115, -5, 5), gy = randn({150, 130}, 116);
    cs.push_back({"softmax",
                  [=] {
                    Tensor y = ops::softmax(x);
                    return TVec{y, ops::softmax_backward(gy, y)};
                  },
                  1e-5});
  }
  return cs;
}

std::vector<Big16Case> reduce_big16_cases() {
  std::vector<Big16Case> cs;
  const int64_t R = kBigR, C = kBigC;
  cs.push_back({"sums", [=](DType dt) {
                  const BigInputs x = big_inputs(dt);
                  return TVec{ops::sum(x.a, {0}),        ops::sum(x.a, {1}, true),     ops::sum_to(x.a, {C}),
                              ops::sum_to(x.a, {R, 1}),  ops::mean(x.a, {0}),          ops::sum(x.a3, {0}),
                              ops::sum(x.a3, {0, 1}),    ops::sum(x.at, {0}),          ops::sum_to(x.as, {1, C}),
                              ops::sum_all(x.a),         ops::sum_all(x.a3),           ops::mean(x.a3, {}),
                              ops::sum(x.a3, {1, 2}),    ops::sum_to(x.a3, {4, 1, 1}), ops::sum(x.a3, {0, 2}),
                              ops::sum_to(x.at, {R, C}), ops::mean(x.as, {1}, true)};
                }});
  cs.push_back({"softmax", [=](DType dt) {
                  const Tensor x = randn({150, 130}, 118, -5, 5).to(dt), gy = randn({150, 130}, 119).to(dt);
                  const Tensor xs = randn({150, 261}, 120, -5, 5).to(dt).slice(1, 1, 261, 2);  // (150, 130) stride 2
                  const Tensor y = ops::softmax(x);
                  return TVec{y, ops::softmax_backward(gy, y), ops::softmax(xs)};
                }});
  return cs;
}

namespace {

TEST(Ops, SumSquares) {
  Tensor x = Tensor::from_vector({1, -2, 3, 0.5, 4, -1}, {2, 3}).transpose(0, 1);
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    EXPECT_DOUBLE_EQ(ops::sum_squares(x), 1 + 4 + 9 + 0.25 + 16 + 1);
  }
}

TEST(Ops, SumSquaresParallelBranchIsThreadIndependent) {
  // elementwise.cpp sum_squares: n = 33410 > 1 << 15, blocks of 4096 summed in double.
  const Tensor x = randn({130, 257}, 126);
  double want;
  {
    ops::BackendScope s(ops::Backend::Ref);
    want = ops::sum_squares(x);
  }
  std::vector<double> got;
  for (int threads : {1, 2, 3}) {
    OmpThreads t(threads);
    ops::BackendScope s(ops::Backend::Cpu);
    got.push_back(ops::sum_squares(x));
    EXPECT_NEAR(got.back(), want, 1e-12 * want) << threads << " threads";
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0], got[2]);
}

}  // namespace

}  // namespace brigade::optest
