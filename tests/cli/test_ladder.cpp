// `brigade ablate --ladder`: the ladder syntax (a spec string and a TOML file), the rows it makes
// (cumulative, leave-one-out, reuse of identical rows), the predictor's JSON, the time to a target
// loss, and the whole command on a tiny GPT with a fake predictor (its Δ and error columns recomputed
// here from the rows' own numbers); also that a variant of tp x dp processes runs as that many ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/cli/ladder.h"
#include "brigade/core/error.h"
#include "support/recipes.h"

namespace fs = std::filesystem;
using namespace brigade;
using namespace brigade::cli;
using test_support::CmdResult;
using test_support::slurp;

namespace {

std::string ladder_error(const std::string& spec) {
  try {
    parse_ladder(spec);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string toml_error(const std::string& text) {
  try {
    parse_ladder_toml(text, "l.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The recipe the overrides give from the defaults (to compare two spellings of the same values).
train::Recipe applied(const std::vector<std::string>& sets) {
  train::Recipe r;
  for (const auto& s : sets) train::apply_override(r, s);
  return r;
}

std::vector<std::string> V(std::initializer_list<const char*> v) { return {v.begin(), v.end()}; }

}  // namespace

// ---- the ladder syntax

TEST(Ladder, ParsesNamedTechniquesWithTheirOverrides) {
  const auto l = parse_ladder(
      " bf16 = precision.level=O2 ; accum=train.accumulation=2, train.batch_size=4;"
      "prompt=sample.prompt=\"a;b, c\";");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0], (Technique{"bf16", V({"precision.level=O2"})}));
  EXPECT_EQ(l[1], (Technique{"accum", V({"train.accumulation=2", "train.batch_size=4"})}));
  // ';' and ',' inside double quotes belong to the value
  EXPECT_EQ(l[2], (Technique{"prompt", V({"sample.prompt=\"a;b, c\""})}));
}

TEST(Ladder, BadSpecsSayWhatIsWrongAndHowToWriteIt) {
  EXPECT_NE(ladder_error("precision.level=O2").find("starts with a key, not a name"), std::string::npos);
  EXPECT_NE(ladder_error("bf16").find("has no overrides; write bf16=section.key=value"), std::string::npos);
  EXPECT_NE(ladder_error("bf16=").find("has no overrides"), std::string::npos);
  EXPECT_NE(ladder_error("acc=train.acumulation=2").find("did you mean 'train.accumulation'"), std::string::npos);
  EXPECT_NE(ladder_error("acc=train.accumulation=two").find("must be an integer"), std::string::npos);
  EXPECT_NE(ladder_error("a=train.accumulation=2;a=optim.lr=1e-3").find("technique 'a' is given twice"),
            std::string::npos);
  EXPECT_NE(ladder_error("a=train.accumulation=2,,optim.lr=1").find("empty override"), std::string::npos);
  EXPECT_NE(ladder_error("a=train.accumulation=2,train.accumulation=4").find("sets train.accumulation twice"),
            std::string::npos);
  EXPECT_NE(ladder_error("a=run.out_dir=x").find("run.out_dir"), std::string::npos);
  EXPECT_NE(ladder_error("b f=optim.lr=1").find("must be a word"), std::string::npos);
  EXPECT_NE(ladder_error(" ; ").find("no techniques"), std::string::npos);
  // every message names the option and the spec
  EXPECT_EQ(ladder_error("bf16").rfind("--ladder 'bf16'", 0), 0u) << ladder_error("bf16");
}

TEST(Ladder, TomlFileGivesTheSameTechniquesAsTheSpec) {
  const auto file = parse_ladder_toml(
      "[[technique]]\nname = \"bf16\"\nprecision.level = \"O2\"\n\n"
      "[[technique]]\nname = \"accum\"\ntrain.accumulation = 2\ntrain.batch_size = 4\noptim.lr = 1e-3\n",
      "l.toml");
  const auto spec = parse_ladder("bf16=precision.level=O2;accum=train.accumulation=2,train.batch_size=4,optim.lr=1e-3");
  ASSERT_EQ(file.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(file[i].name, spec[i].name);
    EXPECT_EQ(file[i].sets.size(), spec[i].sets.size());
    EXPECT_TRUE(applied(file[i].sets) == applied(spec[i].sets)) << i;
  }
  EXPECT_NE(toml_error("[[technique]]\nprecision.level = \"O2\"\n").find("technique 1: needs name"), std::string::npos);
  EXPECT_NE(toml_error("[[technique]]\nname = \"a\"\nlevel = \"O2\"\n").find("'level' is not a recipe section"),
            std::string::npos);
  EXPECT_NE(toml_error("[bf16]\nx = 1\n").find("unknown top-level key 'bf16'"), std::string::npos);
  EXPECT_NE(toml_error("[[technique]]\nname = \"a\"\nprecision.level = \n").find("l.toml: line 3"), std::string::npos);
  EXPECT_NE(toml_error("[[technique]]\nname = \"a\"\ntrain.acumulation = 2\n").find("did you mean"), std::string::npos);
}

// ---- the rows

TEST(Ladder, RowsAreBaselineCumulativeThenLeaveOneOutWithIdenticalRowsReused) {
  const std::vector<Technique> l = {
      {"a", V({"train.accumulation=2"})}, {"b", V({"optim.lr=1e-3"})}, {"c", V({"precision.level=O2"})}};
  const auto rows = ladder_rows(l);
  struct Want {
    RowKind kind;
    const char* label;
    std::vector<size_t> techniques;
    int same_as;
  };
  const std::vector<Want> want = {
      {RowKind::Baseline, "baseline", {}, -1},         {RowKind::Cumulative, "a", {0}, -1},
      {RowKind::Cumulative, "a + b", {0, 1}, -1},      {RowKind::Cumulative, "a + b + c", {0, 1, 2}, -1},
      {RowKind::LeaveOneOut, "all but a", {1, 2}, -1}, {RowKind::LeaveOneOut, "all but b", {0, 2}, -1},
      {RowKind::LeaveOneOut, "all but c", {0, 1}, 2}};  // = cumulative a + b
  ASSERT_EQ(rows.size(), want.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].kind, want[i].kind) << i;
    EXPECT_EQ(rows[i].label, want[i].label) << i;
    EXPECT_EQ(rows[i].techniques, want[i].techniques) << i;
    EXPECT_EQ(rows[i].same_as, want[i].same_as) << i;
  }
  EXPECT_EQ(rows[5].overrides, V({"train.accumulation=2", "precision.level=O2"}));
  EXPECT_TRUE(rows[0].overrides.empty());
}

TEST(Ladder, ALaterTechniqueOnTheSameKeyMakesLeavingTheEarlierOneOutTheFullSet) {
  // zero2 overrides zero1's key: all but zero1 = {zero 2, recompute} = the full set (row 4)
  const std::vector<Technique> l = {{"zero1", V({"parallel.zero=1"})},
                                    {"zero2", V({"parallel.zero=2"})},
                                    {"recompute", V({"memory.recompute=selective"})}};
  const auto rows = ladder_rows(l);
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_EQ(rows[4].label, "all but zero1");
  EXPECT_EQ(rows[4].same_as, 3);
  EXPECT_EQ(rows[5].same_as, -1);  // {zero 1, recompute}
  EXPECT_EQ(rows[6].same_as, 2);   // {zero 2} = zero1 + zero2
  EXPECT_EQ(effective_overrides(rows[4].overrides),
            (std::map<std::string, std::string>{{"parallel.zero", "2"}, {"memory.recompute", "selective"}}));
  // one technique: leaving it out is the baseline
  const auto one = ladder_rows({{"bf16", V({"precision.level=O2"})}});
  ASSERT_EQ(one.size(), 3u);
  EXPECT_EQ(one[2].same_as, 0);
}

TEST(Ladder, DefaultLadderHasOnlyTechniquesThatApply) {
  const train::Recipe base = train::parse_recipe(test_support::tiny_gpt_recipe(), "tiny.toml", {}, false);
  std::vector<std::string> skipped;
  const auto l = default_ladder(base, &skipped);
  ASSERT_EQ(l.size(), 3u);  // dp = 1: no ZeRO rows
  EXPECT_EQ(l[0].name, "bf16");
  EXPECT_EQ(l[1], (Technique{"recompute", V({"memory.recompute=selective"})}));
  // the tiny recipe's batch of 8 as 2 micro-steps of 4: the same global batch
  EXPECT_EQ(l[2], (Technique{"accum", V({"train.accumulation=2", "train.batch_size=4"})}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("parallel.dp = 1"), std::string::npos);

  const train::Recipe dp2 = train::parse_recipe(test_support::tiny_gpt_recipe(), "tiny.toml",
                                                {"parallel.dp=2", "precision.level=O2", "train.batch_size=5"}, false);
  skipped.clear();
  const auto l2 = default_ladder(dp2, &skipped);
  std::vector<std::string> names;
  for (const auto& t : l2) names.push_back(t.name);
  EXPECT_EQ(names, V({"zero1", "zero2", "recompute"}));
  EXPECT_EQ(skipped.size(), 2u);  // bf16 (already O2) and accum (odd batch)
}

// ---- the predictor's answer and the time to a loss

TEST(Ladder, ReadsThePredictorsJson) {
  const Prediction p = parse_prediction(
      "some note\n{\"feasible\": true, \"reason\": \"\", \"step_s\": 0.5, \"items_per_s\": 1024, \"item\": "
      "\"tokens\", \"peak_bytes\": {\"params\": 1, \"grads\": 2, \"optimizer\": 3, \"activations\": 4, "
      "\"workspace\": 5, \"other\": 6, \"total\": 21}}\n");
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_TRUE(p.feasible);
  EXPECT_EQ(p.items_per_s, 1024.0);
  EXPECT_EQ(p.step_s, 0.5);
  EXPECT_EQ(p.peak, (std::array<int64_t, 6>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.peak_total, 21);
  const Prediction no = parse_prediction("{\"feasible\": false, \"reason\": \"needs 30 GiB per rank\"}");
  ASSERT_TRUE(no.ok);
  EXPECT_FALSE(no.feasible);
  EXPECT_EQ(no.reason, "needs 30 GiB per rank");
  EXPECT_FALSE(parse_prediction("").ok);
  EXPECT_NE(parse_prediction("not json").error.find("not one JSON object"), std::string::npos);
  EXPECT_NE(parse_prediction("{\"feasible\": true, \"items_per_s\": 5}").error.find("peak_bytes"), std::string::npos);
  EXPECT_NE(parse_prediction("{\"items_per_s\": 5}").error.find("feasible"), std::string::npos);
}

TEST(Ladder, TimeToLossSumsEachStepsItemsOverItsRate) {
  const fs::path dir = test_support::fresh_test_dir("brigade_ladder");
  std::ofstream(dir / "metrics.jsonl") << "{\"step\":1,\"loss\":5.0,\"tokens_per_s\":1000,\"tokens_seen\":100}\n"
                                          "{\"step\":2,\"loss\":4.0,\"tokens_per_s\":500,\"tokens_seen\":200}\n"
                                          "{\"step\":2,\"val_loss\":3.9}\n"
                                          "{\"step\":3,\"loss\":3.0,\"tokens_per_s\":100,\"tokens_seen\":300}\n";
  const std::string m = (dir / "metrics.jsonl").string();
  const LossTiming t = time_to_loss(m, 4.0);  // 100/1000 + 100/500 s
  EXPECT_NEAR(t.to_target, 0.3, 1e-12);
  EXPECT_EQ(t.target_step, 2);
  EXPECT_NEAR(t.train_seconds, 1.3, 1e-12);
  EXPECT_EQ(time_to_loss(m, 2.0).target_step, 0);
  EXPECT_EQ(time_to_loss(m, 2.0).to_target, -1.0);
  EXPECT_NEAR(time_to_loss(m, 9.0).to_target, 0.1, 1e-12);
  fs::remove_all(dir);
}

// ---- end to end

class LadderRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        test_support::write_tiny_run(test_support::fresh_test_dir("brigade_ladder"), test_support::tiny_gpt_recipe());
    // The fake planner: fixed numbers, and no model of accumulation (fails as `brigade plan` would).
    std::ofstream(dir_ / "fake_plan.sh")
        << "case \"$*\" in *train.accumulation*) echo 'starting' >&2; echo 'fake: no model for accumulation' "
           ">&2; exit 3;; esac\n"
           "echo '{\"feasible\": true, \"reason\": \"\", \"step_s\": 0.02, \"items_per_s\": 40000, \"item\": "
           "\"tokens\", \"peak_bytes\": {\"params\": 100000, \"grads\": 100000, \"optimizer\": 200000, "
           "\"activations\": 900000, \"workspace\": 0, \"other\": 0, \"total\": 1300000}}'\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  CmdResult brigade(const std::string& args, const std::string& env = "") {
    return test_support::run_brigade(dir_, args, 0, "", env, 120);
  }
  fs::path dir_;
};

std::string pct_text(double now, double base) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * (now - base) / std::fabs(base));
  return buf;
}

