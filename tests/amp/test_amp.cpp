// Mixed precision (amp/): policy table, autocast, loss scalers, and the fp16
// underflow mechanism that loss scaling exists for. Expected values come from the
// definitions (docs/mixed-precision.md), algebra, or an fp32 run of the same model.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "brigade/amp/loss_scaler.h"
#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/core/rng.h"
#include "brigade/nn/layers.h"
#include "brigade/optim/optimizer.h"
#include "support/numeric.h"

using namespace brigade;
namespace F = brigade::fn;
using amp::Level;
using amp::Op;
using amp::Rule;

namespace {

// A parameter: an f32 leaf allocated as MemTag::Params, N(0, std) from seed.
Tensor make_param(const Shape& s, uint64_t seed, double std = 0.5) {
  Tensor p = Tensor::empty(s, DType::F32, MemTag::Params);
  Generator g(seed);
  g.normal_(p, 0.0, std);
  p.set_requires_grad(true);
  return p;
}

Tensor make_input(const Shape& s, uint64_t seed) {
  Tensor x = Tensor::empty(s);
  Generator g(seed);
  g.normal_(x);
  return x;
}

}  // namespace

// ------------------------------------------------------------------ the table

TEST(AmpPolicy, TableFollowsTheDefinitionOfEachLevel) {
  for (size_t i = 0; i < size_t(Op::kCount); ++i) {
    const Op op = Op(i);
    const bool gemm = op == Op::Linear || op == Op::Matmul || op == Op::Attention || op == Op::Conv;
    const bool sensitive = op == Op::LayerNorm || op == Op::BatchNorm || op == Op::Softmax || op == Op::CrossEntropy ||
                           op == Op::Reduction;
    SCOPED_TRACE(std::string(amp::op_name(op)));
    if (op == Op::Dropout) {  // a mask multiply: runs in whatever it is given, at every level
      for (int l = 0; l < 4; ++l) EXPECT_EQ(amp::rule(op, Level(l)), Rule::Keep);
      continue;
    }
    EXPECT_EQ(amp::rule(op, Level::O0), Rule::Keep);                    // O0: as given
    EXPECT_EQ(amp::rule(op, Level::O1), gemm ? Rule::Low : Rule::F32);  // O1: allow-list low, rest fp32
    // O2: all low but the sensitive; batch norm computes in f32 on its 16-bit input (mixed)
    EXPECT_EQ(amp::rule(op, Level::O2), op == Op::BatchNorm ? Rule::Mixed : sensitive ? Rule::F32 : Rule::Low);
    EXPECT_EQ(amp::rule(op, Level::O3), Rule::Low);  // O3: all low
  }
  EXPECT_NE(amp::policy_table_markdown().find("| layer_norm | keep | f32 | f32 | low |"), std::string::npos);
  EXPECT_NE(amp::policy_table_markdown().find("| conv | keep | low | low | low |"), std::string::npos);
  EXPECT_NE(amp::policy_table_markdown().find("| batch_norm | keep | f32 | mixed | low |"), std::string::npos);
  EXPECT_NE(amp::policy_table_markdown().find("| pool | keep | f32 | low | low |"), std::string::npos);
}

TEST(AmpPolicy, NamesAndScopes) {
  EXPECT_EQ(amp::level_from_name("O2"), Level::O2);
  EXPECT_THROW(amp::level_from_name("o2"), ValueError);
  EXPECT_EQ(amp::current_policy().level, Level::O0);
  {
    amp::AutocastScope a({Level::O1, DType::F16});
    EXPECT_EQ(amp::current_policy().level, Level::O1);
    {
      amp::AutocastScope b({Level::O3, DType::BF16});
      EXPECT_EQ(amp::compute_dtype(Op::LayerNorm, {DType::F32}), DType::BF16);
    }
    EXPECT_EQ(amp::compute_dtype(Op::Linear, {DType::F32, DType::F32}), DType::F16);
    EXPECT_EQ(amp::compute_dtype(Op::Gelu, {DType::F16}), DType::F32);
  }
  EXPECT_EQ(amp::current_policy().level, Level::O0);
  // O0 keeps the inputs' dtype and promotes a mix to f32
  EXPECT_EQ(amp::compute_dtype(Op::Linear, {DType::BF16, DType::BF16}), DType::BF16);
  EXPECT_EQ(amp::compute_dtype(Op::Elementwise, {DType::BF16, DType::F16}), DType::F32);
  EXPECT_THROW(amp::AutocastScope({Level::O2, DType::F32}), ValueError);
}

