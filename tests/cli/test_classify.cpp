// End-to-end tests of `brigade train` for the image classifiers (model.type = "vit" /
// "resnet18" on data.corpus = "fashion-mnist") and of `brigade eval --ckpt`: a tiny model
// trained for a few dozen steps on the real data learns (loss falls, test accuracy above
// chance), writes metrics.jsonl and a checkpoint with parameters and buffers, and `brigade
// eval` on that checkpoint prints exactly the final test accuracy and loss. Bad combinations
// end in one clear error line. Skipped when Debian's Fashion-MNIST files are not installed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/recipes.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

using test_support::CmdResult;
using test_support::slurp;

const char* kData = "/usr/share/datasets/fashion-mnist";

CmdResult brigade(const std::string& args, const fs::path& cwd) {
  return test_support::run_brigade(cwd, args, 0, "", "", 120);
}

const char* kVit = R"(
[run]
name = "tiny-vit"
out_dir = "vit"
seed = 3
threads = 1
[model]
type = "vit"
patch_size = 7
n_layer = 2
n_head = 2
n_embd = 32
intermediate_size = 64
layer_norm_eps = 1e-6
[data]
corpus = "fashion-mnist"
dir = "/usr/share/datasets/fashion-mnist"
augment = false
[train]
steps = 100
batch_size = 64
eval_every = 30
eval_batches = 2
log_every = 5
[optim]
lr = 5e-3
weight_decay = 0.05
beta2 = 0.99
[schedule]
warmup_steps = 5
min_lr = 1e-4
)";

const char* kResnet = R"(
[run]
name = "tiny-resnet"
out_dir = "resnet"
seed = 3
threads = 1
[model]
type = "resnet18"
width = 4
[data]
corpus = "fashion-mnist"
dir = "/usr/share/datasets/fashion-mnist"
augment = true
[train]
steps = 80
batch_size = 32
eval_every = 0
log_every = 5
[optim]
name = "sgd"
lr = 0.05
momentum = 0.9
weight_decay = 5e-4
[schedule]
warmup_steps = 2
min_lr = 1e-3
)";

const char* kSwin = R"(
[run]
name = "tiny-swin"
out_dir = "swin"
seed = 3
threads = 1
[model]
type = "swin"
patch_size = 2
n_embd = 32
n_head = 1
depths = "1,2"
window_size = 7
mlp_ratio = 2.0
[data]
corpus = "fashion-mnist"
dir = "/usr/share/datasets/fashion-mnist"
[train]
steps = 100
batch_size = 32
eval_every = 0
log_every = 5
[optim]
lr = 5e-3
weight_decay = 0.05
[schedule]
warmup_steps = 5
min_lr = 1e-4
)";

