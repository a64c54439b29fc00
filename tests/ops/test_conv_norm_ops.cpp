// The conv and norm families (and the other ops of the ResNet and ALIGN image towers) beyond the
// op harness, which runs each op in f32, bf16 and f16 on small shapes (tests/ops/cases/conv.cpp,
// norm.cpp, elementwise.cpp, reduce.cpp, loss.cpp); these tests link every module, for fn::,
// the precision policy and the fixture reader:
//  - bf16 conv2d / conv2d_backward on the cpu backend run oneDNN's bf16 convolution
//    primitives (not the widened f32 path, not oneDNN's reference kernel) on ResNet-sized
//    geometries, within one bf16 rounding (plus f32 accumulation noise) of the f32 ref on the
//    same values, with the contract's output dtypes, bitwise reproducible; f16 and mixed
//    dtypes widen;
//  - the pieces of synchronised batch norm (batch_norm2d_sums, batch_norm2d_grad_sums,
//    batch_norm2d_backward_input): cpu equals ref (double sums: to 1e-12), with the local
//    sums and count they are batch_norm2d's training statistics and backward, 16-bit inputs
//    are widened exactly;
//  - the ops of ALIGN's EfficientNet tower against PyTorch (tests/fixtures/align_ops.safetensors
//    from tests/reference/make_align_ops_fixture.py): depthwise convolutions with HF's
//    asymmetric correct_pad padding and a bias, a grouped convolution and the asymmetric stem,
//    forward and gradients through fn::conv2d on both backends; label-smoothed cross-entropy
//    (with ignored rows) through fn::cross_entropy_smoothed; all within 1e-5;
//  - the direct depthwise kernel above its OpenMP threshold at 1, 2 and 3 threads (cpu vs ref,
//    bitwise across thread counts), likewise sigmoid, spatial_mean and the smoothed
//    cross-entropy; conv2d's old signature is bitwise the symmetric Conv2dParams call;
//  - the precision policy's dtypes for conv2d, sigmoid, spatial_mean and the smoothed
//    cross-entropy under O1;
//  - channels-last (NHWC) convolutions: every geometry (padding per side, bias, groups,
//    depthwise, the ImageNet stem) on the cpu backend within 1e-5 of the NCHW oracle on the same
//    values, running a non-reference oneDNN kernel (bf16 too, within one bf16 rounding), and
//    bitwise the oracle on the ref backend; channels-last batch norm against the oracle at 1, 2
//    and 3 threads (bitwise across them) and against the NCHW cpu op; gradients of a
//    channels-last conv + batch norm against finite differences;
//  - 16-bit batch norm (both layouts) and relu read and write 16-bit values themselves, bitwise
//    the widened f32 op; O2's mixed batch norm is bitwise the cast form it replaces.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"
#include "support/numeric.h"

using namespace brigade;
using brigade::test_support::rel_err;

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

