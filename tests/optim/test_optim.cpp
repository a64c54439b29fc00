// Optimizers, clipping and schedules against values worked out by hand (AdamW's
// numerics against PyTorch are covered by the GPT-2 parity test in tests/models; LAMB
// and SGD against PyTorch fixtures in test_optim_fixtures.cpp; schedules against their
// closed forms in test_schedule.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "brigade/core/error.h"
#include "brigade/ops/ops.h"
#include "brigade/optim/optimizer.h"
#include "brigade/optim/schedule.h"

using namespace brigade;

static Tensor param(std::vector<float> v, Shape s, std::vector<float> g) {
  Tensor p = Tensor::from_vector(v, s);
  p.set_requires_grad(true);
  p.set_grad(Tensor::from_vector(g, s));
  return p;
}

TEST(AdamW, FirstStepMovesByLrTimesSignAndDecaysOnlyMatrices) {
  // step 1: m_hat = g, v_hat = g^2, update = lr * g / (|g| + eps) ~= lr * sign(g)
  Tensor w = param({1, 1, 1, 1}, {2, 2}, {0.5f, -2.0f, 1e-3f, 0.0f});
  Tensor b = param({1, 1}, {2}, {3.0f, -3.0f});
  optim::AdamW opt({{"w", w}, {"b", b}}, optim::AdamWOptions{0.9, 0.999, 1e-8, 0.1});
  opt.step(0.01);
  const double decay = 1 - 0.01 * 0.1;  // matrices only
  std::vector<float> wv = w.to_vector(), bv = b.to_vector();
  EXPECT_NEAR(wv[0], decay - 0.01, 1e-6);
  EXPECT_NEAR(wv[1], decay + 0.01, 1e-6);
  EXPECT_NEAR(wv[2], decay - 0.01 * 1e-3 / (1e-3 + 1e-8), 1e-6);
  EXPECT_NEAR(wv[3], decay, 1e-7);
  EXPECT_NEAR(bv[0], 1 - 0.01, 1e-6);  // no decay on vectors
  EXPECT_NEAR(bv[1], 1 + 0.01, 1e-6);
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_EQ(opt.state_tensors().size(), 4u);
  EXPECT_EQ(opt.state_tensors()[0].first, "exp_avg.w");
  EXPECT_EQ(opt.state_tensors()[0].second.tag(), MemTag::Optimizer);
}

TEST(AdamW, StateRoundTripContinuesIdentically) {
  auto make = [] { return param({1, 2, 3, 4}, {2, 2}, {0.1f, -0.2f, 0.3f, -0.4f}); };
  Tensor a = make(), b = make();
  optim::AdamW oa({{"p", a}}, {}), ob({{"p", b}}, {});
  oa.step(0.1);
  oa.step(0.1);
  ob.step(0.1);
  ob.step(0.1);
  std::map<std::string, Tensor> state;
  for (auto& [n, t] : oa.state_tensors()) state.emplace(n, t.clone());
  Tensor c = Tensor::from_vector(a.to_vector(), {2, 2});
  c.set_requires_grad(true);
  c.set_grad(a.grad().clone());
  optim::AdamW oc({{"p", c}}, {});
  oc.load_state(state, oa.steps());
  ob.step(0.1);
  oc.step(0.1);
  EXPECT_EQ(b.to_vector(), c.to_vector());
  state.erase("exp_avg.p");
  EXPECT_THROW(oc.load_state(state, 2), CheckpointError);
}

TEST(AdamW, FusedGradScaleIsBitwiseTheInPlaceScale) {
  // Clipping fused into the update: step() with set_grad_scale(s) must give exactly what
  // scaling the gradients in place (ops::mul_scalar_, a float multiply) and stepping gives,
  // leave the gradients themselves unscaled, and reset to 1 after the step.
  auto make = [] { return param({1, -2, 3, 0.5f}, {2, 2}, {0.3f, -1.7f, 2.9f, -0.01f}); };
  Tensor a = make(), b = make();
  optim::AdamW fused({{"p", a}}, optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  optim::AdamW plain({{"p", b}}, optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  ASSERT_TRUE(fused.fuses_grad_scale());
  const double s = 1.0 / 3.4;
  fused.set_grad_scale(s);
  fused.step(0.01);
  ops::mul_scalar_(b.grad(), s);
  plain.step(0.01);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{0.3f, -1.7f, 2.9f, -0.01f})) << "gradients left unscaled";
  // the factor was used once: the next step reads the gradients as they are
  b.grad().copy_(a.grad());
  fused.step(0.01);
  plain.step(0.01);
  EXPECT_EQ(a.to_vector(), b.to_vector());
}

