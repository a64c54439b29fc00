// Plans applied to ResNet from outside (models/resnet, nn::Block):
//  - nn::find_blocks lists the residual blocks by torchvision name ("layer1.0" ... "layer4.1"
//    for ResNet-18, "layer1.0" ... "layer4.2" for ResNet-50), and nothing inside them;
//  - activation recompute (Full and Selective on every block) against None, for tiny
//    ResNet-18 and ResNet-50 layouts: one training forward + backward gives bitwise the same
//    loss, every parameter gradient and every BatchNorm buffer (running_mean, running_var,
//    num_batches_tracked: updated once per real forward, not again by the recompute), while
//    holding fewer activation bytes at the end of the forward; the same under O2 bf16;
//  - mixed precision on the convolution path (amp::Op::Conv / BatchNorm / Pool): under O1/O2
//    the convs compute and return bf16, BatchNorm f32 at O1 and bf16 at O2 (mixed: computed
//    in f32 on the bf16 activation) and O3, every parameter gradient is f32; O0 is bitwise the plain fp32 run; a tiny
//    ResNet-18 (width 8) trained 20 AdamW steps under O2 bf16 (fp32 master weights) follows the fp32 losses within a
//    few percent and decreases;
//  - synchronised batch norm (fn::sync_batch_norm2d, nn::BatchNorm2d::sync) with a reducer
//    that is the identity (a group of one) matches plain BatchNorm2d within 1e-6 relative:
//    output, gx, gw, gb, running statistics, then eval; a tiny ResNet-18 with every
//    BatchNorm synchronised over the one-rank world (parallel::sync_batch_norms) matches the
//    plain model, and recompute with synchronised batch norm is bitwise no recompute.
//    (The multi-rank test is tests/parallel/test_sync_batch_norm.cpp, under mpirun.)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/core/allocator.h"
#include "brigade/models/resnet/resnet.h"
#include "brigade/ops/ops.h"
#include "brigade/optim/optimizer.h"
#include "brigade/parallel/sync_batch_norm.h"
#include "support/parity.h"

using namespace brigade;
using nn::Recompute;

namespace {

models::ResNetConfig tiny(bool bottleneck) {
  models::ResNetConfig c = bottleneck ? models::resnet50_config(5, 2, true) : models::resnet18_config(5, 2, true);
  c.width = 4;
  return c;
}

std::shared_ptr<models::ResNet> make(const models::ResNetConfig& c) {
  auto m = std::make_shared<models::ResNet>(c);
  Generator g(11);
  m->init_weights(g);
  m->train();
  return m;
}

// A deterministic batch: images (N, C, 12, 12) standard normal, labels in [0, classes).
std::pair<Tensor, Tensor> batch(const models::ResNetConfig& c, int64_t N, uint64_t seed) {
  Generator g(seed);
  Tensor x = Tensor::empty({N, c.in_channels, 12, 12});  // (N, C, 12, 12)
  g.normal_(x);
  std::vector<int64_t> lv(static_cast<size_t>(N));
  for (size_t i = 0; i < lv.size(); ++i) lv[i] = int64_t((i * 3 + seed) % uint64_t(c.num_classes));
  return {x, Tensor::from_vector_i64(lv, {N})};
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

struct StepResult {
  std::vector<uint8_t> loss;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> grads, buffers;
  int64_t held_after_forward = 0;  // activation bytes live after the forward
};

int64_t act_live() { return Allocator::instance().stats().live[int(MemTag::Activations)]; }

// One training forward + backward of a freshly initialised model with every block in `mode`,
// the forward under `policy`.
StepResult step(const models::ResNetConfig& c, Recompute mode, amp::Policy policy = {}) {
  auto m = make(c);
  for (auto& [name, b] : nn::find_blocks(*m)) b->recompute = mode;
  auto [x, labels] = batch(c, 4, 5);
  StepResult r;
  {
    MemTagScope tag(MemTag::Activations);
    amp::AutocastScope autocast(policy);
    const int64_t start = act_live();
    Tensor loss = m->loss(x, labels);
    r.held_after_forward = act_live() - start;
    r.loss = bytes_of(loss);
    autograd::backward(loss);
  }
  for (auto& [n, p] : m->named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << n;
    if (p.grad().defined()) r.grads.emplace_back(n, bytes_of(p.grad()));
  }
  for (auto& [n, b] : m->named_buffers()) {
    r.buffers.emplace_back(n, bytes_of(b));
    if (n.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(b.to_vector_i64()[0], 1) << n;
    }
  }
  return r;
}

void expect_bitwise(const StepResult& a, const StepResult& b) {
  EXPECT_EQ(a.loss, b.loss) << "loss";
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_EQ(a.grads[i].first, b.grads[i].first);
    EXPECT_TRUE(a.grads[i].second == b.grads[i].second) << "gradient of " << a.grads[i].first;
  }
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    EXPECT_EQ(a.buffers[i].first, b.buffers[i].first);
    EXPECT_TRUE(a.buffers[i].second == b.buffers[i].second) << "buffer " << a.buffers[i].first;
  }
}

