// ResNet parity with the plain-PyTorch reference (tests/reference/resnet_ref.py; fixture
// tests/fixtures/resnet_tiny.safetensors from make_resnet_fixture.py): for a tiny basic-block
// and a tiny bottleneck config (small-input stem) and the bottleneck one with the ImageNet stem, train-mode logits and
// loss to 1e-5, every parameter gradient to 1e-4, BatchNorm running statistics after the train-mode forward, eval-mode
// logits to 1e-5 (relative errors: max|a - b| / max|b|). Also: torchvision names (parameters and buffers, in module
// order), train/eval reaching every BatchNorm, a safetensors save/load round trip by name, a Brigade checkpoint loading
// into the PyTorch model with the same logits (skipped without torch), the same checks for channels-last activations
// (model.memory_format), the standard ResNet-18/50 parameter counts, and the
// measured speed of one ResNet-18 small-input training step (batch 64) for the report.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/models/resnet/resnet.h"

#include "support/parity.h"

using namespace brigade;
using test_support::grad_err;
using test_support::rel_err;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(BRIGADE_FIXTURES_DIR) + "/resnet_tiny.safetensors";

models::ResNetConfig config_of(const ckpt::SafetensorsReader& r, const std::string& prefix) {
  auto j = nlohmann::json::parse(r.metadata("config." + prefix).value());
  models::ResNetConfig c;
  c.layers = j.at("layers").get<std::vector<int64_t>>();
  c.bottleneck = j.at("bottleneck");
  c.num_classes = j.at("num_classes");
  c.in_channels = j.at("in_channels");
  c.width = j.at("width");
  c.small_input = j.at("small_input");
  return c;
}

class ResNetParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kFixture)) << kFixture;
    r_.open(kFixture);
    ASSERT_EQ(r_.metadata("magic").value_or(""), "brigade-fixture");
    p_ = GetParam();
    m_ = std::make_shared<models::ResNet>(config_of(r_, p_));
    for (auto& [name, t] : m_->named_parameters()) r_.get_into(p_ + ".param." + name, t);
    for (auto& [name, t] : m_->named_buffers()) r_.get_into(p_ + ".buffer." + name, t);
  }
  Tensor get(const std::string& k) const { return r_.get(p_ + "." + k); }
  ckpt::SafetensorsReader r_;
  std::string p_;
  std::shared_ptr<models::ResNet> m_;
};

TEST_P(ResNetParity, NamesAreTorchvisions) {
  std::vector<std::string> want_p, want_b, got_p, got_b;
  for (const std::string& n : r_.names()) {
    if (n.rfind(p_ + ".param.", 0) == 0) want_p.push_back(n.substr(p_.size() + 7));
    if (n.rfind(p_ + ".buffer.", 0) == 0) want_b.push_back(n.substr(p_.size() + 8));
  }
  for (auto& [n, t] : m_->named_parameters()) got_p.push_back(n);
  for (auto& [n, t] : m_->named_buffers()) got_b.push_back(n);
  EXPECT_EQ(got_p, want_p);  // the fixture keeps torch's named_parameters() order
  EXPECT_EQ(got_b, want_b);
  for (auto& [n, t] : m_->named_parameters()) EXPECT_EQ(t.shape(), r_.info(p_ + ".param." + n).shape) << n;
}

TEST_P(ResNetParity, TrainModeLogitsLossGradientsAndRunningStatsMatchTorch) {
  m_->train();
  const Tensor images = get("images"), labels = get("labels");
  Tensor logits = m_->forward(images);
  EXPECT_LT(rel_err(logits, get("logits_train")), 1e-5);
  // loss() runs a second train-mode forward; compare the statistics after the first one.
  for (auto& [name, t] : m_->named_buffers()) {
    if (name.find("num_batches_tracked") != std::string::npos)
      EXPECT_EQ(t.to_vector_i64(), get("after." + name).to_vector_i64()) << name;
    else
      EXPECT_LT(rel_err(t, get("after." + name)), 1e-5) << name;
  }
  Tensor loss = fn::cross_entropy(logits, labels);
  EXPECT_LT(rel_err(loss, get("loss_train")), 1e-5) << loss.item() << " vs " << get("loss_train").item();
  autograd::backward(loss);
  for (auto& [name, p] : m_->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LT(rel_err(p.grad(), get("grad." + name)), 1e-4) << "gradient of " << name;
  }
}

