// Vision ops beyond the table-driven harness (tests/ops/cases_vision.inc runs every vision op
// in f32, bf16 and f16 on small shapes):
//  - bf16 conv2d / conv2d_backward on the cpu backend run oneDNN's bf16 convolution
//    primitives (not the widened f32 path, not oneDNN's reference kernel) on ResNet-sized
//    geometries, within one bf16 rounding (plus f32 accumulation noise) of the f32 ref on the
//    same values, with the contract's output dtypes, bitwise reproducible; f16 and mixed
//    dtypes widen;
//  - the pieces of synchronised batch norm (batch_norm2d_sums, batch_norm2d_grad_sums,
//    batch_norm2d_backward_input): cpu equals ref (double sums: to 1e-12), with the local
//    sums and count they are batch_norm2d's training statistics and backward, 16-bit inputs
//    are widened exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "brigade/ops/ext_vision.h"
#include "brigade/ops/ops.h"

using namespace brigade;

namespace {

Tensor randn(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = nd(rng);
  return Tensor::from_vector(v, s);
}

// max |a - b| / max |b|
double rel_err(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to(DType::F32).to_vector(), y = b.to(DType::F32).to_vector();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::fabs(double(x[i]) - double(y[i])));
    den = std::max(den, std::fabs(double(y[i])));
  }
  return den > 0 ? num / den : num;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.nbytes() == y.nbytes() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

constexpr double kBf16 = 1.0 / 256;  // one bf16 rounding (unit roundoff 2^-8), relative to the tensor's scale

struct Geom {
  Shape x, w;
  int64_t stride, pad;
  bool bias;
};

TEST(VisionOps16, Bf16ConvolutionsRunOneDnnBf16PrimitivesOnResNetShapes) {
  if (!ops::conv2d_native_bf16()) GTEST_SKIP() << "oneDNN has no non-reference bf16 convolution on this CPU";
  const std::vector<Geom> geoms = {
      {{4, 16, 14, 14}, {16, 16, 3, 3}, 1, 1, false},  // a basic block's 3x3
      {{4, 16, 14, 14}, {32, 16, 3, 3}, 2, 1, false},  // the first 3x3 of a stage (stride 2)
      {{4, 16, 14, 14}, {32, 16, 1, 1}, 2, 0, false},  // the downsample
      {{3, 3, 20, 20}, {8, 3, 7, 7}, 2, 3, true},      // an ImageNet stem, with a bias
  };
  uint32_t seed = 7;
  for (const Geom& g : geoms) {
    SCOPED_TRACE(shape_str(g.x) + " * " + shape_str(g.w));
    const Tensor x = randn(g.x, seed++).to(DType::BF16), w = randn(g.w, seed++).to(DType::BF16);
    const Tensor b = g.bias ? randn({g.w[0]}, seed++) : Tensor();
    ops::BackendScope cpu(ops::Backend::Cpu);
    const Tensor y = ops::conv2d(x, w, b, g.stride, g.pad);
    const std::string impl = ops::last_conv2d_impl();
    EXPECT_NE(impl.find("bf16"), std::string::npos) << impl;
    EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
    EXPECT_EQ(y.dtype(), DType::BF16);
    EXPECT_TRUE(bitwise_equal(ops::conv2d(x, w, b, g.stride, g.pad), y)) << "not reproducible";
    const Tensor gy = randn(y.shape(), seed++).to(DType::BF16);
    const ops::Conv2dGrads gr = ops::conv2d_backward(gy, x, w, g.stride, g.pad, true, true, g.bias);
    Tensor y32;
    ops::Conv2dGrads g32;
    {
      ops::BackendScope ref(ops::Backend::Ref);
      const Tensor xf = x.to(DType::F32), wf = w.to(DType::F32), gyf = gy.to(DType::F32);
      y32 = ops::conv2d(xf, wf, b, g.stride, g.pad);
      g32 = ops::conv2d_backward(gyf, xf, wf, g.stride, g.pad, true, true, g.bias);
    }
    EXPECT_LE(rel_err(y, y32), kBf16) << "forward";
    EXPECT_EQ(gr.gx.dtype(), DType::BF16);
    EXPECT_EQ(gr.gw.dtype(), DType::BF16);
    EXPECT_LE(rel_err(gr.gx, g32.gx), kBf16) << "gx";
    EXPECT_LE(rel_err(gr.gw, g32.gw), kBf16) << "gw";
    if (g.bias) {
      EXPECT_EQ(gr.gb.dtype(), DType::BF16);
      EXPECT_LE(rel_err(gr.gb, g32.gb), kBf16) << "gb";
    }
  }
}

