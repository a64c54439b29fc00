// Pipeline schedules as data and the simulator (parallel/pipeline_schedule.h), against
// the closed forms of the papers: bubble (p-1)/m for GPipe and 1F1B, (p-1)/(v m) for
// interleaved 1F1B; GPipe holds m micro-batches in flight, 1F1B at most p; ZB-H1 has a
// smaller bubble than 1F1B at the same in-flight count.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include "brigade/core/error.h"
#include "brigade/parallel/pipeline_schedule.h"

using namespace brigade;
using namespace brigade::parallel;

namespace {

// Every (stage, mb) is computed exactly once forward and once backward (whole, or as Bi
// then W) on the rank that owns the stage, each send has its receive, and on every rank
// a micro-batch's forward comes before its backward.
void expect_complete(const PipePlan& plan) {
  std::map<std::tuple<int, int, int>, int> count;         // op, stage, mb
  std::multiset<std::tuple<int, int, int>> sends, recvs;  // kind, receiving stage, mb
  for (int r = 0; r < plan.p; ++r) {
    std::set<std::pair<int, int>> forwarded;
    for (const PipeAction& a : plan.ranks[size_t(r)]) {
      ASSERT_EQ(plan.rank_of(a.stage), r) << pipe_op_name(a.op) << " stage " << a.stage;
      ASSERT_TRUE(a.mb >= 0 && a.mb < plan.m);
      ++count[{int(a.op), a.stage, a.mb}];
      if (a.op == PipeOp::Forward) forwarded.insert({a.stage, a.mb});
      if (a.op == PipeOp::Backward || a.op == PipeOp::BackwardInput)
        EXPECT_TRUE(forwarded.count({a.stage, a.mb})) << "backward before forward, stage " << a.stage;
      if (a.op == PipeOp::SendActivation) sends.insert({0, a.stage + 1, a.mb});
      if (a.op == PipeOp::SendGrad) sends.insert({1, a.stage - 1, a.mb});
      if (a.op == PipeOp::RecvActivation) recvs.insert({0, a.stage, a.mb});
      if (a.op == PipeOp::RecvGrad) recvs.insert({1, a.stage, a.mb});
    }
  }
  EXPECT_EQ(sends, recvs);
  const bool split = plan.kind == PipeSchedule::ZeroBubbleH1;
  for (int s = 0; s < plan.stages(); ++s)
    for (int i = 0; i < plan.m; ++i) {
      EXPECT_EQ((count[{int(PipeOp::Forward), s, i}]), 1);
      EXPECT_EQ((count[{int(PipeOp::Backward), s, i}]), split ? 0 : 1);
      EXPECT_EQ((count[{int(PipeOp::BackwardInput), s, i}]), split ? 1 : 0);
      EXPECT_EQ((count[{int(PipeOp::BackwardWeight), s, i}]), split ? 1 : 0);
    }
}

}  // namespace

TEST(PipeSchedule, GPipeAnd1F1BBubbleIsPMinusOneOverM) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 4, 8, 12, 32})
      for (auto [f, bi, w] : {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.0, 1.3, 0.9}}) {
        SCOPED_TRACE(fmt::format("p {} m {} costs {} {} {}", p, m, f, bi, w));
        const PipeCosts c = PipeCosts::uniform(p, f, bi, w);
        for (PipeSchedule k : {PipeSchedule::GPipe, PipeSchedule::OneFOneB}) {
          const PipePlan plan = build_pipe_plan(k, p, m);
          expect_complete(plan);
          const PipeSimulation sim = simulate_pipe_plan(plan, c);
          // makespan (m + p - 1)(F + B): ideal m (F + B), bubble (p - 1) / m
          EXPECT_NEAR(sim.makespan, (m + p - 1) * (f + bi + w), 1e-9) << pipe_schedule_name(k);
          EXPECT_NEAR(sim.bubble, double(p - 1) / m, 1e-12) << pipe_schedule_name(k);
          for (int r = 0; r < p; ++r)  // GPipe keeps every micro-batch; 1F1B at most p - r <= p
            EXPECT_EQ(sim.peak_in_flight[size_t(r)], k == PipeSchedule::GPipe ? m : std::min(p - r, m))
                << pipe_schedule_name(k) << " rank " << r;
        }
      }
}