// The same model with channels-last activations (NHWC convolutions and batch norms) against the
// same torch fixture: the layout changes no parameter, buffer or output beyond rounding.
TEST_P(ResNetParity, ChannelsLastMatchesTorchToo) {
  models::ResNetConfig c = config_of(r_, p_);
  c.channels_last = true;
  auto m = std::make_shared<models::ResNet>(c);
  for (auto& [name, t] : m->named_parameters()) r_.get_into(p_ + ".param." + name, t);
  for (auto& [name, t] : m->named_buffers()) r_.get_into(p_ + ".buffer." + name, t);
  const Tensor images = get("images"), labels = get("labels");
  m->train(false);
  {
    autograd::NoGradGuard ng;
    EXPECT_LT(rel_err(m->forward(images), get("logits_eval")), 1e-5);
  }
  m->train();
  Tensor logits = m->forward(images);
  EXPECT_LT(rel_err(logits, get("logits_train")), 1e-5);
  for (auto& [name, t] : m->named_buffers()) {
    if (name.find("num_batches_tracked") == std::string::npos) {
      EXPECT_LT(rel_err(t, get("after." + name)), 1e-5) << name;
    }
  }
  Tensor loss = fn::cross_entropy(logits, labels);
  autograd::backward(loss);
  for (auto& [name, p] : m->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LT(rel_err(p.grad(), get("grad." + name)), 1e-4) << "gradient of " << name;
  }
}

TEST_P(ResNetParity, LossIsMeanCrossEntropy) {
  m_->train();
  Tensor loss = m_->loss(get("images"), get("labels"));
  EXPECT_LT(rel_err(loss, get("loss_train")), 1e-5);
}

TEST_P(ResNetParity, EvalModeLogitsMatchTorchAndLeaveBuffersAlone) {
  m_->train(false);
  EXPECT_FALSE(m_->bn1->is_training());
  EXPECT_FALSE((*m_->stages[3])[0].is_training());
  autograd::NoGradGuard ng;
  EXPECT_LT(rel_err(m_->forward(get("images")), get("logits_eval")), 1e-5);
  for (auto& [name, t] : m_->named_buffers()) {
    if (name.find("num_batches_tracked") == std::string::npos) {
      EXPECT_EQ(rel_err(t, get("buffer." + name)), 0.0) << name;
    }
  }
}

TEST_P(ResNetParity, SafetensorsRoundTripByTorchvisionNames) {
  m_->train();
  {
    autograd::NoGradGuard ng;
    m_->forward(get("images"));  // move the running statistics away from the fixture's
  }
  const fs::path path = fs::temp_directory_path() / ("brigade_resnet_" + std::to_string(::getpid()) + ".safetensors");
  ckpt::save_safetensors(path.string(), m_->state_dict());
  models::ResNet m2(m_->config());
  ckpt::SafetensorsReader rd(path.string());
  ASSERT_EQ(rd.size(), m2.state_dict().size());
  for (auto& [name, t] : m2.state_dict()) rd.get_into(name, t);
  fs::remove(path);
  m_->train(false);
  m2.train(false);
  autograd::NoGradGuard ng;
  const Tensor a = m_->forward(get("images")), b = m2.forward(get("images"));
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  EXPECT_EQ(m2.bn1->num_batches_tracked.to_vector_i64(), m_->bn1->num_batches_tracked.to_vector_i64());
}

