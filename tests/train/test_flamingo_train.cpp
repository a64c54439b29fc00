// Flamingo through the one trainer (model.type "flamingo", train/tasks/flamingo.cpp): tiny CLIP and
// GPT runs give the frozen towers; a Flamingo run on them keeps every frozen tensor bitwise, moves the
// gates, starts as the LM (the step-0 model's logits are the GPT checkpoint's), reports the
// rank-classification table with both controls, matches one process under dp 2, resumes bitwise and
// trains under O2 bf16. The `brigade` binary; mpirun cases skip without it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/models/flamingo/flamingo.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/config.h"
#include "brigade/train/registry.h"
#include "brigade/train/task.h"
#include "brigade/train/tasks.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

using namespace brigade;
namespace fs = std::filesystem;
using test_support::CmdResult;
using test_support::Curve;

namespace {

const std::string kBin = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";
const std::string kMpirun = BRIGADE_MPIRUN;

const char* kCommon =
    "[train]\nsteps = {steps}\nbatch_size = {rows}\neval_every = 5\neval_batches = 1\nlog_every = 1\n"
    "grad_clip = 1.0\n[optim]\nlr = 3e-3\nweight_decay = 0.0\n[schedule]\nwarmup_steps = 2\nmin_lr = 3e-4\n";

std::string common(int steps, int rows) {
  std::string s = kCommon;
  s.replace(s.find("{steps}"), 7, std::to_string(steps));
  s.replace(s.find("{rows}"), 6, std::to_string(rows));
  return s;
}

class FlamingoTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test_support::have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST (apt install dataset-fashion-mnist)";
    dir_ = test_support::fresh_test_dir("brigade_flamingo_train");
    test_support::write_fashion_subset(dir_ / "fashion", 512, 100);
    test_support::write_tiny_corpus(dir_ / "corpus.txt");
    // the class phrases' characters, so the tiny LM's tokenizer can spell the captions
    std::ofstream(dir_ / "corpus.txt", std::ios::app)
        << "t-shirt or top, trouser, pullover, dress, coat, sandal, shirt, sneaker, bag, ankle boot.\n";
    const std::string img = "[data]\ncorpus = \"fashion-mnist\"\ndir = \"fashion\"\n";
    std::ofstream(dir_ / "clip.toml")
        << "[run]\nname = \"clip\"\nout_dir = \"clip\"\nseed = 3\nthreads = 1\n[model]\ntype = \"clip\"\n"
           "patch_size = 7\nn_layer = 1\nn_head = 2\nn_embd = 32\nintermediate_size = 64\ntext_layers = 1\n"
           "text_heads = 2\ntext_width = 32\nprojection_dim = 16\n"
        << img << common(3, 16);
    // block_size 64: Flamingo's rows (four chunks of a character-level phrase) need the room
    std::ofstream(dir_ / "gpt.toml") << "[run]\nname = \"gpt\"\nout_dir = \"gpt\"\nseed = 4\nthreads = 1\n[model]\n"
                                        "vocab_size = 128\nblock_size = 64\nn_layer = 2\nn_head = 2\nn_embd = 32\n"
                                        "[data]\ncorpus = \"corpus.txt\"\ndir = \"data\"\nval_fraction = 0.1\n"
                                     << "[train]\nseq_len = 16\n"
                                     << common(3, 4).substr(8);
    for (const char* t : {"clip", "gpt"}) {
      const CmdResult r = test_support::run_in(dir_, kBin + " train " + t + ".toml --quiet --no-sample");
      ASSERT_EQ(r.code, 0) << t << "\n" << r.err;
    }
    std::ofstream(dir_ / "r.toml") << "[run]\nname = \"fl\"\nout_dir = \"run\"\nseed = 5\nthreads = 1\n[model]\n"
                                      "type = \"flamingo\"\nvision_from = \"clip/checkpoint\"\n"
                                      "lm_from = \"gpt/checkpoint\"\nresampler_depth = 1\nresampler_heads = 2\n"
                                      "resampler_latents = 4\ncross_attn_every_n_layers = 1\n"
                                   << img << common(10, 8);
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }
  CmdResult run(int np, const std::string& args) {
    return test_support::run_in(
        dir_, test_support::launcher(np > 1 ? np : 0, kMpirun, np > 1 ? "" : "OMP_NUM_THREADS=1") + " " + kBin +
                  " train r.toml --quiet --no-sample " + args);
  }
  Curve ok(int np, const std::string& out, const std::string& args = "") {
    const CmdResult r = run(np, "--set run.out_dir=" + out + " " + args);
    EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
    return test_support::read_curve(dir_ / out / "metrics.jsonl");
  }
  fs::path dir_;
};

