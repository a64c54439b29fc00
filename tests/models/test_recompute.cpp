// Activation recompute of GPT blocks (nn::Recompute, models::plan_recompute, docs/memory.md):
//  - GPT-2 124M shape (12 layers, 768 wide, 12 heads, vocab 50257; B=1, T=32, dropout 0.1):
//    the loss and every parameter gradient are bitwise equal for none / full / selective /
//    every_k=2 / a mixed plan, and the dropout generator ends in the same state; the
//    activation bytes held at the end of the forward are ordered full < selective < none;
//  - the default recipe's shape (4 layers, 256 wide, vocab 4096; B=16, T=128): the measured
//    step peak of activation bytes is ordered full < selective < none, and the estimate the
//    budget policy plans with is an upper bound within 1% (here and on a grid of small
//    configurations with dropout and mixed plans, within 5%);
//  - budget: for several budgets the measured peak stays under the budget, more budget
//    never means more recompute, and an impossible budget is a ConfigError;
//  - two micro-batches with dropout (gradient accumulation): bitwise across policies;
//  - ZeRO-3 (DataParallel in one process): recompute full and selective give the plain
//    model's gradients bitwise, and so does a checkpoint around a whole block with its
//    ZeRO-3 hooks inside (the hooks see autograd::recomputing()); blocks are released
//    after the forward and after the backward as without recompute;
//  - the [memory] recipe keys are validated with messages that say what to change.
// Peak bytes are the allocator's MemTag::Activations high-water mark over forward + backward.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/config.h"
#include "brigade/train/executor.h"
#include "brigade/train/trainer.h"

using namespace brigade;
using nn::Recompute;
namespace F = brigade::fn;

namespace {

models::GPTConfig gpt2_config() {
  models::GPTConfig c;  // the defaults are GPT-2 124M
  c.block_size = 64;
  c.dropout = 0.1;
  return c;
}

models::GPTConfig recipe_config() {  // recipes/gpt-kjv.toml
  models::GPTConfig c;
  c.vocab_size = 4096;
  c.block_size = 128;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 256;
  return c;
}

std::vector<Recompute> modes_of(const std::string& s) {
  std::vector<Recompute> m;
  for (char ch : s) m.push_back(ch == 'f' ? Recompute::Full : ch == 's' ? Recompute::Selective : Recompute::None);
  return m;
}

std::vector<Recompute> policy(const models::GPTConfig& c, const std::string& mode, int64_t k = 2) {
  models::RecomputePolicy p;
  p.mode = mode;
  p.every_k = k;
  return models::plan_recompute(c, 1, 1, p);
}

// Deterministic (B, T) ids and targets in [0, V).
std::pair<Tensor, Tensor> batch(int64_t B, int64_t T, int64_t V, uint32_t seed) {
  std::vector<int64_t> x(size_t(B * T)), y(x.size());
  uint32_t s = seed;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return int64_t((s >> 8) % uint32_t(V));
  };
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = next();
    y[i] = next();
  }
  return {Tensor::from_vector_i64(x, {B, T}), Tensor::from_vector_i64(y, {B, T})};
}

int64_t act_live() { return Allocator::instance().stats().live[int(MemTag::Activations)]; }
int64_t act_peak() { return Allocator::instance().stats().peak[int(MemTag::Activations)]; }