TEST_F(LadderRun, MeasuresEveryDistinctRowBesideItsPrediction) {
  const CmdResult r = brigade(
      "ablate tiny.toml --ladder \"bf16=precision.level=O2;accum=train.accumulation=2,train.batch_size=4\" "
      "--steps 3 --out lad --predictor \"sh fake_plan.sh\"");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json js = nlohmann::json::parse(slurp(dir_ / "lad/ladder.json"));
  const nlohmann::json& rows = js.at("rows");
  ASSERT_EQ(rows.size(), 5u);
  const std::vector<std::string> labels = {"baseline", "bf16", "bf16 + accum", "all but bf16", "all but accum"};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(rows[i].at("label"), labels[i]) << i;
  // leaving accum out is the bf16 row: reused, not run again (4 run folders)
  EXPECT_EQ(rows[4].at("same_as"), 2);
  EXPECT_EQ(rows[4].at("dir"), rows[1].at("dir"));
  EXPECT_EQ(rows[4].at("measured"), rows[1].at("measured"));
  size_t runs = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "lad"))
    if (e.is_directory() && e.path().filename() != "predict") ++runs;
  EXPECT_EQ(runs, 4u);

  const nlohmann::json& base = rows[0].at("measured");
  const double target = base.at("final_loss").get<double>();  // the default target
  EXPECT_EQ(js.at("target_loss").get<double>(), target);
  const std::string md = slurp(dir_ / "lad/ladder.md");
  for (size_t i = 0; i < 5; ++i) {
    const nlohmann::json& row = rows[i];
    ASSERT_TRUE(row.at("ok").get<bool>()) << row.dump();
    const nlohmann::json& m = row.at("measured");
    const fs::path run = dir_ / row.at("dir").get<std::string>();
    EXPECT_EQ(m.at("steps"), 3);
    // the measured numbers are the run folder's
    const nlohmann::json mem = test_support::json_file(run / "memory.json");
    EXPECT_EQ(m.at("peak_bytes").at("total"), mem.at("peak_total"));
    EXPECT_EQ(m.at("peak_bytes").at("activations"), mem.at("peak").at("activations"));
    const auto rates = test_support::per_step(run / "metrics.jsonl", "tokens_per_s");
    const auto seen = test_support::per_step(run / "metrics.jsonl", "tokens_seen");
    const auto loss = test_support::per_step(run / "metrics.jsonl", "loss");
    ASSERT_EQ(rates.size(), 3u);
    std::vector<double> sorted;
    for (const auto& [s, v] : rates) sorted.push_back(v);
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(m.at("items_per_s").get<double>(), sorted[1]);  // the median of 3
    EXPECT_EQ(m.at("final_loss").get<double>(), loss.at(3));
    // Δ against the baseline, from the rows' own numbers
    const double v = m.at("items_per_s").get<double>(), b = base.at("items_per_s").get<double>();
    const double pv = double(m.at("peak_bytes").at("total").get<int64_t>()),
                 pb = double(base.at("peak_bytes").at("total").get<int64_t>());
    EXPECT_NEAR(row.at("delta_pct").at("items_per_s").get<double>(), 100.0 * (v - b) / b, 1e-9) << i;
    EXPECT_NEAR(row.at("delta_pct").at("peak_total").get<double>(), 100.0 * (pv - pb) / pb, 1e-9) << i;
    // the time to the target: each step's tokens over its tokens/s, up to the first loss <= target
    double t = 0, before = 0, reached = -1;
    int64_t step = 0;
    for (const auto& [s, rate] : rates) {
      t += (seen.at(s) - before) / rate;
      before = seen.at(s);
      if (reached < 0 && loss.at(s) <= target) {
        reached = t;
        step = s;
      }
    }
    if (step > 0) {
      EXPECT_NEAR(row.at("time_to_target_s").get<double>(), reached, 1e-9) << i;
      EXPECT_EQ(row.at("target_step"), step) << i;
    } else {
      EXPECT_TRUE(row.at("time_to_target_s").is_null()) << i;
    }
    EXPECT_NEAR(m.at("train_seconds").get<double>(), t, 1e-9) << i;
    if (i == 0) {
      EXPECT_EQ(step, 3);  // the baseline reaches its own final loss at its last step at the latest
    }
    // the prediction: the fake's numbers where it answers (no accumulation), its reason where not
    const bool predicted = i == 0 || i == 1 || i == 4;
    const nlohmann::json& p = row.at("predicted");
    if (predicted) {
      EXPECT_EQ(p.at("items_per_s").get<double>(), 40000.0);
      EXPECT_EQ(p.at("peak_bytes").at("total").get<int64_t>(), 1300000);
      EXPECT_NEAR(row.at("error_pct").at("items_per_s").get<double>(), 100.0 * (v / 40000.0 - 1), 1e-9) << i;
      EXPECT_NEAR(row.at("error_pct").at("peak_total").get<double>(), 100.0 * (pv / 1300000.0 - 1), 1e-9) << i;
    } else {
      EXPECT_EQ(p.at("error"), "exit 3: fake: no model for accumulation") << p.dump();
      EXPECT_FALSE(row.contains("error_pct"));
    }
    // the markdown row carries the same numbers
    std::string cells = fmt::format("| {} | {}{} | 3 | {:.0f} | {} | {} | {} | {:.1f} | {} | {} | {} |", i + 1,
                                    labels[i], i == 4 ? " (= row 2)" : "", v, i == 0 ? "base" : pct_text(v, b),
                                    predicted ? "40000" : "no prediction", predicted ? pct_text(v, 40000.0) : "",
                                    pv / double(1 << 20), i == 0 ? "base" : pct_text(pv, pb),
                                    predicted ? fmt::format("{:.1f}", 1300000.0 / double(1 << 20)) : "no prediction",
                                    predicted ? pct_text(pv, 1300000.0) : "");
    EXPECT_NE(md.find(cells), std::string::npos) << cells << "\n" << md;
    EXPECT_NE(r.out.find(cells), std::string::npos) << "the table is printed too";
  }
  EXPECT_NE(md.find("no prediction: exit 3: fake: no model for accumulation"), std::string::npos) << md;
  EXPECT_EQ(slurp(dir_ / "lad/ladder.svg").rfind("<svg", 0), 0u);
  EXPECT_NE(r.err.find("ladder: [4/4] all but bf16"), std::string::npos) << r.err;  // progress per row
}