double sum_abs(const Tensor& t) {
  double s = 0;
  for (float v : t.to(DType::F32).to_vector()) s += std::fabs(double(v));
  return s;
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
  EXPECT_LT(rel_err(s[1].s1, s[0].s1), 1e-12);
  EXPECT_LT(rel_err(s[1].s2, s[0].s2), 1e-12);
  EXPECT_LT(rel_err(gs[1].s1, gs[0].s1), 1e-12);
  EXPECT_LT(rel_err(gs[1].s2, gs[0].s2), 1e-12);
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

// ---------------------------------------------------------------- ALIGN's ops vs PyTorch

const std::string kAlignFixture = std::string(BRIGADE_FIXTURES_DIR) + "/align_ops.safetensors";

class AlignOpsVsTorch : public ::testing::TestWithParam<ops::Backend> {
 protected:
  void SetUp() override {
    r_.open(kAlignFixture);
    ASSERT_EQ(r_.metadata("magic").value_or(""), "brigade-fixture");
    ASSERT_EQ(r_.metadata("kind").value_or(""), "align_ops");
  }
  ckpt::SafetensorsReader r_;
};

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

TEST_P(AlignOpsVsTorch, GroupedDepthwiseAndAsymmetricConvolutions) {
  ops::BackendScope be(GetParam());
  int cases = 0;
  for (const char* name : {"dw_k5_s2", "dw_k3_s2", "dw_k3_same", "grouped", "stem"}) {
    SCOPED_TRACE(name);
    const std::string p = std::string("conv.") + name;
    const auto j = nlohmann::json::parse(r_.metadata(p).value());
    const ops::Conv2dParams cp{j.at("stride"),   j.at("pad_top"),   j.at("pad_bottom"),
                               j.at("pad_left"), j.at("pad_right"), j.at("groups")};
    const bool bias = j.at("bias");
    const Tensor x = leaf(r_.get(p + ".x")), w = leaf(r_.get(p + ".w"));
    const Tensor b = bias ? leaf(r_.get(p + ".b")) : Tensor();
    const Tensor y = fn::conv2d(x, w, b, cp);
    EXPECT_LE(rel_err(y, r_.get(p + ".y")), 1e-5) << "y";
    autograd::backward(fn::sum_all(fn::mul(y, r_.get(p + ".r"))));
    EXPECT_LE(rel_err(x.grad(), r_.get(p + ".gx")), 1e-5) << "gx";
    EXPECT_LE(rel_err(w.grad(), r_.get(p + ".gw")), 1e-5) << "gw";
    if (bias) {
      EXPECT_LE(rel_err(b.grad(), r_.get(p + ".gb")), 1e-5) << "gb";
    }
    if (GetParam() == ops::Backend::Cpu) {
      const bool depthwise = cp.groups == x.size(1) && cp.groups == w.size(0);
      const std::string impl = ops::last_conv2d_impl();
      if (depthwise)
        EXPECT_EQ(impl, "direct_depthwise f32");
      else
        EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;  // oneDNN, not its reference kernel
    }
    ++cases;
  }
  EXPECT_EQ(cases, 5);
}

TEST_P(AlignOpsVsTorch, LabelSmoothedCrossEntropy) {
  ops::BackendScope be(GetParam());
  for (const char* name : {"eps0.1", "eps0.3"}) {
    SCOPED_TRACE(name);
    const std::string p = std::string("ce.") + name;
    const double eps = nlohmann::json::parse(r_.metadata(p).value()).at("eps");
    const Tensor logits = leaf(r_.get(p + ".logits")), targets = r_.get(p + ".targets");
    const Tensor loss = fn::cross_entropy_smoothed(logits, targets, eps, -100);
    EXPECT_NEAR(loss.item(), r_.get(p + ".loss").item(), 1e-5 * std::fabs(r_.get(p + ".loss").item()));
    autograd::backward(loss);
    EXPECT_LE(rel_err(logits.grad(), r_.get(p + ".glogits")), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AlignOpsVsTorch, ::testing::Values(ops::Backend::Cpu, ops::Backend::Ref),
                         [](const ::testing::TestParamInfo<ops::Backend>& i) {
                           return i.param == ops::Backend::Cpu ? "cpu" : "ref";
                         });

// ---------------------------------------------------------------- above the OpenMP thresholds

class OmpThreads {
 public:
  explicit OmpThreads(int n) : prev_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(prev_); }

 private:
  int prev_;
};

using TVec = std::vector<Tensor>;

// run() on Ref once and on Cpu at 1, 2 and 3 threads: cpu within tol of ref, every output
// bitwise the same at every thread count.
void check_threads(const std::function<TVec()>& run, double tol, const std::string& what) {
  TVec want;
  {
    ops::BackendScope s(ops::Backend::Ref);
    want = run();
  }
  std::vector<TVec> got;
  for (int threads : {1, 2, 3}) {
    OmpThreads t(threads);
    ops::BackendScope s(ops::Backend::Cpu);
    got.push_back(run());
    ASSERT_EQ(got.back().size(), want.size());
    for (size_t k = 0; k < want.size(); ++k)
      EXPECT_LE(rel_err(got.back()[k], want[k]), tol) << what << ": output " << k << " at " << threads << " threads";
  }
  for (size_t k = 0; k < want.size(); ++k)
    for (size_t r = 1; r < got.size(); ++r)
      EXPECT_TRUE(bitwise_equal(got[0][k], got[r][k])) << what << ": output " << k << ", 1 vs " << r + 1 << " threads";
}

TEST(AlignOps, DepthwiseKernelAtOneTwoAndThreeThreads) {
  // N C H W = 3 * 16 * 26 * 27 = 33696 > 2^15: the forward's, the data gradient's and the weight
  // gradient's parallel loops all run
  const Tensor x = randn({3, 16, 26, 27}, 41), b = randn({16}, 42);
  for (auto [k, p] : {std::pair{int64_t(5), ops::Conv2dParams{2, 1, 2, 1, 2, 16}},
                      std::pair{int64_t(3), ops::Conv2dParams::symmetric(1, 1, 16)}}) {
    const Tensor w = randn({16, 1, k, k}, 43);
    Shape ys;
    {
      ops::BackendScope s(ops::Backend::Ref);
      ys = ops::conv2d(x, w, b, p).shape();
    }
    const Tensor gy = randn(ys, 44);
    check_threads(
        [&] {
          const ops::Conv2dGrads g = ops::conv2d_backward(gy, x, w, p, true, true, true);
          return TVec{ops::conv2d(x, w, b, p), g.gx, g.gw, g.gb};
        },
        1e-5, fmt::format("depthwise k{} s{}", k, p.stride));
    ops::BackendScope s(ops::Backend::Cpu);
    ops::conv2d(x, w, b, p);
    EXPECT_EQ(ops::last_conv2d_impl(), "direct_depthwise f32");
  }
}

TEST(AlignOps, SigmoidSpatialMeanAndSmoothedCrossEntropyAtOneTwoAndThreeThreads) {
  const Tensor x = randn({4, 32, 17, 16}, 51), gy = randn({4, 32, 17, 16}, 52), gm = randn({4, 32}, 53);
  check_threads(
      [&] {
        const Tensor y = ops::sigmoid(x);
        return TVec{y, ops::sigmoid_backward(gy, y), ops::spatial_mean(x), ops::spatial_mean_backward(gm, x.shape())};
      },
      2e-6, "sigmoid, spatial_mean");
  const int64_t N = 70, V = 300;  // N V > 2^14
  std::vector<int64_t> t;
  for (int64_t i = 0; i < N; ++i) t.push_back(i % 5 == 2 ? -100 : (i * 37 + 5) % V);
  const Tensor logits = randn({N, V}, 54), tt = Tensor::from_vector_i64(t, {N});
  check_threads(
      [&] {
        const ops::CrossEntropyOut o = ops::cross_entropy_smoothed(logits, tt, 0.1, -100);
        return TVec{o.loss, o.lse, ops::cross_entropy_smoothed_backward(0.7, logits, tt, o.lse, 0.1, -100)};
      },
      1e-5, "cross_entropy_smoothed");
}

TEST(AlignOps, OldConvSignatureIsTheSymmetricParams) {
  const Tensor x = randn({2, 8, 11, 11}, 61), w = randn({8, 8, 3, 3}, 62), b = randn({8}, 63);
  const Tensor gy = randn({2, 8, 6, 6}, 64);
  ops::BackendScope s(ops::Backend::Cpu);
  EXPECT_TRUE(bitwise_equal(ops::conv2d(x, w, b, 2, 1), ops::conv2d(x, w, b, ops::Conv2dParams::symmetric(2, 1))));
  const ops::Conv2dGrads a = ops::conv2d_backward(gy, x, w, 2, 1);
  const ops::Conv2dGrads c = ops::conv2d_backward(gy, x, w, ops::Conv2dParams::symmetric(2, 1));
  EXPECT_TRUE(bitwise_equal(a.gx, c.gx));
  EXPECT_TRUE(bitwise_equal(a.gw, c.gw));
  EXPECT_TRUE(bitwise_equal(a.gb, c.gb));
  // a groups that does not divide the channels, or w of the wrong per-group width, is a ShapeError
  EXPECT_THROW(ops::conv2d(x, randn({8, 3, 3, 3}, 65), Tensor(), ops::Conv2dParams::symmetric(1, 1, 3)), ShapeError);
  EXPECT_THROW(ops::conv2d(x, randn({8, 2, 3, 3}, 66), Tensor(), ops::Conv2dParams::symmetric(1, 1, 2)), ShapeError);
  EXPECT_THROW(ops::conv2d(x, w, Tensor(), ops::Conv2dParams{1, -1, 0, 0, 0, 1}), ValueError);
  EXPECT_THROW(ops::cross_entropy_smoothed(randn({2, 3}, 67), Tensor::from_vector_i64({0, 1}, {2}), 1.5), ValueError);
}

TEST(AlignOps, PrecisionPolicyOfTheNewFunctions) {
  // O1 bf16: conv (also depthwise) low, sigmoid (elementwise) / spatial_mean (reduction) /
  // smoothed cross-entropy f32; fp32 leaves get fp32 gradients
  const Tensor x = leaf(randn({2, 4, 6, 6}, 71)), w = leaf(randn({4, 1, 3, 3}, 72));
  Tensor y, s, m;
  {
    amp::AutocastScope o1({amp::Level::O1, DType::BF16});
    y = fn::conv2d(x, w, Tensor(), ops::Conv2dParams{2, 0, 1, 0, 1, 4});
    s = fn::sigmoid(y);
    m = fn::spatial_mean(s, true);
    EXPECT_EQ(y.dtype(), DType::BF16);
    EXPECT_EQ(s.dtype(), DType::F32);
    EXPECT_EQ(m.dtype(), DType::F32);
    EXPECT_EQ(m.shape(), Shape({2, 4, 1, 1}));
    const Tensor loss = fn::cross_entropy_smoothed(fn::reshape(m, {2, 4}), Tensor::from_vector_i64({1, 3}, {2}), 0.1);
    EXPECT_EQ(loss.dtype(), DType::F32);
    autograd::backward(loss);
  }
  EXPECT_EQ(x.grad().dtype(), DType::F32);
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  EXPECT_GT(sum_abs(x.grad()), 0.0);
}

// ---------------------------------------------------------------- channels-last (NHWC) forms

Tensor nhwc(const Tensor& t) { return t.defined() ? t.permute({0, 2, 3, 1}).contiguous() : t; }
Tensor nchw(const Tensor& t) { return t.defined() ? t.permute({0, 3, 1, 2}).contiguous() : t; }
ops::Conv2dParams channels_last(ops::Conv2dParams p) {
  p.channels_last = true;
  return p;
}

// Every geometry the NCHW convolution has (stride, padding per side, bias, groups, depthwise),
// channels-last on the cpu backend (oneDNN on NHWC memory, reordered weights) against the NCHW
// oracle of the ref backend on the same values; on the ref backend channels-last is that oracle
// on permuted copies, bitwise.
TEST(VisionOpsChannelsLast, ConvolutionsMatchTheNchwOracle) {
  struct G {
    Shape x, w;
    ops::Conv2dParams p;
    bool bias;
  };
  const std::vector<G> geoms = {
      {{2, 5, 9, 8}, {7, 5, 3, 3}, ops::Conv2dParams::symmetric(1, 1), true},
      {{2, 5, 9, 8}, {6, 5, 3, 3}, ops::Conv2dParams{2, 2, 1, 0, 1, 1}, false},   // asymmetric padding
      {{3, 8, 7, 7}, {16, 8, 1, 1}, ops::Conv2dParams::symmetric(2, 0), false},   // a downsample
      {{2, 6, 8, 9}, {4, 3, 3, 3}, ops::Conv2dParams::symmetric(1, 1, 2), true},  // grouped
      {{2, 6, 8, 9}, {6, 1, 3, 3}, ops::Conv2dParams::symmetric(2, 1, 6), true},  // depthwise
      {{2, 3, 20, 20}, {8, 3, 7, 7}, ops::Conv2dParams::symmetric(2, 3), false},  // an ImageNet stem
  };
  uint32_t seed = 301;
  for (const G& g : geoms) {
    SCOPED_TRACE(shape_str(g.x) + " * " + shape_str(g.w) + " groups " + std::to_string(g.p.groups));
    const Tensor x = randn(g.x, seed++), w = randn(g.w, seed++), b = g.bias ? randn({g.w[0]}, seed++) : Tensor();
    Tensor y;
    ops::Conv2dGrads want;
    Tensor gy;
    {
      ops::BackendScope ref(ops::Backend::Ref);
      y = ops::conv2d(x, w, b, g.p);
      gy = randn(y.shape(), seed++);
      want = ops::conv2d_backward(gy, x, w, g.p, true, true, g.bias);
      // the ref backend's channels-last form is the same oracle: bitwise
      const Tensor ycl = ops::conv2d(nhwc(x), w, b, channels_last(g.p));
      EXPECT_EQ(ycl.shape(), Shape({y.size(0), y.size(2), y.size(3), y.size(1)}));
      EXPECT_TRUE(bitwise_equal(nchw(ycl), y));
      const ops::Conv2dGrads r = ops::conv2d_backward(nhwc(gy), nhwc(x), w, channels_last(g.p), true, true, g.bias);
      EXPECT_TRUE(bitwise_equal(nchw(r.gx), want.gx));
      EXPECT_TRUE(bitwise_equal(r.gw, want.gw));
    }
    ops::BackendScope cpu(ops::Backend::Cpu);
    const Tensor ycl = ops::conv2d(nhwc(x), w, b, channels_last(g.p));
    const std::string impl = ops::last_conv2d_impl();
    EXPECT_NE(impl.find("f32 nhwc"), std::string::npos) << impl;
    EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
    EXPECT_LE(rel_err(nchw(ycl), y), 1e-5) << "forward";
    const ops::Conv2dGrads r = ops::conv2d_backward(nhwc(gy), nhwc(x), w, channels_last(g.p), true, true, g.bias);
    EXPECT_EQ(r.gx.shape(), nhwc(x).shape());
    EXPECT_LE(rel_err(nchw(r.gx), want.gx), 1e-5) << "gx";
    EXPECT_LE(rel_err(r.gw, want.gw), 1e-5) << "gw";
    if (g.bias) {
      EXPECT_LE(rel_err(r.gb, want.gb), 1e-5) << "gb";
    }
    // only some gradients asked for: the same values
    const ops::Conv2dGrads only_w = ops::conv2d_backward(nhwc(gy), nhwc(x), w, channels_last(g.p), false, true, false);
    EXPECT_FALSE(only_w.gx.defined());
    EXPECT_LE(rel_err(only_w.gw, want.gw), 1e-5);
  }
  // a wrong layout is a shape error naming it
  ops::BackendScope cpu(ops::Backend::Cpu);
  try {
    ops::conv2d(randn({2, 5, 9, 8}, 1), randn({7, 5, 3, 3}, 2), Tensor(),
                channels_last(ops::Conv2dParams::symmetric(1, 1)));
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("channels-last (N, H, W, C)"), std::string::npos) << e.what();
  }
}

TEST(VisionOps16, Bf16ChannelsLastConvolutionsRunOneDnnBf16Primitives) {
  if (!ops::conv2d_native_bf16()) GTEST_SKIP() << "oneDNN has no non-reference bf16 convolution on this CPU";
  uint32_t seed = 401;
  for (const auto& [xs, ws, p] :
       {std::tuple{Shape{4, 16, 14, 14}, Shape{32, 16, 3, 3}, ops::Conv2dParams::symmetric(2, 1)},
        std::tuple{Shape{4, 16, 14, 14}, Shape{64, 16, 1, 1}, ops::Conv2dParams::symmetric(1, 0)}}) {
    const Tensor x = randn(xs, seed++).to(DType::BF16), w = randn(ws, seed++).to(DType::BF16);
    ops::BackendScope cpu(ops::Backend::Cpu);
    const Tensor y = ops::conv2d(nhwc(x), w, Tensor(), channels_last(p));
    const std::string impl = ops::last_conv2d_impl();
    EXPECT_NE(impl.find("bf16 nhwc"), std::string::npos) << impl;
    EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
    EXPECT_EQ(y.dtype(), DType::BF16);
    const Tensor gy = randn(y.shape(), seed++).to(DType::BF16);
    const ops::Conv2dGrads gr = ops::conv2d_backward(gy, nhwc(x), w, channels_last(p), true, true, false);
    ops::BackendScope ref(ops::Backend::Ref);
    const Tensor xf = x.to(DType::F32), wf = w.to(DType::F32), gyf = nchw(gy).to(DType::F32);
    const ops::Conv2dGrads g32 = ops::conv2d_backward(gyf, xf, wf, p, true, true, false);
    EXPECT_LE(rel_err(nchw(y), ops::conv2d(xf, wf, Tensor(), p)), kBf16) << "forward";
    EXPECT_EQ(gr.gx.dtype(), DType::BF16);
    EXPECT_LE(rel_err(nchw(gr.gx), g32.gx), kBf16) << "gx";
    EXPECT_LE(rel_err(gr.gw, g32.gw), kBf16) << "gw";
  }
}

// Channels-last batch norm (cpu: blocked column sums) against the ref oracle, which runs the NCHW
// templates on the (N H W, C, 1) view of the same bytes, at 1, 2 and 3 threads (bitwise the same at
// each), training with running statistics and eval; and against the NCHW cpu op on permuted values.
TEST(VisionOpsChannelsLast, BatchNormAtOneTwoAndThreeThreads) {
  // N H W C = 4 * 17 * 16 * 24 = 26112 rows x channels ... 2 * 26112 > 2^15: the parallel loops run
  const Tensor x = nhwc(randn({4, 24, 17, 16}, 501)), w = randn({24}, 502), b = randn({24}, 503);
  const Tensor gy = nhwc(randn({4, 24, 17, 16}, 504));
  const Tensor x2 = nhwc(randn({8, 24, 17, 16}, 505)), gy2 = nhwc(randn({8, 24, 17, 16}, 506));
  const Tensor rm0 = randn({24}, 507), rv0 = ops::add_scalar(ops::mul(rm0, rm0), 0.5);
  for (const auto& [xx, gg] : {std::pair{x, gy}, std::pair{x2, gy2}}) {
    check_threads(
        [&] {
          const Tensor rm = rm0.clone(), rv = rv0.clone();
          const ops::BatchNormOut o = ops::batch_norm2d(xx, w, b, rm, rv, true, 0.1, 1e-5, true);
          const ops::BatchNormGrads g = ops::batch_norm2d_backward(gg, xx, w, o.mean, o.rstd, true, true);
          const ops::BatchNormOut e = ops::batch_norm2d(xx, w, b, rm, rv, false, 0.1, 1e-5, true);
          const ops::BatchNormGrads ge = ops::batch_norm2d_backward(gg, xx, w, e.mean, e.rstd, false, true);
          return TVec{o.y, o.mean, o.rstd, rm, rv, g.gx, g.gw, g.gb, e.y, ge.gx, ge.gw, ge.gb};
        },
        1e-5, "channels-last batch norm " + shape_str(xx.shape()));
  }
  ops::BackendScope cpu(ops::Backend::Cpu);
  const Tensor rm = rm0.clone(), rv = rv0.clone(), rm2 = rm0.clone(), rv2 = rv0.clone();
  const ops::BatchNormOut a = ops::batch_norm2d(x, w, b, rm, rv, true, 0.1, 1e-5, true);
  const ops::BatchNormOut c = ops::batch_norm2d(nchw(x), w, b, rm2, rv2, true, 0.1, 1e-5);
  EXPECT_LE(rel_err(nchw(a.y), c.y), 1e-5);
  EXPECT_LE(rel_err(rm, rm2), 1e-6);
  EXPECT_LE(rel_err(rv, rv2), 1e-6);
  const ops::BatchNormGrads ga = ops::batch_norm2d_backward(gy, x, w, a.mean, a.rstd, true, true);
  const ops::BatchNormGrads gc = ops::batch_norm2d_backward(nchw(gy), nchw(x), w, c.mean, c.rstd, true);
  EXPECT_LE(rel_err(nchw(ga.gx), gc.gx), 1e-5);
  EXPECT_LE(rel_err(ga.gw, gc.gw), 1e-5);
  EXPECT_LE(rel_err(ga.gb, gc.gb), 1e-5);
  // bf16 input: widened, the output rounded once to bf16
  const ops::BatchNormOut h = ops::batch_norm2d(x.to(DType::BF16), w, b, Tensor(), Tensor(), true, 0.1, 1e-5, true);
  EXPECT_EQ(h.y.dtype(), DType::BF16);
  EXPECT_LE(
      rel_err(h.y,
              ops::batch_norm2d(x.to(DType::BF16).to(DType::F32), w, b, Tensor(), Tensor(), true, 0.1, 1e-5, true).y),
      kBf16);
}

// fn::conv2d and fn::batch_norm2d in channels-last form: gradients against central finite
// differences of a scalar loss (double-checked on a small problem, f32 tolerance).
TEST(VisionOpsChannelsLast, ConvAndBatchNormGradientsMatchFiniteDifferences) {
  ops::BackendScope cpu(ops::Backend::Cpu);
  const Tensor x0 = nhwc(randn({2, 3, 5, 4}, 601)), w0 = randn({4, 3, 3, 3}, 602), g0 = randn({4}, 603),
               b0 = randn({4}, 604), proj = randn({2, 3, 2, 4}, 605);  // y (2, 3, 2, 4): stride 2, pad 1
  const ops::Conv2dParams p = channels_last(ops::Conv2dParams::symmetric(2, 1));
  auto loss_of = [&](const Tensor& x, const Tensor& w, const Tensor& g, const Tensor& b) {
    const Tensor y = fn::batch_norm2d(fn::conv2d(x, w, Tensor(), p), g, b, Tensor(), Tensor(), true, 0.1, 1e-5, true);
    return fn::sum_all(fn::mul(y, proj));
  };
  Tensor x = x0.clone(), w = w0.clone(), g = g0.clone(), b = b0.clone();
  for (Tensor* t : {&x, &w, &g, &b}) t->set_requires_grad(true);
  autograd::backward(loss_of(x, w, g, b));
  for (auto [name, t, t0] : {std::tuple{"x", &x, &x0}, std::tuple{"w", &w, &w0}, std::tuple{"gamma", &g, &g0},
                             std::tuple{"beta", &b, &b0}}) {
    const std::vector<float> base = t0->to_vector(), grad = t->grad().to_vector();
    double num = 0, den = 0;
    for (size_t i = 0; i < base.size(); i += 3) {
      const double h = 1e-2;
      auto at = [&](double d) {
        std::vector<float> v = base;
        v[i] = float(double(v[i]) + d);
        const Tensor tv = Tensor::from_vector(v, t0->shape());
        autograd::NoGradGuard ng;
        return double(loss_of(t == &x ? tv : x0, t == &w ? tv : w0, t == &g ? tv : g0, t == &b ? tv : b0).item());
      };
      const double fd = (at(h) - at(-h)) / (2 * h);
      num = std::max(num, std::fabs(fd - double(grad[i])));
      den = std::max(den, std::fabs(fd));
    }
    EXPECT_LE(num / den, 2e-2) << name;
  }
}

}  // namespace

