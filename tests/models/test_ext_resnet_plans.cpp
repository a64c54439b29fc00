// Plans applied to ResNet from outside (models/resnet, nn::Block):
//  - nn::find_blocks lists the residual blocks by torchvision name ("layer1.0" ... "layer4.1"
//    for ResNet-18, "layer1.0" ... "layer4.2" for ResNet-50), and nothing inside them;
//  - activation recompute (Full and Selective on every block) against None, for tiny
//    ResNet-18 and ResNet-50 layouts: one training forward + backward gives bitwise the same
//    loss, every parameter gradient and every BatchNorm buffer (running_mean, running_var,
//    num_batches_tracked: updated once per real forward, not again by the recompute), while
//    holding fewer activation bytes at the end of the forward.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/core/allocator.h"
#include "brigade/models/resnet/resnet.h"

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

// One training forward + backward of a freshly initialised model with every block in `mode`.
StepResult step(const models::ResNetConfig& c, Recompute mode) {
  auto m = make(c);
  for (auto& [name, b] : nn::find_blocks(*m)) b->recompute = mode;
  auto [x, labels] = batch(c, 4, 5);
  StepResult r;
  {
    MemTagScope tag(MemTag::Activations);
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
    if (n.find("num_batches_tracked") != std::string::npos) EXPECT_EQ(b.to_vector_i64()[0], 1) << n;
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
    for (int64_t j = 0; j < per_stage[s]; ++j) want.push_back("layer" + std::to_string(s + 1) + "." + std::to_string(j));
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
  std::printf("activation bytes held after the forward: full %lld, selective %lld, none %lld\n",
              (long long)held[0], (long long)held[1], (long long)none.held_after_forward);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ResNetRecompute, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "ResNet50" : "ResNet18");
                         });

}  // namespace