uint64_t hash_bits(const Tensor& t) {  // FNV-1a over the raw f32 bits
  const Tensor c = t.contiguous();
  const uint32_t* p = reinterpret_cast<const uint32_t*>(c.data<float>());
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < c.numel(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct StepResult {
  std::vector<double> losses;
  std::map<std::string, uint64_t> grads;  // bit hash of every parameter gradient
  std::string rng;                        // dropout generator state after the step
  int64_t held_after_forward = 0;         // activation bytes live after the first forward
  int64_t peak = 0;                       // activation high-water mark over the step (above the start)
  double seconds = 0;
};

// `micro` forward + backward passes (gradients accumulate), the model's dropout generator
// seeded first; the batch tensors are allocated before the peak is reset (as in the trainer).
StepResult step(models::GPT& m, const std::vector<Recompute>& modes, int64_t B, int64_t T, int micro = 1) {
  m.set_recompute(modes);
  for (auto& p : m.parameters()) p.set_grad(Tensor());
  m.dropout_generator().manual_seed(4242);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int k = 0; k < micro; ++k) batches.push_back(batch(B, T, m.config().vocab_size, 99u + uint32_t(k)));
  StepResult r;
  const int64_t start = act_live();
  Allocator::instance().reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < micro; ++k) {
    Tensor loss = m.loss(batches[size_t(k)].first, batches[size_t(k)].second);
    if (k == 0) r.held_after_forward = act_live() - start;
    r.losses.push_back(loss.item());
    autograd::backward(loss);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.peak = act_peak() - start;
  for (auto& [n, p] : m.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << n;
    if (p.grad().defined()) r.grads[n] = hash_bits(p.grad());
  }
  r.rng = m.dropout_generator().state();
  return r;
}

void expect_same_step(const StepResult& got, const StepResult& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << what << " loss " << i;
  EXPECT_EQ(got.rng, want.rng) << what << ": dropout generator state after the step";
  size_t differ = 0;
  for (auto& [n, h] : want.grads) {
    auto it = got.grads.find(n);
    ASSERT_NE(it, got.grads.end()) << n;
    if (it->second != h) {
      ++differ;
      ADD_FAILURE() << what << ": gradient of " << n << " differs";
    }
  }
  EXPECT_EQ(differ, 0u) << what;
}

}  // namespace

TEST(Recompute, Gpt2ShapeLossAndGradientsBitwiseAcrossPolicies) {
  const models::GPTConfig c = gpt2_config();
  models::GPT m(c);
  {
    Generator g(7);
    m.init_weights(g);
  }
  ASSERT_EQ(m.num_parameters(), 124439808 - (1024 - 64) * 768);  // GPT-2 124M but for the shorter wpe
  const int64_t B = 1, T = 32;
  const StepResult none = step(m, policy(c, "none"), B, T);
  std::map<std::string, StepResult> other;
  for (const std::string p : {"full", "selective", "every_k"}) other[p] = step(m, policy(c, p), B, T);
  other["mixed"] = step(m, modes_of("ffssnnffssnn"), B, T);
  for (auto& [name, r] : other) expect_same_step(r, none, name);
  std::printf("GPT-2 124M shape, B=%lld T=%lld: activation bytes held after the forward / step time\n", (long long)B,
              (long long)T);
  std::printf("  none      %10lld  %.2f s\n", (long long)none.held_after_forward, none.seconds);
  for (auto& [name, r] : other)
    std::printf("  %-9s %10lld  %.2f s\n", name.c_str(), (long long)r.held_after_forward, r.seconds);
  EXPECT_LT(other["full"].held_after_forward, other["selective"].held_after_forward);
  EXPECT_LT(other["selective"].held_after_forward, none.held_after_forward);
  EXPECT_LT(other["every_k"].held_after_forward, none.held_after_forward);
  EXPECT_GT(other["every_k"].held_after_forward, other["full"].held_after_forward);
}

TEST(Recompute, RecipeShapePeakOrderedAndEstimated) {
  const models::GPTConfig c = recipe_config();
  models::GPT m(c);
  Generator g(7);
  m.init_weights(g);
  const int64_t B = 16, T = 128;
  std::map<std::string, StepResult> r;
  for (const std::string p : {"none", "selective", "every_k", "full"}) {
    r[p] = step(m, policy(c, p), B, T);
    const int64_t est = models::estimate_activation_peak(c, B, T, policy(c, p));
    std::printf("  %-9s peak %10lld  estimate %10lld  %.2f s\n", p.c_str(), (long long)r[p].peak, (long long)est,
                r[p].seconds);
    EXPECT_LE(r[p].peak, est) << p;
    EXPECT_LE(double(est), 1.01 * double(r[p].peak)) << p;
  }
  for (const std::string p : {"selective", "every_k", "full"}) expect_same_step(r[p], r["none"], p);
  EXPECT_LT(r["full"].peak, r["selective"].peak);
  EXPECT_LT(r["selective"].peak, r["none"].peak);
  EXPECT_LT(r["full"].peak, r["every_k"].peak);
  EXPECT_LT(r["every_k"].peak, r["none"].peak);
}

