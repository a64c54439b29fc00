// fn::checkpoint (activation recompute) on small graphs: the recomputed backward
// gives bitwise the gradients of the plain graph (inputs and captured parameters,
// with dropout: the masks are replayed from the saved generator state, and the
// generator ends where the plain forward left it), with CheckpointKeep::Inputs and
// ::GemmOutputs; parameters get their gradients through their own AccumulateGrad
// nodes (.grad accumulates, grad-ready hooks fire once per backward); the forward
// keeps only the inputs (plus the GEMM outputs); no_grad and nested regions run
// inline; autograd::recomputing() is set exactly while fn re-runs; a captured
// non-leaf is a clear error; graphs stay one-shot.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/core/rng.h"

using namespace brigade;
namespace F = brigade::fn;

namespace {

Tensor rand_tensor(const Shape& s, unsigned seed, bool grad) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-1, 1);
  std::vector<float> v(size_t(shape_numel(s)));
  for (auto& e : v) e = U(rng);
  Tensor t = Tensor::from_vector(v, s);
  if (grad) t.set_requires_grad(true);
  return t;
}

void expect_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no gradient";
  ASSERT_TRUE(want.defined()) << what << ": no reference gradient";
  const std::vector<float> a = got.to_vector(), b = want.to_vector();
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << a.size() << " elements differ";
}

// A small "block": parameters captured (as a layer's would be), two inputs, dropout,
// a GEMM, GELU, LayerNorm, attention, a residual that reads the input twice.
struct Net {
  Tensor w1 = rand_tensor({8, 16}, 1, true), b1 = rand_tensor({16}, 2, true);
  Tensor w2 = rand_tensor({16, 24}, 3, true);
  Tensor lw = rand_tensor({8}, 4, true), lb = rand_tensor({8}, 5, true);
  Generator gen{77};
  double p = 0.0;

  std::vector<Tensor> params() const { return {w1, b1, w2, lw, lb}; }
  void zero() {
    for (const Tensor& t : params()) Tensor(t).set_grad(Tensor());
  }
  // x (2, 4, 8), y (2, 4, 8) -> (2, 4, 8)
  Tensor forward(const Tensor& x, const Tensor& y) {
    Tensor a = F::layer_norm(F::add(x, y), lw, lb, 1e-5);              // (2, 4, 8)
    Tensor h = F::gelu(F::linear(a, w1, b1, F::WeightLayout::InOut));  // (2, 4, 16)
    h = F::dropout(h, p, true, gen);                                   // (2, 4, 16)
    Tensor qkv = F::linear(h, w2, Tensor(), F::WeightLayout::InOut);   // (2, 4, 24)
    Tensor att = F::causal_self_attention(qkv, 2);                     // (2, 4, 8)
    return F::add(F::mul(x, att), F::dropout(x, p, true, gen));        // (2, 4, 8)
  }
};

struct Result {
  double loss = 0;
  std::vector<Tensor> grads;  // x, y, then the parameters
  std::string rng_after_backward;
};

// One forward + backward of sum(forward(x, y) * R), plain or through a checkpoint.
Result run(Net& net, bool checkpointed, F::CheckpointKeep keep) {
  net.zero();
  net.gen.manual_seed(1234);
  Tensor x = rand_tensor({2, 4, 8}, 10, true), y = rand_tensor({2, 4, 8}, 11, true);
  Tensor r = rand_tensor({2, 4, 8}, 12, false);
  Tensor out;
  if (checkpointed) {
    F::CheckpointOptions o;
    o.keep = keep;
    o.rng = &net.gen;
    out = F::checkpoint([&net](const std::vector<Tensor>& in) { return net.forward(in[0], in[1]); }, {x, y}, o);
  } else {
    out = net.forward(x, y);
  }
  Tensor loss = F::sum_all(F::mul(out, r));
  Result res;
  res.loss = loss.item();
  const std::string rng_after_forward = net.gen.state();
  autograd::backward(loss);
  res.rng_after_backward = net.gen.state();
  EXPECT_EQ(res.rng_after_backward, rng_after_forward) << "the backward moved the dropout generator";
  res.grads = {x.grad(), y.grad()};
  for (const Tensor& p : net.params()) res.grads.push_back(p.grad());
  return res;
}

void expect_same(const Result& got, const Result& want, const std::string& what) {
  EXPECT_EQ(got.loss, want.loss) << what;
  EXPECT_EQ(got.rng_after_backward, want.rng_after_backward) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i)
    expect_bitwise(got.grads[i], want.grads[i], what + " grad " + std::to_string(i));
}

}  // namespace

TEST(Checkpoint, GradientsAreBitwiseThoseOfThePlainGraph) {
  for (double p : {0.0, 0.3}) {
    Net net;
    net.p = p;
    const Result plain = run(net, false, F::CheckpointKeep::Inputs);
    expect_same(run(net, true, F::CheckpointKeep::Inputs), plain, "keep inputs, p=" + std::to_string(p));
    expect_same(run(net, true, F::CheckpointKeep::GemmOutputs), plain, "keep GEMM outputs, p=" + std::to_string(p));
  }
}

