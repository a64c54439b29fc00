// Learning-rate schedules against their closed forms, written here independently of
// schedule.cpp (as functions of the step with the warmup written out), at sampled steps
// across warmup, the body and past the end; plus values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/optim/schedule.h"

using namespace brigade;
using optim::DecayShape;
using optim::Schedule;
using optim::ScheduleKind;

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kLr = 3e-3, kMin = 2e-4;
constexpr int64_t kWarm = 20, kTotal = 220;

// steps 0..kTotal+30 every 7, plus the edges
std::vector<int64_t> sampled() {
  std::vector<int64_t> s;
  for (int64_t i = 0; i <= kTotal + 30; i += 7) s.push_back(i);
  for (int64_t e : {int64_t(0), kWarm - 1, kWarm, kWarm + 1, kTotal - 1, kTotal, kTotal + 1, int64_t(10000)})
    s.push_back(e);
  return s;
}

double warm(int64_t t) { return kLr * double(t + 1) / double(kWarm); }  // t < kWarm
double frac(int64_t t) {  // fraction of the post-warmup span done, capped at 1
  const double f = double(t - kWarm) / double(kTotal - kWarm);
  return f < 0 ? 0 : (f > 1 ? 1 : f);
}

void expect_schedule(const Schedule& s, double (*formula)(int64_t), const char* what) {
  for (int64_t t : sampled()) {
    const double want = t < kWarm ? warm(t) : formula(t);
    EXPECT_NEAR(s.lr_at(t), want, 1e-15 + 1e-12 * want) << what << " at step " << t;
  }
}

Schedule make(ScheduleKind k) {
  Schedule s;
  s.kind = k;
  s.base_lr = kLr;
  s.min_lr = kMin;
  s.warmup_steps = kWarm;
  s.total_steps = kTotal;
  return s;
}

}  // namespace

TEST(Schedules, ConstantIsWarmupThenFlat) {
  expect_schedule(
      make(ScheduleKind::Constant), [](int64_t) { return kLr; }, "constant");
}

TEST(Schedules, CosineFollowsHalfCosineToTheFloor) {
  expect_schedule(
      make(ScheduleKind::Cosine), [](int64_t t) { return kMin + (kLr - kMin) * (std::cos(kPi * frac(t)) + 1) / 2; },
      "cosine");
  const Schedule s = make(ScheduleKind::Cosine);
  EXPECT_NEAR(s.lr_at(kWarm + (kTotal - kWarm) / 2), (kLr + kMin) / 2, 1e-15);  // halfway: the mean
  EXPECT_DOUBLE_EQ(s.lr_at(kTotal + 5), kMin);
}

TEST(Schedules, LinearDecaysInAStraightLine) {
  expect_schedule(
      make(ScheduleKind::Linear), [](int64_t t) { return kLr - (kLr - kMin) * frac(t); }, "linear");
  const Schedule s = make(ScheduleKind::Linear);
  EXPECT_NEAR(s.lr_at(kWarm + 50), kLr - (kLr - kMin) * 0.25, 1e-15);  // 50 of 200 steps
}

TEST(Schedules, StepDecayMultipliesByGammaEveryPeriodDownToTheFloor) {
  Schedule s = make(ScheduleKind::Step);
  s.step_every = 30;
  s.step_gamma = 0.5;
  expect_schedule(
      s,
      [](int64_t t) {
        const double v = kLr * std::pow(0.5, std::floor(double(t - kWarm) / 30.0));
        return v < kMin ? kMin : v;
      },
      "step");
  EXPECT_DOUBLE_EQ(s.lr_at(kWarm + 29), kLr);
  EXPECT_DOUBLE_EQ(s.lr_at(kWarm + 30), kLr / 2);
  EXPECT_DOUBLE_EQ(s.lr_at(kWarm + 95), kLr / 8);
  EXPECT_DOUBLE_EQ(s.lr_at(kWarm + 150), kMin);  // 3e-3/32 < 2e-4: floored
  s.step_every = 0;
  EXPECT_THROW(s.lr_at(kWarm), ValueError);
}

TEST(Schedules, WarmupStableDecayHoldsThenDecaysOverTheLastSteps) {
  constexpr int64_t kDecay = 60;  // decay over steps [160, 220)
  static const auto q = [](int64_t t) {
    const double f = double(t - (kTotal - kDecay)) / double(kDecay);
    return f < 0 ? 0 : (f > 1 ? 1 : f);
  };
  Schedule s = make(ScheduleKind::WSD);
  s.decay_steps = kDecay;
  s.decay_shape = DecayShape::Linear;
  expect_schedule(
      s, [](int64_t t) { return kMin + (kLr - kMin) * (1 - q(t)); }, "wsd linear");
  s.decay_shape = DecayShape::Cosine;
  expect_schedule(
      s, [](int64_t t) { return kMin + (kLr - kMin) * (1 + std::cos(kPi * q(t))) / 2; }, "wsd cosine");
  s.decay_shape = DecayShape::Sqrt;
  expect_schedule(
      s, [](int64_t t) { return kMin + (kLr - kMin) * (1 - std::sqrt(q(t))); }, "wsd sqrt");
  EXPECT_DOUBLE_EQ(s.lr_at(kTotal - kDecay - 1), kLr);                           // still stable
  EXPECT_DOUBLE_EQ(s.lr_at(kTotal - kDecay), kLr);                               // q = 0
  EXPECT_NEAR(s.lr_at(kTotal - kDecay + 15), kMin + (kLr - kMin) * 0.5, 1e-15);  // sqrt(1/4) = 1/2
  EXPECT_DOUBLE_EQ(s.lr_at(kTotal), kMin);
  s.decay_steps = 0;
  EXPECT_THROW(s.lr_at(kWarm), ValueError);
}

TEST(Schedules, NoWarmupStartsAtThePeak) {
  Schedule s = make(ScheduleKind::Linear);
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(s.lr_at(0), kLr);
  EXPECT_NEAR(s.lr_at(110), kLr - (kLr - kMin) * 0.5, 1e-15);
}

TEST(Schedules, NamesAndUnknownNames) {
  EXPECT_EQ(optim::schedule_from_name("constant"), ScheduleKind::Constant);
  EXPECT_EQ(optim::schedule_from_name("cosine"), ScheduleKind::Cosine);
  EXPECT_EQ(optim::schedule_from_name("linear"), ScheduleKind::Linear);
  EXPECT_EQ(optim::schedule_from_name("step"), ScheduleKind::Step);
  EXPECT_EQ(optim::schedule_from_name("wsd"), ScheduleKind::WSD);
  EXPECT_THROW(optim::schedule_from_name("exponential"), ConfigError);
  EXPECT_EQ(optim::decay_shape_from_name("sqrt"), DecayShape::Sqrt);
  EXPECT_THROW(optim::decay_shape_from_name("exp"), ConfigError);
}
