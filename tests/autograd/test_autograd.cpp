// Autograd engine mechanics: accumulation into leaves, several uses of one
// tensor, views, no_grad, error messages, graph lifetime (no leak without
// backward, a second backward is an error). Expected values come from algebra;
// every fn:: derivative rule is also checked end to end against central finite
// differences (AutogradRules); the raw backward ops are checked by the op
// harness (tests/ops), whole-model gradients against PyTorch (tests/models).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <span>
#include <string>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/nn/layers.h"
#include "support/numeric.h"

using namespace brigade;
namespace F = brigade::fn;

static Tensor leaf(std::vector<float> v, Shape s) {
  Tensor t = Tensor::from_vector(v, s);
  t.set_requires_grad(true);
  return t;
}

TEST(Autograd, SharedInputGradientsSum) {
  // y = sum(x * x + 3 x)  =>  dy/dx = 2x + 3
  Tensor x = leaf({1, -2, 0.5f, 4}, {4});
  Tensor y = F::sum_all(F::add(F::mul(x, x), F::mul_scalar(x, 3.0)));
  autograd::backward(y);
  std::vector<float> g = x.grad().to_vector();
  std::vector<float> want{5, -1, 4, 11};
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(g[i], want[i]);
}

TEST(Autograd, LeafGradientsAccumulateAcrossBackwardCalls) {
  Tensor x = leaf({1, 2}, {2});
  for (int i = 0; i < 3; ++i) autograd::backward(F::sum_all(F::mul_scalar(x, 2.0)));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{6, 6}));
  EXPECT_EQ(x.grad().tag(), MemTag::Grads);
}

TEST(Autograd, BroadcastAddReducesGradient) {
  // y = sum((a + b) * w) with a (2,3), b (3) broadcast: db = column sums of w
  Tensor a = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = leaf({0, 0, 0}, {3});
  Tensor w = Tensor::from_vector({1, 2, 3, 10, 20, 30}, {2, 3});
  autograd::backward(F::sum_all(F::mul(F::add(a, b), w)));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(a.grad().to_vector(), w.to_vector());
}

TEST(Autograd, ViewsRouteGradientsToTheRightElements) {
  // y = sum(narrow(x, 1, 1, 2)^T * c): gradient is c^T in the narrowed columns, 0 elsewhere
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor c = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  Tensor v = F::transpose(F::narrow(x, 1, 1, 2), 0, 1);  // (2, 2)
  autograd::backward(F::sum_all(F::mul(v, c)));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{0, 1, 3, 0, 2, 4}));
}

TEST(Autograd, MatmulGradientsMatchAlgebra) {
  // y = sum(A @ B): dA = 1 @ B^T (row sums of B broadcast), dB = A^T @ 1
  Tensor A = leaf({1, 2, 3, 4}, {2, 2});
  Tensor B = leaf({5, 6, 7, 8}, {2, 2});
  autograd::backward(F::sum_all(F::matmul(A, B)));
  EXPECT_EQ(A.grad().to_vector(), (std::vector<float>{11, 15, 11, 15}));
  EXPECT_EQ(B.grad().to_vector(), (std::vector<float>{4, 4, 6, 6}));
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y;
  {
    autograd::NoGradGuard ng;
    y = F::sum_all(F::mul(x, x));
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_THROW(autograd::backward(y), ValueError);
}

TEST(Autograd, NonScalarRootNeedsExplicitGradient) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = F::mul_scalar(x, 3.0);
  try {
    autograd::backward(y);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("not a scalar"), std::string::npos) << e.what();
  }
  autograd::backward(y, Tensor::from_vector({1, 10}, {2}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{3, 30}));
}

TEST(Autograd, InputsWithoutRequiresGradGetNoGradient) {
  Tensor x = leaf({1, 2}, {2});
  Tensor c = Tensor::from_vector({3, 4}, {2});
  autograd::backward(F::sum_all(F::mul(x, c)));
  EXPECT_FALSE(c.grad().defined());
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{3, 4}));
}