TEST_F(LadderRun, ReadsATomlLadderAndAGivenTargetAndRunsWithoutAPlanner) {
  std::ofstream(dir_ / "l.toml") << "[[technique]]\nname = \"lr\"\noptim.lr = 1e-3\n";
  // the build's own `brigade plan --predict` when there is one; where it fails the row says why
  const CmdResult r = brigade("ablate tiny.toml --ladder-file l.toml --steps 2 --target-loss 0.5 --out lad --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json js = nlohmann::json::parse(slurp(dir_ / "lad/ladder.json"));
  ASSERT_EQ(js.at("rows").size(), 3u);
  EXPECT_EQ(js.at("target_loss").get<double>(), 0.5);
  EXPECT_EQ(js.at("rows")[2].at("same_as"), 1);  // leaving the only technique out is the baseline
  for (const auto& row : js.at("rows")) {
    EXPECT_TRUE(row.at("time_to_target_s").is_null()) << "a loss of 0.5 is out of reach in 2 steps";
    const nlohmann::json& p = row.at("predicted");
    EXPECT_TRUE(p.contains("error") || p.contains("feasible")) << p.dump();
  }
  EXPECT_NE(slurp(dir_ / "lad/ladder.md").find("| not reached |"), std::string::npos);
}

TEST_F(LadderRun, RowsOfTheSameRecipeRunOnce) {
  // `own` sets the recipe's own learning rate: its rows are the baseline's, however they are spelled
  const CmdResult r = brigade(
      "ablate tiny.toml --ladder \"own=optim.lr=3e-3;lr=optim.lr=1e-3\" --steps 1 --out lad --quiet "
      "--predictor \"sh fake_plan.sh\"");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json rows = nlohmann::json::parse(slurp(dir_ / "lad/ladder.json")).at("rows");
  ASSERT_EQ(rows.size(), 5u);
  // baseline, own (= 1), own + lr, all but own = {lr} (= 3), all but lr = {own} (= 1)
  const std::vector<nlohmann::json> same = {nullptr, 1, nullptr, 3, 1};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(rows[i].at("same_as"), same[i]) << i;
  size_t runs = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "lad"))
    if (e.is_directory() && e.path().filename() != "predict") ++runs;
  EXPECT_EQ(runs, 2u);
}