TEST(Checkpoint, DropoutMasksAreReplayedNotRedrawn) {
  // Without restoring the generator the recompute would draw new masks: gradients would
  // differ from the plain graph's (and here they would also differ from the forward's loss).
  Net net;
  net.p = 0.5;
  const Result plain = run(net, false, F::CheckpointKeep::Inputs);
  net.zero();
  net.gen.manual_seed(1234);
  Tensor x = rand_tensor({2, 4, 8}, 10, true), y = rand_tensor({2, 4, 8}, 11, true);
  F::CheckpointOptions o;  // rng deliberately not given
  Tensor out = F::checkpoint([&net](const std::vector<Tensor>& in) { return net.forward(in[0], in[1]); }, {x, y}, o);
  autograd::backward(F::sum_all(F::mul(out, rand_tensor({2, 4, 8}, 12, false))));
  const std::vector<float> a = x.grad().to_vector(), b = plain.grads[0].to_vector();
  EXPECT_NE(a, b) << "expected different masks without the saved generator state";
}

TEST(Checkpoint, ParametersAccumulateThroughTheirOwnNodesAndHooksFireOnce) {
  Net net;
  std::vector<int> fired(5, 0);
  const std::vector<Tensor> ps = net.params();
  for (size_t i = 0; i < ps.size(); ++i) autograd::set_grad_ready_hook(ps[i], [&fired, i] { ++fired[i]; });
  const Result once = run(net, false, F::CheckpointKeep::Inputs);
  for (int f : fired) EXPECT_EQ(f, 1);
  // Two checkpointed backward passes without zeroing: .grad = 2 x the single gradient (exact: x + x).
  Tensor x = rand_tensor({2, 4, 8}, 10, true), y = rand_tensor({2, 4, 8}, 11, true);
  Tensor r = rand_tensor({2, 4, 8}, 12, false);
  net.zero();
  std::fill(fired.begin(), fired.end(), 0);
  for (int k = 0; k < 2; ++k) {
    Tensor out = F::checkpoint([&net](const std::vector<Tensor>& in) { return net.forward(in[0], in[1]); }, {x, y}, {});
    autograd::backward(F::sum_all(F::mul(out, r)));
  }
  for (int f : fired) EXPECT_EQ(f, 2) << "one hook call per parameter per backward";
  for (size_t i = 0; i < ps.size(); ++i) {
    std::vector<float> g = ps[i].grad().to_vector(), g1 = once.grads[2 + i].to_vector();
    for (auto& v : g1) v = v + v;
    EXPECT_EQ(g, g1) << "parameter " << i;
    autograd::set_grad_ready_hook(ps[i], {});
  }
}

TEST(Checkpoint, ParametersGetGradientsWhenNoInputNeedsOne) {
  // The region's only input is a constant: the node is still recorded, since fn reads parameters.
  Net plain_net, ck_net;
  Tensor x = rand_tensor({2, 4, 8}, 10, false), y = rand_tensor({2, 4, 8}, 11, false);
  autograd::backward(F::sum_all(plain_net.forward(x, y)));
  Tensor out =
      F::checkpoint([&ck_net](const std::vector<Tensor>& in) { return ck_net.forward(in[0], in[1]); }, {x, y}, {});
  EXPECT_TRUE(out.requires_grad());
  autograd::backward(F::sum_all(out));
  for (size_t i = 0; i < 5; ++i) expect_bitwise(ck_net.params()[i].grad(), plain_net.params()[i].grad(), "param");
  EXPECT_FALSE(x.grad().defined());
}

TEST(Checkpoint, ForwardKeepsOnlyTheInputsOrAlsoTheGemmOutputs) {
  Net net;
  Tensor x = rand_tensor({2, 4, 8}, 10, true), y = rand_tensor({2, 4, 8}, 11, true);
  auto live = [] { return Allocator::instance().stats().live[int(MemTag::Activations)]; };
  auto f = [&net](const std::vector<Tensor>& in) { return net.forward(in[0], in[1]); };
  const int64_t out_bytes = int64_t(Allocator::round_size(2 * 4 * 8 * 4));
  const int64_t before = live();
  {
    Tensor out = F::checkpoint(f, {x, y}, {});
    EXPECT_EQ(live() - before, out_bytes);  // the inputs are the caller's: only the output is new
  }
  {
    F::CheckpointOptions o;
    o.keep = F::CheckpointKeep::GemmOutputs;
    Tensor out = F::checkpoint(f, {x, y}, o);
    EXPECT_EQ(live() - before, out_bytes + int64_t(Allocator::round_size(2 * 4 * 16 * 4)) +
                                   int64_t(Allocator::round_size(2 * 4 * 24 * 4)));  // + both linear outputs
  }
  {
    Tensor out = net.forward(x, y);
    EXPECT_GT(live() - before, out_bytes + 2 * int64_t(Allocator::round_size(2 * 4 * 24 * 4)));
  }
  EXPECT_EQ(live(), before);  // nothing leaks without a backward
}