TEST(Recompute, EstimateBoundsTheMeasuredPeakOnAGrid) {
  struct Cfg {
    int64_t L, C, NH, V, B, T;
    double dropout;
    std::string modes;
  };
  const std::vector<Cfg> grid = {
      {3, 64, 4, 100, 4, 32, 0.0, "nnn"},   {3, 64, 4, 100, 4, 32, 0.0, "fff"},
      {3, 64, 4, 100, 4, 32, 0.0, "sss"},   {3, 64, 4, 100, 4, 32, 0.2, "nnn"},
      {3, 64, 4, 100, 4, 32, 0.2, "fsn"},   {3, 64, 4, 100, 4, 32, 0.2, "sss"},
      {4, 96, 3, 5000, 2, 16, 0.0, "nsfn"}, {4, 96, 3, 5000, 2, 16, 0.1, "ffff"},
      {5, 32, 2, 64, 8, 24, 0.0, "fnsnf"},  {2, 128, 8, 300, 3, 40, 0.1, "sn"},
      {2, 128, 8, 300, 3, 40, 0.0, "fs"},   {6, 48, 4, 2000, 1, 64, 0.0, "nnnnnn"},
      {2, 64, 4, 50, 1, 4, 0.0, "fs"},      {3, 32, 4, 1000, 1, 1, 0.1, "nsf"},
      {2, 256, 4, 128, 2, 8, 0.0, "sf"},
  };
  for (const Cfg& k : grid) {
    models::GPTConfig c;
    c.n_layer = k.L, c.n_embd = k.C, c.n_head = k.NH, c.vocab_size = k.V, c.block_size = k.T, c.dropout = k.dropout;
    models::GPT m(c);
    Generator g(3);
    m.init_weights(g);
    const std::vector<Recompute> modes = modes_of(k.modes);
    const StepResult r = step(m, modes, k.B, k.T);
    const int64_t est = models::estimate_activation_peak(c, k.B, k.T, modes);
    const std::string what =
        fmt::format("L{} C{} NH{} V{} B{} T{} dropout {} modes {}", k.L, k.C, k.NH, k.V, k.B, k.T, k.dropout, k.modes);
    EXPECT_LE(r.peak, est) << what;
    EXPECT_LE(double(est), 1.05 * double(r.peak)) << what;
  }
}

TEST(Recompute, BudgetKeepsTheMeasuredPeakUnderIt) {
  const models::GPTConfig c = recipe_config();
  models::GPT m(c);
  Generator g(7);
  m.init_weights(g);
  const int64_t B = 16, T = 128, MiB = 1 << 20;
  const StepResult none = step(m, policy(c, "none"), B, T);
  double last_flops = 1e300;
  for (int64_t budget_mb : {80, 100, 130, 160, 190, 250}) {
    models::RecomputePolicy p;
    p.mode = "budget";
    p.budget_bytes = budget_mb * MiB;
    const std::vector<Recompute> plan = models::plan_recompute(c, B, T, p);
    const StepResult r = step(m, plan, B, T);
    std::string s;
    for (Recompute x : plan) s += models::recompute_name(x)[0];
    std::printf("  budget %4lld MiB: plan %s, measured peak %.1f MiB\n", (long long)budget_mb, s.c_str(),
                double(r.peak) / double(MiB));
    EXPECT_LE(r.peak, p.budget_bytes) << "budget " << budget_mb << " MiB, plan " << s;
    const double f = models::recompute_flops(c, B, T, plan);
    EXPECT_LE(f, last_flops) << "a larger budget must not recompute more";
    last_flops = f;
    expect_same_step(r, none, "budget " + std::to_string(budget_mb));
  }
  EXPECT_EQ(last_flops, 0.0);  // 250 MiB fits without recompute
  models::RecomputePolicy p;
  p.mode = "budget";
  p.budget_bytes = 40 * MiB;
  try {
    models::plan_recompute(c, B, T, p);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("memory.budget_mb = 40.0 MiB is below"), std::string::npos) << e.what();
  }
}

