// Op harness (first cut): basic values of the front-end on both backends.
#include <gtest/gtest.h>

#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

using namespace brigade;

TEST(Ops, AddBroadcast) {
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor b = Tensor::from_vector({10, 20, 30}, {3});
    EXPECT_EQ(ops::add(a, b).to_vector(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
    EXPECT_EQ(ops::sum(a, {0}).to_vector(), (std::vector<float>{5, 7, 9}));
    EXPECT_EQ(ops::matmul(a, a, false, true).to_vector(), (std::vector<float>{14, 32, 32, 77}));
    EXPECT_THROW(ops::add(a, Tensor::zeros({4})), ShapeError);
  }
}