// ------------------------------------------------------------------ autocast through fn::

TEST(Autocast, DtypesPerLevelAndFp32GradientsForFp32Parameters) {
  const int64_t N = 6, C = 8;
  Tensor w = make_param({C, C}, 1), b = make_param({C}, 2), lw = make_param({C}, 3), lb = make_param({C}, 4);
  Tensor x = make_input({N, C}, 5);
  struct Want {
    Level level;
    DType lin, norm, act;
  };
  for (const Want& want :
       {Want{Level::O0, DType::F32, DType::F32, DType::F32}, Want{Level::O1, DType::BF16, DType::F32, DType::F32},
        Want{Level::O2, DType::BF16, DType::F32, DType::BF16},
        Want{Level::O3, DType::BF16, DType::BF16, DType::BF16}}) {
    SCOPED_TRACE(std::string(amp::level_name(want.level)));
    for (Tensor* p : {&w, &b, &lw, &lb}) p->set_grad(Tensor());
    Tensor loss;
    {
      amp::AutocastScope ac({want.level, DType::BF16});
      Tensor h = F::linear(x, w, b, ops::WeightLayout::OutIn);  // (N, C)
      EXPECT_EQ(h.dtype(), want.lin);
      Tensor n = F::layer_norm(h, lw, lb, 1e-5);  // (N, C)
      EXPECT_EQ(n.dtype(), want.norm);
      Tensor g = F::gelu(n);  // (N, C)
      EXPECT_EQ(g.dtype(), want.act);
      loss = F::mean_all(F::mul(g, g));
    }
    autograd::backward(loss);
    for (Tensor* p : {&w, &b, &lw, &lb}) {
      ASSERT_TRUE(p->grad().defined());
      EXPECT_EQ(p->grad().dtype(), DType::F32);  // fp32 masters get fp32 gradients at every level
    }
  }
}

// Frozen parameters (LoRA's base, requires_grad off) read by f32 activations, through the ops GPT
// and LLaMA use: embedding (token and position tables), add, linear with bias, layer norm, RMS
// norm and the tied head (matmul against the embedding table).
struct FrozenRun {
  std::vector<std::vector<float>> outs;  // each op's output, then the input's gradient
  std::vector<DType> dtypes;             // each op's output dtype
  int64_t held = 0;                      // params bytes alive with the graph, above the stored weights
};
FrozenRun run_frozen(amp::Policy policy, DType storage, bool trainable) {
  const int64_t N = 12, C = 64, V = 100;
  // N(0, 0.5) values, rounded once to bf16 whatever the storage: an f32 weight holds the same values
  auto weight = [&](const Shape& s, uint64_t seed) {
    Tensor v = make_param(s, seed).detach().to(DType::BF16);
    Tensor p = Tensor::empty(s, trainable ? DType::F32 : storage, MemTag::Params);
    p.copy_(v);
    p.set_requires_grad(trainable);
    return p;
  };
  Tensor emb = weight({V, C}, 1), w = weight({C, C}, 2), b = weight({C}, 3), lw = weight({C}, 4), lb = weight({C}, 5),
         rw = weight({C}, 6);
  std::vector<int64_t> id(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) id[size_t(i)] = (i * 37 + 5) % V;
  const Tensor ids = Tensor::from_vector_i64(id, {N});
  Tensor x = make_input({N, C}, 7);
  x.set_requires_grad(true);
  FrozenRun r;
  Tensor loss;
  {
    amp::AutocastScope ac(policy);
    Allocator& a = Allocator::instance();
    const int64_t p0 = a.stats().live[size_t(MemTag::Params)];
    const Tensor e = F::embedding(emb, ids);                        // (N, C)
    const Tensor h = F::add(x, e);                                  // (N, C)
    const Tensor l = F::linear(h, w, b, ops::WeightLayout::OutIn);  // (N, C)
    const Tensor n = F::layer_norm(l, lw, lb, 1e-5);                // (N, C)
    const Tensor q = F::rms_norm(n, rw, 1e-6);                      // (N, C)
    const Tensor logits = F::matmul(q, emb, false, true);           // (N, V)
    r.held = a.stats().live[size_t(MemTag::Params)] - p0;
    for (const Tensor* t : {&e, &h, &l, &n, &q, &logits}) {
      r.outs.push_back(t->to_vector());
      r.dtypes.push_back(t->dtype());
    }
    loss = F::mean_all(F::mul(logits, logits));
  }
  autograd::backward(loss);
  r.outs.push_back(x.grad().to_vector());
  r.dtypes.push_back(x.grad().dtype());
  return r;
}

