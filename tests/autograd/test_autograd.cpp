// Autograd engine mechanics: accumulation into leaves, several uses of one
// tensor, views, no_grad, error messages. Expected values come from algebra;
// numerical correctness of each derivative rule is the op harness's job
// (tests/ops), whole-model gradients are checked against PyTorch (tests/models).
#include <gtest/gtest.h>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/nn/layers.h"

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