TEST(Autograd, ModuleNamesAreHierarchical) {
  struct Net : nn::Module {
    Net() {
      fc = register_module("fc", std::make_shared<nn::Linear>(3, 2));
      ln = register_module("ln", std::make_shared<nn::LayerNorm>(2));
    }
    std::shared_ptr<nn::Linear> fc;
    std::shared_ptr<nn::LayerNorm> ln;
  };
  Net net;
  std::vector<std::string> names;
  for (auto& [n, p] : net.named_parameters()) {
    names.push_back(n);
    EXPECT_EQ(p.tag(), MemTag::Params);
    EXPECT_TRUE(p.requires_grad());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fc.weight", "fc.bias", "ln.weight", "ln.bias"}));
  EXPECT_EQ(net.num_parameters(), 6 + 2 + 2 + 2);
}

// ------------------------------------------------------------------ derivative rules vs finite differences
//
// Each fn:: function is checked through a scalar L = sum(f(leaves) * R) with a fixed random R
// (so every output element carries a distinct weight): the autograd gradient of every leaf
// against central finite differences of L, evaluated in f32 under no_grad with h = 1e-2.
// Inputs are well conditioned (values O(1)), so truncation error O(h^2) and f32 rounding
// (~1e-7 |L| / h) both stay far below the 1e-2 tolerance; a wrong rule is off by O(1).

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor rand_tensor(const Shape& s, unsigned seed, float lo = -1, float hi = 1, bool grad = true) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& e : v) e = U(rng);
  Tensor t = Tensor::from_vector(v, s);
  if (grad) t.set_requires_grad(true);
  return t;
}

// L = sum(f(x) * R) when f's output is not already a scalar.
Tensor weighted_sum(const Tensor& y, unsigned seed) {
  if (y.numel() == 1) return y;
  return F::sum_all(F::mul(y, rand_tensor(y.shape(), seed, -1, 1, false)));
}

// Checks the gradient of every leaf that requires grad (leaves must be contiguous).
void check_fd(const std::string& what, const Fn& f, std::vector<Tensor> leaves, double h = 1e-2, double tol = 1e-2) {
  for (Tensor& t : leaves) ASSERT_TRUE(t.is_contiguous()) << what;
  autograd::backward(weighted_sum(f(leaves), 999));
  for (size_t li = 0; li < leaves.size(); ++li) {
    Tensor& x = leaves[li];
    if (!x.requires_grad()) continue;
    ASSERT_TRUE(x.grad().defined()) << what << ": leaf " << li << " got no gradient";
    autograd::NoGradGuard ng;
    const std::vector<double> fd = test_support::central_difference([&] { return weighted_sum(f(leaves), 999).item(); },
                                                                    std::span(x.data<float>(), size_t(x.numel())), h);
    // floor 1e-3: gradients below it are compared in absolute terms
    EXPECT_LE(test_support::rel_err(x.grad().to_vector(), fd, 1e-3), tol)
        << what << ": gradient of leaf " << li << " vs finite differences";
  }
}

}  // namespace

TEST(AutogradRules, Softmax) {
  check_fd("softmax", [](const std::vector<Tensor>& v) { return F::softmax(v[0]); }, {rand_tensor({3, 7}, 1, -2, 2)});
  // Non-contiguous input (the transpose of a leaf) and 3-D.
  check_fd("softmax of a transpose", [](const std::vector<Tensor>& v) { return F::softmax(F::transpose(v[0], 1, 2)); },
           {rand_tensor({2, 5, 4}, 2, -2, 2)});
}

// add_relu against finite differences (no sum within 2h of the kink), and bitwise the unfused
// relu(add(a, b)) in its output and both gradients.
TEST(AutogradRules, AddReluIsReluOfAdd) {
  const Tensor a = rand_tensor({3, 5}, 21), b = rand_tensor({3, 5}, 22);
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  int positive = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_GT(std::abs(va[i] + vb[i]), 0.02f) << i;
    positive += va[i] + vb[i] > 0;
  }
  ASSERT_GT(positive, 3);
  ASSERT_LT(positive, 12);
  check_fd("add_relu", [](const std::vector<Tensor>& v) { return F::add_relu(v[0], v[1]); }, {a, b});
  const Tensor a1 = rand_tensor({3, 5}, 21), b1 = rand_tensor({3, 5}, 22);
  const Tensor a2 = rand_tensor({3, 5}, 21), b2 = rand_tensor({3, 5}, 22);
  const Tensor fused = F::add_relu(a2, b2), unfused = F::relu(F::add(a1, b1));
  EXPECT_EQ(std::string(fused.grad_fn()->name()), "AddReluBackward");
  EXPECT_EQ(fused.to_vector(), unfused.to_vector());
  autograd::backward(weighted_sum(unfused, 7));
  autograd::backward(weighted_sum(fused, 7));
  EXPECT_EQ(a2.grad().to_vector(), a1.grad().to_vector());
  EXPECT_EQ(b2.grad().to_vector(), b1.grad().to_vector());
}