TEST_F(LadderRun, BadLadderFailsBeforeAnythingRuns) {
  const CmdResult r = brigade("ablate tiny.toml --ladder precision.level=O2 --out bad");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("brigade: error: --ladder 'precision.level=O2': 'precision.level=O2' starts with a key"),
            std::string::npos)
      << r.err;
  // a row whose recipe is invalid is named before the first row trains
  const CmdResult n = brigade("ablate tiny.toml --ladder \"a=optim.lr=1e-3;heads=model.n_head=3\" --out bad");
  EXPECT_EQ(n.code, 1) << n.err;
  EXPECT_NE(n.err.find("ladder row 3 (a + heads)"), std::string::npos) << n.err;
  EXPECT_FALSE(fs::exists(dir_ / "bad"));
  const CmdResult target = brigade("ablate tiny.toml --vary optim.lr=1e-3 --target-loss 3 --out bad");
  EXPECT_EQ(target.code, 1);
  EXPECT_NE(target.err.find("--target-loss and --predictor go with --ladder"), std::string::npos) << target.err;
  const CmdResult both = brigade("ablate tiny.toml --vary optim.lr=1e-3 --ladder default --out bad");
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
}

// The fix on the way: a variant of tp = 2 runs as 2 processes (dp x tp x pp), not parallel.dp's 1.
TEST_F(LadderRun, VariantRunsAsDpTimesTpTimesPpProcesses) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun on PATH";
  const CmdResult r =
      brigade("ablate tiny.toml --vary parallel.tp=2 --steps 2 --out tp --quiet", test_support::kMpiEnv);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json js = nlohmann::json::parse(slurp(dir_ / "tp/ablate.json"));
  ASSERT_EQ(js.size(), 1u);
  const nlohmann::json mem = test_support::json_file(dir_ / js[0].at("dir").get<std::string>() / "memory.json");
  EXPECT_EQ(mem.at("ranks").size(), 2u) << mem.dump();
}
