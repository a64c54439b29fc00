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

#include "brigade/train/trainer.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using brigade::test_support::CmdResult;
using brigade::test_support::Curve;
using brigade::test_support::expect_close;
using ModelCase = brigade::test_support::TinyModel;

namespace {

const std::string kBin = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";
const std::string kMpirun = BRIGADE_MPIRUN;

// tiny_models() but for tensor parallelism: vocabularies of 127 (GPT's tied and LLaMA's untied
// heads padded to 128 under tp 2), LLaMA with 4 query and 2 key/value heads (tp 2 divides both).
const std::vector<ModelCase>& cases() {
  static const std::vector<ModelCase> c{
      {"gpt", "vocab_size = 127\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_embd = 32\n", false},
      {"llama",
       "type = \"llama\"\nvocab_size = 127\nblock_size = 16\nn_layer = 2\nn_head = 4\nn_kv_head = 2\nn_embd = 32\n"
       "intermediate_size = 64\n",
       false},
      // tied head (vocabulary-parallel through the embedding's shard, summed across pipeline
      // stages) and llama3-scaled RoPE
      {"llama_tied",
       "type = \"llama\"\nvocab_size = 127\nblock_size = 16\nn_layer = 2\nn_head = 4\nn_kv_head = 2\nn_embd = 32\n"
       "intermediate_size = 64\ntie_embeddings = true\nrope_scaling = \"llama3\"\nrope_scaling_factor = 4.0\n"
       "rope_low_freq_factor = 1.0\nrope_high_freq_factor = 4.0\nrope_original_max_positions = 16\n",
       false},
      {"bert",
       "type = \"bert\"\nvocab_size = 127\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_embd = 32\n"
       "intermediate_size = 64\n",
       false},
      {"vit", "type = \"vit\"\npatch_size = 7\nn_layer = 2\nn_head = 2\nn_embd = 32\nintermediate_size = 64\n", true},
  };
  return c;
}

class MpModels : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (!brigade::test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun";
    const ModelCase& c = GetParam();
    if (c.images && !brigade::test_support::have_fashion_mnist())
      GTEST_SKIP() << brigade::test_support::kFashionDir << " is missing (apt install dataset-fashion-mnist)";
    dir_ = brigade::test_support::fresh_test_dir("brigade_mpm");
    // 8 rows a step; 256 test images: the final evaluation cuts them into two pipeline micro-batches
    brigade::test_support::write_tiny_recipe(dir_, c, 8, 256);
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  // A `brigade train r.toml` with `args` that must succeed, under mpirun -np np (np > 1) or alone,
  // into out_dir; its curve.
  Curve ok(int np, const std::string& out_dir, const std::string& args) {
    const CmdResult r = brigade::test_support::run_in(
        dir_, brigade::test_support::launcher(np > 1 ? np : 0, kMpirun, np > 1 ? "" : "OMP_NUM_THREADS=1") + " " +
                  kBin + " train r.toml --quiet --no-sample --set run.out_dir=" + out_dir + " " + args);
    EXPECT_EQ(r.code, 0) << GetParam().name << " np " << np << " " << args << "\n" << r.err;
    return brigade::test_support::read_curve(dir_ / out_dir / "metrics.jsonl");
  }

  fs::path dir_;
};

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