TEST_F(FlamingoTrain, FrozenTowersStayBitwiseTheGatesTrainAndTheTableHasBothControls) {
  const Curve c = ok(1, "run");
  ASSERT_EQ(c.loss.size(), 10u);
  EXPECT_LT(c.loss.at(10), c.loss.at(1));
  const ckpt::SafetensorsReader out((dir_ / "run/checkpoint/model.safetensors").string());
  const ckpt::SafetensorsReader vis((dir_ / "clip/checkpoint/model.safetensors").string());
  const ckpt::SafetensorsReader lm((dir_ / "gpt/checkpoint/model.safetensors").string());
  int64_t frozen = 0, gates_moved = 0;
  for (const std::string& name : out.names()) {
    const bool v = name.rfind("vision_model.", 0) == 0;
    const bool t = name.rfind("transformer.", 0) == 0 && name != "transformer.wte.additional_embedding.weight";
    if (v || t) {
      const Tensor a = out.get(name), b = (v ? vis : lm).get(name);
      ASSERT_EQ(a.shape(), b.shape()) << name;
      EXPECT_EQ(a.to_vector(), b.to_vector()) << name << " changed: a frozen tower must not train";
      ++frozen;
    }
    if (name.find("alpha_cross_attn") != std::string::npos || name.find("alpha_dense") != std::string::npos)
      gates_moved += out.get(name).item() != 0.0;
  }
  EXPECT_GT(frozen, 20);
  EXPECT_EQ(gates_moved, 4) << "both gates of the two gated blocks start at 0 and must train";
  // the final evaluation's table: 0-shot, 4-shot and both controls, over the whole test split
  std::ifstream f(dir_ / "run/metrics.jsonl");
  nlohmann::json last;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("zero_shot_accuracy")) last = j;
  }
  for (const char* k :
       {"zero_shot_accuracy", "four_shot_accuracy", "gates_zero_accuracy", "shuffled_images_accuracy"}) {
    ASSERT_TRUE(last.contains(k)) << last.dump();
    EXPECT_GE(last[k].get<double>(), 0.0);
    EXPECT_LE(last[k].get<double>(), 1.0);
  }
  EXPECT_EQ(last["test_images"].get<int64_t>(), 100);
}

TEST_F(FlamingoTrain, AtStepZeroTheModelIsTheLanguageModel) {
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);  // the recipe's tower paths are relative
  struct Back {
    fs::path p;
    ~Back() { fs::current_path(p); }
  } back{cwd};
  const train::Recipe r = train::load_recipe((dir_ / "r.toml").string());
  std::unique_ptr<train::Task> task = train::make_task(r);
  auto& fl = dynamic_cast<models::Flamingo&>(task->model());
  const train::Recipe lr = train::checkpoint_recipe("gpt/checkpoint");
  std::unique_ptr<models::CausalLM> gpt = train::make_causal_lm(lr.model);
  train::load_model_weights("gpt/checkpoint/model.safetensors", *gpt);
  // ids with images before, at and between the text tokens
  const int64_t V = lr.model.vocab_size, img = fl.config().image_token_id();
  const std::vector<int64_t> seq{img, 5, 9, 17, V, img, 40, 3, 11, V, 2, 7};
  const Tensor ids = Tensor::from_vector_i64(seq, {1, int64_t(seq.size())});
  autograd::NoGradGuard ng;
  // text alone: the first V columns are the GPT checkpoint's logits, bitwise
  const Tensor lm_ids = Tensor::from_vector_i64({5, 9, 17, 40}, {1, 4});
  const std::vector<float> want = gpt->forward(lm_ids).contiguous().to_vector();        // (1, 4, V)
  const std::vector<float> fp = fl.forward(Tensor(), lm_ids).contiguous().to_vector();  // (1, 4, V + 2)
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t v = 0; v < V; ++v)
      ASSERT_EQ(fp[size_t(t * (V + 2) + v)], want[size_t(t * V + v)]) << "t " << t << " v " << v;
  // with images: the gates are 0, so the logits are the extended LM's, whatever the images
  const Tensor images = Tensor::full({2, 1, 28, 28}, 0.3);
  EXPECT_EQ(fl.forward(images, ids).contiguous().to_vector(), fl.lm_logits(ids).contiguous().to_vector());
}

TEST_F(FlamingoTrain, DataParallelMatchesOneProcessResumeIsBitwiseAndO2Trains) {
  const Curve ref = ok(1, "ref");
  ASSERT_EQ(ref.loss.size(), 10u);
  ok(1, "split", "--stop-at 5");
  const Curve split = ok(1, "split", "--resume");
  EXPECT_EQ(split.loss_text, ref.loss_text);
  EXPECT_EQ(split.val_text, ref.val_text);
  EXPECT_EQ(test_support::slurp(dir_ / "split/checkpoint/model.safetensors"),
            test_support::slurp(dir_ / "ref/checkpoint/model.safetensors"));
  const Curve bf16 = ok(1, "bf16", "--set precision.level=O2 --set precision.dtype=bf16");
  ASSERT_EQ(bf16.loss.size(), 10u);
  for (auto& [s, v] : bf16.loss) EXPECT_TRUE(std::isfinite(v)) << s;
  EXPECT_LT(bf16.loss.at(10), bf16.loss.at(1));
  if (!test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun for the dp case";
  for (int zero : {0, 3}) {
    const Curve d = ok(2, "dp" + std::to_string(zero),
                       "--set train.batch_size=4 --set parallel.dp=2 --set parallel.zero=" + std::to_string(zero));
    test_support::expect_close(d.loss, ref.loss, "flamingo dp 2 ZeRO-" + std::to_string(zero));
    test_support::expect_close(d.val_loss, ref.val_loss, "flamingo dp 2 ZeRO-" + std::to_string(zero) + " (val)");
  }
}

}  // namespace
