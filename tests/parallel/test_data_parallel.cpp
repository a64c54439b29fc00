// DataParallel in one process (a one-rank group: collectives are local copies), on a
// small GPT, against an identical plain model trained without it:
//  - the step protocol (begin_step, begin_micro_step, forward, backward,
//    finish_gradients) leaves in optimizer_params() exactly the plain model's
//    gradients, for ZeRO 0..3, overlap on and off, accumulation 1 (bitwise: with one
//    rank and one micro-step the 1/(dp x accumulation) scale is exactly 1) and 2 (the
//    mean of two micro-batches, to 1e-6 of each tensor's largest entry, since the
//    accumulation order of tied-weight contributions may differ). With one rank the
//    communication queue always runs inline (comm_queue.h), so overlap on/off run
//    the same code here; the multi-rank overlap is covered by tests/parallel/test_dp_train;
//  - ZeRO-3 gathers and releases parameter storage as documented: block units are
//    released after their forward and after their gradients are reduce-scattered, the
//    non-module unit stays gathered for the step; gather_all() makes the model usable
//    (same loss, bitwise) and release_all() frees it again;
//  - construction moves the parameters into the flat buffers without leaking the
//    per-parameter storages: live Params bytes are exactly the flat buffer (ZeRO 0)
//    or the shard (ZeRO 3, one rank: the shard is everything).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/core/allocator.h"
#include "brigade/core/rng.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/parallel/comm_queue.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/executor.h"
#include "brigade/train/trainer.h"

using namespace brigade;

namespace {

models::GPTConfig small_config() {
  models::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 24;  // 24-float rows: parameters are not multiples of 16 floats, so the flat layout pads
  c.dropout = 0.0;
  return c;
}

constexpr int64_t kB = 3, kT = 16;

std::unique_ptr<models::GPT> make_gpt() {
  auto m = std::make_unique<models::GPT>(small_config());
  Generator g(1234);
  m->init_weights(g);
  return m;
}

// The trainer's unit split (train/trainer.h).
std::vector<parallel::ParamUnit> units_of(models::GPT& m) { return train::model_units(m); }

// Deterministic token batch number `k`: (kB, kT) ids in [0, vocab).
std::pair<Tensor, Tensor> batch(int k) {
  std::vector<int64_t> x(size_t(kB * kT)), y(x.size());
  uint32_t s = 777u + 1000u * uint32_t(k);
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return int64_t((s >> 16) % 64u);
  };
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = next();
    y[i] = next();
  }
  return {Tensor::from_vector_i64(x, {kB, kT}), Tensor::from_vector_i64(y, {kB, kT})};
}

// The plain model's gradients for the mean loss over micro-batches 0..accumulation-1:
// the sum of the backward passes, times 1/accumulation. Returns the micro-batch losses.
std::vector<double> plain_step(models::GPT& m, int accumulation, std::map<std::string, std::vector<float>>& grads) {
  for (auto& [n, p] : m.named_parameters()) p.set_grad(Tensor());
  std::vector<double> losses;
  for (int k = 0; k < accumulation; ++k) {
    auto [x, y] = batch(k);
    Tensor loss = m.loss(x, y);
    losses.push_back(loss.item());
    autograd::backward(loss);
  }
  for (auto& [n, p] : m.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << n;
    std::vector<float> g = p.grad().to_vector();
    if (accumulation > 1)
      for (float& v : g) v = float(double(v) * (1.0 / double(accumulation)));
    grads[n] = std::move(g);
  }
  return losses;
}

bool materialized(const Tensor& p) { return p.impl()->storage->materialized(); }

bool is_block_param(const std::string& name) { return name.rfind("transformer.h.", 0) == 0; }

struct Case {
  int zero;
  bool overlap;
  int accumulation;
};

std::string case_str(const Case& c) {
  return "zero" + std::to_string(c.zero) + (c.overlap ? "_overlap" : "_sync") + "_accum" +
         std::to_string(c.accumulation);
}
std::string case_name(const ::testing::TestParamInfo<Case>& i) { return case_str(i.param); }
void PrintTo(const Case& c, std::ostream* os) { *os << case_str(c); }

class DataParallelOneRank : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelOneRank, GradientsMatchThePlainModel) {
  const Case c = GetParam();
  auto plain = make_gpt();
  std::map<std::string, std::vector<float>> want;
  const std::vector<double> plain_losses = plain_step(*plain, c.accumulation, want);

