// data.corpus = "synthetic" (random images of any shape, for `brigade bench` and --dry-run) and
// ResNet's model.stem, through the `brigade` binary: bench times a ResNet-18 with the ImageNet
// stem on 3-channel 32x32 images of 7 classes (its parameter count is the small-stem 1-channel
// 10-class model's plus the difference the algebra of the two stems and heads gives);
// --dry-run predicts it; `brigade train` refuses
// the synthetic corpus in one error line. Needs no dataset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/recipes.h"

namespace fs = std::filesystem;
using brigade::test_support::CmdResult;

namespace {

class SyntheticImages : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = brigade::test_support::fresh_test_dir("brigade_synthetic"); }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }
  // a width-4 ResNet-18 recipe; `model` and `data` are extra lines of those sections
  void write(const std::string& model, const std::string& data) {
    std::ofstream(dir_ / "r.toml") << "[run]\nname = \"s\"\nout_dir = \"run\"\nthreads = 1\n"
                                   << "[model]\ntype = \"resnet18\"\nwidth = 4\n"
                                   << model << "[data]\n"
                                   << data << "[train]\nsteps = 2\nbatch_size = 4\n[schedule]\nwarmup_steps = 0\n";
  }
  CmdResult brigade(const std::string& args) {
    return brigade::test_support::run_brigade(dir_, args, 0, "", "OMP_NUM_THREADS=1");
  }
  nlohmann::json bench() {
    const CmdResult r = brigade("bench r.toml --steps 1 --warmup 0");
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  }
  fs::path dir_;
};

TEST_F(SyntheticImages, BenchTimesAnyShapeWithTheImageNetStem) {
  write("", "corpus = \"synthetic\"\n");  // Fashion-MNIST's shape, small stem
  const nlohmann::json small = bench();
  write("stem = \"imagenet\"\nimage_size = 32\nin_channels = 3\nnum_classes = 7\n", "corpus = \"synthetic\"\n");
  const nlohmann::json big = bench();
  ASSERT_FALSE(small.empty() || big.empty());
  EXPECT_EQ(big.at("item").get<std::string>(), "images");
  EXPECT_TRUE(std::isfinite(big.at("last_loss").get<double>()));
  // conv1: 4 x 1 x 3 x 3 -> 4 x 3 x 7 x 7; fc over the 8 x 4 = 32 final channels: 10 -> 7 outputs
  const int64_t w = 4, feat = 8 * w;
  EXPECT_EQ(big.at("parameters").get<int64_t>() - small.at("parameters").get<int64_t>(),
            w * (3 * 49 - 1 * 9) + (7 - 10) * (feat + 1));
  EXPECT_GT(big.at("flops_per_item").get<double>(), 0.0);
}

TEST_F(SyntheticImages, DryRunPredictsItAndTrainRefusesIt) {
  write("stem = \"imagenet\"\nimage_size = 32\nin_channels = 3\n", "corpus = \"synthetic\"\n");
  const CmdResult d = brigade("train r.toml --dry-run --json");
  ASSERT_EQ(d.code, 0) << d.err;
  const nlohmann::json pred = nlohmann::json::parse(d.out);
  EXPECT_GT(pred.at("ranks").at(0).at("peak").at("activations").get<double>(), 0.0);
  EXPECT_FALSE(fs::exists(dir_ / "run"));
  const CmdResult t = brigade("train r.toml --quiet");
  EXPECT_EQ(t.code, 1) << t.err;
  EXPECT_NE(t.err.find("data.corpus = \"synthetic\" is random images with random labels, for `brigade bench`"),
            std::string::npos)
      << t.err;
  EXPECT_EQ(std::count(t.err.begin(), t.err.end(), '\n'), 1) << t.err;
  EXPECT_FALSE(fs::exists(dir_ / "run")) << "a refused run creates nothing";
}

}  // namespace