// At O0 a frozen bf16 weight computes as an f32 weight holding its values: every output and the
// input's gradient bitwise, in f32 (the embedding's rows come out widened; the other ops promote
// the mix). The GEMMs keep no working copy of a frozen weight between forward and backward (they
// cast it again in the backward): what the graph holds under params is the norms' C-element f32
// weight copies only, below one 64 x 64 f32 matrix. At O2 a frozen f32 weight gives what a
// trainable one gives, bitwise, without the bf16 working copies the trainable ones keep.
TEST(Autocast, FrozenBf16WeightsComputeInF32AtO0) {
  const amp::Policy o0{Level::O0, DType::BF16}, o2{Level::O2, DType::BF16};
  const FrozenRun want = run_frozen(o0, DType::F32, false), got = run_frozen(o0, DType::BF16, false);
  ASSERT_EQ(got.outs.size(), want.outs.size());
  for (size_t i = 0; i < want.outs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got.dtypes[i], DType::F32);
    EXPECT_EQ(got.outs[i], want.outs[i]);
  }
  EXPECT_EQ(want.held, 0);  // nothing cast
  EXPECT_GT(got.held, 0);
  EXPECT_LT(got.held, 64 * 64 * 4);

  const FrozenRun trained = run_frozen(o2, DType::F32, true), frozen = run_frozen(o2, DType::F32, false);
  for (size_t i = 0; i < trained.outs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(frozen.dtypes[i], trained.dtypes[i]);
    EXPECT_EQ(frozen.outs[i], trained.outs[i]);
  }
  EXPECT_EQ(frozen.dtypes[2], DType::BF16);  // the linear runs in bf16 at O2
  // trainable: the bf16 copies of w (64 x 64) and of the table (100 x 64) saved for the backward
  EXPECT_GE(trained.held, (64 * 64 + 100 * 64) * 2);
  EXPECT_LT(frozen.held, 64 * 64 * 2);
}

TEST(Autocast, LowPrecisionResultsTrackFp32WithinTheDtypesRounding) {
  // One linear + GELU + loss: O1/O2 in bf16 and fp16 against O0. Inputs of the GEMM are
  // rounded once (unit roundoff u: bf16 2^-8, f16 2^-11) and its output once, so the
  // forward and the gradients agree with fp32 to a small multiple of u.
  const int64_t N = 32, C = 16;
  Tensor w = make_param({C, C}, 11, 0.25), x = make_input({N, C}, 12);
  auto run = [&](amp::Policy p, std::vector<float>& grad) {
    w.set_grad(Tensor());
    Tensor loss;
    {
      amp::AutocastScope ac(p);
      loss = F::mean_all(F::gelu(F::linear(x, w, Tensor(), ops::WeightLayout::OutIn)));
    }
    autograd::backward(loss);
    grad = w.grad().to_vector();
    return loss.item();
  };
  std::vector<float> g32, g;
  const double l32 = run({Level::O0, DType::BF16}, g32);
  for (auto [p, u] :
       {std::pair{amp::Policy{Level::O1, DType::BF16}, 0x1p-8}, std::pair{amp::Policy{Level::O2, DType::BF16}, 0x1p-8},
        std::pair{amp::Policy{Level::O1, DType::F16}, 0x1p-11},
        std::pair{amp::Policy{Level::O2, DType::F16}, 0x1p-11}}) {
    SCOPED_TRACE(fmt::format("{} {}", amp::level_name(p.level), dtype_name(p.low)));
    const double l = run(p, g);
    EXPECT_LE(std::fabs(l - l32), 8 * u * std::fabs(l32) + 1e-6);
    const double e = test_support::rel_err(g, g32, 1e-30);
    EXPECT_LE(e, 16 * u);
    EXPECT_GT(e, 0.0);  // it really ran in low precision
  }
}

TEST(Autocast, CastOfAParameterIsAWeightCopyAndItsGradientComesBackInF32) {
  Tensor w = make_param({4, 4}, 21);
  Tensor c = F::cast(w, DType::F16);
  EXPECT_EQ(c.dtype(), DType::F16);
  EXPECT_EQ(c.tag(), MemTag::Params);
  EXPECT_TRUE(F::cast(w, DType::F32).same_storage(w));  // no copy when the dtype matches
  autograd::backward(F::sum_all(F::cast(c, DType::F32)));
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  for (float v : w.grad().to_vector()) EXPECT_EQ(v, 1.0f);
}