// The cpu batch norm reads and writes 16-bit activations itself (no widened copies): bitwise the
// f32 op on the exactly widened values with each output rounded once to its dtype, in both
// layouts, training (with running statistics) and eval, at 1, 2 and 3 threads; 300 channels
// (more than one widening chunk of a channels-last row), planes of 7 x 9 (not a multiple of the
// 16 vector lanes); mixed dtypes (f32 gy with bf16 x; bf16 w) too.
TEST(VisionOps16, BatchNormOn16BitActivationsIsTheWidenedOpBitwise) {
  ops::BackendScope cpu(ops::Backend::Cpu);
  const Tensor w = randn({300}, 701), b = randn({300}, 702), rm0 = randn({300}, 703),
               rv0 = ops::add_scalar(ops::mul(rm0, rm0), 0.5);
  for (DType dt : {DType::BF16, DType::F16})
    for (bool cl : {false, true})
      for (bool training : {true, false}) {
        SCOPED_TRACE(
            fmt::format("{} {} {}", dtype_name(dt), cl ? "channels-last" : "nchw", training ? "training" : "eval"));
        Tensor x = randn({5, 300, 7, 9}, 704), gy = randn({5, 300, 7, 9}, 705);  // 5*300*63 > 2^15
        if (cl) x = nhwc(x), gy = nhwc(gy);
        const Tensor x16 = x.to(dt), gy16 = gy.to(dt), xw = x16.to(DType::F32), gw = gy16.to(DType::F32);
        for (int threads : {1, 2, 3}) {
          OmpThreads t(threads);
          const Tensor rm = rm0.clone(), rv = rv0.clone(), rmw = rm0.clone(), rvw = rv0.clone();
          const ops::BatchNormOut o = ops::batch_norm2d(x16, w, b, rm, rv, training, 0.1, 1e-5, cl);
          const ops::BatchNormOut ow = ops::batch_norm2d(xw, w, b, rmw, rvw, training, 0.1, 1e-5, cl);
          ASSERT_EQ(o.y.dtype(), dt);
          EXPECT_TRUE(bitwise_equal(o.y, ow.y.to(dt))) << threads << " threads";
          for (auto [got, want] :
               {std::pair{o.mean, ow.mean}, std::pair{o.rstd, ow.rstd}, std::pair{rm, rmw}, std::pair{rv, rvw}})
            EXPECT_TRUE(bitwise_equal(got, want)) << threads << " threads";
          const ops::BatchNormGrads g = ops::batch_norm2d_backward(gy16, x16, w, o.mean, o.rstd, training, cl);
          const ops::BatchNormGrads gw32 = ops::batch_norm2d_backward(gw, xw, w, ow.mean, ow.rstd, training, cl);
          ASSERT_EQ(g.gx.dtype(), dt);
          EXPECT_TRUE(bitwise_equal(g.gx, gw32.gx.to(dt))) << threads << " threads";
          EXPECT_TRUE(bitwise_equal(g.gw, gw32.gw)) << threads << " threads";
          EXPECT_TRUE(bitwise_equal(g.gb, gw32.gb)) << threads << " threads";
          // f32 gy beside a 16-bit x: gx still in x's dtype
          const ops::BatchNormGrads gm = ops::batch_norm2d_backward(gw, x16, w, o.mean, o.rstd, training, cl);
          EXPECT_TRUE(bitwise_equal(gm.gx, gw32.gx.to(dt))) << threads << " threads";
        }
        // 16-bit weights (O3): widened, their gradients rounded to w's dtype
        const Tensor w16 = w.to(dt), b16 = b.to(dt);
        const Tensor rm = rm0.clone(), rv = rv0.clone(), rmw = rm0.clone(), rvw = rv0.clone();
        const ops::BatchNormOut o = ops::batch_norm2d(x16, w16, b16, rm, rv, training, 0.1, 1e-5, cl);
        const ops::BatchNormOut ow =
            ops::batch_norm2d(xw, w16.to(DType::F32), b16.to(DType::F32), rmw, rvw, training, 0.1, 1e-5, cl);
        EXPECT_TRUE(bitwise_equal(o.y, ow.y.to(dt)));
        const ops::BatchNormGrads g = ops::batch_norm2d_backward(gy16, x16, w16, o.mean, o.rstd, training, cl);
        const ops::BatchNormGrads gw32 =
            ops::batch_norm2d_backward(gw, xw, w16.to(DType::F32), ow.mean, ow.rstd, training, cl);
        EXPECT_TRUE(bitwise_equal(g.gx, gw32.gx.to(dt)));
        EXPECT_TRUE(bitwise_equal(g.gw, gw32.gw.to(dt)));
        EXPECT_TRUE(bitwise_equal(g.gb, gw32.gb.to(dt)));
      }
}

