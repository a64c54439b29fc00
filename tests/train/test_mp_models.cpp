// Model parallelism for every model with a plan: GPT, LLaMA, BERT and ViT at tiny sizes through
// the one trainer (the `brigade` binary, one thread per process, under mpirun):
//   - tensor parallelism (parallel.tp = 2: each model's tp_plan() applied by the generic
//     parallel::apply_tensor_parallel) and a pipeline (parallel.pp = 2, 1F1B, 2 micro-batches:
//     the task's Stages) each give the one-process losses, train and val, within 1e-5 relative
//     over 10 steps at the same global batch. LLaMA has n_kv_head 2 of n_head 4 (tp 2 divides
//     both) and a vocabulary of 127 (its untied head padded to 128 under tp); BERT's two
//     pipeline micro-batches hold different numbers of masked tokens (their losses are weighted
//     by their shares); ViT's final evaluation cuts 256 test images into two micro-batches;
//   - a tp 2 run's checkpoint holds the whole model (gathered to rank 0): model.safetensors
//     loads in one process (train::evaluate_checkpoint, the `brigade eval` path) and evaluates
//     to the run's own final val loss within 1e-5.
// Image models read a 512 / 256-image subset of Debian's Fashion-MNIST that the test writes (the
// ViT cases skip without the dataset); text models the tiny corpus of tests/support. Every case
// skips without mpirun.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "brigade/data/ext_fashion_mnist.h"
#include "brigade/train/trainer.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using brigade::test_support::CmdResult;
using brigade::test_support::slurp;

namespace {

const std::string kBin = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";
const std::string kMpirun = BRIGADE_MPIRUN;
const char* kFashion = "/usr/share/datasets/fashion-mnist";

struct ModelCase {
  std::string name;
  std::string model;  // the [model] section's keys
  bool images = false;
};

void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

const std::vector<ModelCase>& cases() {
  static const std::vector<ModelCase> c{
      {"gpt", "vocab_size = 127\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_embd = 32\n", false},
      {"llama",
       "type = \"llama\"\nvocab_size = 127\nblock_size = 16\nn_layer = 2\nn_head = 4\nn_kv_head = 2\nn_embd = 32\n"
       "intermediate_size = 64\n",
       false},
      {"bert",
       "type = \"bert\"\nvocab_size = 127\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_embd = 32\n"
       "intermediate_size = 64\n",
       false},
      {"vit", "type = \"vit\"\npatch_size = 7\nn_layer = 2\nn_head = 2\nn_embd = 32\nintermediate_size = 64\n", true},
  };
  return c;
}

// Fashion-MNIST's first n train / m test images as IDX files (uncompressed: read_idx_gz reads
// plain files too) under `dir`.
void write_fashion_subset(const fs::path& dir, int64_t n, int64_t m) {
  fs::create_directories(dir);
  auto be32 = [](std::ofstream& f, uint32_t v) {
    const unsigned char b[4] = {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
    f.write(reinterpret_cast<const char*>(b), 4);
  };
  for (auto [split, prefix, count] : {std::tuple{brigade::data::FashionMnist::Split::Train, "train", n},
                                      std::tuple{brigade::data::FashionMnist::Split::Test, "t10k", m}}) {
    const brigade::data::FashionMnist set(kFashion, split);
    std::ofstream img(dir / (std::string(prefix) + "-images-idx3-ubyte.gz"), std::ios::binary);
    be32(img, 0x00000803);
    be32(img, uint32_t(count));
    be32(img, 28);
    be32(img, 28);
    std::ofstream lab(dir / (std::string(prefix) + "-labels-idx1-ubyte.gz"), std::ios::binary);
    be32(lab, 0x00000801);
    be32(lab, uint32_t(count));
    for (int64_t i = 0; i < count; ++i) {
      img.write(reinterpret_cast<const char*>(set.pixels(i)), 28 * 28);
      const char y = char(set.label(i));
      lab.write(&y, 1);
    }
  }
}

struct Curve {
  std::map<int64_t, double> loss, val_loss;
};

class MpModels : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
    const ModelCase& c = GetParam();
    if (c.images && !fs::exists(fs::path(kFashion) / "t10k-images-idx3-ubyte.gz"))
      GTEST_SKIP() << kFashion << " is missing (apt install dataset-fashion-mnist)";
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();  // "Name/model"
    for (char& ch : test)
      if (ch == '/') ch = '_';
    dir_ = fs::temp_directory_path() / ("brigade_mpm_" + test + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string data;
    if (c.images) {
      write_fashion_subset(dir_ / "fashion", 512, 256);
      data = "corpus = \"fashion-mnist\"\ndir = \"fashion\"\n";
    } else {
      brigade::test_support::write_tiny_corpus(dir_ / "corpus.txt");
      data = "corpus = \"corpus.txt\"\ndir = \"data\"\nval_fraction = 0.1\n";
    }
    std::ofstream(dir_ / "r.toml") << "[run]\nname = \"mpm\"\nout_dir = \"run\"\nseed = 5\nthreads = 1\n[model]\n"
                                   << c.model << "[data]\n"
                                   << data
                                   << "[train]\nsteps = 10\nbatch_size = 8\nseq_len = 16\neval_every = 5\n"
                                      "eval_batches = 1\nlog_every = 1\ngrad_clip = 1.0\n[optim]\nlr = 3e-3\n"
                                      "weight_decay = 0.01\n[schedule]\nwarmup_steps = 2\nmin_lr = 3e-4\n";
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }
  static bool have_mpirun() { return !kMpirun.empty() && ::access(kMpirun.c_str(), X_OK) == 0; }

  // `brigade train r.toml` with `args` in the test dir, under mpirun -np np (np > 1) or alone.
  CmdResult run(int np, const std::string& args) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string launcher =
        np > 1 ? std::string(brigade::test_support::kMpiEnv) + " timeout 300 " + kMpirun +
                     " --oversubscribe --bind-to none -np " + std::to_string(np)
               : "-u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_RANK OMP_NUM_THREADS=1 timeout 300";
    const std::string cmd = "cd '" + dir_.string() + "' && env " + launcher + " " + kBin +
                            " train r.toml --quiet --no-sample " + args + " >'" + out.string() + "' 2>'" +
                            err.string() + "'";
    const int st = std::system(cmd.c_str());
    CmdResult r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }
  // A run that must succeed, into out_dir; its curve.
  Curve ok(int np, const std::string& out_dir, const std::string& args) {
    const CmdResult r = run(np, "--set run.out_dir=" + out_dir + " " + args);
    EXPECT_EQ(r.code, 0) << GetParam().name << " np " << np << " " << args << "\n" << r.err;
    Curve c;
    std::ifstream f(dir_ / out_dir / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      const int64_t step = j.at("step");
      if (j.contains("val_loss"))
        c.val_loss[step] = j["val_loss"];
      else if (j.contains("loss"))
        c.loss[step] = j["loss"];
    }
    return c;
  }

