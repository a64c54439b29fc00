// DataParallel's communication queue under mpirun (2 ranks, threaded queue): the backward never
// queues more than max_buckets_in_flight() bucket collectives at once, whatever the ZeRO stage,
// even when the peer is late (rank 1 sleeps before its backward, so rank 0's first collective
// blocks while its backward produces every other bucket). Unbounded, rank 0 would queue every
// bucket; bounded, its backward waits for the oldest. The gradients still match one process's
// (the mean of the two ranks' batches), so the waiting loses nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/core/rng.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/executor.h"

using namespace brigade;

namespace {

std::unique_ptr<models::GPT> make_gpt() {
  models::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 24;
  c.dropout = 0.0;
  auto m = std::make_unique<models::GPT>(c);
  Generator g(1234);
  m->init_weights(g);
  return m;
}

// Rank r's (2, 16) token batch.
std::pair<Tensor, Tensor> batch(int r) {
  std::vector<int64_t> x(32), y(32);
  uint32_t s = 99u + 1000u * uint32_t(r);
  for (size_t i = 0; i < x.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = int64_t((s >> 16) % 64u);
    s = s * 1664525u + 1013904223u;
    y[i] = int64_t((s >> 16) % 64u);
  }
  return {Tensor::from_vector_i64(x, {2, 16}), Tensor::from_vector_i64(y, {2, 16})};
}

class DpQueue : public ::testing::TestWithParam<int> {};

TEST_P(DpQueue, BackwardQueuesAtMostTheBoundEvenWhenThePeerIsLate) {
  auto world = dist::ProcessGroup::world();
  if (world->size() != 2) GTEST_SKIP() << "needs mpirun -np 2";
  const int zero = GetParam();

  // One process's gradients of the mean loss over both ranks' batches.
  auto plain = make_gpt();
  for (int r = 0; r < 2; ++r) autograd::backward(plain->loss(batch(r).first, batch(r).second));
  std::map<std::string, std::vector<float>> want;
  for (auto& [n, p] : plain->named_parameters()) {
    std::vector<float> g = p.grad().to_vector();
    for (float& v : g) v *= 0.5f;
    want[n] = std::move(g);
  }

  auto model = make_gpt();
  parallel::DataParallelOptions o;
  o.zero = zero;
  o.overlap = true;
  o.bucket_bytes = 4 << 10;  // many buckets (ZeRO-2/3 buckets are the units: one per block + the rest)
  parallel::DataParallel dp(train::model_units(*model), world, o);
  const size_t bound = parallel::DataParallel::max_buckets_in_flight();
  const int64_t buckets_at_least = zero >= 2 ? 4 : dp.flat_numel() * 4 / o.bucket_bytes;
  ASSERT_GT(buckets_at_least, int64_t(bound)) << "the test needs more buckets than the bound";

  dp.begin_step();
  dp.begin_micro_step(0);
  auto [x, y] = batch(world->rank());
  Tensor loss = model->loss(x, y);
  if (world->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  autograd::backward(loss);
  dp.finish_gradients();
  EXPECT_LE(dp.comm_peak_queued(), int64_t(bound) + (zero == 3 ? 1 : 0))  // ZeRO-3: + the prefetched gather
      << "rank " << world->rank() << " queued more bucket collectives than the bound";

  // Each rank's shard of the averaged gradients, against one process's.
  std::map<std::string, std::pair<int64_t, int64_t>> range;
  for (const parallel::FlatEntry& e : dp.layout()) range[e.name] = {e.offset, e.offset + e.numel};
  for (auto& [name, view] : dp.optimizer_params()) {
    const auto [a, b] = range.at(name);
    const int64_t lo = zero == 0 ? a : std::max(a, dp.shard_begin());
    const std::vector<float> got = view.grad().to_vector();
    const std::vector<float>& full = want.at(name);
    ASSERT_EQ(int64_t(got.size()), zero == 0 ? b - a : std::min(b, dp.shard_end()) - lo) << name;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], full[size_t(lo - a) + i], 1e-6f * (1.0f + std::abs(full[size_t(lo - a) + i])))
          << name << "[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, DpQueue, ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "zero" + std::to_string(i.param); });

}  // namespace