  auto model = make_gpt();
  {
    parallel::DataParallelOptions o;
    o.zero = c.zero;
    o.overlap = c.overlap;
    o.accumulation = c.accumulation;
    o.bucket_bytes = 8 << 10;  // several buckets on this model (ZeRO-3 buckets are the units)
    parallel::DataParallel dp(units_of(*model), dist::ProcessGroup::world(), o);
    ASSERT_EQ(dp.size(), 1);
    const nn::NamedTensors params = model->named_parameters();
    // ZeRO-3 during the step: block units released, the non-module unit gathered.
    auto expect_blocks_released = [&](const std::string& when) {
      for (auto& [n, p] : params) EXPECT_EQ(materialized(p), !is_block_param(n)) << n << " " << when;
    };

    // Two steps without an optimizer update in between: the second must give the same
    // gradients again (begin_step clears the previous step's).
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      dp.begin_step();
      for (int m = 0; m < c.accumulation; ++m) {
        dp.begin_micro_step(m);
        auto [x, y] = batch(m);
        Tensor loss = model->loss(x, y);
        EXPECT_EQ(loss.item(), plain_losses[size_t(m)]) << "micro-step " << m;  // same forward, bitwise
        if (c.zero == 3) expect_blocks_released("after the forward of micro-step " + std::to_string(m));
        autograd::backward(loss);
        // blocks released again once their gradients are handed over
        if (c.zero == 3) expect_blocks_released("after the backward of micro-step " + std::to_string(m));
        if (c.zero >= 2) {
          for (auto& [n, p] : params) EXPECT_FALSE(p.grad().defined()) << n << ": full gradient kept under ZeRO-2/3";
        }
      }
      dp.finish_gradients();
      if (c.zero == 3) {
        for (auto& [n, p] : params) EXPECT_FALSE(materialized(p)) << n << " still gathered after the step";
      }

      // optimizer_params(): the parameters (ZeRO 0) or flat views of the (whole) shard
      // named after them; with one rank every parameter appears once, in full.
      const nn::NamedTensors& op = dp.optimizer_params();
      ASSERT_EQ(op.size(), want.size());
      for (auto& [n, p] : op) {
        SCOPED_TRACE(n);
        ASSERT_TRUE(want.count(n));
        ASSERT_TRUE(p.grad().defined());
        const std::vector<float> got = p.grad().to_vector(), &ref = want.at(n);
        ASSERT_EQ(got.size(), ref.size());
        if (c.accumulation == 1) {
          size_t mismatches = 0;
          for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != ref[i];  // exact (+0 == -0)
          EXPECT_EQ(mismatches, 0u);
        } else {
          double err = 0, scale = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            err = std::max(err, std::abs(double(got[i]) - double(ref[i])));
            scale = std::max(scale, std::abs(double(ref[i])));
          }
          EXPECT_GT(scale, 0.0);
          EXPECT_LE(err, 1e-6 * scale);
        }
      }
    }

    if (c.zero == 3) {
      // Outside the step: gather_all() makes the whole model usable (and keeps it gathered).
      dp.gather_all();
      for (auto& [n, p] : params) EXPECT_TRUE(materialized(p)) << n;
      {
        autograd::NoGradGuard ng;
        auto [x, y] = batch(0);
        EXPECT_EQ(model->loss(x, y).item(), plain_losses[0]);
      }
      for (auto& [n, p] : params) EXPECT_TRUE(materialized(p)) << n << " released by a forward under gather_all";
      dp.release_all();
      for (auto& [n, p] : params) EXPECT_FALSE(materialized(p)) << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllStages, DataParallelOneRank,
                         ::testing::Values(Case{0, true, 1}, Case{0, false, 1}, Case{0, true, 2}, Case{0, false, 2},
                                           Case{1, true, 1}, Case{1, false, 1}, Case{1, true, 2}, Case{1, false, 2},
                                           Case{2, true, 1}, Case{2, false, 1}, Case{2, true, 2}, Case{2, false, 2},
                                           Case{3, true, 1}, Case{3, false, 1}, Case{3, true, 2}, Case{3, false, 2}),
                         case_name);

// Live Params bytes of the flat layout: every parameter starts on a 16-float (64-byte)
// boundary; with one rank the shard S is the whole padded space.
int64_t flat_floats(models::GPT& m) {
  int64_t off = 0;
  for (auto& [n, p] : m.named_parameters()) off = (off + p.numel() + 15) / 16 * 16;
  return off;
}