TEST(Autocast, RecomputeReplaysThePolicyOfTheForward) {
  // A checkpointed transformer block under O2: the recompute runs in the backward, after the
  // autocast scope has closed; it must re-run in bf16 and give the same gradients bitwise.
  Generator gen(3);
  nn::TransformerBlock blk(16, 2, 0.0, 1e-5, &gen);
  for (auto& [name, p] : blk.named_parameters()) {
    Generator g(std::hash<std::string>{}(name));
    g.normal_(p, 0.0, 0.2);
  }
  Tensor x = make_input({2, 8, 16}, 31);
  auto grads = [&](nn::Recompute mode) {
    blk.recompute = mode;
    for (auto& [name, p] : blk.named_parameters()) p.set_grad(Tensor());
    Tensor loss;
    {
      amp::AutocastScope ac({Level::O2, DType::BF16});
      loss = F::mean_all(F::mul(blk.forward(x), blk.forward(x)));
    }
    autograd::backward(loss);
    std::vector<std::vector<float>> g;
    for (auto& [name, p] : blk.named_parameters()) g.push_back(p.grad().to_vector());
    return g;
  };
  const auto none = grads(nn::Recompute::None);
  EXPECT_EQ(grads(nn::Recompute::Full), none);
  EXPECT_EQ(grads(nn::Recompute::Selective), none);
}

// ------------------------------------------------------------------ loss scalers

namespace {
amp::UnscaleResult clean(double amax = 1e-3) { return {0.0, amax}; }
amp::UnscaleResult overflow() { return {1.0, 0.0}; }
}  // namespace

TEST(LossScaler, NoneIsScaleOneAndNeverSkips) {
  amp::LossScaler s;
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.update(overflow()));
  EXPECT_EQ(s.state(), "");
}

TEST(LossScaler, StaticSkipsOverflowsAndNeverMoves) {
  amp::LossScalerOptions o;
  o.mode = amp::ScaleMode::Static;
  o.init_scale = 1024;
  o.growth_interval = 1;
  amp::LossScaler s(o);
  EXPECT_FALSE(s.update(clean()));
  EXPECT_TRUE(s.update(overflow()));
  EXPECT_FALSE(s.update(clean()));
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.skipped(), 1);
}

TEST(LossScaler, DynamicGrowsAfterNCleanStepsAndHalvesOnOverflowWithinFloorAndCeiling) {
  amp::LossScalerOptions o;
  o.mode = amp::ScaleMode::Dynamic;
  o.init_scale = 8;
  o.growth_interval = 3;
  o.min_scale = 2;
  o.max_scale = 32;
  amp::LossScaler s(o);
  // clean, clean, clean -> x2 on the third
  EXPECT_FALSE(s.update(clean()));
  EXPECT_FALSE(s.update(clean()));
  EXPECT_EQ(s.scale(), 8.0);
  EXPECT_FALSE(s.update(clean()));
  EXPECT_EQ(s.scale(), 16.0);
  // two clean, then an overflow resets the count: skip and halve
  s.update(clean());
  s.update(clean());
  EXPECT_TRUE(s.update(overflow()));
  EXPECT_EQ(s.scale(), 8.0);
  for (int i = 0; i < 2; ++i) s.update(clean());
  EXPECT_EQ(s.scale(), 8.0);  // the count restarted after the overflow
  s.update(clean());
  EXPECT_EQ(s.scale(), 16.0);
  for (int i = 0; i < 9; ++i) s.update(clean());
  EXPECT_EQ(s.scale(), 32.0);  // ceiling
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(s.update(overflow()));
  EXPECT_EQ(s.scale(), 2.0);  // floor
  EXPECT_EQ(s.skipped(), 7);
  EXPECT_EQ(s.overflows(), 7);
}

TEST(LossScaler, AdaptiveHysteresisToleratesKOverflowsInARow) {
  amp::LossScalerOptions o;
  o.mode = amp::ScaleMode::Adaptive;
  o.init_scale = 1024;
  o.hysteresis = 3;
  o.growth_interval = 100;
  amp::LossScaler s(o);
  // k = 3 overflows in a row: all three steps skipped, the scale stays
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.update(overflow()));
  EXPECT_EQ(s.scale(), 1024.0);
  // a clean step resets the streak: three more are tolerated again
  EXPECT_FALSE(s.update(clean()));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.update(overflow()));
  EXPECT_EQ(s.scale(), 1024.0);
  // the fourth in a row backs off, and so does every further one in that streak
  EXPECT_TRUE(s.update(overflow()));
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_TRUE(s.update(overflow()));
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_EQ(s.skipped(), 8);
  EXPECT_EQ(s.overflows(), 8);
}