TEST(AutogradRules, AttentionCausalAndFull) {
  for (bool causal : {true, false}) {
    check_fd(causal ? "attention causal" : "attention full",
             [causal](const std::vector<Tensor>& v) {
               return F::attention(v[0], v[1], v[2], causal ? F::AttentionMask::causal() : F::AttentionMask{});
             },
             {rand_tensor({2, 2, 5, 4}, 3, -1.5, 1.5), rand_tensor({2, 2, 5, 4}, 4, -1.5, 1.5),
              rand_tensor({2, 2, 5, 4}, 5)});
  }
  // Causal: query 0 sees only key/value 0, so the output row 0 does not depend on v rows 1..T-1.
  Tensor q = rand_tensor({1, 1, 4, 3}, 6), k = rand_tensor({1, 1, 4, 3}, 7), v = rand_tensor({1, 1, 4, 3}, 8);
  autograd::backward(F::sum_all(F::narrow(F::attention(q, k, v, F::AttentionMask::causal()), 2, 0, 1)));
  const std::vector<float> gv = v.grad().to_vector();
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(gv[i], 1.0f);  // d out[0] / d v[0] = p[0, 0] = 1
  for (size_t i = 3; i < gv.size(); ++i) EXPECT_EQ(gv[i], 0.0f) << i;
  for (float g : k.grad().to_vector()) EXPECT_EQ(g, 0.0f);  // softmax over one key: constant 1
}

TEST(AutogradRules, CausalSelfAttention) {
  check_fd("causal_self_attention", [](const std::vector<Tensor>& v) { return F::causal_self_attention(v[0], 2); },
           {rand_tensor({2, 5, 12}, 9, -1.5, 1.5)});
}

TEST(AutogradRules, DropoutTrainMaskAndEvalIdentity) {
  const double p = 0.4;
  const float inv = float(1.0 / (1.0 - p));
  Tensor x = rand_tensor({6, 8}, 10, 0.5, 1.5);  // nonzero, so a dropped element is y == 0
  Tensor g = rand_tensor({6, 8}, 11, -1, 1, false);
  Generator gen(5);
  Tensor y = F::dropout(x, p, true, gen);
  ASSERT_NE(y.grad_fn(), nullptr);
  autograd::backward(y, g);
  const std::vector<float> xv = x.to_vector(), yv = y.to_vector(), gv = g.to_vector(), gx = x.grad().to_vector();
  int kept = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const float m = yv[i] == 0.0f ? 0.0f : inv;  // the mask the forward applied
    kept += m != 0.0f;
    EXPECT_EQ(yv[i], xv[i] * m) << i;
    EXPECT_EQ(gx[i], gv[i] * m) << i;  // grad = mask * upstream, the same mask
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, int(xv.size()));
  // Eval mode (and p = 0): identity, gradient passes through unchanged, no randomness used.
  Generator e1(5), e2(5);
  for (auto [pp, train] : {std::pair{p, false}, std::pair{0.0, true}}) {
    Tensor x2 = rand_tensor({6, 8}, 12);
    Tensor y2 = F::dropout(x2, pp, train, e1);
    EXPECT_EQ(y2.to_vector(), x2.to_vector());
    autograd::backward(y2, g);
    EXPECT_EQ(x2.grad().to_vector(), gv);
  }
  EXPECT_EQ(F::dropout(x, p, true, e1).to_vector(), F::dropout(x, p, true, e2).to_vector())
      << "eval / p = 0 must not consume random numbers";
}

