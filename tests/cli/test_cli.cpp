// End-to-end tests of the `brigade` binary on a tiny corpus and model: bitwise
// determinism, exact resume, generation, and one clear error line (non-zero exit,
// no crash, no hang) for each kind of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "support/recipes.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

using test_support::CmdResult;
using test_support::slurp;

// Runs `brigade <args>` in `cwd` with a time limit; captures stdout and stderr.
CmdResult brigade(const std::string& args, const fs::path& cwd) { return test_support::run_brigade(cwd, args); }

// 16 steps of 4 rows on two threads, an evaluation every 8 steps, a sample after training.
const std::string kRecipe =
    test_support::tiny_gpt_recipe({"run.threads=2", "train.steps=16", "train.batch_size=4", "train.eval_every=8",
                                   "schedule.warmup_steps=4", "sample.prompt=\"And the king\"", "sample.tokens=12"});

class Cli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test_support::write_tiny_run(test_support::fresh_test_dir("brigade_cli"), kRecipe); }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream f(dir_ / name);
    f << text;
  }
  // Loss of every step, as printed in metrics.jsonl (full float precision).
  std::vector<std::string> losses(const std::string& run_dir) {
    std::ifstream f(dir_ / run_dir / "metrics.jsonl");
    std::vector<std::string> out;
    std::regex re("\"loss\":([-0-9.eE+]+)");
    std::smatch m;
    for (std::string line; std::getline(f, line);)
      if (std::regex_search(line, m, re)) out.push_back(m[1]);
    return out;
  }
  // Asserts a failed run that printed exactly one "brigade: error:" line containing `needle`.
  void expect_clean_error(const CmdResult& r, const std::string& needle) {
    EXPECT_EQ(r.code, 1) << r.err;
    std::istringstream s(r.err);
    std::string line, last;
    int error_lines = 0;
    for (; std::getline(s, line);)
      if (line.rfind("brigade: error:", 0) == 0) {
        ++error_lines;
        last = line;
      }
    EXPECT_EQ(error_lines, 1) << r.err;
    EXPECT_NE(last.find(needle), std::string::npos) << "error line: " << last;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
  fs::path dir_;
};

TEST_F(Cli, SameSeedSameThreadsGivesBitwiseIdenticalLossCurve) {
  CmdResult a = brigade("train tiny.toml --quiet --no-sample --set run.out_dir=a", dir_);
  ASSERT_EQ(a.code, 0) << a.err;
  CmdResult b = brigade("train tiny.toml --quiet --no-sample --set run.out_dir=b", dir_);
  ASSERT_EQ(b.code, 0) << b.err;
  std::vector<std::string> la = losses("a"), lb = losses("b");
  ASSERT_EQ(la.size(), 16u);
  EXPECT_EQ(la, lb);
  // and it learns: the last loss is well below the first
  EXPECT_LT(std::stod(la.back()), std::stod(la.front()) - 0.5);
}

TEST_F(Cli, StopAndResumeGivesBitwiseIdenticalLosses) {
  // with dropout on, so the dropout generator's state must travel in the checkpoint too
  const std::string train = "train tiny.toml --quiet --no-sample --set model.dropout=0.1";
  CmdResult full = brigade(train + " --set run.out_dir=full", dir_);
  ASSERT_EQ(full.code, 0) << full.err;
  CmdResult first = brigade(train + " --set run.out_dir=split --stop-at 8", dir_);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_EQ(losses("split").size(), 8u);
  CmdResult second = brigade(train + " --set run.out_dir=split --resume", dir_);
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(losses("full"), losses("split"));
  // the checkpoints at the end are identical too
  EXPECT_EQ(slurp(dir_ / "full/checkpoint/model.safetensors"), slurp(dir_ / "split/checkpoint/model.safetensors"));
  EXPECT_EQ(slurp(dir_ / "full/checkpoint/optimizer.safetensors"),
            slurp(dir_ / "split/checkpoint/optimizer.safetensors"));
}

TEST_F(Cli, ResumeRecoversFromACrashBetweenCheckpointRenames) {
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample --stop-at 8", dir_).code, 0);
  // the state a crash between "checkpoint -> checkpoint.old" and "tmp -> checkpoint" leaves
  fs::rename(dir_ / "run/checkpoint", dir_ / "run/checkpoint.old");
  fs::create_directories(dir_ / "run/checkpoint.tmp");
  CmdResult r = brigade("train tiny.toml --quiet --no-sample --resume", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses("run").size(), 16u);
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoint.old"));
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoint.tmp"));
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample --set run.out_dir=straight", dir_).code, 0);
  EXPECT_EQ(losses("run"), losses("straight"));
}