TEST(LossScaler, AdaptiveGrowsToThePowerOfTwoThatKeepsTheLargestGradientClearOfTheMax) {
  amp::LossScalerOptions o;
  o.mode = amp::ScaleMode::Adaptive;
  o.init_scale = 4;
  o.growth_interval = 2;
  o.dtype = DType::F16;
  amp::LossScaler s(o);
  s.update(clean(1e-3));
  s.update(clean(2e-3));  // window max 2e-3: 65504 / (2e-3 * 256) = 127937.5 -> 2^16
  EXPECT_EQ(s.scale(), 65536.0);
  // a window with larger gradients does not lower the scale (only overflows do)
  s.update(clean(10.0));
  s.update(clean(10.0));
  EXPECT_EQ(s.scale(), 65536.0);
  // the ceiling still applies
  s.update(clean(1e-9));
  s.update(clean(1e-9));
  EXPECT_EQ(s.scale(), o.max_scale);
}

TEST(LossScaler, UnscaleDividesAndFindsInfAndNaNInOnePass) {
  amp::LossScalerOptions o;
  o.mode = amp::ScaleMode::Dynamic;
  o.init_scale = 4;
  amp::LossScaler s(o);
  Tensor a = Tensor::from_vector({4, -8, 2}, {3});
  Tensor big = Tensor::full({100001}, 2.0);  // the OpenMP branch
  amp::UnscaleResult r = s.unscale_({a, Tensor(), big});
  EXPECT_EQ(r.found_inf, 0.0);
  EXPECT_EQ(r.amax, 2.0);
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1, -2, 0.5f}));
  EXPECT_EQ(big.to_vector()[100000], 0.5f);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    big.data<float>()[77777] = bad;
    EXPECT_EQ(s.unscale_({a, big}).found_inf, 1.0) << bad;
    big.data<float>()[77777] = 1.0f;
  }
  // a finite value that overflows nothing is fine; only the non-finite ones count
  Tensor huge = Tensor::full({3}, 3e38);
  EXPECT_EQ(s.unscale_({huge}).found_inf, 0.0);
  Tensor h16 = Tensor::full({3}, 1.0, DType::F16);
  EXPECT_THROW(s.unscale_({h16}), InternalError);
}

TEST(LossScaler, StateRoundTripsAndBadStateIsACheckpointError) {
  amp::LossScalerOptions o;
  o.mode = amp::ScaleMode::Adaptive;
  o.growth_interval = 5;
  amp::LossScaler a(o), b(o);
  a.update(overflow());
  a.update(overflow());
  a.update(clean(3e-4));
  b.set_state(a.state());
  for (int i = 0; i < 7; ++i) {
    const amp::UnscaleResult r = i % 3 == 2 ? overflow() : clean(1e-4 * (i + 1));
    EXPECT_EQ(a.update(r), b.update(r));
    EXPECT_EQ(a.scale(), b.scale());
  }
  EXPECT_EQ(a.state(), b.state());
  EXPECT_THROW(b.set_state("{\"scale\": 2}"), CheckpointError);
  EXPECT_THROW(b.set_state("not json"), CheckpointError);
  EXPECT_THROW(amp::scale_mode_from_name("dynamc"), ValueError);
}

// The counters of a saved state are whole numbers >= 0, checked: a float such as 1e300 reached an
// int64_t conversion (undefined behaviour) when state.json was damaged (found writing its fuzz target, tests/fuzz).
TEST(LossScaler, AStateWithAFractionalOrHugeCounterIsACheckpointError) {
  amp::LossScalerOptions o;
  o.mode = amp::ScaleMode::Dynamic;
  amp::LossScaler s(o);
  auto state = [](const std::string& good_steps) {
    return "{\"scale\": 1024.0, \"good_steps\": " + good_steps +
           ", \"streak\": 0, \"overflows\": 0, \"skipped\": 0, \"window_amax\": 0}";
  };
  for (const auto& [bad, shown] :
       std::vector<std::pair<std::string, std::string>>{{"1e300", "1e+300"}, {"2.5", "2.5"}, {"-3", "-3"}}) {
    try {
      s.set_state(state(bad));
      ADD_FAILURE() << bad << ": no error";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("\"good_steps\" holds " + shown + ", not a whole number >= 0"),
                std::string::npos)
          << e.what();
    }
  }
  s.set_state(state("7.0"));  // a whole number written as a float reads
  EXPECT_EQ(s.scale(), 1024.0);
}

