// Tests of the interconnect calibration that need no MPI: the constrained alpha-beta fit against
// algebra (points on a known line, a negative intercept or slope clamped), the JSON form (exact
// round trip, every missing field named), lookups of absent keys, and measure_comm's one-rank
// and bad-option cases.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/plan/comm_bench.h"
#include "plan/fit_check.h"

namespace {

using brigade::ConfigError;
using brigade::plan::comm_from_json;
using brigade::plan::comm_to_json;
using brigade::plan::CommBenchOptions;
using brigade::plan::CommCalibration;
using brigade::plan::CommFit;
using brigade::plan::fit_alpha_beta;
using brigade::plan::testing::expect_constrained_least_squares;
using Points = std::vector<std::pair<int64_t, double>>;

const std::vector<int64_t> kSizes = {4096, 65536, 1 << 20, 4 << 20, 16 << 20};

Points on_line(double a, double b, const std::vector<int64_t>& xs = kSizes) {
  Points p;
  for (const int64_t x : xs) p.emplace_back(x, a + b * double(x));
  return p;
}

// The message of the ConfigError `f` throws ("" and a failure when it throws none).
template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return "";
}

TEST(FitAlphaBeta, RecoversAKnownLine) {
  // 25 us latency, 8 GB/s.
  const double a = 25e-6, b = 1.0 / 8e9;
  const CommFit f = fit_alpha_beta(on_line(a, b));
  EXPECT_NEAR(f.alpha_s, a, 1e-12 * a + 1e-18);
  EXPECT_NEAR(f.beta_s_per_byte, b, 1e-12 * b);
  EXPECT_EQ(f.points, on_line(a, b));
  EXPECT_NEAR(f.seconds(1 << 30), a + b * double(1 << 30), 1e-12);
  expect_constrained_least_squares(f.points, f.alpha_s, f.beta_s_per_byte, "known line");
}

TEST(FitAlphaBeta, NoisyPointsGiveTheNormalEquationsSolution) {
  // y = 1e-5 + 1e-10 x with alternating +-1e-6 noise: the unconstrained fit, from Cramer's rule on
  // the raw normal equations [n sx; sx sxx] [a b]' = [sy sxy]'.
  Points p = on_line(1e-5, 1e-10);
  for (size_t i = 0; i < p.size(); ++i) p[i].second += (i % 2 ? -1e-6 : 1e-6);
  double n = 0, sx = 0, sxx = 0, sy = 0, sxy = 0;
  for (const auto& [xi, y] : p) {
    const double x = double(xi);
    n += 1, sx += x, sxx += x * x, sy += y, sxy += x * y;
  }
  const double det = n * sxx - sx * sx;
  const double a = (sy * sxx - sx * sxy) / det, b = (n * sxy - sx * sy) / det;
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  const CommFit f = fit_alpha_beta(p);
  EXPECT_NEAR(f.alpha_s, a, 1e-6 * a);
  EXPECT_NEAR(f.beta_s_per_byte, b, 1e-9 * b);
  expect_constrained_least_squares(p, f.alpha_s, f.beta_s_per_byte, "noisy line");
}

TEST(FitAlphaBeta, ClampsANegativeInterceptAndRefitsThroughTheOrigin) {
  const Points p = on_line(-1e-5, 1e-10);
  // alpha = 0: the least-squares slope through the origin is sum(x y) / sum(x x).
  double sxy = 0, sxx = 0;
  for (const auto& [x, y] : p) sxy += double(x) * y, sxx += double(x) * double(x);
  const CommFit f = fit_alpha_beta(p);
  EXPECT_EQ(f.alpha_s, 0.0);
  EXPECT_NEAR(f.beta_s_per_byte, sxy / sxx, 1e-12 * (sxy / sxx));
  expect_constrained_least_squares(p, f.alpha_s, f.beta_s_per_byte, "negative intercept");
}

TEST(FitAlphaBeta, ClampsANegativeSlopeToTheMean) {
  const Points p = on_line(1e-3, -1e-11);
  double mean = 0;
  for (const auto& [x, y] : p) mean += y / double(p.size());
  const CommFit f = fit_alpha_beta(p);
  EXPECT_EQ(f.beta_s_per_byte, 0.0);
  EXPECT_NEAR(f.alpha_s, mean, 1e-12 * mean);
  expect_constrained_least_squares(p, f.alpha_s, f.beta_s_per_byte, "negative slope");
}

TEST(FitAlphaBeta, OneSizeGivesTheMeanAsAlpha) {
  const CommFit one = fit_alpha_beta({{4096, 3e-6}});
  EXPECT_EQ(one.alpha_s, 3e-6);
  EXPECT_EQ(one.beta_s_per_byte, 0.0);
  const CommFit same = fit_alpha_beta({{4096, 2e-6}, {4096, 4e-6}});
  EXPECT_NEAR(same.alpha_s, 3e-6, 1e-18);
  EXPECT_EQ(same.beta_s_per_byte, 0.0);
}