std::vector<std::string> block_names(const nn::Module& m) {
  std::vector<std::string> out;
  for (auto& [n, b] : nn::find_blocks(m)) out.push_back(n);
  return out;
}

TEST(ResNetBlocks, FindBlocksListsTheResidualBlocksByTorchvisionName) {
  auto r18 = make(tiny(false));
  EXPECT_EQ(block_names(*r18), (std::vector<std::string>{"layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0",
                                                         "layer3.1", "layer4.0", "layer4.1"}));
  auto r50 = make(tiny(true));
  std::vector<std::string> want;
  const int64_t per_stage[4] = {3, 4, 6, 3};
  for (int s = 0; s < 4; ++s)
    for (int64_t j = 0; j < per_stage[s]; ++j)
      want.push_back("layer" + std::to_string(s + 1) + "." + std::to_string(j));
  EXPECT_EQ(block_names(*r50), want);
  // The blocks are the model's own modules: (*stages[k])[j] is the block named layer{k+1}.{j}.
  EXPECT_EQ(nn::find_blocks(*r18)[2].second, &(*r18->stages[1])[0]);
}

class ResNetRecompute : public ::testing::TestWithParam<bool> {};

TEST_P(ResNetRecompute, FullAndSelectiveAreBitwiseNoneIncludingBatchNormBuffers) {
  const models::ResNetConfig c = tiny(GetParam());
  const StepResult none = step(c, Recompute::None);
  // the step moved the running statistics away from their initial values
  bool moved = false;
  for (auto& [n, b] : make(c)->named_buffers())
    if (n.find("running_mean") != std::string::npos)
      for (auto& [n2, bytes] : none.buffers)
        if (n2 == n) moved |= bytes != bytes_of(b);
  EXPECT_TRUE(moved);
  int64_t held[2] = {0, 0};
  for (Recompute mode : {Recompute::Full, Recompute::Selective}) {
    SCOPED_TRACE(mode == Recompute::Full ? "full" : "selective");
    const StepResult r = step(c, mode);
    expect_bitwise(r, none);
    held[mode == Recompute::Full ? 0 : 1] = r.held_after_forward;
  }
  // Full keeps each block's input; Selective also its conv outputs (CheckpointKeep::GemmOutputs)
  EXPECT_LT(held[0], held[1]);
  EXPECT_LT(held[1], none.held_after_forward);
  std::printf("activation bytes held after the forward: full %lld, selective %lld, none %lld\n", (long long)held[0],
              (long long)held[1], (long long)none.held_after_forward);
}

