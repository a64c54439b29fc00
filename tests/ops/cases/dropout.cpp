// The dropout family (src/brigade/ops/dropout.h): random, so outside the op table: p = 0 is the
// identity, the mask's statistics, the same mask on both backends and for the same seed, the
// backward; the 16-bit big case above the OpenMP threshold.
#include "ops/harness.h"

#include <gtest/gtest.h>

#include <vector>

#include "brigade/core/error.h"

namespace brigade::optest {

std::vector<Big16Case> dropout_big16_cases() {
  std::vector<Big16Case> cs;
  const int64_t R = kBigR, C = kBigC;
  cs.push_back({"dropout", [=](DType dt) {
                  const BigInputs x = big_inputs(dt);
                  Generator g(42);
                  const ops::DropoutOut o = ops::dropout(x.at, 0.3, g);
                  return TVec{o.y, o.mask, ops::dropout_backward(x.b, o.mask),
                              ops::dropout_backward(randn({R, C}, 110), o.mask)};
                }});
  return cs;
}

namespace {

TEST(Ops, DropoutZeroIsIdentity) {
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    Generator gen(7);
    Tensor x = randn({5, 6}, 11).transpose(0, 1);
    ops::DropoutOut o = ops::dropout(x, 0.0, gen);
    EXPECT_TRUE(bitwise_equal(o.y, x));
    EXPECT_EQ(o.mask.to_vector(), std::vector<float>(30, 1.0f));
  }
}

TEST(Ops, DropoutStatisticsAndBackward) {
  const double p = 0.3;
  Tensor x = randn({200, 100}, 12);
  Generator g1(42), g2(42);
  ops::DropoutOut ref_o, cpu_o;
  {
    ops::BackendScope s(ops::Backend::Ref);
    ref_o = ops::dropout(x, p, g1);
  }
  {
    ops::BackendScope s(ops::Backend::Cpu);
    cpu_o = ops::dropout(x, p, g2);
  }
  // Same generator state -> same mask on both backends; mask values are 0 or 1/(1-p).
  EXPECT_TRUE(bitwise_equal(ref_o.mask, cpu_o.mask));
  EXPECT_TRUE(bitwise_equal(ref_o.y, cpu_o.y));
  const std::vector<float> m = cpu_o.mask.to_vector(), xv = x.to_vector(), yv = cpu_o.y.to_vector();
  const float inv = float(1.0 / (1.0 - p));
  int64_t kept = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    ASSERT_TRUE(m[i] == 0.0f || m[i] == inv) << m[i];
    kept += m[i] != 0.0f;
    ASSERT_EQ(yv[i], xv[i] * m[i]);
  }
  // Keep fraction: 20000 Bernoulli(0.7) draws, sd = sqrt(0.21 / 20000) = 0.0032; allow 5 sd.
  EXPECT_NEAR(double(kept) / double(m.size()), 1.0 - p, 0.016);
  // E[y] = x: the mean of mask is ~1.
  EXPECT_NEAR(ops::mean(cpu_o.mask, {}).item(), 1.0, 0.025);
  // Backward uses the same mask: gx = gy * mask, on both backends.
  Tensor gy = randn({200, 100}, 13);
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    EXPECT_TRUE(bitwise_equal(ops::dropout_backward(gy, cpu_o.mask), ops::mul(gy, cpu_o.mask)));
  }
  // A different seed gives a different mask; the same seed the same one.
  Generator g3(43), g4(42);
  EXPECT_FALSE(bitwise_equal(ops::dropout(x, p, g3).mask, cpu_o.mask));
  EXPECT_TRUE(bitwise_equal(ops::dropout(x, p, g4).mask, cpu_o.mask));
  Generator g5(1);
  EXPECT_THROW(ops::dropout(x, 1.5, g5), ValueError);
}

}  // namespace

}  // namespace brigade::optest