TEST(VisionOps16, F16AndMixedConvolutionsWiden) {
  const Tensor x = randn({2, 4, 9, 9}, 1), w = randn({6, 4, 3, 3}, 2);
  ops::BackendScope cpu(ops::Backend::Cpu);
  Tensor want = ops::conv2d(x.to(DType::F16).to(DType::F32), w.to(DType::F16).to(DType::F32), Tensor(), 1, 1);
  const Tensor yh = ops::conv2d(x.to(DType::F16), w.to(DType::F16), Tensor(), 1, 1);
  EXPECT_EQ(yh.dtype(), DType::F16);
  EXPECT_NE(ops::last_conv2d_impl().find("f32"), std::string::npos) << ops::last_conv2d_impl();
  EXPECT_TRUE(bitwise_equal(yh, want.to(DType::F16))) << "f16 is the f32 kernel on widened values, rounded once";
  const Tensor ym = ops::conv2d(x.to(DType::BF16), w, Tensor(), 1, 1);  // bf16 x f32: widened, f32 out
  EXPECT_EQ(ym.dtype(), DType::F32);
  EXPECT_NE(ops::last_conv2d_impl().find("f32"), std::string::npos) << ops::last_conv2d_impl();
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return den > 0 ? num / den : num;
}

TEST(VisionOps, SyncBatchNormPiecesAreBatchNormWithLocalSums) {
  const int64_t N = 3, C = 5, H = 7, W = 9;  // HW = 63: the 8-lane loop and its tail
  const Tensor x = randn({N, C, H, W}, 31), gy = randn({N, C, H, W}, 32), w = randn({C}, 33), b = randn({C}, 34);
  const double M = double(N * H * W);
  ops::ChannelSums s[2], gs[2];
  Tensor gx[2];
  ops::BatchNormOut bn[2];
  ops::BatchNormGrads bg[2];
  int k = 0;
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope scope(be);
    s[k] = ops::batch_norm2d_sums(x);
    bn[k] = ops::batch_norm2d(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5);
    // both backends read the ref statistics, so the sums see the same inputs
    gs[k] = ops::batch_norm2d_grad_sums(gy, x, bn[0].mean, bn[0].rstd);
    gx[k] = ops::batch_norm2d_backward_input(gy, x, w, bn[0].mean, bn[0].rstd, gs[0], M);
    bg[k] = ops::batch_norm2d_backward(gy, x, w, bn[0].mean, bn[0].rstd, true);
    ++k;
  }
  EXPECT_LT(max_rel(s[1].s1, s[0].s1), 1e-12);
  EXPECT_LT(max_rel(s[1].s2, s[0].s2), 1e-12);
  EXPECT_LT(max_rel(gs[1].s1, gs[0].s1), 1e-12);
  EXPECT_LT(max_rel(gs[1].s2, gs[0].s2), 1e-12);
  EXPECT_LT(rel_err(gx[1], gx[0]), 1e-6);
  for (int j = 0; j < 2; ++j) {
    // local sums: the statistics and the backward of batch_norm2d in training
    std::vector<float> mean = bn[j].mean.to_vector();
    for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(s[j].s1[size_t(c)] / M, mean[size_t(c)], 1e-6);
    EXPECT_LT(rel_err(gx[j], bg[j].gx), 1e-5);
    std::vector<float> gw = bg[j].gw.to_vector(), gb = bg[j].gb.to_vector();
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_NEAR(gs[j].s2[size_t(c)], gw[size_t(c)], 1e-4 * (1 + std::fabs(gw[size_t(c)])));
      EXPECT_NEAR(gs[j].s1[size_t(c)], gb[size_t(c)], 1e-4 * (1 + std::fabs(gb[size_t(c)])));
    }
  }
  // 16-bit inputs are widened exactly; gx comes back in x's dtype
  const Tensor xb = x.to(DType::BF16), gyb = gy.to(DType::BF16);
  const ops::ChannelSums sb = ops::batch_norm2d_sums(xb), sw = ops::batch_norm2d_sums(xb.to(DType::F32));
  EXPECT_EQ(sb.s1, sw.s1);
  EXPECT_EQ(sb.s2, sw.s2);
  const Tensor gxb = ops::batch_norm2d_backward_input(gyb, xb, w, bn[0].mean, bn[0].rstd, gs[0], M);
  EXPECT_EQ(gxb.dtype(), DType::BF16);
  EXPECT_TRUE(bitwise_equal(
      gxb, ops::batch_norm2d_backward_input(gyb.to(DType::F32), xb.to(DType::F32), w, bn[0].mean, bn[0].rstd, gs[0], M)
               .to(DType::BF16)));
}

}  // namespace