// The checkpoint replays the forward's policy: O2 (bf16 convs, kept as bf16 conv outputs by
// Selective) is bitwise O2 without recompute.
TEST_P(ResNetRecompute, UnderO2Bf16TooBitwise) {
  const models::ResNetConfig c = tiny(GetParam());
  const amp::Policy o2{amp::Level::O2, DType::BF16};
  const StepResult none = step(c, Recompute::None, o2);
  EXPECT_NE(none.loss, step(c, Recompute::None).loss);  // O2 is not fp32
  for (Recompute mode : {Recompute::Full, Recompute::Selective}) {
    SCOPED_TRACE(mode == Recompute::Full ? "full" : "selective");
    expect_bitwise(step(c, mode, o2), none);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ResNetRecompute, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "ResNet50" : "ResNet18");
                         });

// ------------------------------------------------------------------ mixed precision

TEST(ResNetAmp, ConvPathDtypesPerLevelAndFp32Gradients) {
  const models::ResNetConfig c = tiny(false);
  auto m = make(c);
  auto [x, labels] = batch(c, 4, 5);
  struct Want {
    amp::Level level;
    DType conv, bn, relu;
  };
  for (Want w : {Want{amp::Level::O0, DType::F32, DType::F32, DType::F32},
                 Want{amp::Level::O1, DType::BF16, DType::F32, DType::F32},
                 Want{amp::Level::O2, DType::BF16, DType::BF16, DType::BF16},  // batch norm: mixed
                 Want{amp::Level::O3, DType::BF16, DType::BF16, DType::BF16}}) {
    SCOPED_TRACE(std::string(amp::level_name(w.level)));
    m->zero_grad();
    Tensor loss;
    {
      amp::AutocastScope autocast({w.level, DType::BF16});
      const Tensor y = m->conv1->forward(x);  // (N, width, 12, 12)
      EXPECT_EQ(y.dtype(), w.conv);
      const Tensor z = m->bn1->forward(y);
      EXPECT_EQ(z.dtype(), w.bn);
      EXPECT_EQ(fn::relu(z).dtype(), w.relu);
      auto& blk = static_cast<models::BasicBlock&>((*m->stages[1])[0]);
      EXPECT_EQ(blk.downsample->conv->forward(fn::relu(z)).dtype(), w.conv);
      loss = m->loss(x, labels);
    }
    EXPECT_EQ(loss.dtype(), DType::F32);  // the cross-entropy's loss is f32 at every level (ops.h)
    autograd::backward(loss);
    for (auto& [n, p] : m->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << n;
      EXPECT_EQ(p.grad().dtype(), DType::F32) << n;
    }
  }
  // O0 inside a scope is bitwise no scope at all
  auto a = make(c), b = make(c);
  Tensor la, lb;
  {
    amp::AutocastScope autocast({amp::Level::O0, DType::BF16});
    la = a->loss(x, labels);
  }
  lb = b->loss(x, labels);
  EXPECT_EQ(bytes_of(la), bytes_of(lb));
  autograd::backward(la);
  autograd::backward(lb);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(bytes_of(pa[i].second.grad()) == bytes_of(pb[i].second.grad()));
}

TEST(ResNetAmp, Bf16ConvolutionsRunOneDnnBf16Kernels) {
  if (!ops::conv2d_native_bf16()) GTEST_SKIP() << "oneDNN has no bf16 convolution on this CPU: bf16 convs widen";
  const models::ResNetConfig c = tiny(false);
  auto m = make(c);
  auto [x, labels] = batch(c, 4, 5);
  amp::AutocastScope autocast({amp::Level::O2, DType::BF16});
  m->conv1->forward(x);
  const std::string impl = ops::last_conv2d_impl();
  EXPECT_NE(impl.find("bf16"), std::string::npos) << impl;
  EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
}