TEST(AutogradRules, SubWithBroadcast) {
  check_fd("sub", [](const std::vector<Tensor>& v) { return F::sub(v[0], v[1]); },
           {rand_tensor({2, 3}, 13), rand_tensor({3}, 14)});
  // Algebra: L = sum(a - b) with b broadcast over 2 rows: da = 1, db = -2.
  Tensor a = rand_tensor({2, 3}, 15), b = rand_tensor({3}, 16);
  autograd::backward(F::sum_all(F::sub(a, b)));
  EXPECT_EQ(a.grad().to_vector(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(b.grad().to_vector(), std::vector<float>(3, -2.0f));
}

TEST(AutogradRules, MeanAll) {
  Tensor x = rand_tensor({3, 4}, 17);
  autograd::backward(F::mean_all(x));
  for (float g : x.grad().to_vector()) EXPECT_FLOAT_EQ(g, 1.0f / 12.0f);
  EXPECT_NEAR(F::mean_all(x).item(), F::sum_all(x).item() / 12.0, 1e-6);
  check_fd("mean_all(x * x)", [](const std::vector<Tensor>& v) { return F::mean_all(F::mul(v[0], v[0])); },
           {rand_tensor({3, 4}, 18)});
}

TEST(AutogradRules, MatmulAllTransposesWithBroadcastBatch) {
  // a batch (2, 1), b batch (3): out batch (2, 3); M = 3, K = 4, N = 2.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_fd(fmt::format("matmul ta={} tb={}", ta, tb),
               [ta, tb](const std::vector<Tensor>& v) { return F::matmul(v[0], v[1], ta, tb); },
               {rand_tensor(ta ? Shape{2, 1, 4, 3} : Shape{2, 1, 3, 4}, 19),
                rand_tensor(tb ? Shape{3, 2, 4} : Shape{3, 4, 2}, 20)});
    }
}

TEST(AutogradRules, LinearBothLayoutsWithAndWithoutBias) {
  for (auto layout : {F::WeightLayout::OutIn, F::WeightLayout::InOut})
    for (bool bias : {true, false}) {
      const bool oi = layout == F::WeightLayout::OutIn;
      std::vector<Tensor> leaves{rand_tensor({2, 3, 5}, 21), rand_tensor(oi ? Shape{4, 5} : Shape{5, 4}, 22)};
      if (bias) leaves.push_back(rand_tensor({4}, 23));
      check_fd(
          fmt::format("linear {} {}", oi ? "OutIn" : "InOut", bias ? "bias" : "nobias"),
          [layout, bias](const std::vector<Tensor>& v) {
            return F::linear(v[0], v[1], bias ? v[2] : Tensor(), layout);
          },
          leaves);
    }
}

TEST(AutogradRules, LayerNorm) {
  check_fd("layer_norm", [](const std::vector<Tensor>& v) { return F::layer_norm(v[0], v[1], v[2], 1e-5); },
           {rand_tensor({3, 8}, 24, -2, 2), rand_tensor({8}, 25, 0.5, 1.5), rand_tensor({8}, 26)});
}

TEST(AutogradRules, EmbeddingRepeatedIdsAccumulate) {
  Tensor w = rand_tensor({5, 3}, 27);
  Tensor ids = Tensor::from_vector_i64({1, 3, 1, 1, 0, 3}, {2, 3});
  Tensor r = rand_tensor({2, 3, 3}, 28, -1, 1, false);
  autograd::backward(F::sum_all(F::mul(F::embedding(w, ids), r)));
  // Algebra: grad row v = sum of the R rows at the positions whose id is v.
  const std::vector<float> rv = r.to_vector(), gw = w.grad().to_vector();
  const std::vector<int64_t> idv = ids.to_vector_i64();
  std::vector<double> want(15, 0.0);
  for (size_t n = 0; n < idv.size(); ++n)
    for (size_t c = 0; c < 3; ++c) want[size_t(idv[n]) * 3 + c] += rv[n * 3 + c];
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(gw[i], want[i], 1e-6) << i;
  for (size_t i : {6, 7, 8, 12, 13, 14}) EXPECT_EQ(gw[i], 0.0f) << "unused row, element " << i;
  check_fd("embedding", [ids](const std::vector<Tensor>& v) { return F::embedding(v[0], ids); },
           {rand_tensor({5, 3}, 29)});
}