TEST(Recompute, TwoMicroBatchesWithDropoutBitwise) {
  models::GPTConfig c;
  c.n_layer = 4, c.n_embd = 64, c.n_head = 4, c.vocab_size = 500, c.block_size = 32, c.dropout = 0.2;
  models::GPT m(c);
  Generator g(5);
  m.init_weights(g);
  const StepResult none = step(m, modes_of("nnnn"), 3, 32, 2);
  for (const std::string s : {"ffff", "ssss", "fnfn", "sfns"})
    expect_same_step(step(m, modes_of(s), 3, 32, 2), none, s);
}

TEST(Recompute, PlanPolicies) {
  models::GPTConfig c;
  c.n_layer = 7;
  EXPECT_EQ(policy(c, "none"), modes_of("nnnnnnn"));
  EXPECT_EQ(policy(c, "full"), modes_of("fffffff"));
  EXPECT_EQ(policy(c, "selective"), modes_of("sssssss"));
  EXPECT_EQ(policy(c, "every_k", 2), modes_of("fnfnfnf"));
  EXPECT_EQ(policy(c, "every_k", 3), modes_of("fnnfnnf"));
  EXPECT_EQ(policy(c, "every_k", 1), modes_of("fffffff"));
  EXPECT_THROW(policy(c, "every_k", 0), ConfigError);
  EXPECT_THROW(policy(c, "sometimes"), ConfigError);
  EXPECT_THROW(policy(c, "budget"), ConfigError);  // no budget given
  models::GPT m(c);
  EXPECT_THROW(m.set_recompute(modes_of("nn")), ValueError);
  m.set_recompute(modes_of("fnsnfns"));
  EXPECT_EQ(m.recompute_modes(), modes_of("fnsnfns"));
}

// ---------------------------------------------------------------- ZeRO-3

namespace {

models::GPTConfig zero_config() {
  models::GPTConfig c;
  c.vocab_size = 64, c.block_size = 16, c.n_layer = 3, c.n_head = 2, c.n_embd = 24, c.dropout = 0.1;
  return c;
}

// The trainer's unit split (train/trainer.h).
std::vector<parallel::ParamUnit> units_of(models::GPT& m) { return train::model_units(m); }

// GPT::loss with every whole block (hooks included) inside a checkpoint.
Tensor loss_with_outer_checkpoints(models::GPT& m, const Tensor& ids, const Tensor& targets) {
  auto& t = *m.transformer;
  const int64_t B = ids.size(0), T = ids.size(1), C = m.config().n_embd;
  Tensor pos = Tensor::arange(T, DType::I64);                   // (T)
  Tensor x = F::add(t.wte->forward(ids), t.wpe->forward(pos));  // (B, T, C)
  x = t.drop->forward(x);
  F::CheckpointOptions o;
  o.rng = &m.dropout_generator();
  for (const auto& block : *t.h)
    x = F::checkpoint([&block](const std::vector<Tensor>& in) { return block->forward(in[0]); }, {x}, o);
  x = F::reshape(t.ln_f->forward(x), {B * T, C});            // (B*T, C)
  Tensor logits = F::matmul(x, t.wte->weight, false, true);  // (B*T, V)
  return F::cross_entropy(logits, targets.reshape({targets.numel()}));
}

}  // namespace