// Losses of `steps` AdamW steps on one fixed random batch (the model memorises it).
std::vector<double> train_losses(const amp::Policy& policy, int steps) {
  models::ResNetConfig c = models::resnet18_config(10, 1, true);
  c.width = 8;
  auto m = make(c);
  Generator g(21);
  Tensor x = Tensor::empty({16, 1, 16, 16});  // (N, 1, 16, 16)
  g.normal_(x);
  std::vector<int64_t> lv(16);
  for (size_t i = 0; i < lv.size(); ++i) lv[i] = int64_t((i * 7) % 10);
  const Tensor labels = Tensor::from_vector_i64(lv, {16});
  optim::AdamW opt(m->named_parameters(), optim::AdamWOptions{});
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    m->zero_grad();
    Tensor loss;
    {
      amp::AutocastScope autocast(policy);
      loss = m->loss(x, labels);
    }
    losses.push_back(loss.item());
    autograd::backward(loss);
    opt.step(1e-3);
  }
  return losses;
}

TEST(ResNetAmp, O2Bf16TrainsLikeFp32) {
  const std::vector<double> f32 = train_losses({amp::Level::O0, DType::BF16}, 20);
  const std::vector<double> o2 = train_losses({amp::Level::O2, DType::BF16}, 20);
  double worst = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    worst = std::max(worst, std::fabs(o2[i] - f32[i]) / f32[i]);
    EXPECT_LT(std::fabs(o2[i] - f32[i]), 0.05 * f32[i]) << "step " << i << ": O2 " << o2[i] << " fp32 " << f32[i];
  }
  EXPECT_LT(o2.back(), 0.5 * o2.front()) << "O2 loss did not decrease: " << o2.front() << " -> " << o2.back();
  EXPECT_LT(f32.back(), 0.5 * f32.front());
  std::printf("fp32 loss %.4f -> %.4f, O2 bf16 %.4f -> %.4f; largest relative gap %.2f%%\n", f32.front(), f32.back(),
              o2.front(), o2.back(), 100 * worst);
}

// ------------------------------------------------------------------ synchronised batch norm

using brigade::test_support::rel_err;

// A group of one: the sums are already the group's. Counts its calls.
struct IdentitySync : fn::BatchNormSync {
  mutable int calls = 0;
  void allreduce_sum(double*, int64_t) const override { ++calls; }
};

Tensor randn(const Shape& s, uint64_t seed, double mean = 0.0) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  g.normal_(t, mean, 1.0);
  return t;
}

TEST(SyncBatchNorm, IdentityReducerMatchesBatchNorm2d) {
  const int64_t N = 5, C = 3;
  for (double offset : {0.0, 3.0}) {  // 3: the variance from sums of squares cancels a little
    SCOPED_TRACE("mean offset " + std::to_string(offset));
    nn::BatchNorm2d plain(C), synced(C);
    auto sync = std::make_shared<IdentitySync>();
    synced.sync = sync;
    for (nn::BatchNorm2d* bn : {&plain, &synced}) {
      bn->weight.copy_(randn({C}, 1, 1.0));
      bn->bias.copy_(randn({C}, 2));
    }
    const Tensor G = randn({N, C, 6, 7}, 4);  // a non-uniform upstream gradient
    Tensor xs[2], ys[2];
    for (int k = 0; k < 2; ++k) {
      xs[k] = randn({N, C, 6, 7}, 3, offset);
      xs[k].set_requires_grad(true);
      ys[k] = (k == 0 ? plain : synced).forward(xs[k]);
      autograd::backward(ys[k], G);
    }
    EXPECT_EQ(sync->calls, 2);  // one allreduce in the forward, one in the backward
    EXPECT_LT(rel_err(ys[1], ys[0]), 1e-6) << "output";
    EXPECT_LT(rel_err(xs[1].grad(), xs[0].grad()), 1e-6) << "gx";
    EXPECT_LT(rel_err(synced.weight.grad(), plain.weight.grad()), 1e-6) << "gw";
    EXPECT_LT(rel_err(synced.bias.grad(), plain.bias.grad()), 1e-6) << "gb";
    EXPECT_LT(rel_err(synced.running_mean, plain.running_mean), 1e-6) << "running_mean";
    EXPECT_LT(rel_err(synced.running_var, plain.running_var), 1e-6) << "running_var";
    EXPECT_EQ(synced.num_batches_tracked.to_vector_i64(), plain.num_batches_tracked.to_vector_i64());
    plain.train(false);
    synced.train(false);
    autograd::NoGradGuard ng;
    EXPECT_LT(rel_err(synced.forward(xs[0]), plain.forward(xs[0])), 1e-6) << "eval";
    EXPECT_EQ(sync->calls, 2);  // eval normalises with the running statistics: no allreduce
  }
}