// relu and its backward on 16-bit tensors work on the bit patterns: bitwise the widened op,
// special values included (NaN passes the forward, -0 and negatives become +0, +Inf passes,
// denormals keep their sign's rule), on a tensor above the parallel threshold.
TEST(VisionOps16, ReluOn16BitValuesIsTheWidenedOpBitwise) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v = {0.f, -0.f, 1.f, -1.f, inf, -inf, nan, -nan, 1e-40f, -1e-40f, 6e-8f, -6e-8f, 3.5f, -2e30f};
  const Tensor r = randn({40000}, 710);
  for (float e : r.to_vector()) v.push_back(e);
  const Tensor x = Tensor::from_vector(v, {int64_t(v.size())});
  const Tensor g = randn({int64_t(v.size())}, 711);
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor x16 = x.to(dt), g16 = g.to(dt);
    for (int threads : {1, 2}) {
      OmpThreads t(threads);
      ops::BackendScope cpu(ops::Backend::Cpu);
      const Tensor y = ops::relu(x16);
      ASSERT_EQ(y.dtype(), dt);
      EXPECT_TRUE(bitwise_equal(y, ops::relu(x16.to(DType::F32)).to(dt)));
      const Tensor gx = ops::relu_backward(g16, y);
      ASSERT_EQ(gx.dtype(), dt);
      EXPECT_TRUE(bitwise_equal(gx, ops::relu_backward(g16.to(DType::F32), y.to(DType::F32)).to(dt)));
      // the ref backend's widened path agrees
      ops::BackendScope ref(ops::Backend::Ref);
      EXPECT_TRUE(bitwise_equal(ops::relu(x16), y));
      EXPECT_TRUE(bitwise_equal(ops::relu_backward(g16, y), gx));
    }
  }
}