TEST_P(ResNetParity, BrigadeCheckpointLoadsIntoPyTorchWithTheSameLogits) {
  if (!test_support::have_torch())
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  m_->train();
  {
    autograd::NoGradGuard ng;
    m_->forward(get("images"));
  }
  m_->train(false);
  Tensor logits;
  {
    autograd::NoGradGuard ng;
    logits = m_->forward(get("images"));
  }
  const std::string base = (fs::temp_directory_path() / ("brigade_resnet_py_" + std::to_string(::getpid()))).string();
  ckpt::save_safetensors(base + ".model.safetensors", m_->state_dict(),
                         {{"config", r_.metadata("config." + p_).value()}});
  ckpt::save_safetensors(base + ".batch.safetensors", {{"images", get("images")}, {"logits", logits}});
  const std::string cmd = "/usr/bin/python3 " + std::string(BRIGADE_SOURCE_DIR) +
                          "/tests/reference/resnet_ref.py --model " + base + ".model.safetensors --batch " + base +
                          ".batch.safetensors";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove(base + ".model.safetensors");
  fs::remove(base + ".batch.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Tiny, ResNetParity, ::testing::Values("basic", "bottleneck", "imagenet_stem"));

TEST(ResNet, StandardParameterCountsAndNames) {
  // torchvision resnet18(num_classes=1000): 11,689,512; resnet50: 25,557,032.
  models::ResNet r18(models::resnet18_config(1000, 3, false));
  EXPECT_EQ(r18.num_parameters(), 11689512);
  models::ResNet r50(models::resnet50_config(1000, 3, false));
  EXPECT_EQ(r50.num_parameters(), 25557032);
  const auto np = r50.named_parameters();
  EXPECT_EQ(np.front().first, "conv1.weight");
  EXPECT_EQ(np.back().first, "fc.bias");
  bool has_ds = false;
  for (auto& [n, t] : np) has_ds |= n == "layer3.0.downsample.1.weight";
  EXPECT_TRUE(has_ds);
  EXPECT_EQ(r50.named_buffers().size(), size_t(3 * 53));  // 53 BatchNorm2d layers
}

TEST(ResNet, InitFollowsTorchvision) {
  auto m = models::resnet18(10, 1, true);
  Generator g(7);
  m->init_weights(g);
  auto& blk = static_cast<models::BasicBlock&>((*m->stages[3])[0]);
  const std::vector<float> w = blk.conv2->weight.to_vector();  // (512, 512, 3, 3): kaiming normal, fan_out
  double s2 = 0;
  for (float v : w) s2 += double(v) * double(v);
  const double sd = std::sqrt(s2 / double(w.size())), want = std::sqrt(2.0 / (512.0 * 9.0));
  EXPECT_NEAR(sd, want, 0.01 * want);
  for (float v : blk.bn2->weight.to_vector()) EXPECT_EQ(v, 1.0f);
  for (float v : blk.bn2->bias.to_vector()) EXPECT_EQ(v, 0.0f);
  const double bound = 1.0 / std::sqrt(512.0);
  for (float v : m->fc->weight.to_vector()) EXPECT_LE(std::abs(v), bound);
  EXPECT_EQ(m->conv1->weight.shape(), Shape({64, 1, 3, 3}));
  EXPECT_EQ(m->maxpool, nullptr);
}

// One ResNet-18 small-input training step (batch 64 of 1x28x28, forward + backward), one
// thread. Opt-in (slow): BRIGADE_RESNET_BENCH=1.
TEST(ResNet, Resnet18StepSpeed) {
  if (!std::getenv("BRIGADE_RESNET_BENCH")) GTEST_SKIP() << "set BRIGADE_RESNET_BENCH=1 to measure";
  omp_set_num_threads(1);
  auto m = models::resnet18(10, 1, true);
  Generator g(1);
  m->init_weights(g);
  const auto [x, labels] = test_support::bench_image_batch(64, g);
  double best = 1e30;
  for (int it = 0; it < 3; ++it) {
    m->zero_grad();
    const auto t0 = std::chrono::steady_clock::now();
    autograd::backward(m->loss(x, labels));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("ResNet-18 small-input step (batch 64, 1 thread, fwd+bwd): %.3f s, %.1f images/s\n", best, 64 / best);
}

}  // namespace