TEST(FitAlphaBeta, RejectsNoPointsAndBadPoints) {
  EXPECT_NE(config_error_of([] { fit_alpha_beta({}); }).find("no points"), std::string::npos);
  EXPECT_NE(config_error_of([] { fit_alpha_beta({{4096, std::nan("")}}); }).find("4096 bytes"), std::string::npos);
  EXPECT_NE(config_error_of([] { fit_alpha_beta({{-1, 1e-6}}); }).find("-1 bytes"), std::string::npos);
}

CommCalibration sample() {
  CommCalibration c;
  c.ranks = 2;
  c.launcher = "mpirun -np 2 (OMPI_MCA_btl=self,vader)";
  c.reps = 5, c.warmup = 1;
  // Values with long binary expansions, so that a lossy decimal form would show.
  c.fits["allreduce/ring"] = fit_alpha_beta({{4096, 1.0 / 3.0 * 1e-5}, {1 << 20, std::acos(-1.0) * 1e-4}});
  c.fits["sendrecv"] = fit_alpha_beta({{4096, 7.123456789012345e-7}, {65536, 2.0 / 7.0 * 1e-5}});
  c.fits["allgather"] = CommFit{0.1 + 0.2, 1e-300, {}};
  return c;
}

TEST(CommJson, RoundTripIsExact) {
  const CommCalibration c = sample();
  const nlohmann::json j = comm_to_json(c);
  const CommCalibration back = comm_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.ranks, c.ranks);
  EXPECT_EQ(back.launcher, c.launcher);
  EXPECT_EQ(back.reps, c.reps);
  EXPECT_EQ(back.warmup, c.warmup);
  ASSERT_EQ(back.fits.size(), c.fits.size());
  for (const auto& [key, f] : c.fits) {
    const CommFit& g = back.fit(key);
    EXPECT_EQ(g.alpha_s, f.alpha_s) << key;  // bit for bit
    EXPECT_EQ(g.beta_s_per_byte, f.beta_s_per_byte) << key;
    EXPECT_EQ(g.points, f.points) << key;
  }
  EXPECT_EQ(comm_to_json(back).dump(), j.dump());
}

// The fits timed beside a compute load travel with the idle ones; a file without them (older,
// or measured without a load) reads back with none.
TEST(CommJson, BusyFitsRoundTripAndAreOptional) {
  CommCalibration c = sample();
  c.busy_threads = 1;
  c.busy_fits["allgather"] = fit_alpha_beta({{4096, 2.0 / 3.0 * 1e-5}, {1 << 20, std::sqrt(2.0) * 1e-3}});
  const nlohmann::json j = comm_to_json(c);
  const CommCalibration back = comm_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.busy_threads, 1);
  ASSERT_EQ(back.busy_fits.size(), 1u);
  EXPECT_EQ(back.busy_fits.at("allgather").points, c.busy_fits.at("allgather").points);
  EXPECT_EQ(back.busy_fits.at("allgather").beta_s_per_byte, c.busy_fits.at("allgather").beta_s_per_byte);
  EXPECT_EQ(comm_to_json(back).dump(), j.dump());
  const CommCalibration idle = comm_from_json(comm_to_json(sample()));
  EXPECT_EQ(idle.busy_threads, 0);
  EXPECT_TRUE(idle.busy_fits.empty());
  nlohmann::json half = j;
  half.erase("busy_fits");
  EXPECT_NE(config_error_of([&] { comm_from_json(half); }).find("'busy_fits'"), std::string::npos);
  half = j;
  half["busy_fits"]["allgather"]["alpha_s"] = -1.0;
  EXPECT_NE(config_error_of([&] { comm_from_json(half); }).find("'busy_fits.allgather.alpha_s'"), std::string::npos);
}

TEST(CommJson, NamesAMissingField) {
  const nlohmann::json good = comm_to_json(sample());
  // (JSON pointer to remove, the field as the message names it)
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/ranks", "ranks"},
      {"/launcher", "launcher"},
      {"/reps", "reps"},
      {"/warmup", "warmup"},
      {"/fits", "fits"},
      {"/fits/allgather/alpha_s", "fits.allgather.alpha_s"},
      {"/fits/sendrecv/beta_s_per_byte", "fits.sendrecv.beta_s_per_byte"},
      {"/fits/allreduce~1ring/points", "fits.allreduce/ring.points"}};
  for (const auto& [path, dotted] : cases) {
    nlohmann::json j = good;
    const nlohmann::json::json_pointer ptr(path);
    j[ptr.parent_pointer()].erase(ptr.back());
    const std::string msg = config_error_of([&] { comm_from_json(j); });
    EXPECT_NE(msg.find("'" + dotted + "'"), std::string::npos) << path << " -> " << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  }
}

