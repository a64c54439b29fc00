// Defects found by trying the engine from outside, as a new user would; each test failed on the
// code before its fix:
//   1. a changed corpus was silently ignored (data.dir already prepared from another one);
//   2. `generate` / `eval` could not open a checkpoint interrupted between the two renames of a
//      save (checkpoint -> checkpoint.old, checkpoint.tmp -> checkpoint);
//   3. a stop before any evaluation printed "val loss -1.0000" and wrote -1 into state.json;
//   7. `brigade bench` on an image recipe silently benchmarked a GPT.
// (Item 4, a failed save's leftover checkpoint.tmp, is tests/train/test_checkpoint_dir.cpp.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "support/recipes.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using brigade::test_support::CmdResult;
using brigade::test_support::slurp;

namespace {

class Defects : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = brigade::test_support::fresh_test_dir("brigade_defects");
    brigade::test_support::write_tiny_recipe(dir_, brigade::test_support::tiny_models().at(0), 4);  // gpt
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // `brigade <args>` in the test dir, one process, one thread.
  CmdResult brigade(const std::string& args) {
    return brigade::test_support::run_brigade(dir_, args, 0, "", "OMP_NUM_THREADS=1");
  }
  fs::path dir_;
};

TEST_F(Defects, AChangedCorpusIsPreparedAgainNotIgnored) {
  const CmdResult first = brigade("train r.toml --no-sample --set train.steps=2");
  ASSERT_EQ(first.code, 0) << first.err;
  const auto train_bytes = fs::file_size(dir_ / "data/train.bin");
  // another corpus (a third of the first) with the same data.dir
  {
    std::ifstream in(dir_ / "corpus.txt");
    std::ofstream out(dir_ / "other.txt");
    int n = 0;
    for (std::string line; std::getline(in, line) && n < 1000; ++n) out << line << '\n';
  }
  const CmdResult second = brigade("train r.toml --no-sample --set train.steps=2 --set data.corpus=other.txt");
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_NE(second.err.find("preparing again"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("other.txt"), std::string::npos) << second.err;
  EXPECT_LT(fs::file_size(dir_ / "data/train.bin"), train_bytes);  // the new corpus's tokens, not the old
}

TEST_F(Defects, GenerateAndEvalOpenACheckpointInterruptedBetweenItsRenames) {
  const CmdResult t = brigade("train r.toml --no-sample --set train.steps=2");
  ASSERT_EQ(t.code, 0) << t.err;
  const std::string before = slurp(dir_ / "run/checkpoint/model.safetensors");
  // a save killed between `checkpoint -> checkpoint.old` and `checkpoint.tmp -> checkpoint`
  fs::rename(dir_ / "run/checkpoint", dir_ / "run/checkpoint.old");
  fs::create_directories(dir_ / "run/checkpoint.tmp");
  const CmdResult g = brigade("generate --ckpt run/checkpoint --prompt 'And the king' --tokens 4");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("And the king", 0), 0u) << g.out;
  EXPECT_EQ(slurp(dir_ / "run/checkpoint/model.safetensors"), before);
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoint.tmp"));
  // and again for eval
  fs::rename(dir_ / "run/checkpoint", dir_ / "run/checkpoint.old");
  const CmdResult e = brigade("eval --ckpt run/checkpoint");
  EXPECT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("val loss"), std::string::npos) << e.out;
}

TEST_F(Defects, AStopBeforeAnyEvaluationWritesNoSentinel) {
  // SIGTERM a long run that only evaluates at its end
  const CmdResult r = brigade::test_support::interrupt_brigade(
      dir_, "train r.toml --no-sample --set train.steps=1000000 --set train.eval_every=0", dir_ / "run/metrics.jsonl",
      SIGTERM, 1, "OMP_NUM_THREADS=1");
  EXPECT_EQ(r.code, 130);
  const std::string out = r.out + r.err;
  EXPECT_EQ(out.find("-1.0"), std::string::npos) << out;
  const nlohmann::json state = nlohmann::json::parse(slurp(dir_ / "run/checkpoint/state.json"));
  EXPECT_TRUE(state.at("last_val_loss").is_null()) << state.dump();
  // and the resumed run reads it back as "none yet"
  const CmdResult more = brigade(
      "train r.toml --no-sample --resume --set train.steps=1000000 --set train.eval_every=0 "
      "--stop-at " +
      std::to_string(state.at("step").get<int64_t>() + 1));
  EXPECT_EQ(more.code, 0) << more.err;
}

TEST_F(Defects, BenchMeasuresTheRecipesModelAndNamesIt) {
  if (!brigade::test_support::have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  fs::create_directories(dir_ / "vit");
  brigade::test_support::write_tiny_recipe(dir_ / "vit", brigade::test_support::tiny_models().at(3), 8);  // vit
  const CmdResult b = brigade("bench vit/r.toml --steps 1 --warmup 0");
  ASSERT_EQ(b.code, 0) << b.err;
  const nlohmann::json j = nlohmann::json::parse(b.out);
  EXPECT_EQ(j.at("model"), "vit");
  EXPECT_EQ(j.at("item"), "images");
  EXPECT_FALSE(j.contains("tokens_per_s")) << j.dump();
  EXPECT_LT(j.at("last_loss").get<double>(), 4.0);  // ln 10 = 2.3, not ln 4096 = 8.3 of a language model
}

}  // namespace