  fs::path dir_;
};

// `got` has exactly the steps of `want`, each within `tol` relative.
void expect_close(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, const std::string& what,
                  double tol = 1e-5) {
  ASSERT_FALSE(want.empty()) << what;
  EXPECT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, w] : want) {
    auto it = got.find(step);
    if (it == got.end()) {
      ADD_FAILURE() << what << ": no record for step " << step;
      continue;
    }
    EXPECT_TRUE(std::isfinite(it->second)) << what << " step " << step;
    EXPECT_LE(std::abs(it->second - w), tol * std::abs(w))
        << what << " step " << step << ": " << it->second << " vs " << w;
  }
}

TEST_P(MpModels, TensorAndPipelineParallelMatchOneProcess) {
  const ModelCase& c = GetParam();
  const Curve ref = ok(1, "ref", "");
  ASSERT_EQ(ref.loss.size(), 10u);
  ASSERT_EQ(ref.val_loss.size(), 2u);
  const Curve tp = ok(2, "tp2", "--set parallel.tp=2");
  expect_close(tp.loss, ref.loss, c.name + " tp 2");
  expect_close(tp.val_loss, ref.val_loss, c.name + " tp 2 (val)");
  const Curve pp = ok(2, "pp2", "--set parallel.pp=2 --set parallel.schedule=1f1b --set parallel.microbatches=2");
  expect_close(pp.loss, ref.loss, c.name + " pp 2, 1f1b, 2 micro-batches");
  expect_close(pp.val_loss, ref.val_loss, c.name + " pp 2, 1f1b, 2 micro-batches (val)");
}

TEST_P(MpModels, TensorParallelCheckpointLoadsInOneProcess) {
  const ModelCase& c = GetParam();
  const Curve tp = ok(2, "tp2", "--set parallel.tp=2");
  ASSERT_EQ(tp.val_loss.count(10), 1u);
  ASSERT_TRUE(fs::exists(dir_ / "tp2/checkpoint/model.safetensors"));
  // The whole model by name, evaluated in this (one-process) test as `brigade eval` does, from the
  // run's directory (the recipe's data.dir is relative to it).
  const fs::path here = fs::current_path();
  fs::current_path(dir_);
  brigade::train::EvalReport rep;
  try {
    rep = brigade::train::evaluate_checkpoint("tp2/checkpoint", 1);
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.name << ": " << e.what();
  }
  fs::current_path(here);
  ASSERT_TRUE(rep.fields.contains("val_loss")) << rep.fields.dump();
  const double got = rep.fields["val_loss"], want = tp.val_loss.at(10);
  EXPECT_LE(std::abs(got - want), 1e-5 * std::abs(want)) << c.name << ": one process " << got << " vs tp 2 " << want;
}

INSTANTIATE_TEST_SUITE_P(Models, MpModels, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<ModelCase>& i) { return i.param.name; });

}  // namespace