TEST(CommJson, NamesAFieldOfTheWrongKind) {
  const nlohmann::json good = comm_to_json(sample());
  auto msg_with = [&](const std::string& path, const nlohmann::json& v) {
    nlohmann::json j = good;
    j[nlohmann::json::json_pointer(path)] = v;
    return config_error_of([&] { comm_from_json(j); });
  };
  EXPECT_NE(msg_with("/ranks", 0).find("'ranks'"), std::string::npos);
  EXPECT_NE(msg_with("/ranks", 2.5).find("'ranks'"), std::string::npos);
  EXPECT_NE(msg_with("/launcher", 3).find("'launcher'"), std::string::npos);
  EXPECT_NE(msg_with("/fits/allgather/alpha_s", -1e-6).find("'fits.allgather.alpha_s'"), std::string::npos);
  EXPECT_NE(msg_with("/fits/allgather/beta_s_per_byte", "fast").find("'fits.allgather.beta_s_per_byte'"),
            std::string::npos);
  EXPECT_NE(msg_with("/fits/sendrecv/points/1", nlohmann::json::array({65536})).find("'fits.sendrecv.points[1]'"),
            std::string::npos);
  EXPECT_NE(msg_with("/fits/sendrecv/points/0/0", -4).find("'fits.sendrecv.points[0][0]'"), std::string::npos);
  EXPECT_NE(config_error_of([] { comm_from_json(nlohmann::json::array()); }).find("JSON object"), std::string::npos);
}

TEST(CommCalibration, FitOfAnAbsentKeyNamesItAndTheKeysPresent) {
  const std::string msg = config_error_of([] { sample().fit("allreduce/tree"); });
  EXPECT_NE(msg.find("'allreduce/tree'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allgather, allreduce/ring, sendrecv"), std::string::npos) << msg;
  CommCalibration one;
  const std::string none = config_error_of([&] { one.fit("sendrecv"); });
  EXPECT_NE(none.find("'sendrecv'"), std::string::npos) << none;
  EXPECT_NE(none.find("at least 2 ranks"), std::string::npos) << none;
}

// Without a launcher the world is one rank: nothing to measure.
TEST(MeasureComm, OneRankMeasuresNothing) {
  auto world = brigade::dist::ProcessGroup::world();
  ASSERT_EQ(world->size(), 1);
  const CommCalibration c = brigade::plan::measure_comm(*world);
  EXPECT_EQ(c.ranks, 1);
  EXPECT_TRUE(c.fits.empty());
  EXPECT_EQ(c.reps, CommBenchOptions{}.reps);
}

TEST(MeasureComm, RejectsBadOptions) {
  auto world = brigade::dist::ProcessGroup::world();
  auto msg_for = [&](CommBenchOptions o) { return config_error_of([&] { brigade::plan::measure_comm(*world, o); }); };
  CommBenchOptions o;
  o.bytes = {};
  EXPECT_NE(msg_for(o).find("empty"), std::string::npos);
  o.bytes = {4096, 4098};
  EXPECT_NE(msg_for(o).find("4098"), std::string::npos);
  o.bytes = {0};
  EXPECT_NE(msg_for(o).find("size 0"), std::string::npos);
  o = {};
  o.reps = 0;
  EXPECT_NE(msg_for(o).find("reps = 0"), std::string::npos);
  o = {};
  o.warmup = -1;
  EXPECT_NE(msg_for(o).find("warmup = -1"), std::string::npos);
}

}  // namespace

namespace brigade::plan {
namespace {

TEST(CommFitInterpolate, LinearBetweenMeasuredSizesProportionalAboveAndAlphaBetaWithoutPoints) {
  CommFit f;
  f.alpha_s = 1e-3, f.beta_s_per_byte = 1e-6;
  EXPECT_DOUBLE_EQ(f.interpolate(2000), 1e-3 + 2e-3);  // no points: the fit
  f.points = {{3000, 2.0}, {1000, 1.0}};               // any order
  EXPECT_DOUBLE_EQ(f.interpolate(2000), 1.5);
  EXPECT_DOUBLE_EQ(f.interpolate(1000), 1.0);
  EXPECT_DOUBLE_EQ(f.interpolate(500), 1.0);   // below the smallest: its time
  EXPECT_DOUBLE_EQ(f.interpolate(6000), 4.0);  // above the largest: 2.0 x 6000 / 3000
}

}  // namespace
}  // namespace brigade::plan
