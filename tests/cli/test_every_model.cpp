// Every tool works for every model type (the registry's rows, at the tiny sizes of
// support/tiny_models.h), through the `brigade` binary:
//   - `brigade bench` times the recipe's own model (its JSON names the type it measured and
//     counts its items: tokens, images or pairs);
//   - `brigade eval --ckpt` reproduces the run's last evaluation exactly (the same fields, bit for
//     bit, as metrics.jsonl's record);
//   - `brigade train --dry-run --json` predicts every memory category within 15% of what the run
//     then measures (GPT from formulas, the others from a measured dry step);
//   - `brigade ablate` runs two variants and writes its table with the model's throughput unit;
//   - `brigade generate` samples from the language models and refuses the others by name;
//   - `brigade prepare` prepares the text models' data and refuses the image models by name.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/recipes.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using brigade::test_support::CmdResult;
using brigade::test_support::slurp;
using brigade::test_support::TinyModel;

namespace {

class EveryModel : public ::testing::TestWithParam<TinyModel> {
 protected:
  void SetUp() override {
    const TinyModel& c = GetParam();
    if (c.images && !brigade::test_support::have_fashion_mnist())
      GTEST_SKIP() << brigade::test_support::kFashionDir << " is missing (apt install dataset-fashion-mnist)";
    dir_ = brigade::test_support::fresh_test_dir("brigade_every");
    brigade::test_support::write_tiny_recipe(dir_, c, c.batch);
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }
  // `brigade <args>` in the test dir, one process, one thread.
  CmdResult brigade(const std::string& args) {
    return brigade::test_support::run_brigade(dir_, args, 0, "", "OMP_NUM_THREADS=1");
  }
  std::string type() const {
    const std::string& m = GetParam().model;
    const size_t at = m.find("type = \"");
    return at == std::string::npos ? "gpt" : m.substr(at + 8, m.find('"', at + 8) - at - 8);
  }
  bool is_text() const { return !GetParam().images; }
  fs::path dir_;
};

TEST_P(EveryModel, BenchMeasuresTheRecipesOwnModel) {
  const CmdResult r = brigade("bench r.toml --steps 2 --warmup 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("model").get<std::string>(), type());
  const std::string item = j.at("item");
  EXPECT_EQ(item, is_text() ? "tokens" : type() == "clip" || type() == "align" ? "pairs" : "images");
  EXPECT_GT(j.at("items_per_s").get<double>(), 0.0);
  EXPECT_EQ(j.at(item + "_per_s").get<double>(), j.at("items_per_s").get<double>());
  EXPECT_GT(j.at("flops_per_item").get<double>(), 0.0);
  EXPECT_GT(j.at("mfu").get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(j.at("last_loss").get<double>()));
  EXPECT_GT(j.at("parameters").get<int64_t>(), 0);
}

TEST_P(EveryModel, EvalReproducesTheRunsLastEvaluation) {
  const CmdResult t = brigade("train r.toml --quiet --no-sample");
  ASSERT_EQ(t.code, 0) << t.err;
  nlohmann::json last;
  std::ifstream f(dir_ / "run/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) last = j;
  }
  ASSERT_EQ(last.at("step").get<int64_t>(), 10);
  const CmdResult e = brigade("eval --ckpt run/checkpoint --threads 1 --json");
  ASSERT_EQ(e.code, 0) << e.err;
  const nlohmann::json ev = nlohmann::json::parse(e.out);
  EXPECT_EQ(ev.at("model").get<std::string>(), type());
  for (auto it = last.begin(); it != last.end(); ++it) {
    if (it.key() == "step") continue;
    ASSERT_TRUE(ev.contains(it.key())) << it.key();
    EXPECT_EQ(ev[it.key()].dump(), it.value().dump()) << it.key();  // bitwise
  }
  // the human line too, one line
  const CmdResult line = brigade("eval --ckpt run/checkpoint --threads 1");
  ASSERT_EQ(line.code, 0) << line.err;
  EXPECT_EQ(std::count(line.out.begin(), line.out.end(), '\n'), 1) << line.out;
}

TEST_P(EveryModel, DryRunPredictsEveryCategoryWithin15Percent) {
  const CmdResult d = brigade("train r.toml --dry-run --json");
  ASSERT_EQ(d.code, 0) << d.err;
  const nlohmann::json pred = nlohmann::json::parse(d.out);
  EXPECT_EQ(pred.at("model").get<std::string>(), type());
  EXPECT_EQ(pred.at("measured").get<bool>(), type() != "gpt");  // GPT from formulas
  EXPECT_FALSE(fs::exists(dir_ / "run")) << "a dry run creates nothing";
  const CmdResult t = brigade("train r.toml --quiet --no-sample");
  ASSERT_EQ(t.code, 0) << t.err;
  const nlohmann::json mem = nlohmann::json::parse(slurp(dir_ / "run/memory.json"));
  const nlohmann::json& p = pred.at("ranks").at(0).at("peak");
  for (const char* cat : {"params", "grads", "optimizer", "activations", "workspace", "other"}) {
    const double want = mem.at("peak").at(cat).get<double>(), got = p.at(cat).get<double>();
    // 15% of the measured value (one 4 KiB allocator block of slack for the near-empty categories)
    EXPECT_LE(std::abs(got - want), 0.15 * want + 4096)
        << type() << " " << cat << ": predicted " << got << ", measured " << want;
  }
}

TEST_P(EveryModel, AblateComparesTwoVariants) {
  const CmdResult a = brigade("ablate r.toml --steps 3 --vary optim.lr=1e-3,2e-3 --out abl --quiet");
  ASSERT_EQ(a.code, 0) << a.err << a.out;
  const std::string md = slurp(dir_ / "abl/ablate.md");
  const std::string unit = is_text() ? "tokens/s" : type() == "clip" || type() == "align" ? "pairs/s" : "images/s";
  EXPECT_NE(md.find(unit), std::string::npos) << md;
  const nlohmann::json js = nlohmann::json::parse(slurp(dir_ / "abl/ablate.json"));
  ASSERT_EQ(js.size(), 2u);
  for (const auto& v : js) {
    EXPECT_TRUE(v.at("ok").get<bool>()) << v.dump();
    EXPECT_GT(v.at("items_per_s").get<double>(), 0.0) << v.dump();
    EXPECT_EQ(v.at("steps").get<int64_t>(), 3);
  }
}

TEST_P(EveryModel, GenerateAndPrepareSayWhatTheyApplyTo) {
  const CmdResult p = brigade("prepare r.toml");
  if (is_text()) {
    EXPECT_EQ(p.code, 0) << p.err;
  } else {
    EXPECT_EQ(p.code, 1);
    EXPECT_NE(p.err.find("needs no preparation"), std::string::npos) << p.err;
    EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
  }
  const CmdResult t = brigade("train r.toml --quiet --no-sample --set train.steps=2");
  ASSERT_EQ(t.code, 0) << t.err;
  const CmdResult g = brigade("generate --ckpt run/checkpoint --prompt 'And the king' --tokens 4");
  if (type() == "gpt" || type() == "llama") {
    EXPECT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(g.out.rfind("And the king", 0), 0u) << g.out;
  } else {
    EXPECT_EQ(g.code, 1);
    EXPECT_NE(g.err.find("does not generate text"), std::string::npos) << g.err;
    EXPECT_NE(g.err.find(type()), std::string::npos) << g.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EveryModel, ::testing::ValuesIn(brigade::test_support::tiny_models()),
                         [](const ::testing::TestParamInfo<TinyModel>& p) { return p.param.name; });

}  // namespace