// Under O2, batch norm is amp::Rule::Mixed: fn::batch_norm2d takes the 16-bit activation as it
// is (no cast nodes) and returns it in that dtype; values and gradients are bitwise those of the
// f32 batch norm on the widened input with the output rounded once (what O2 computed when it
// cast around batch norm, since every consumer of its output rounded it to bf16 first).
TEST(VisionOps16, O2BatchNormIsMixedAndBitwiseTheCastForm) {
  ops::BackendScope cpu(ops::Backend::Cpu);
  for (bool cl : {false, true}) {
    SCOPED_TRACE(cl ? "channels-last" : "nchw");
    Tensor xv = randn({4, 12, 6, 5}, 720), gv = randn({4, 12, 6, 5}, 721);
    if (cl) xv = nhwc(xv), gv = nhwc(gv);
    const Tensor g16 = gv.to(DType::BF16);
    auto run = [&](bool o2, Tensor& gx, Tensor& gw, Tensor& gb) {
      Tensor x = xv.to(DType::BF16).detach(), w = randn({12}, 722), b = randn({12}, 723);
      x.set_requires_grad(true), w.set_requires_grad(true), b.set_requires_grad(true);
      const Tensor rm = Tensor::zeros({12}), rv = Tensor::ones({12});
      Tensor y;
      if (o2) {
        amp::AutocastScope scope({amp::Level::O2, DType::BF16});
        y = fn::batch_norm2d(x, w, b, rm, rv, true, 0.1, 1e-5, cl);
      } else {  // the cast form, spelled out at O0
        y = fn::cast(fn::batch_norm2d(fn::cast(x, DType::F32), w, b, rm, rv, true, 0.1, 1e-5, cl), DType::BF16);
      }
      autograd::backward(y, g16);
      gx = x.grad(), gw = w.grad(), gb = b.grad();
      return std::vector<Tensor>{y, rm, rv};
    };
    Tensor gx1, gw1, gb1, gx2, gw2, gb2;
    const std::vector<Tensor> a = run(true, gx1, gw1, gb1), c = run(false, gx2, gw2, gb2);
    EXPECT_EQ(a[0].dtype(), DType::BF16);
    for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(bitwise_equal(a[k], c[k])) << "output " << k;
    EXPECT_EQ(gx1.dtype(), DType::BF16);
    EXPECT_EQ(gw1.dtype(), DType::F32);
    EXPECT_TRUE(bitwise_equal(gx1, gx2));
    EXPECT_TRUE(bitwise_equal(gw1, gw2));
    EXPECT_TRUE(bitwise_equal(gb1, gb2));
  }
}