TEST(Checkpoint, RecomputingIsSetOnlyWhileTheRegionReRuns) {
  std::vector<bool> seen;
  Tensor x = rand_tensor({3}, 1, true);
  Tensor out = F::checkpoint(
      [&seen](const std::vector<Tensor>& in) {
        seen.push_back(autograd::recomputing());
        seen.push_back(autograd::grad_enabled());
        return F::mul(in[0], in[0]);
      },
      {x}, {});
  EXPECT_FALSE(autograd::recomputing());
  autograd::backward(F::sum_all(out));
  EXPECT_FALSE(autograd::recomputing());
  EXPECT_EQ(seen, (std::vector<bool>{false, false, true, true}));  // forward: no grad; recompute: grad on
  const std::vector<float> xv = x.to_vector(), g = x.grad().to_vector();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(g[i], xv[i] + xv[i]);
}

TEST(Checkpoint, UnderNoGradTheFunctionJustRuns) {
  Tensor x = rand_tensor({3}, 1, true);
  autograd::NoGradGuard ng;
  int calls = 0;
  Tensor out = F::checkpoint(
      [&calls](const std::vector<Tensor>& in) {
        ++calls;
        return F::mul_scalar(in[0], 2.0);
      },
      {x}, {});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out.requires_grad());
}

TEST(Checkpoint, NestedRegionsRunInlineInsideTheOuterOne) {
  Net plain_net, ck_net;
  Tensor x = rand_tensor({2, 4, 8}, 10, true), y = rand_tensor({2, 4, 8}, 11, true);
  autograd::backward(F::sum_all(plain_net.forward(x, y)));
  const std::vector<Tensor> want = {x.grad(), y.grad()};
  x.set_grad(Tensor());
  y.set_grad(Tensor());
  int inner_calls = 0;
  Tensor out = F::checkpoint(
      [&](const std::vector<Tensor>& in) {
        F::CheckpointOptions o;
        o.keep = F::CheckpointKeep::GemmOutputs;
        Tensor s = F::checkpoint(
            [&](const std::vector<Tensor>& v) {
              ++inner_calls;
              return ck_net.forward(v[0], v[1]);
            },
            {in[0], in[1]}, o);
        return F::mul_scalar(s, 1.0);
      },
      {x, y}, {});
  autograd::backward(F::sum_all(out));
  EXPECT_EQ(inner_calls, 2);  // the forward and the outer recompute; no separate inner recompute
  expect_bitwise(x.grad(), want[0], "x");
  expect_bitwise(y.grad(), want[1], "y");
  for (size_t i = 0; i < 5; ++i) expect_bitwise(ck_net.params()[i].grad(), plain_net.params()[i].grad(), "param");
}

TEST(Checkpoint, ChainOfRegionsAndInputsUsedOutsideToo) {
  // Three regions in a chain, the first input also read after the chain: gradients of a
  // tensor used inside and outside a region are summed as in the plain graph.
  Tensor w = rand_tensor({6, 6}, 3, true);
  auto step = [&w](const std::vector<Tensor>& in) { return F::gelu(F::matmul(in[0], w)); };
  auto loss_of = [&](bool ck) {
    w.set_grad(Tensor());
    Tensor x = rand_tensor({4, 6}, 4, true);
    Tensor h = x;
    for (int i = 0; i < 3; ++i) h = ck ? F::checkpoint(step, {h}, {}) : step({h});
    autograd::backward(F::sum_all(F::mul(F::add(h, x), x)));
    return std::vector<Tensor>{x.grad(), w.grad()};
  };
  const auto plain = loss_of(false), ck = loss_of(true);
  expect_bitwise(ck[0], plain[0], "x");
  expect_bitwise(ck[1], plain[1], "w");
}

TEST(Checkpoint, CapturedNonLeafIsAClearError) {
  Tensor x = rand_tensor({3}, 1, true);
  Tensor outside = F::mul_scalar(x, 3.0);  // a non-leaf of the surrounding graph
  Tensor out = F::checkpoint([&outside](const std::vector<Tensor>& in) { return F::mul(in[0], outside); }, {x}, {});
  try {
    autograd::backward(F::sum_all(out));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("pass that tensor in the checkpoint's inputs"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, SecondBackwardThrows) {
  Tensor x = rand_tensor({3}, 1, true);
  Tensor out = F::checkpoint([](const std::vector<Tensor>& in) { return F::mul(in[0], in[0]); }, {x}, {});
  Tensor loss = F::sum_all(out);
  autograd::backward(loss);
  EXPECT_THROW(autograd::backward(loss), ValueError);
}
