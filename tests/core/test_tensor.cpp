// Tensor views and copies: every view shares storage and addresses the elements
// that index arithmetic says it should; contiguous()/clone()/to() copy correctly.
#include <gtest/gtest.h>

#include <numeric>

#include "brigade/core/error.h"
#include "brigade/core/tensor.h"

using namespace brigade;

static Tensor iota(const Shape& s) {
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_vector(v, s);
}

TEST(Tensor, FactoriesShapesAndStrides) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(Tensor::full({2}, 2.5).to_vector(), (std::vector<float>{2.5f, 2.5f}));
  EXPECT_EQ(Tensor::arange(4, DType::I64).to_vector_i64(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_THROW(Tensor::empty({2, -1}), ShapeError);
}

TEST(Tensor, TransposeAndPermuteAreViews) {
  Tensor a = iota({2, 3});
  Tensor t = a.transpose(0, 1);  // (3, 2)
  EXPECT_TRUE(t.same_storage(a));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor p = iota({2, 3, 4}).permute({2, 0, 1});  // (4, 2, 3): p[k][i][j] = 12 i + 4 j + k
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.at({3, 1, 2}), 12 * 1 + 4 * 2 + 3);
  EXPECT_TRUE(p.contiguous().is_contiguous());
  EXPECT_EQ(p.contiguous().at({3, 1, 2}), 23);
}

TEST(Tensor, SliceNarrowSelectExpand) {
  Tensor a = iota({4, 5});
  Tensor s = a.slice(1, 1, 5, 2);  // columns 1, 3
  EXPECT_EQ(s.to_vector(), (std::vector<float>{1, 3, 6, 8, 11, 13, 16, 18}));
  Tensor n = a.narrow(0, 2, 2);
  EXPECT_EQ(n.to_vector(), (std::vector<float>{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(a.select(1, -1).to_vector(), (std::vector<float>{4, 9, 14, 19}));
  Tensor e = iota({3}).unsqueeze(0).expand({2, 3});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.to_vector(), (std::vector<float>{0, 1, 2, 0, 1, 2}));
  EXPECT_THROW(a.narrow(0, 3, 2), ShapeError);
  EXPECT_THROW(iota({2, 3}).expand({2, 4}), ShapeError);
}

TEST(Tensor, WritesThroughViewsReachTheBase) {
  Tensor a = Tensor::zeros({3, 4});
  a.narrow(1, 1, 2).fill_(7.0);
  a.select(0, 2).copy_(Tensor::from_vector({1, 2, 3, 4}, {4}));
  EXPECT_EQ(a.to_vector(), (std::vector<float>{0, 7, 7, 0, 0, 7, 7, 0, 1, 2, 3, 4}));
}

TEST(Tensor, ViewVersusReshape) {
  Tensor a = iota({2, 3, 4});
  EXPECT_TRUE(a.view({6, 4}).same_storage(a));
  EXPECT_EQ(a.view({-1, 12}).shape(), (Shape{2, 12}));
  Tensor t = a.transpose(1, 2);  // (2, 4, 3), not viewable as (2, 12)
  EXPECT_THROW(t.view({2, 12}), ShapeError);
  Tensor r = t.reshape({2, 12});  // copies
  EXPECT_FALSE(r.same_storage(a));
  EXPECT_EQ(r.at({0, 1}), 4);  // t[0][0][1] = a[0][1][0]
  // a transposed pair of trailing dims that stays mergeable: (2,3,4) -> permute(0,2,1) -> view of (2,4,3) dims 0 only
  EXPECT_TRUE(t.view({2, 4, 3}).same_storage(a));
  EXPECT_THROW(a.view({5, 5}), ShapeError);
}

TEST(Tensor, DtypeConversionsThroughCopy) {
  Tensor a = Tensor::from_vector({1.0f, -2.5f, 3.140625f}, {3});
  Tensor b = a.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.to(DType::F32).to_vector(), (std::vector<float>{1.0f, -2.5f, 3.140625f}));
  Tensor h = a.to(DType::F16).to(DType::F32);
  EXPECT_EQ(h.to_vector(), a.to_vector());  // all exactly representable in f16
  Tensor i = Tensor::from_vector({1.9f, -1.9f}, {2}).to(DType::I64);
  EXPECT_EQ(i.to_vector_i64(), (std::vector<int64_t>{1, -1}));  // C++ truncation, as torch
  EXPECT_THROW(a.data<int64_t>(), ShapeError);
}

TEST(Tensor, EmptyAndScalarTensors) {
  Tensor z = Tensor::zeros({3, 0, 2});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(z.contiguous().numel(), 0);
  Tensor s = Tensor::full({}, 4.0);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 4.0);
  EXPECT_EQ(s.reshape({1, 1}).item(), 4.0);
  EXPECT_THROW(iota({2}).item(), ShapeError);
}