TEST(SGD, MomentumMatchesTheRecurrence) {
  // b1 = g; p1 = p0 - lr g; b2 = mu b1 + g; p2 = p1 - lr b2
  Tensor p = param({1.0f}, {1}, {2.0f});
  optim::SGD opt({{"p", p}}, optim::SGDOptions{0.5, 0.0, false});
  opt.step(0.1);
  EXPECT_FLOAT_EQ(p.to_vector()[0], 1.0f - 0.2f);
  opt.step(0.1);
  EXPECT_FLOAT_EQ(p.to_vector()[0], 0.8f - 0.1f * (0.5f * 2.0f + 2.0f));
}

TEST(Clip, GlobalNormScalesAllGradients) {
  Tensor a = param({0, 0}, {2}, {3, 0});
  Tensor b = param({0}, {1}, {4});
  nn::NamedTensors ps{{"a", a}, {"b", b}};
  EXPECT_DOUBLE_EQ(optim::grad_norm(ps), 5.0);
  const double n = optim::clip_grad_norm(ps, 1.0);
  EXPECT_DOUBLE_EQ(n, 5.0);
  const double s = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(a.grad().to_vector()[0], 3 * s, 1e-7);
  EXPECT_NEAR(b.grad().to_vector()[0], 4 * s, 1e-7);
  EXPECT_NEAR(optim::grad_norm(ps), 1.0, 1e-6);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm(ps, 10.0), optim::grad_norm(ps));  // below the limit: untouched
}

TEST(Schedule, WarmupThenCosineToTheFloor) {
  optim::Schedule s{optim::ScheduleKind::Cosine, 1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);
  EXPECT_NEAR(s.lr_at(60), 0.1 + 0.9 * 0.5, 1e-12);  // halfway: cos(pi/2) = 0
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.lr_at(500), 0.1, 1e-12);
  optim::Schedule c{optim::ScheduleKind::Constant, 0.5, 0.0, 0, 10};
  EXPECT_DOUBLE_EQ(c.lr_at(7), 0.5);
  EXPECT_THROW(optim::schedule_from_name("linear-ish"), ConfigError);
}

TEST(Clip, ByValueClampsEachElement) {
  Tensor a = param({0, 0, 0, 0}, {2, 2}, {0.5f, -3.0f, 2.0f, -0.25f});
  nn::NamedTensors ps{{"a", a}};
  optim::clip_grad_value(ps, 1.0);
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{0.5f, -1.0f, 1.0f, -0.25f}));
  optim::clip_grad_value(ps, 0.0);  // off
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{0.5f, -1.0f, 1.0f, -0.25f}));
}

TEST(Clip, NormThenValueAsTheTrainerAppliesThem) {
  // g = (3, 4): norm 5 -> clip to 2.5 gives (1.5, 2) (up to torch's 1e-6) -> clamp at 1.8 gives (1.5, 1.8)
  Tensor a = param({0, 0}, {2}, {3, 4});
  nn::NamedTensors ps{{"a", a}};
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm(ps, 2.5), 5.0);
  optim::clip_grad_value(ps, 1.8);
  EXPECT_NEAR(a.grad().to_vector()[0], 1.5, 1e-6);
  EXPECT_FLOAT_EQ(a.grad().to_vector()[1], 1.8f);
}

TEST(SGD, NesterovAddsTheMomentumLookahead) {
  // b1 = g; d1 = g + mu b1; b2 = mu b1 + g; d2 = g + mu b2
  Tensor p = param({1.0f}, {1}, {2.0f});
  optim::SGD opt({{"p", p}}, optim::SGDOptions{0.5, 0.0, true});
  opt.step(0.1);
  EXPECT_FLOAT_EQ(p.to_vector()[0], 1.0f - 0.1f * (2.0f + 0.5f * 2.0f));
  opt.step(0.1);
  EXPECT_FLOAT_EQ(p.to_vector()[0], 0.7f - 0.1f * (2.0f + 0.5f * 3.0f));
  EXPECT_THROW(optim::SGD({{"p", p}}, optim::SGDOptions{0.0, 0.0, true}), ValueError);
}

TEST(LAMB, FirstStepOfAOneElementParameterMovesByLr) {
  // t = 1: r = g/(|g| + eps) = sign(g) (no decay on vectors); ||w|| = |w|, ||r|| = 1 -> ratio |w|,
  // so w -= lr |w| sign(g): w = 2, g = 5, lr = 0.1 gives 2 - 0.2 (up to eps)
  Tensor w = param({2.0f}, {1}, {5.0f});
  optim::LAMB opt({{"w", w}}, optim::LAMBOptions{0.9, 0.999, 1e-6, 0.5});
  opt.step(0.1);
  EXPECT_NEAR(w.to_vector()[0], 1.8, 1e-6);
  EXPECT_NEAR(opt.trust_ratios()[0], 2.0 * (5.0 + 1e-6) / 5.0, 1e-6);
  EXPECT_EQ(opt.state_tensors()[0].first, "exp_avg.w");
  EXPECT_EQ(opt.state_tensors()[1].first, "exp_avg_sq.w");
  EXPECT_EQ(opt.state_tensors()[0].second.tag(), MemTag::Optimizer);
}