TEST_F(Cli, NothingToResumeAndBadStopAtAreClearErrors) {
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample", dir_).code, 0);
  expect_clean_error(brigade("train tiny.toml --quiet --no-sample --resume", dir_), "nothing to train");
  expect_clean_error(brigade("train tiny.toml --quiet --no-sample --stop-at 0", dir_), "--stop-at");
  CmdResult w = brigade("train tiny.toml --no-sample --resume --set train.steps=18 --set optim.lr=0.01", dir_);
  EXPECT_EQ(w.code, 0) << w.err;
  EXPECT_NE(w.err.find("warning: resuming with settings that differ"), std::string::npos) << w.err;
  EXPECT_NE(w.err.find("optim.lr"), std::string::npos) << w.err;
}

TEST_F(Cli, InterruptCheckpointsAndResumesExactly) {
  // A long run, stopped with SIGINT once a few steps are logged.
  const std::string long_run = "train tiny.toml --quiet --no-sample --set train.steps=100000 --set train.eval_every=0";
  const CmdResult r = test_support::interrupt_brigade(dir_, long_run + " --set run.out_dir=intr",
                                                      dir_ / "intr/metrics.jsonl", SIGINT, 5);
  EXPECT_EQ(r.code, 130) << r.err;
  const size_t done = losses("intr").size();
  ASSERT_GE(done, 5u);
  std::ifstream st(dir_ / "intr/checkpoint/state.json");
  std::string state((std::istreambuf_iterator<char>(st)), {});
  EXPECT_NE(state.find("\"step\": " + std::to_string(done)), std::string::npos) << state;
  // resume for 3 more steps == an uninterrupted run of done + 3 steps (same schedule)
  const std::string until = " --stop-at " + std::to_string(done + 3);
  ASSERT_EQ(brigade(long_run + " --set run.out_dir=intr --resume" + until, dir_).code, 0);
  ASSERT_EQ(brigade(long_run + " --set run.out_dir=straight" + until, dir_).code, 0);
  EXPECT_EQ(losses("intr"), losses("straight"));
  EXPECT_EQ(losses("straight").size(), done + 3);
}