int64_t live_params() { return Allocator::instance().stats().live[size_t(MemTag::Params)]; }

class DataParallelMemory : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelMemory, ConstructionLeavesOnlyTheFlatStorage) {
  const int zero = GetParam();
  const int64_t before = live_params();
  auto model = make_gpt();
  int64_t per_param = 0;
  for (auto& [n, p] : model->named_parameters())
    per_param += int64_t(Allocator::round_size(size_t(p.numel()) * sizeof(float)));
  ASSERT_EQ(live_params() - before, per_param);  // the model alone: one storage per parameter

  const int64_t S = flat_floats(*model);
  ASSERT_NE(S, model->num_parameters());  // the padding is exercised (n_embd = 24)
  parallel::DataParallelOptions o;
  o.zero = zero;
  parallel::DataParallel dp(units_of(*model), dist::ProcessGroup::world(), o);
  ASSERT_EQ((dp.flat_numel() + 15) / 16 * 16, S);  // the layout the test assumes
  // ZeRO 0: one flat buffer holds every parameter; ZeRO 3: the shard (= everything, one rank)
  // and the unit storages, which start released. Either way the per-parameter storages are gone.
  EXPECT_EQ(live_params() - before, int64_t(Allocator::round_size(size_t(S) * sizeof(float))));
  if (zero == 3) {
    dp.gather_all();  // the unit storages come back: shard + every unit
    int64_t units = 0;
    for (const auto& u : units_of(*model)) {
      int64_t off = 0;
      for (auto& [n, p] : u.params) off = (off + p.numel() + 15) / 16 * 16;
      units += int64_t(Allocator::round_size(size_t(off) * sizeof(float)));
    }
    EXPECT_EQ(live_params() - before, int64_t(Allocator::round_size(size_t(S) * sizeof(float))) + units);
    dp.release_all();
    EXPECT_EQ(live_params() - before, int64_t(Allocator::round_size(size_t(S) * sizeof(float))));
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, DataParallelMemory, ::testing::Values(0, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "zero" + std::to_string(i.param); });

}  // namespace

// The communication queue's task accounting: a task that computes uses CPU, one that sleeps
// uses wall time only; both on the thread and inline (the CPU of a thread, not of the process).
TEST(CommQueueSeconds, CpuOfTheTasksAndTheirWallTime) {
  for (const bool threaded : {true, false}) {
    parallel::CommQueue q(threaded);
    auto spin = [] {  // ~30 ms of CPU
      const auto t0 = std::chrono::steady_clock::now();
      volatile double x = 0;
      while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(30)) x = x + 1.0;
    };
    q.submit(spin);
    q.submit([] { std::this_thread::sleep_for(std::chrono::milliseconds(60)); });
    q.wait_all();
    const double cpu = q.task_cpu_seconds(), wall = q.task_wall_seconds();
    EXPECT_GE(wall, 0.089) << "threaded " << threaded;        // 30 ms + 60 ms, less the clocks' rounding
    EXPECT_GE(cpu, 0.005) << "threaded " << threaded;         // the spin, however the scheduler shared the core
    EXPECT_LT(cpu, wall - 0.055) << "threaded " << threaded;  // the sleep used no CPU
    q.reset_task_seconds();
    EXPECT_EQ(q.task_cpu_seconds(), 0.0);
    EXPECT_EQ(q.task_wall_seconds(), 0.0);
  }
}

// The queue's depth: tasks queued behind a running one count until they complete; an inline task
// is 1; a reset starts from what is pending then.
TEST(CommQueueDepth, PeakPendingCountsQueuedTasks) {
  parallel::CommQueue q(true);
  for (int i = 0; i < 3; ++i) q.submit([] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  q.wait_all();
  EXPECT_EQ(q.peak_pending(), 3);  // the first sleeps 50 ms, long after the other two were queued
  q.reset_peak_pending();
  EXPECT_EQ(q.peak_pending(), 0);
  q.submit([] {});
  q.wait_all();
  EXPECT_EQ(q.peak_pending(), 1);

  parallel::CommQueue inline_q(false);
  EXPECT_EQ(inline_q.peak_pending(), 0);
  inline_q.submit([] {});
  inline_q.submit([] {});
  EXPECT_EQ(inline_q.peak_pending(), 1);
}
