// measure_comm under mpirun (CTest runs this binary with 2 processes): the result's structure
// (every key, one point per size in order, the same result on every rank, the launcher read from
// the environment) and that every fit is the constrained least-squares one over its own points.
// Timings are noisy, so their values are not compared with anything.
// A disabled test runs the default options (what `brigade calibrate` uses) and prints the table
// of alpha (us) and bandwidth (GB/s, 1 / beta) per key on rank 0; run it by hand with
//   mpirun --oversubscribe --bind-to none -np 2 build/tests/plan/test_comm_bench_mpi
//     --gtest_also_run_disabled_tests --gtest_filter='*DefaultOptionsTable'
// (one command line; with the environment brigade_mpi_test sets, tests/CMakeLists.txt).
//
// Every rank makes the same collective calls before checking anything (no ASSERT_* between
// collectives), so a failing check cannot leave another rank waiting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "brigade/dist/process_group.h"
#include "brigade/plan/comm_bench.h"
#include "plan/fit_check.h"

namespace {

using brigade::dist::ProcessGroup;
using brigade::plan::CommBenchOptions;
using brigade::plan::CommCalibration;
using brigade::plan::CommFit;

const std::set<std::string> kKeys = {
    "allreduce/mpi",       "allreduce/ring",      "allreduce/tree", "reduce_scatter/mpi",
    "reduce_scatter/ring", "reduce_scatter/tree", "allgather",      "sendrecv"};

// Checks one calibration measured with options `o` on a group `pg` of 2 or more ranks.
// Collective: compares this rank's numbers with the maximum over ranks.
void check_calibration(ProcessGroup& pg, const CommCalibration& c, const CommBenchOptions& o) {
  EXPECT_EQ(c.ranks, pg.size());
  EXPECT_EQ(c.reps, o.reps);
  EXPECT_EQ(c.warmup, o.warmup);
  // The test's environment (brigade_mpi_test) runs Open MPI's mpirun with btl self,vader.
  EXPECT_EQ(c.launcher.rfind("mpirun -np " + std::to_string(pg.size()), 0), 0u) << c.launcher;
  EXPECT_NE(c.launcher.find("OMPI_MCA_btl=self,vader"), std::string::npos) << c.launcher;
  std::set<std::string> keys;
  for (const auto& [k, f] : c.fits) keys.insert(k);
  EXPECT_EQ(keys, kKeys);

  // Every rank holds the same numbers: each equals its maximum over ranks.
  std::vector<double> mine;
  for (const std::string& k : kKeys) {
    const auto it = c.fits.find(k);
    const size_t npts = it == c.fits.end() ? 0 : it->second.points.size();
    mine.push_back(it == c.fits.end() ? -1.0 : it->second.alpha_s);
    mine.push_back(it == c.fits.end() ? -1.0 : it->second.beta_s_per_byte);
    for (size_t i = 0; i < o.bytes.size(); ++i) mine.push_back(i < npts ? it->second.points[i].second : -1.0);
  }
  std::vector<double> most = mine;
  pg.allreduce_max(most.data(), int64_t(most.size()));
  EXPECT_EQ(mine, most) << "rank " << pg.rank() << " holds a different calibration from another rank";

  for (const auto& [k, f] : c.fits) {
    ASSERT_EQ(f.points.size(), o.bytes.size()) << k;
    for (size_t i = 0; i < o.bytes.size(); ++i) {
      EXPECT_EQ(f.points[i].first, o.bytes[i]) << k;
      EXPECT_TRUE(std::isfinite(f.points[i].second) && f.points[i].second >= 0) << k << " " << f.points[i].second;
    }
    brigade::plan::testing::expect_constrained_least_squares(f.points, f.alpha_s, f.beta_s_per_byte, k);
  }
}

TEST(MeasureCommMpi, SmallSizesGiveEveryKeyAndLeastSquaresFits) {
  auto world = ProcessGroup::world();
  ASSERT_GE(world->size(), 2) << "run under mpirun with at least 2 processes";
  CommBenchOptions o;
  o.bytes = {4096, 65536, 262144};
  o.reps = 3;
  o.warmup = 1;
  const CommCalibration c = brigade::plan::measure_comm(*world, o);
  check_calibration(*world, c, o);
}

// With a compute load beside them, every collective is timed again: the same keys and sizes.
TEST(MeasureCommMpi, BusyFitsBesideAComputeLoad) {
  auto world = ProcessGroup::world();
  ASSERT_GE(world->size(), 2) << "run under mpirun with at least 2 processes";
  CommBenchOptions o;
  o.bytes = {4096, 262144};
  o.reps = 2;
  o.warmup = 0;
  o.busy_threads = 1;
  const CommCalibration c = brigade::plan::measure_comm(*world, o);
  EXPECT_EQ(c.busy_threads, 1);
  ASSERT_EQ(c.busy_fits.size(), c.fits.size());
  for (const auto& [k, f] : c.fits) {
    ASSERT_TRUE(c.busy_fits.count(k)) << k;
    const CommFit& b = c.busy_fits.at(k);
    ASSERT_EQ(b.points.size(), f.points.size()) << k;
    for (size_t i = 0; i < b.points.size(); ++i) {
      EXPECT_EQ(b.points[i].first, f.points[i].first) << k;
      EXPECT_GT(b.points[i].second, 0.0) << k;
    }
  }
}

// The default options, as `brigade calibrate` uses them; prints the fitted table. Disabled: it
// takes seconds and its output is for reading.
TEST(MeasureCommMpi, DISABLED_DefaultOptionsTable) {
  auto world = ProcessGroup::world();
  ASSERT_GE(world->size(), 2) << "run under mpirun with at least 2 processes";
  const CommBenchOptions o;
  const CommCalibration c = brigade::plan::measure_comm(*world, o);
  check_calibration(*world, c, o);
  if (world->rank() != 0) return;
  std::printf("launcher: %s\n%-20s %10s %10s   median seconds per size\n", c.launcher.c_str(), "key", "alpha_us",
              "GB/s");
  for (const auto& [k, f] : c.fits) {
    std::printf("%-20s %10.2f %10.3f  ", k.c_str(), f.alpha_s * 1e6,
                f.beta_s_per_byte > 0 ? 1e-9 / f.beta_s_per_byte : INFINITY);
    for (const auto& [b, s] : f.points) std::printf(" %lld:%.3g", static_cast<long long>(b), s);
    std::printf("\n");
  }
}

}  // namespace