TEST(AutogradRules, CrossEntropyWithIgnoreIndex) {
  for (int64_t ignore : {int64_t(-100), int64_t(2)}) {
    Tensor targets = Tensor::from_vector_i64({0, ignore, 4, 2, ignore == 2 ? 1 : -100, 3}, {6});
    check_fd(fmt::format("cross_entropy ignore_index={}", ignore),
             [targets, ignore](const std::vector<Tensor>& v) { return F::cross_entropy(v[0], targets, ignore); },
             {rand_tensor({6, 5}, 30, -2, 2)});
    // Ignored rows get exactly zero gradient; each counted row's gradient sums to zero.
    Tensor logits = rand_tensor({6, 5}, 31, -2, 2);
    autograd::backward(F::cross_entropy(logits, targets, ignore));
    const std::vector<float> g = logits.grad().to_vector();
    const std::vector<int64_t> t = targets.to_vector_i64();
    for (size_t n = 0; n < 6; ++n) {
      double s = 0;
      for (size_t j = 0; j < 5; ++j) {
        if (t[n] == ignore) {
          EXPECT_EQ(g[n * 5 + j], 0.0f) << "row " << n;
        }
        s += g[n * 5 + j];
      }
      EXPECT_NEAR(s, 0.0, 1e-6) << "row " << n;
    }
  }
}

TEST(AutogradRules, ReshapeTransposeNarrow) {
  check_fd("reshape",
           [](const std::vector<Tensor>& v) {
             return F::reshape(v[0], {4, 6});
           },
           {rand_tensor({2, 3, 4}, 32)});
  check_fd("transpose", [](const std::vector<Tensor>& v) { return F::transpose(v[0], 0, 2); },
           {rand_tensor({2, 3, 4}, 33)});
  check_fd("narrow", [](const std::vector<Tensor>& v) { return F::narrow(v[0], 1, 1, 2); },
           {rand_tensor({2, 4, 3}, 34)});
  // Composed, and the leaf used through two different views (their gradients sum).
  check_fd("reshape/transpose/narrow composed",
           [](const std::vector<Tensor>& v) {
             Tensor t = F::narrow(F::transpose(F::reshape(v[0], {3, 8}), 0, 1), 0, 2, 5);  // (5, 3)
             Tensor u = F::narrow(F::reshape(v[0], {8, 3}), 0, 1, 5);                      // (5, 3)
             return F::mul(t, u);
           },
           {rand_tensor({2, 3, 4}, 35)});
}

// ------------------------------------------------------------------ graph lifetime

// A forward with grad enabled whose output is dropped without backward must free
// everything it allocated: a saved output that points back to its own node is a
// reference cycle (tensor -> grad_fn -> saved tensor) that would leak the activations.
TEST(AutogradGraph, ForwardWithoutBackwardFreesActivations) {
  auto live = [] { return Allocator::instance().stats().live[int(MemTag::Activations)]; };
  Tensor x = rand_tensor({256, 1024}, 40);  // softmax input
  Tensor q = rand_tensor({1, 4, 256, 64}, 41), k = rand_tensor({1, 4, 256, 64}, 42),
         v = rand_tensor({1, 4, 256, 64}, 43);  // (B, NH, T, HS)
  Tensor qkv = rand_tensor({1, 256, 768}, 44);  // (B, T, 3C)
  const int64_t start = live();
  for (int i = 0; i < 5; ++i) {
    {
      Tensor y = F::softmax(x);
      ASSERT_NE(y.grad_fn(), nullptr);
    }
    EXPECT_EQ(live(), start) << "softmax, iteration " << i << ": " << (live() - start) << " bytes still held";
    {
      Tensor y = F::attention(q, k, v, F::AttentionMask::causal());
      ASSERT_NE(y.grad_fn(), nullptr);
    }
    EXPECT_EQ(live(), start) << "attention, iteration " << i << ": " << (live() - start) << " bytes still held";
    {
      Tensor y = F::causal_self_attention(qkv, 4);
      ASSERT_NE(y.grad_fn(), nullptr);
    }
    EXPECT_EQ(live(), start) << "causal_self_attention, iteration " << i << ": " << (live() - start)
                             << " bytes still held";
  }
}

TEST(AutogradGraph, SecondBackwardOnAFreedGraphThrows) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = F::sum_all(F::mul(F::softmax(x), x));
  autograd::backward(y);
  const std::vector<float> g1 = x.grad().to_vector();
  try {
    autograd::backward(y);
    FAIL() << "a second backward on a freed graph must throw";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("freed") != std::string::npos || msg.find("released") != std::string::npos) << msg;
  }
  EXPECT_EQ(x.grad().to_vector(), g1) << "the failed backward must not touch the gradients";
}