TEST(SyncBatchNorm, ResNetOverTheOneRankWorldMatchesThePlainModelAndRecomputesBitwise) {
  const models::ResNetConfig c = tiny(false);
  auto [x, labels] = batch(c, 4, 5);
  auto plain = make(c);
  Tensor lp = plain->loss(x, labels);
  autograd::backward(lp);
  auto run = [&](Recompute mode) {
    auto m = make(c);
    EXPECT_EQ(parallel::sync_batch_norms(*m, dist::ProcessGroup::world()), 20);  // bn1, 2 per block, 3 downsamples
    for (auto& [n, b] : nn::find_blocks(*m)) b->recompute = mode;
    Tensor loss = m->loss(x, labels);
    autograd::backward(loss);
    return std::make_pair(m, loss);
  };
  auto [m, loss] = run(Recompute::None);
  EXPECT_LT(rel_err(loss, lp), 1e-6);
  auto pp = plain->named_parameters(), pm = m->named_parameters();
  for (size_t i = 0; i < pp.size(); ++i)
    EXPECT_LT(rel_err(pm[i].second.grad(), pp[i].second.grad()), 1e-5) << pp[i].first;
  auto bp = plain->named_buffers(), bm = m->named_buffers();
  for (size_t i = 0; i < bp.size(); ++i)
    if (bp[i].first.find("num_batches") == std::string::npos) {
      EXPECT_LT(rel_err(bm[i].second, bp[i].second), 1e-6) << bp[i].first;
    }
  for (Recompute mode : {Recompute::Full, Recompute::Selective}) {
    auto [mr, lr] = run(mode);
    EXPECT_EQ(bytes_of(lr), bytes_of(loss));
    auto pr = mr->named_parameters();
    for (size_t i = 0; i < pm.size(); ++i) EXPECT_TRUE(bytes_of(pr[i].second.grad()) == bytes_of(pm[i].second.grad()));
    auto br = mr->named_buffers();
    for (size_t i = 0; i < bm.size(); ++i) EXPECT_TRUE(bytes_of(br[i].second) == bytes_of(bm[i].second)) << bm[i].first;
  }
}

// ResNet-18 small-input training step (batch 32 of 1x28x28, forward + backward) at O0 and O2
// bf16, median of 5, on the threads OpenMP gives. Opt-in (slow): BRIGADE_RESNET_BENCH=1.
TEST(ResNetAmp, Resnet18StepSpeedO0VsO2) {
  if (!std::getenv("BRIGADE_RESNET_BENCH")) GTEST_SKIP() << "set BRIGADE_RESNET_BENCH=1 to measure";
  auto m = models::resnet18(10, 1, true);
  Generator g(1);
  m->init_weights(g);
  const auto [x, labels] = test_support::bench_image_batch(32, g);
  for (amp::Level level : {amp::Level::O0, amp::Level::O2, amp::Level::O0, amp::Level::O2}) {
    std::vector<double> t;
    for (int it = 0; it < 5; ++it) {
      m->zero_grad();
      const auto t0 = std::chrono::steady_clock::now();
      Tensor loss;
      {
        amp::AutocastScope autocast({level, DType::BF16});
        loss = m->loss(x, labels);
      }
      autograd::backward(loss);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    std::printf("ResNet-18 step (batch 32, 28x28) %s: median %.3f s, %.1f images/s\n",
                std::string(amp::level_name(level)).c_str(), t[2], 32 / t[2]);
  }
}

}  // namespace