TEST_F(Cli, TrainPrintsValLossAndSampleThenGenerateContinuesPrompt) {
  CmdResult r = brigade("train tiny.toml --quiet", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("final val loss:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("And the king"), std::string::npos) << r.out;
  CmdResult g1 = brigade("generate --ckpt run/checkpoint --prompt 'And the people' --tokens 10 --seed 3", dir_);
  ASSERT_EQ(g1.code, 0) << g1.err;
  EXPECT_EQ(g1.out.rfind("And the people", 0), 0u) << g1.out;
  CmdResult g2 = brigade("generate --ckpt run/checkpoint --prompt 'And the people' --tokens 10 --seed 3", dir_);
  EXPECT_EQ(g1.out, g2.out);
}

TEST_F(Cli, UnknownRecipeKeyIsNamed) {
  write("bad.toml", kRecipe + "\n[extra]\nfoo = 1\n");
  expect_clean_error(brigade("train bad.toml --quiet", dir_), "extra");
  CmdResult r = brigade("train tiny.toml --quiet --set train.stepz=3", dir_);
  expect_clean_error(r, "train.stepz");
}

TEST_F(Cli, MistypedRecipeValueIsNamed) {
  CmdResult r = brigade("train tiny.toml --quiet --set 'train.steps=\"many\"'", dir_);
  expect_clean_error(r, "train.steps");
  std::string text = std::regex_replace(kRecipe, std::regex("n_layer = 2"), "n_layer = \"two\"");
  write("typo.toml", text);
  CmdResult r2 = brigade("train typo.toml --quiet", dir_);
  expect_clean_error(r2, "model.n_layer");
  EXPECT_NE(r2.err.find("typo.toml"), std::string::npos) << r2.err;
}

TEST_F(Cli, MissingRecipeAndCorpusAreClearErrors) {
  expect_clean_error(brigade("train nope.toml --quiet", dir_), "nope.toml");
  expect_clean_error(brigade("train tiny.toml --quiet --set data.corpus=missing.txt --set data.dir=d2", dir_),
                     "missing.txt");
}

TEST_F(Cli, TruncatedTokenFileIsAClearError) {
  ASSERT_EQ(brigade("prepare tiny.toml", dir_).code, 0);
  const fs::path bin = dir_ / "data/train.bin";
  fs::resize_file(bin, fs::file_size(bin) / 2 + 1);
  expect_clean_error(brigade("train tiny.toml --quiet", dir_), "train.bin");
}

TEST_F(Cli, TruncatedOrCorruptedCheckpointIsAClearError) {
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample", dir_).code, 0);
  const fs::path st = dir_ / "run/checkpoint/model.safetensors";
  const std::string gen = "generate --ckpt run/checkpoint --prompt 'And' --tokens 4";
  ASSERT_EQ(brigade(gen, dir_).code, 0);
  // corrupt the JSON header
  {
    std::fstream f(st, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(9);
    f.write("\x01\x02\x03", 3);
  }
  expect_clean_error(brigade(gen, dir_), "model.safetensors");
  // truncate the tensor data
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample", dir_).code, 0);
  fs::resize_file(st, fs::file_size(st) - 100);
  expect_clean_error(brigade(gen, dir_), "model.safetensors");
  expect_clean_error(brigade("train tiny.toml --quiet --no-sample --resume", dir_), "model.safetensors");
  // not a checkpoint at all
  expect_clean_error(brigade("generate --ckpt data --prompt And", dir_), "data");
}

TEST_F(Cli, PromptWithUnknownCharactersIsAClearError) {
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample", dir_).code, 0);
  CmdResult r = brigade("generate --ckpt run/checkpoint --prompt 'And the king ☃ é'", dir_);
  expect_clean_error(r, "U+2603");
}

// ---- early stopping, loss plots, ablate

// (step, val_loss) of every evaluation in a run's metrics.jsonl, at full precision.
std::vector<std::pair<int64_t, double>> val_losses(const fs::path& metrics) {
  std::ifstream f(metrics);
  std::vector<std::pair<int64_t, double>> out;
  std::regex re("\"step\":([0-9]+),\"val_loss\":([-0-9.eE+]+)");
  std::smatch m;
  for (std::string line; std::getline(f, line);)
    if (std::regex_search(line, m, re)) out.emplace_back(std::stoll(m[1]), std::stod(m[2]));
  return out;
}

// The early-stopping rule as docs/recipes.md states it, written again here: an evaluation
// improves if it is the first or lower than the best by more than min_delta; the run stops
// at the patience-th evaluation in a row without improvement. -> (stop step or 0, best step)
std::pair<int64_t, int64_t> expected_early_stop(const std::vector<std::pair<int64_t, double>>& evals, int patience,
                                                double min_delta) {
  int64_t best_step = 0, bad = 0;
  double best = 0;
  for (const auto& [step, loss] : evals) {
    if (best_step == 0 || loss < best - min_delta) {
      best = loss, best_step = step, bad = 0;
    } else if (++bad == patience) {
      return {step, best_step};
    }
  }
  return {0, best_step};
}

int64_t state_step(const fs::path& ckpt) {
  std::smatch m;
  const std::string s = slurp(ckpt / "state.json");
  std::regex re("\"step\": ([0-9]+)");
  return std::regex_search(s, m, re) ? std::stoll(m[1]) : -1;
}

// Number of "x,y" points of every <polyline> in an SVG.
std::vector<size_t> polyline_points(const std::string& svg) {
  std::vector<size_t> out;
  std::regex re("<polyline[^>]* points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    const std::string pts = (*it)[1];
    out.push_back(size_t(std::count(pts.begin(), pts.end(), ',')));
  }
  return out;
}

// Settings where the tiny model's val loss stops improving well before train.steps:
// an evaluation every step and a high learning rate.
const std::string kEarlyStop =
    "train tiny.toml --quiet --no-sample --set train.steps=40 --set optim.lr=3e-2 --set train.eval_every=1 "
    "--set train.early_stop=true ";

TEST_F(Cli, EarlyStopStopsWhereTheRuleSaysAndKeepsTheBestModel) {
  CmdResult r = brigade(kEarlyStop + "--set train.patience=2 --set train.min_delta=0.01 --set run.out_dir=es", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto evals = val_losses(dir_ / "es/metrics.jsonl");
  const auto [stop, best] = expected_early_stop(evals, 2, 0.01);
  ASSERT_GT(stop, 0) << "val loss kept improving for 40 steps; these settings no longer exercise early stopping";
  ASSERT_LT(stop, 40);
  EXPECT_EQ(evals.back().first, stop);  // it stopped right there
  EXPECT_EQ(losses("es").size(), size_t(stop));
  EXPECT_NE(r.out.find("early stop at step " + std::to_string(stop)), std::string::npos) << r.out;
  const std::string metrics = slurp(dir_ / "es/metrics.jsonl");
  EXPECT_NE(metrics.find("\"best_step\":" + std::to_string(best) + ","), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\"early_stop\":true,\"step\":" + std::to_string(stop) + "}"), std::string::npos) << metrics;
  // best/ is the checkpoint of the best step; checkpoint/ the last one
  EXPECT_EQ(state_step(dir_ / "es/best"), best);
  EXPECT_EQ(state_step(dir_ / "es/checkpoint"), stop);
  // ... and holds exactly the weights an ordinary run has at that step
  ASSERT_EQ(
      brigade("train tiny.toml --quiet --no-sample --set train.steps=40 --set optim.lr=3e-2 --set run.out_dir=ref "
              "--stop-at " +
                  std::to_string(best),
              dir_)
          .code,
      0);
  EXPECT_EQ(slurp(dir_ / "es/best/model.safetensors"), slurp(dir_ / "ref/checkpoint/model.safetensors"));
  // the best checkpoint is a checkpoint: generate reads it
  CmdResult g = brigade("generate --ckpt es/best --prompt 'And the king' --tokens 5", dir_);
  EXPECT_EQ(g.code, 0) << g.err;
  // every run draws loss.svg beside metrics.jsonl: train loss, val loss and the best point
  const std::string svg = slurp(dir_ / "es/loss.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(polyline_points(svg), (std::vector<size_t>{size_t(stop), evals.size(), 1}));
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">val loss</text>"), std::string::npos);
  EXPECT_EQ(polyline_points(slurp(dir_ / "ref/loss.svg")).size(), 2u);
}

TEST_F(Cli, EarlyStopStateSurvivesResume) {
  const std::string es = kEarlyStop + "--set train.patience=2 ";
  ASSERT_EQ(brigade(es + "--set run.out_dir=full", dir_).code, 0);
  const auto evals = val_losses(dir_ / "full/metrics.jsonl");
  const auto [stop, best] = expected_early_stop(evals, 2, 0.0);
  ASSERT_GT(stop, 2) << "val loss kept improving for 40 steps; these settings no longer exercise early stopping";
  // with min_delta = 0 the kept model is the one with the lowest val loss
  EXPECT_EQ(best, std::min_element(evals.begin(), evals.end(), [](const auto& a, const auto& b) {
                    return a.second < b.second;
                  })->first);
  // stop one step before the early stop (one evaluation without improvement already counted), resume
  ASSERT_EQ(brigade(es + "--set run.out_dir=split --stop-at " + std::to_string(stop - 1), dir_).code, 0);
  CmdResult r = brigade(es + "--set run.out_dir=split --resume", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses("full"), losses("split"));
  EXPECT_EQ(val_losses(dir_ / "full/metrics.jsonl"), val_losses(dir_ / "split/metrics.jsonl"));
  EXPECT_EQ(state_step(dir_ / "split/best"), best);
  EXPECT_EQ(slurp(dir_ / "full/best/model.safetensors"), slurp(dir_ / "split/best/model.safetensors"));
  // nothing left to do: resuming a run that stopped early says why and where the best model is
  expect_clean_error(brigade(es + "--set run.out_dir=split --resume", dir_), "early stopping ended the run");
  // early stopping needs periodic evaluations
  expect_clean_error(brigade("train tiny.toml --quiet --set train.early_stop=true --set train.eval_every=0", dir_),
                     "train.eval_every");
}

TEST_F(Cli, AblateRunsEveryVariantAndWritesTheTableAndThePlot) {
  CmdResult r =
      brigade("ablate tiny.toml --vary train.accumulation=1,2 --vary optim.lr=1e-3,3e-3 --steps 3 --out abl", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string md = slurp(dir_ / "abl/ablate.md");
  const char* rows[] = {
      "| 1 | train.accumulation=1, optim.lr=1e-3 | 3 |", "| 2 | train.accumulation=1, optim.lr=3e-3 | 3 |",
      "| 3 | train.accumulation=2, optim.lr=1e-3 | 3 |", "| 4 | train.accumulation=2, optim.lr=3e-3 | 3 |"};
  for (const char* row : rows) {
    EXPECT_NE(md.find(row), std::string::npos) << row << "\n" << md;
    EXPECT_NE(r.out.find(row), std::string::npos) << "the table is printed too\n" << r.out;
  }
  EXPECT_EQ(md.find("failed"), std::string::npos) << md;
  EXPECT_NE(md.find("tokens/s"), std::string::npos);
  EXPECT_NE(md.find("activations MiB"), std::string::npos);
  EXPECT_NE(md.find("![train loss of every variant](ablate.svg)"), std::string::npos);
  const std::string svg = slurp(dir_ / "abl/ablate.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(polyline_points(svg), (std::vector<size_t>{3, 3, 3, 3}));
  const std::string json = slurp(dir_ / "abl/ablate.json");
  EXPECT_EQ(std::regex_search(json, std::regex("\"ok\": true")), true) << json;
  // every variant is an ordinary run folder (log_every = 1, the given steps, its own loss.svg)
  size_t runs = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "abl"))
    if (e.is_directory()) {
      ++runs;
      EXPECT_EQ(losses(fs::relative(e.path(), dir_).string()).size(), 3u) << e.path();
      EXPECT_TRUE(fs::exists(e.path() / "loss.svg")) << e.path();
      EXPECT_TRUE(fs::exists(e.path() / "memory.json")) << e.path();
    }
  EXPECT_EQ(runs, 4u);
}

TEST_F(Cli, AblateChecksKeysAndVariantsBeforeRunningAnything) {
  CmdResult bad = brigade("ablate tiny.toml --vary train.acumulation=1,2 --out bad1", dir_);
  expect_clean_error(bad, "did you mean 'train.accumulation'");
  EXPECT_NE(bad.err.find("--vary"), std::string::npos) << bad.err;
  expect_clean_error(brigade("ablate tiny.toml --vary train.accumulation=1,two --out bad2", dir_),
                     "must be an integer");
  // model.n_head = 3 does not divide n_embd = 32: refused before variant 1 runs
  expect_clean_error(brigade("ablate tiny.toml --vary model.n_head=2,3 --out bad3", dir_),
                     "variant 2 (model.n_head=3)");
  expect_clean_error(brigade("ablate tiny.toml --vary train.steps=1,2 --vary train.steps=3 --out bad4", dir_),
                     "given twice");
  for (const char* d : {"bad1", "bad2", "bad3", "bad4"}) EXPECT_FALSE(fs::exists(dir_ / d)) << d;
}

// ------------------------------------------------------------------ mixed precision (docs/mixed-precision.md)

// Values of `"key":<number>` on each metrics line that has the key (as printed).
std::vector<std::string> metric(const fs::path& metrics, const std::string& key) {
  std::ifstream f(metrics);
  std::vector<std::string> out;
  std::regex re("\"" + key + "\":([-0-9.eE+]+|null)");
  std::smatch m;
  for (std::string line; std::getline(f, line);)
    if (std::regex_search(line, m, re)) out.push_back(m[1]);
  return out;
}

double final_val_loss(const fs::path& metrics) {
  const std::vector<std::string> v = metric(metrics, "val_loss");
  return v.empty() ? -1.0 : std::stod(v.back());
}

TEST_F(Cli, EveryPrecisionLevelTrainsCloseToFp32) {
  const std::string train = "train tiny.toml --quiet --no-sample ";
  ASSERT_EQ(brigade(train + "--set run.out_dir=o0", dir_).code, 0);
  const double o0 = final_val_loss(dir_ / "o0/metrics.jsonl");
  struct Level {
    const char* dir;
    const char* sets;
    double tol;
  };
  for (const Level& l : {Level{"o1", "--set precision.level=O1", 0.02}, Level{"o2", "--set precision.level=O2", 0.02},
                         Level{"o2h", "--set precision.level=O2 --set precision.dtype=fp16", 0.02},
                         Level{"o3", "--set precision.level=O3", 0.05}}) {
    CmdResult r = brigade(train + l.sets + " --set run.out_dir=" + l.dir, dir_);
    ASSERT_EQ(r.code, 0) << r.err;
    const double v = final_val_loss(dir_ / l.dir / "metrics.jsonl");
    EXPECT_NEAR(v, o0, l.tol * o0) << l.sets;
    EXPECT_NE(slurp(dir_ / l.dir / "memory.json").find("\"level\": \"O"), std::string::npos);
  }
  // fp16 gets dynamic loss scaling by default ("auto"), logged every step; bf16 gets none
  EXPECT_EQ(metric(dir_ / "o2h/metrics.jsonl", "loss_scale").size(), 16u);
  EXPECT_EQ(metric(dir_ / "o2/metrics.jsonl", "loss_scale").size(), 0u);
}

TEST_F(Cli, ResumeUnderO2WithDynamicScalingIsBitwise) {
  // growth every 2 clean steps from 2^20, so the scale climbs until fp16 overflows, backs
  // off and skips steps: the scale, its counters and the optimizer's own step count (fewer
  // updates than steps) must all travel in the checkpoint
  const std::string train =
      "train tiny.toml --quiet --no-sample --set precision.level=O2 --set precision.dtype=fp16 "
      "--set precision.loss_scale=dynamic --set precision.growth_interval=2 --set precision.init_scale=1048576";
  ASSERT_EQ(brigade(train + " --set run.out_dir=full", dir_).code, 0);
  ASSERT_EQ(brigade(train + " --set run.out_dir=split --stop-at 7", dir_).code, 0);
  CmdResult second = brigade(train + " --set run.out_dir=split --resume", dir_);
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(losses("full"), losses("split"));
  const std::vector<std::string> scales = metric(dir_ / "full/metrics.jsonl", "loss_scale");
  EXPECT_EQ(scales, metric(dir_ / "split/metrics.jsonl", "loss_scale"));
  EXPECT_GT(std::set<std::string>(scales.begin(), scales.end()).size(), 2u) << "the scale should move";
  const std::vector<std::string> skipped = metric(dir_ / "full/metrics.jsonl", "skipped_total");
  ASSERT_FALSE(skipped.empty());
  EXPECT_GT(std::stoi(skipped.back()), 0) << "some steps should overflow and be skipped";
  EXPECT_EQ(skipped, metric(dir_ / "split/metrics.jsonl", "skipped_total"));
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json"})
    EXPECT_EQ(slurp(dir_ / "full/checkpoint" / f), slurp(dir_ / "split/checkpoint" / f)) << f;
}

TEST_F(Cli, InjectedInfOrNaNGradientSkipsTheStepAndTouchesNothing) {
  for (const char* kind : {"inf_grad", "nan_grad"}) {
    SCOPED_TRACE(kind);
    const std::string out = std::string("run_") + kind;
    const std::string train =
        "train tiny.toml --quiet --no-sample --set precision.level=O2 --set "
        "precision.dtype=fp16 --set run.out_dir=" +
        out;
    ASSERT_EQ(brigade(train + " --stop-at 5", dir_).code, 0);
    const std::string model5 = slurp(dir_ / out / "checkpoint/model.safetensors");
    const std::string opt5 = slurp(dir_ / out / "checkpoint/optimizer.safetensors");
    ::setenv("BRIGADE_FAULT", (std::string("0:6:") + kind).c_str(), 1);
    CmdResult r = brigade(train + " --resume --stop-at 6", dir_);
    ::unsetenv("BRIGADE_FAULT");
    ASSERT_EQ(r.code, 0) << r.err;
    // step 6 was skipped: weights and optimizer state (moments) are bitwise those of step 5
    EXPECT_EQ(slurp(dir_ / out / "checkpoint/model.safetensors"), model5);
    EXPECT_EQ(slurp(dir_ / out / "checkpoint/optimizer.safetensors"), opt5);
    const std::string state = slurp(dir_ / out / "checkpoint/state.json");
    EXPECT_TRUE(std::regex_search(state, std::regex("\"optimizer_steps\": *5,"))) << state;  // 6 steps, 5 updates
    // and the scale backed off: 2^16 -> 2^15, one overflow and one skip in step 6's log interval
    const fs::path m = dir_ / out / "metrics.jsonl";
    EXPECT_EQ(metric(m, "loss_scale"),
              (std::vector<std::string>{"65536.0", "65536.0", "65536.0", "65536.0", "65536.0", "32768.0"}));
    EXPECT_EQ(metric(m, "skipped").back(), "1");
    EXPECT_EQ(metric(m, "overflows").back(), "1");
    // training goes on normally afterwards
    CmdResult rest = brigade(train + " --resume", dir_);
    ASSERT_EQ(rest.code, 0) << rest.err;
    EXPECT_EQ(metric(m, "skipped_total").back(), "1");
  }
}

TEST_F(Cli, AblatePrecisionRecomputeAndAccumulation) {
  CmdResult r = brigade(
      "ablate tiny.toml --vary precision.level=O0,O2 --vary memory.recompute=none,full "
      "--vary train.accumulation=1,2 --steps 2 --out abl",
      dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string md = slurp(dir_ / "abl/ablate.md");
  EXPECT_NE(md.find("| 1 | precision.level=O0, memory.recompute=none, train.accumulation=1 | 2 |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| 8 | precision.level=O2, memory.recompute=full, train.accumulation=2 | 2 |"), std::string::npos)
      << md;
  EXPECT_EQ(md.find("failed"), std::string::npos) << md;
  EXPECT_EQ(polyline_points(slurp(dir_ / "abl/ablate.svg")), (std::vector<size_t>(8, 2)));
}

TEST_F(Cli, BenchPrintsOneJsonLineWithSpeedAndMemory) {
  CmdResult r = brigade("bench tiny.toml --steps 2 --warmup 1 --set precision.level=O1", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* key : {"\"tokens_per_s\":", "\"mfu\":", "\"gemm_peak_f32_gflops\":", "\"gemm_peak_bf16_gflops\":",
                          "\"peak_rss_bytes\":", "\"allocator_peak_bytes\":", "\"precision\":\"O1 bf16\"",
                          "\"flops_per_token\":", "\"timed_page_faults_per_step\":"})
    EXPECT_NE(r.out.find(key), std::string::npos) << key << "\n" << r.out;
  // the steady-state step takes nothing from the OS: every buffer comes from the allocator's cache
  EXPECT_NE(r.out.find("\"timed_os_allocs_per_step\":0.0"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "run")) << "bench writes nothing";
  expect_clean_error(brigade("bench tiny.toml --steps 0", dir_), "--steps must be >= 1");
}

TEST_F(Cli, LlamaTrainsResumesExactlyAndSamples) {
  // model.type = "llama" (RMSNorm, RoPE, SwiGLU, grouped-query attention with 1 kv head of 2, untied
  // head) through the same loop: it learns, resumes bitwise, recomputes bitwise, and its checkpoint
  // samples through `brigade generate` (the checkpoint's recipe picks the architecture).
  const std::string llama = "train tiny.toml --quiet --set model.type=llama --set model.n_kv_head=1 ";
  CmdResult full = brigade(llama + "--no-sample --set run.out_dir=full", dir_);
  ASSERT_EQ(full.code, 0) << full.err;
  const std::vector<std::string> curve = losses("full");
  ASSERT_EQ(curve.size(), 16u);
  EXPECT_LT(std::stod(curve.back()), std::stod(curve.front()) - 0.5) << "llama does not learn";
  CmdResult first = brigade(llama + "--no-sample --set run.out_dir=split --stop-at 8", dir_);
  ASSERT_EQ(first.code, 0) << first.err;
  CmdResult second = brigade(llama + "--no-sample --set run.out_dir=split --resume", dir_);
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(losses("split"), curve);
  CmdResult rc = brigade(llama + "--no-sample --set run.out_dir=rc --set memory.recompute=full", dir_);
  ASSERT_EQ(rc.code, 0) << rc.err;
  EXPECT_EQ(losses("rc"), curve);
  CmdResult g = brigade("generate --ckpt full/checkpoint --prompt 'And the king' --tokens 8 --seed 3", dir_);
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("And the king", 0), 0u) << g.out;
  // LLaMA has a tensor-parallel plan (tests/train/test_mp_models.cpp); one process cannot hold a tp 2 mesh.
  expect_clean_error(brigade(llama + "--set parallel.tp=2", dir_), "mpirun -np 2");
}

}  // namespace