TEST(PipeSchedule, OneFOneBWithOneSlowStageHasNoBubble) {
  // Stage 0 costs 1 + 1 a micro-batch, stage 1 a thousandth of that: under 1F1B rank 0 finds every
  // gradient there when it needs it, so the makespan is its busy time, the ideal (bubble 0 exactly);
  // GPipe's rank 0 still waits for stage 1's first backward after all the forwards.
  PipeCosts c;
  c.forward = {1.0, 1e-3};
  c.backward_input = {1.0, 1e-3};
  c.backward_weight = {0.0, 0.0};
  const PipeSimulation o = simulate_pipe_plan(build_pipe_plan(PipeSchedule::OneFOneB, 2, 4), c);
  EXPECT_EQ(o.makespan, 8.0);
  EXPECT_EQ(o.bubble, 0.0);
  const PipeSimulation g = simulate_pipe_plan(build_pipe_plan(PipeSchedule::GPipe, 2, 4), c);
  EXPECT_GT(g.bubble, 0.0);
  EXPECT_NEAR(g.makespan - g.ideal, 2e-3, 1e-12);  // stage 1's forward and backward of the last micro-batch
}

TEST(PipeSchedule, InterleavedBubbleIsPMinusOneOverVM) {
  for (int p : {2, 4})
    for (int v : {2, 3, 4})
      for (int m : {p, 2 * p, 4 * p}) {
        SCOPED_TRACE(fmt::format("p {} v {} m {}", p, v, m));
        // the same model cut into p v stages: each chunk costs 1/v of a rank's share
        const double F = 1.0, B = 2.0;
        const PipeCosts c = PipeCosts::uniform(p * v, F / v, B / v / 2, B / v / 2);
        const PipePlan plan = build_pipe_plan(PipeSchedule::Interleaved, p, m, v);
        expect_complete(plan);
        const PipeSimulation sim = simulate_pipe_plan(plan, c);
        EXPECT_NEAR(sim.ideal, m * (F + B), 1e-9);
        EXPECT_NEAR(sim.bubble, double(p - 1) / (v * m), 1e-9);
      }
  EXPECT_THROW(build_pipe_plan(PipeSchedule::Interleaved, 4, 6, 2), ValueError);  // m % p != 0
  EXPECT_THROW(build_pipe_plan(PipeSchedule::OneFOneB, 4, 8, 2), ValueError);     // v > 1 needs interleaving
}

TEST(PipeSchedule, ZeroBubbleH1BeatsOneFOneBAtTheSameMemory) {
  for (int p : {2, 4, 8})
    for (int m : {p, 2 * p, 4 * p}) {
      SCOPED_TRACE(fmt::format("p {} m {}", p, m));
      const PipeCosts c = PipeCosts::uniform(p, 1.0, 1.0, 1.0);
      const PipePlan zb = build_pipe_plan(PipeSchedule::ZeroBubbleH1, p, m, 1, c);
      expect_complete(zb);
      const PipeSimulation z = simulate_pipe_plan(zb, c);
      const PipeSimulation o = simulate_pipe_plan(build_pipe_plan(PipeSchedule::OneFOneB, p, m), c);
      if (p > 1) {
        EXPECT_LT(z.bubble, o.bubble);
      }
      // the same memory: no rank holds more micro-batches than 1F1B's peak (p, on its first rank)
      const int peak_1f1b = *std::max_element(o.peak_in_flight.begin(), o.peak_in_flight.end());
      EXPECT_EQ(peak_1f1b, std::min(p, m));
      for (int r = 0; r < p; ++r) EXPECT_LE(z.peak_in_flight[size_t(r)], peak_1f1b) << r;
      // Qi et al.: with F = B = W, ZB-H1's bubble is (p - 1)(F + B - W), a third of 1F1B's
      // (p - 1)(F + B + W)
      EXPECT_NEAR(z.makespan - z.ideal, (p - 1) * 1.0, 1e-9) << z.bubble << " vs " << o.bubble;
    }
}