// Channels-last max-pool (the ImageNet stem's 3x3 / 2 / 1, and 2x2 / 2 / 0) on the cpu backend is
// bitwise the NCHW op on the same values: y, the argmax indices, and the gradient (overlapping
// windows sum in output order), in f32, bf16 and f16 (16-bit read and written natively), with
// ties and NaNs, at 1, 2 and 3 threads; the ref backend's permuted oracle gives the same.
TEST(VisionOpsChannelsLast, MaxPoolIsTheNchwOpBitwise) {
  Tensor x = randn({3, 300, 13, 11}, 801);  // 3*300*13*11 > 2^15; 300 channels: two chunks
  std::vector<float> v = x.to_vector();
  for (size_t i = 0; i < v.size(); i += 97) v[i] = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 5; i < v.size(); i += 31) v[i] = 0.5f;  // ties
  x = Tensor::from_vector(v, x.shape());
  const Tensor gy7 = randn({3, 300, 7, 6}, 802), gy6 = randn({3, 300, 6, 5}, 803);
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (auto [k, s, p] :
         {std::tuple{int64_t(3), int64_t(2), int64_t(1)}, std::tuple{int64_t(2), int64_t(2), int64_t(0)}}) {
      SCOPED_TRACE(fmt::format("{} k{} s{} p{}", dtype_name(dt), k, s, p));
      const Tensor xd = x.to(dt), gy = (k == 3 ? gy7 : gy6).to(dt);
      ops::MaxPoolOut want;
      Tensor gwant;
      {
        ops::BackendScope cpu(ops::Backend::Cpu);
        want = ops::max_pool2d(xd, k, s, p);
        gwant = ops::max_pool2d_backward(gy, want.idx, xd.shape());
      }
      for (ops::Backend be : {ops::Backend::Cpu, ops::Backend::Ref})
        for (int threads : {1, 2, 3}) {
          OmpThreads t(threads);
          ops::BackendScope scope(be);
          const ops::MaxPoolOut o = ops::max_pool2d(nhwc(xd), k, s, p, true);
          ASSERT_EQ(o.y.dtype(), dt);
          EXPECT_TRUE(bitwise_equal(o.y, nhwc(want.y))) << threads << " threads";
          EXPECT_TRUE(bitwise_equal(o.idx, nhwc(want.idx))) << threads << " threads";
          const Tensor gx = ops::max_pool2d_backward(nhwc(gy), o.idx, nhwc(xd).shape(), true);
          ASSERT_EQ(gx.dtype(), dt);
          EXPECT_TRUE(bitwise_equal(gx, nhwc(gwant))) << threads << " threads";
        }
    }
  const ops::MaxPoolOut o = ops::max_pool2d(nhwc(x), 3, 2, 1, true);
  EXPECT_THROW(ops::max_pool2d_backward(nhwc(gy7), o.idx, {3, 13, 11, 299}, true), ShapeError);  // C differs
}