TEST(Recompute, ZeroThreeGradientsBitwise) {
  const models::GPTConfig c = zero_config();
  const int64_t B = 3, T = 16;
  auto make = [&] {
    auto m = std::make_unique<models::GPT>(c);
    Generator g(1234);
    m->init_weights(g);
    return m;
  };
  auto plain = make();
  const StepResult want = step(*plain, modes_of("nnn"), B, T);

  for (const std::string variant : {"full", "selective", "outer"}) {
    SCOPED_TRACE(variant);
    auto m = make();
    const nn::NamedTensors params = m->named_parameters();
    parallel::DataParallelOptions o;
    o.zero = 3;
    parallel::DataParallel dp(units_of(*m), dist::ProcessGroup::world(), o);
    m->set_recompute(variant == "outer" ? modes_of("nnn") : policy(c, variant));
    auto blocks_released = [&](const std::string& when) {
      for (auto& [n, p] : params)
        EXPECT_EQ(p.impl()->storage->materialized(), n.rfind("transformer.h.", 0) != 0) << n << " " << when;
    };
    m->dropout_generator().manual_seed(4242);
    dp.begin_step();
    dp.begin_micro_step(0);
    auto [x, y] = batch(B, T, c.vocab_size, 99u);
    Tensor loss = variant == "outer" ? loss_with_outer_checkpoints(*m, x, y) : m->loss(x, y);
    EXPECT_EQ(loss.item(), want.losses[0]);
    blocks_released("after the forward");
    autograd::backward(loss);
    blocks_released("after the backward");
    dp.finish_gradients();
    EXPECT_EQ(m->dropout_generator().state(), want.rng);
    for (auto& [n, p] : params) EXPECT_FALSE(p.impl()->storage->materialized()) << n << " gathered after the step";
    for (auto& [n, p] : dp.optimizer_params()) {
      ASSERT_TRUE(p.grad().defined()) << n;
      EXPECT_EQ(hash_bits(p.grad()), want.grads.at(n)) << variant << ": gradient of " << n;
    }
  }
}

// ---------------------------------------------------------------- recipe keys

TEST(Recompute, MemoryRecipeKeysAreValidated) {
  const char* base = "[train]\nsteps = 10\n[schedule]\nwarmup_steps = 1\n";
  auto msg = [&](const std::vector<std::string>& sets) -> std::string {
    try {
      train::parse_recipe(base, "m.toml", sets);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(msg({"memory.recompute=selective"}), "");
  EXPECT_EQ(msg({"memory.recompute=every_k", "memory.every_k=3"}), "");
  EXPECT_EQ(msg({"memory.recompute=budget", "memory.budget_mb=300"}), "");
  const train::Recipe r = train::parse_recipe("[memory]\nrecompute = \"budget\"\nbudget_mb = 512\n", "m.toml");
  EXPECT_EQ(r.memory.recompute, "budget");
  EXPECT_EQ(r.memory.budget_mb, 512.0);
  auto has = [](const std::string& m, const std::string& part) {
    EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' not in: " << m;
  };
  has(msg({"memory.recompute=selectiv"}), "did you mean 'selective'");
  has(msg({"memory.recompute=every_k", "memory.every_k=0"}), "memory.every_k = 0 must be >= 1");
  has(msg({"memory.recompute=budget"}), "needs memory.budget_mb > 0");
  has(msg({"memory.budget_mb=100"}), "memory.budget_mb = 100 has no effect with memory.recompute = \"none\"");
  has(msg({"memory.budget_mb=-1"}), "memory.budget_mb = -1 must be >= 0");
  has(msg({"memory.recompte=full"}), "did you mean 'memory.recompute'");
  try {
    train::parse_recipe("[memroy]\nrecompute = \"full\"\n", "m.toml");
    FAIL();
  } catch (const ConfigError& e) {
    has(e.what(), "[memory]");
  }
}