class Classify : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(kData) / "t10k-images-idx3-ubyte.gz"))
      GTEST_SKIP() << kData << " is missing (apt install dataset-fashion-mnist)";
    dir_ = brigade::test_support::fresh_test_dir("brigade_classify");
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream f(dir_ / name);
    f << text;
  }
  std::vector<nlohmann::json> records(const std::string& run_dir) {
    std::ifstream f(dir_ / run_dir / "metrics.jsonl");
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  // Trains `recipe`, checks metrics, checkpoint and `brigade eval`; returns the final accuracy.
  double train_and_eval(const std::string& recipe, const std::string& run_dir, const std::vector<std::string>& keys) {
    CmdResult t = brigade("train " + recipe + " --quiet", dir_);
    EXPECT_EQ(t.code, 0) << t.err << t.out;
    if (t.code != 0) return 0;
    std::smatch m;
    const std::regex final_re(R"(final test accuracy: ([0-9.]+)% \((\d+)/(\d+)\) \| test loss ([0-9.]+))");
    EXPECT_TRUE(std::regex_search(t.out, m, final_re)) << t.out;
    const std::string acc = m[1], correct = m[2], total = m[3], loss = m[4];
    EXPECT_EQ(total, "10000");

    // metrics.jsonl: train records with loss/lr/images_per_s, eval records with accuracy
    std::vector<double> losses;
    nlohmann::json last_eval;
    int evals = 0;
    for (const auto& j : records(run_dir)) {
      if (j.contains("loss")) {
        EXPECT_TRUE(j.contains("lr") && j.contains("images_per_s")) << j.dump();
        losses.push_back(j["loss"].get<double>());
      }
      if (j.contains("accuracy")) {
        EXPECT_TRUE(j.contains("val_loss")) << j.dump();
        last_eval = j, ++evals;
      }
    }
    EXPECT_GE(losses.size(), 6u);
    EXPECT_GE(evals, 1);
    if (losses.size() >= 6) {
      const double first = (losses[0] + losses[1] + losses[2]) / 3;
      const size_t n = losses.size();
      const double last = (losses[n - 1] + losses[n - 2] + losses[n - 3]) / 3;
      EXPECT_LT(last, first) << "loss did not decrease";
    }
    EXPECT_EQ(last_eval["test_images"].get<int64_t>(), 10000);
    const double accuracy = last_eval["accuracy"].get<double>();
    EXPECT_EQ(std::to_string(std::llround(accuracy * 10000)), correct);

    // checkpoint with every tensor (parameters and buffers) by name
    const fs::path ck = dir_ / run_dir / "checkpoint";
    for (const char* f : {"model.safetensors", "recipe.toml", "state.json"}) EXPECT_TRUE(fs::exists(ck / f)) << f;
    const std::string st = slurp(ck / "model.safetensors");
    for (const auto& k : keys) EXPECT_NE(st.find("\"" + k + "\""), std::string::npos) << k;
    EXPECT_TRUE(fs::exists(dir_ / run_dir / "loss.svg"));

    // brigade eval reproduces the final numbers exactly
    CmdResult e = brigade("eval --ckpt " + run_dir + "/checkpoint", dir_);
    EXPECT_EQ(e.code, 0) << e.err;
    const std::regex eval_re(R"(test accuracy: ([0-9.]+)% \((\d+)/(\d+)\) \| test loss ([0-9.]+))");
    EXPECT_TRUE(std::regex_search(e.out, m, eval_re)) << e.out;
    EXPECT_EQ(m[1].str(), acc);
    EXPECT_EQ(m[2].str(), correct);
    EXPECT_EQ(m[4].str(), loss);
    return accuracy;
  }
  // One "brigade: error: ..." line, exit 1.
  void expect_one_error(const CmdResult& r, const std::string& needle) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("brigade: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }
  fs::path dir_;
};

TEST_F(Classify, TinyVitTrainsAndEvalReproducesAccuracy) {
  write("vit.toml", kVit);
  const double acc = train_and_eval("vit.toml", "vit",
                                    {"vit.embeddings.cls_token", "vit.embeddings.patch_embeddings.projection.weight",
                                     "vit.encoder.layer.1.output.dense.weight", "classifier.bias"});
  EXPECT_GT(acc, 0.4) << "100 steps of a tiny ViT should beat chance (0.1) clearly";
  // two records at step 30: the capped periodic eval (2 x 64 images)
  bool capped = false;
  for (const auto& j : records("vit"))
    if (j.contains("accuracy") && j["step"] == 30) capped = j["test_images"] == 128;
  EXPECT_TRUE(capped);
}

TEST_F(Classify, TinyResnetTrainsAndEvalReproducesAccuracy) {
  write("resnet.toml", kResnet);
  const double acc = train_and_eval("resnet.toml", "resnet",
                                    {"conv1.weight", "bn1.running_mean", "layer4.1.bn2.running_var",
                                     "layer2.0.downsample.1.num_batches_tracked", "fc.weight"});
  EXPECT_GT(acc, 0.3) << "80 steps of a tiny ResNet should beat chance (0.1) clearly (40 steps: ~0.28, the running "
                         "statistics still settling)";
}

// Swin: stage 0 (14x14 grid, 7x7 windows) holds one unshifted block; stage 1 (7x7, the window
// is the whole grid) two blocks, so no shift there either; patch merging between them.
TEST_F(Classify, TinySwinTrainsAndEvalReproducesAccuracy) {
  write("swin.toml", kSwin);
  const double acc = train_and_eval(
      "swin.toml", "swin",
      {"swin.embeddings.patch_embeddings.projection.weight", "swin.embeddings.norm.weight",
       "swin.encoder.layers.0.blocks.0.attention.self.relative_position_bias_table",
       "swin.encoder.layers.0.downsample.reduction.weight", "swin.encoder.layers.1.blocks.1.output.dense.bias",
       "swin.layernorm.weight", "classifier.weight"});
  EXPECT_GT(acc, 0.3) << "100 steps of a tiny Swin should beat chance (0.1) clearly";
  // a shifted block: depths "2" at stage 0 makes block 1 shift by 3; it trains and reproduces too
  write("swin2.toml", kSwin);
  CmdResult r =
      brigade("train swin2.toml --quiet --set model.depths=2 --set train.steps=10 --set run.out_dir=swin2", dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("final test accuracy"), std::string::npos) << r.out;
}

// --stop-at then --resume ends with the same weights, metrics and accuracy as one run (one thread).
TEST_F(Classify, StopAndResumeMatchesAnUninterruptedRun) {
  write("vit.toml", kVit);
  const std::string base = "train vit.toml --quiet --set train.steps=60 --set train.eval_every=20";
  CmdResult full = brigade(base + " --set run.out_dir=full", dir_);
  ASSERT_EQ(full.code, 0) << full.err;
  CmdResult first = brigade(base + " --set run.out_dir=split --stop-at 25", dir_);
  ASSERT_EQ(first.code, 0) << first.err;
  CmdResult rest = brigade(base + " --set run.out_dir=split --resume", dir_);
  ASSERT_EQ(rest.code, 0) << rest.err;
  EXPECT_EQ(rest.out, full.out.substr(0, full.out.find(" in ")) + rest.out.substr(rest.out.find(" in ")));
  EXPECT_EQ(slurp(dir_ / "split/checkpoint/model.safetensors"), slurp(dir_ / "full/checkpoint/model.safetensors"));
  EXPECT_EQ(slurp(dir_ / "split/checkpoint/optimizer.safetensors"),
            slurp(dir_ / "full/checkpoint/optimizer.safetensors"));
  // metrics.jsonl: the step-25 stop evaluation is cut, so the same evaluation steps remain
  auto eval_steps = [&](const std::string& run) {
    std::vector<int64_t> v;
    for (const auto& j : records(run))
      if (j.contains("accuracy")) v.push_back(j["step"].get<int64_t>());
    return v;
  };
  EXPECT_EQ(eval_steps("split"), eval_steps("full"));
  EXPECT_EQ(eval_steps("full"), (std::vector<int64_t>{20, 40, 60}));
  // nothing left to train, and a different model, are one clear line each
  expect_one_error(brigade(base + " --set run.out_dir=split --resume", dir_), "nothing to train");
  expect_one_error(brigade(base + " --set run.out_dir=split --resume --set model.n_embd=64", dir_),
                   "holds a different model");
  expect_one_error(brigade(base + " --set run.out_dir=none --resume", dir_), "no checkpoint in");
}

// Ctrl-C: the step finishes, the checkpoint is written (no evaluation: `brigade eval` does that),
// exit 130; --resume then continues from that step.
TEST_F(Classify, InterruptCheckpointsAndExits130) {
  write("vit.toml", kVit);
  // signal once a training step is logged (the handler is installed before the loop)
  const CmdResult r = test_support::interrupt_brigade(
      dir_, "train vit.toml --set train.steps=100000 --set run.out_dir=intr", dir_ / "intr" / "metrics.jsonl", SIGINT);
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_NE(r.err.find("interrupted at step"), std::string::npos) << r.err;
  const nlohmann::json state = nlohmann::json::parse(slurp(dir_ / "intr/checkpoint/state.json"));
  const int64_t step = state["step"].get<int64_t>();
  ASSERT_GE(step, 1);
  for (const auto& j : records("intr")) EXPECT_FALSE(j.contains("accuracy") && j["step"] == step) << j.dump();
  CmdResult more =
      brigade("train vit.toml --quiet --set train.steps=100000 --set run.out_dir=intr --resume --stop-at " +
                  std::to_string(step + 3),
              dir_);
  EXPECT_EQ(more.code, 0) << more.err;
  EXPECT_NE(more.out.find(std::to_string(step + 3) + " steps"), std::string::npos) << more.out;
}

TEST_F(Classify, BadCombinationsAreOneErrorLine) {
  write("vit.toml", kVit);
  expect_one_error(brigade("train vit.toml --set data.corpus=kjv", dir_), "is an image model");
  expect_one_error(brigade("train vit.toml --set model.patch_size=5", dir_), "must divide model.image_size");
  expect_one_error(brigade("train vit.toml --set model.type=gpt", dir_), "trains on text");
  expect_one_error(brigade("train vit.toml --set parallel.dp=2", dir_), "this job has 1 process");
  expect_one_error(brigade("train vit.toml --set data.dir=nowhere", dir_), "nowhere");
  expect_one_error(
      brigade("train vit.toml --set model.type=swin --set model.intermediate_size=0 --set model.patch_size=4", dir_),
      "patch merging cannot halve");
  expect_one_error(brigade("train vit.toml --set model.type=swin --set model.intermediate_size=0 --set "
                           "model.patch_size=2 --set model.window_size=5",
                           dir_),
                   "does not divide stage 0's 14x14 grid");
  expect_one_error(brigade("eval --ckpt missing", dir_), "no such checkpoint directory");
  fs::create_directories(dir_ / "lm");
  write("lm/recipe.toml", "[model]\ntype = \"gpt\"\n");
  expect_one_error(brigade("eval --ckpt lm", dir_), "model.safetensors");
}

}  // namespace