TEST(PipeSchedule, SimulatorFindsADeadlockAndBadCosts) {
  PipePlan plan = build_pipe_plan(PipeSchedule::OneFOneB, 2, 2);
  // rank 1 waits for a gradient before its first forward: nobody sends it
  plan.ranks[1].insert(plan.ranks[1].begin(), PipeAction{PipeOp::RecvGrad, 1, 0});
  try {
    simulate_pipe_plan(plan, PipeCosts::uniform(2, 1, 1, 1));
    ADD_FAILURE() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 at recvG(stage 1, mb 0)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(simulate_pipe_plan(build_pipe_plan(PipeSchedule::GPipe, 2, 2), PipeCosts::uniform(3, 1, 1, 1)),
               ValueError);
  EXPECT_THROW(pipe_schedule_from_name("1F1B"), ValueError);
  EXPECT_EQ(pipe_schedule_from_name("zb-h1"), PipeSchedule::ZeroBubbleH1);
}

TEST(PipeSchedule, DynamicPicksTheFastestThatFitsTheMemoryLimit) {
  const int p = 4, m = 8;
  auto costs = [&](int v) { return PipeCosts::uniform(p * v, 1.0 / v, 1.0 / v, 1.0 / v, 0.01); };
  // no limit: the fastest of all candidates (checked against each one's simulation)
  const PipeChoice any = choose_pipe_plan(p, m, {2, 4}, 0, costs);
  for (auto [k, v] : {std::pair{PipeSchedule::GPipe, 1}, std::pair{PipeSchedule::OneFOneB, 1},
                      std::pair{PipeSchedule::ZeroBubbleH1, 1}, std::pair{PipeSchedule::Interleaved, 2},
                      std::pair{PipeSchedule::Interleaved, 4}})
    EXPECT_LE(any.sim.makespan, simulate_pipe_plan(build_pipe_plan(k, p, m, v, costs(v)), costs(v)).makespan + 1e-12)
        << pipe_schedule_name(k) << " v " << v;
  EXPECT_NE(any.table.find("| gpipe | 1 |"), std::string::npos) << any.table;
  // at most p micro-batches in flight: GPipe (m = 8) is out
  const PipeChoice lim = choose_pipe_plan(p, m, {2, 4}, p, costs);
  EXPECT_NE(lim.plan.kind, PipeSchedule::GPipe);
  for (int x : lim.sim.peak_in_flight) EXPECT_LE(x, p);
  EXPECT_THROW(choose_pipe_plan(p, m, {}, 1, costs), ValueError);
}

TEST(PipeSchedule, TimelineSvgHasOneBoxPerComputeAction) {
  const PipeCosts c = PipeCosts::uniform(3, 1, 1, 1);
  const PipeSimulation sim = simulate_pipe_plan(build_pipe_plan(PipeSchedule::ZeroBubbleH1, 3, 6, 1, c), c);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("brigade_pipe_" + std::to_string(::getpid()) + ".svg")).string();
  write_pipe_timeline_svg(path, sim.events, 3, "zb-h1 p=3 m=6");
  std::ifstream f(path);
  const std::string svg((std::istreambuf_iterator<char>(f)), {});
  std::filesystem::remove(path);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  const std::regex rect("<rect ");
  const auto rects = std::distance(std::sregex_iterator(svg.begin(), svg.end(), rect), std::sregex_iterator());
  EXPECT_EQ(size_t(rects), sim.events.size());
  EXPECT_EQ(sim.events.size(), size_t(3 * 6 * 3));  // F, Bi, W per stage and micro-batch
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}