// ------------------------------------------------------------------ the mechanism

// A softmax classifier whose gradients are tiny (its loss is weighted by 1e-6, as a very
// large batch mean or a small loss weight would make them): under O2 fp16 the gradient of
// the logits, ~1e-9, rounds to zero in fp16 (smallest subnormal 6e-8), so without loss
// scaling the weights get exactly zero gradients and never move. Dynamic scaling (2^16)
// lifts it to ~1e-4, which fp16 holds; the unscaled fp32 gradients then train the model
// as fp32 does. AdamW with a tiny eps is invariant to the gradients' overall size, so the
// fp32 reference trains normally despite the 1e-6.
TEST(LossScalingMechanism, Fp16GradientsUnderflowWithoutScalingAndTrainWithDynamicScaling) {
  const int64_t N = 64, IN = 16, K = 8;
  Tensor x = make_input({N, IN}, 41);
  Tensor wtrue = make_input({K, IN}, 42);
  std::vector<int64_t> t(N);
  {
    std::vector<float> s = ops::matmul(x, wtrue, false, true).to_vector();  // (N, K)
    for (int64_t n = 0; n < N; ++n)
      t[size_t(n)] = std::max_element(s.begin() + n * K, s.begin() + (n + 1) * K) - (s.begin() + n * K);
  }
  Tensor targets = Tensor::from_vector_i64(t, {N});
  constexpr double kWeight = 1e-6;

  struct Run {
    std::vector<double> losses;
    std::vector<float> w0, w;
    int64_t zero_grad_steps = 0;
  };
  auto train = [&](amp::Policy p, amp::ScaleMode mode) {
    Tensor w = make_param({K, IN}, 43, 0.05), b = make_param({K}, 44, 0.05);
    optim::AdamW opt({{"w", w}, {"b", b}}, optim::AdamWOptions{0.9, 0.999, 1e-20, 0.0});
    amp::LossScalerOptions so;
    so.mode = mode;
    so.dtype = p.low;
    amp::LossScaler scaler(so);
    Run r;
    r.w0 = w.to_vector();
    for (int step = 0; step < 40; ++step) {
      opt.zero_grad();
      Tensor loss;
      {
        amp::AutocastScope ac(p);
        loss = F::cross_entropy(F::linear(x, w, b, ops::WeightLayout::OutIn), targets);
      }
      r.losses.push_back(loss.item());
      autograd::backward(F::mul_scalar(loss, kWeight * scaler.scale()));  // f32, outside autocast
      const amp::UnscaleResult u = scaler.unscale_({w.grad(), b.grad()});
      if (scaler.update(u)) continue;
      bool all_zero = true;
      for (float v : w.grad().to_vector()) all_zero &= v == 0.0f;
      r.zero_grad_steps += all_zero;
      opt.step(0.05);
    }
    r.w = w.to_vector();
    return r;
  };
  const Run fp32 = train({Level::O0, DType::F16}, amp::ScaleMode::None);
  const Run unscaled = train({Level::O2, DType::F16}, amp::ScaleMode::None);
  const Run scaled = train({Level::O2, DType::F16}, amp::ScaleMode::Dynamic);

  EXPECT_LT(fp32.losses.back(), 0.5 * fp32.losses.front());  // the reference learns
  // without scaling: every gradient flushed to zero, the weights never moved
  EXPECT_EQ(unscaled.zero_grad_steps, 40);
  EXPECT_EQ(unscaled.w, unscaled.w0);
  EXPECT_EQ(unscaled.losses.back(), unscaled.losses.front());
  // with dynamic scaling: it trains, and follows the fp32 curve to fp16 rounding
  EXPECT_EQ(scaled.zero_grad_steps, 0);
  EXPECT_LT(scaled.losses.back(), 0.5 * scaled.losses.front());
  for (size_t i = 0; i < fp32.losses.size(); ++i)
    EXPECT_NEAR(scaled.losses[i], fp32.losses[i], 0.02 * fp32.losses[i]) << "step " << i;
}
