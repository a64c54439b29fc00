// Early stopping on constructed val-loss sequences, the SVG line plot, and the
// pure parts of `brigade ablate` (--vary parsing, the variant product, the table).
// The end-to-end behaviour (a real run stops, keeps best/, ablate runs children)
// is in tests/cli/test_cli.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "brigade/cli/ablate.h"
#include "brigade/core/error.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/config.h"
#include "brigade/train/early_stop.h"
#include "brigade/train/plot.h"

namespace brigade::train {
namespace {

namespace fs = std::filesystem;

using V = EarlyStopper::Verdict;

// Feeds `losses` (one evaluation every `every` steps) and returns the verdicts.
std::vector<V> feed(EarlyStopper& es, const std::vector<double>& losses, int64_t every, int64_t first_step = 0) {
  std::vector<V> out;
  for (size_t i = 0; i < losses.size(); ++i) out.push_back(es.observe(first_step + int64_t(i + 1) * every, losses[i]));
  return out;
}

TEST(EarlyStop, StopsAtTheHandCalculatedStepWithMinDelta) {
  // patience 2, min_delta 0.1, evaluations at steps 10, 20, ...
  //   10: 5.00 first            -> improved (best 5.00 @10)
  //   20: 4.50 < 5.00 - 0.1     -> improved (best 4.50 @20)
  //   30: 4.45 !< 4.40          -> 1 without improvement
  //   40: 4.30 < 4.40           -> improved (best 4.30 @40), count reset
  //   50: 4.25 !< 4.20          -> 1
  //   60: 4.35                  -> 2 = patience -> stop at 60, best @40
  EarlyStopper es(2, 0.1);
  std::vector<V> v = feed(es, {5.00, 4.50, 4.45, 4.30, 4.25, 4.35}, 10);
  EXPECT_EQ(v, (std::vector<V>{V::Improved, V::Improved, V::NoImprovement, V::Improved, V::NoImprovement, V::Stop}));
  EXPECT_EQ(es.state().best_step, 40);
  EXPECT_DOUBLE_EQ(es.state().best_val_loss, 4.30);
  EXPECT_EQ(es.state().evals_since_best, 2);
  EXPECT_TRUE(es.exhausted());
}

TEST(EarlyStop, WithoutMinDeltaAnyDecreaseCountsAndTheBestIsTheMinimum) {
  // patience 3: 4.25 @50 is the minimum; 4.35, 4.26, 4.25 (equal is not better) -> stop at 80
  EarlyStopper es(3, 0.0);
  const std::vector<double> losses{5.00, 4.50, 4.45, 4.30, 4.25, 4.35, 4.26, 4.25};
  std::vector<V> v = feed(es, losses, 10);
  ASSERT_EQ(v.size(), losses.size());
  EXPECT_EQ(v[4], V::Improved);
  EXPECT_EQ(v[5], V::NoImprovement);
  EXPECT_EQ(v[6], V::NoImprovement);
  EXPECT_EQ(v[7], V::Stop);
  EXPECT_EQ(es.state().best_step, 50);
  EXPECT_DOUBLE_EQ(es.state().best_val_loss, 4.25);
  EXPECT_TRUE(es.exhausted());
  // the run would have stopped; a later improvement (fed anyway) resets the count
  EXPECT_EQ(es.observe(90, 4.00), V::Improved);
  EXPECT_FALSE(es.exhausted());
  EXPECT_EQ(es.state().best_step, 90);
}

TEST(EarlyStop, PatienceOneStopsAtTheFirstNonImprovement) {
  EarlyStopper es(1, 0.0);
  EXPECT_EQ(feed(es, {3.0, 2.0, 2.5}, 5), (std::vector<V>{V::Improved, V::Improved, V::Stop}));
  EXPECT_EQ(es.state().best_step, 10);
}

TEST(EarlyStop, NaNNeverImproves) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EarlyStopper es(2, 0.0);
  EXPECT_EQ(feed(es, {nan, 3.0, nan, nan}, 1),
            (std::vector<V>{V::NoImprovement, V::Improved, V::NoImprovement, V::Stop}));
  EXPECT_EQ(es.state().best_step, 2);
}

TEST(EarlyStop, ResumingFromTheSavedStateDecidesAsAnUninterruptedRun) {
  const std::vector<double> losses{5.00, 4.50, 4.45, 4.30, 4.25, 4.35, 4.40};
  EarlyStopper whole(3, 0.01);
  const std::vector<V> all = feed(whole, losses, 10);
  for (size_t split = 0; split <= losses.size(); ++split) {
    EarlyStopper a(3, 0.01);
    std::vector<V> v = feed(a, {losses.begin(), losses.begin() + long(split)}, 10);
    EarlyStopper b(3, 0.01, a.state());  // what state.json carries across --resume
    std::vector<V> rest = feed(b, {losses.begin() + long(split), losses.end()}, 10, int64_t(split) * 10);
    v.insert(v.end(), rest.begin(), rest.end());
    EXPECT_EQ(v, all) << "split after " << split << " evaluations";
    EXPECT_EQ(b.state(), whole.state());
  }
}

TEST(EarlyStop, BadSettingsAreClearErrors) {
  EXPECT_THROW(EarlyStopper(0, 0.0), ValueError);
  EXPECT_THROW(EarlyStopper(3, -0.1), ValueError);
  try {
    EarlyStopper(0, 0.0);
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("train.patience"), std::string::npos) << e.what();
  }
}

TEST(EarlyStop, RecipeKeysAreValidated) {
  const Recipe d;
  EXPECT_FALSE(d.train.early_stop);
  EXPECT_EQ(d.train.patience, 5);
  EXPECT_EQ(d.train.min_delta, 0.0);
  auto msg = [](const std::string& train) -> std::string {
    try {
      parse_recipe("[train]\n" + train + "\n", "es.toml");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(msg("early_stop = true\npatience = 2\nmin_delta = 0.01"), "");
  EXPECT_NE(msg("early_stop = true\neval_every = 0").find("train.eval_every"), std::string::npos);
  EXPECT_NE(msg("patience = 0").find("train.patience"), std::string::npos);
  EXPECT_NE(msg("min_delta = -0.5").find("train.min_delta"), std::string::npos);
  EXPECT_NE(msg("early_stop = \"yes\"").find("true or false"), std::string::npos);
  EXPECT_NE(recipe_to_toml(d).find("\nearly_stop = false\n"), std::string::npos);
}

TEST(EarlyStop, StateTravelsInStateJsonAndOldCheckpointsReadAsNone) {
  const fs::path dir = fs::temp_directory_path() / ("brigade_es_state_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  TrainState st;
  st.step = 12;
  st.tokens_seen = 345;
  st.rng_state = "rng";
  st.last_val_loss = 2.5;
  st.early_stop = {8, 2.25, 2};
  write_checkpoint_files(dir.string(), {}, nullptr, st, Recipe{}, "");
  TrainState back = checkpoint_state(dir.string());
  EXPECT_EQ(back.early_stop, st.early_stop);
  EXPECT_EQ(back.step, 12);
  // a state.json from before early stopping existed
  {
    std::ofstream f(dir / "state.json");
    f << R"({"version": 1, "step": 3, "tokens_seen": 9, "rng_state": "r", "last_val_loss": -1.0})";
  }
  back = checkpoint_state(dir.string());
  EXPECT_EQ(back.early_stop, EarlyStopState{});
  EXPECT_EQ(back.step, 3);
  fs::remove_all(dir);
}

// ---- SVG plot

// Minimal well-formedness check: every element closes in order, attributes are quoted.
::testing::AssertionResult well_formed(const std::string& svg) {
  std::vector<std::string> stack;
  size_t i = 0;
  while ((i = svg.find('<', i)) != std::string::npos) {
    const size_t end = svg.find('>', i);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unterminated tag at " << i;
    const std::string tag = svg.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return ::testing::AssertionFailure() << "empty tag";
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1))
        return ::testing::AssertionFailure()
               << "</" << tag.substr(1) << "> closes " << (stack.empty() ? "nothing" : stack.back());
      stack.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" /"));
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0)
      return ::testing::AssertionFailure() << "unbalanced quotes in <" << tag << ">";
    if (tag.back() != '/') stack.push_back(name);
  }
  if (!stack.empty()) return ::testing::AssertionFailure() << "<" << stack.back() << "> never closed";
  return ::testing::AssertionSuccess();
}

// The "points" of every <polyline> as counts of "x,y" pairs.
std::vector<size_t> polyline_points(const std::string& svg) {
  std::vector<size_t> out;
  std::regex re("<polyline[^>]* points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    const std::string pts = (*it)[1];
    out.push_back(pts.empty() ? 0 : size_t(std::count(pts.begin(), pts.end(), ',')));
  }
  return out;
}

TEST(Plot, OnePolylinePerSeriesWithEveryPointAxesAndLegend) {
  PlotSeries train{"train loss", {1, 2, 3, 4, 5}, {5.0, 4.0, 3.5, 3.2, 3.1}};
  PlotSeries val{"val <loss> & co", {2, 4, 5}, {4.5, 3.6, 3.4}, true};
  PlotOptions o;
  o.title = "tiny: loss";
  o.y_label = "cross-entropy";
  const std::string svg = line_plot_svg({train, val}, o);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_TRUE(well_formed(svg));
  EXPECT_EQ(polyline_points(svg), (std::vector<size_t>{5, 3}));
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">cross-entropy</text>"), std::string::npos);
  EXPECT_NE(svg.find(">tiny: loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">train loss</text>"), std::string::npos);         // legend
  EXPECT_NE(svg.find("val &lt;loss&gt; &amp; co"), std::string::npos);  // escaped
  EXPECT_EQ(svg.find("<loss>"), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\0'), 0);
  // 3 markers for the val series
  size_t circles = 0;
  for (size_t p = 0; (p = svg.find("<circle", p)) != std::string::npos; ++p) ++circles;
  EXPECT_EQ(circles, 3u);
  // every coordinate lies inside the picture
  std::regex num("points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), num); it != std::sregex_iterator(); ++it) {
    std::string pts = (*it)[1];
    std::replace(pts.begin(), pts.end(), ',', ' ');
    std::istringstream in(pts);
    for (double x, y; in >> x >> y;) {
      EXPECT_GE(x, 0);
      EXPECT_LE(x, o.width);
      EXPECT_GE(y, 0);
      EXPECT_LE(y, o.height);
    }
  }
}

TEST(Plot, LogAxisDropsNonPositiveAndNonFinitePoints) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  PlotSeries s{"s", {1, 2, 3, 4, 5}, {10.0, 0.0, nan, 1.0, 0.1}};
  PlotOptions o;
  o.log_y = true;
  const std::string svg = line_plot_svg({s}, o);
  EXPECT_TRUE(well_formed(svg));
  EXPECT_EQ(polyline_points(svg), (std::vector<size_t>{3}));
  EXPECT_NE(svg.find("(log scale)"), std::string::npos);
  EXPECT_NE(svg.find(">1</text>"), std::string::npos);  // a decade tick
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(Plot, EmptyAndSinglePointSeriesStillDraw) {
  EXPECT_TRUE(well_formed(line_plot_svg({}, {})));
  const std::string one = line_plot_svg({{"one", {3}, {2.5}, true}}, {});
  EXPECT_TRUE(well_formed(one));
  EXPECT_EQ(polyline_points(one), (std::vector<size_t>{1}));
  EXPECT_THROW(line_plot_svg({{"bad", {1, 2}, {1}}}, {}), ValueError);
}

TEST(Plot, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 100, 5), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(nice_ticks(3.13, 5.02, 4), (std::vector<double>{3.5, 4.0, 4.5, 5.0}));
  EXPECT_EQ(nice_ticks(-1, 1, 2), (std::vector<double>{-1, 0, 1}));
  EXPECT_EQ(nice_ticks(2, 2, 5), (std::vector<double>{2}));
}

// ---- ablate

using namespace brigade::cli;

TEST(Ablate, ParsesVaryListsAndBuildsTheProductFirstAxisSlowest) {
  VaryAxis a = parse_vary("train.accumulation=1,2");
  EXPECT_EQ(a.key, "train.accumulation");
  EXPECT_EQ(a.values, (std::vector<std::string>{"1", "2"}));
  VaryAxis b = parse_vary("optim.lr = 1e-3, 3e-3");
  EXPECT_EQ(b.key, "optim.lr");
  EXPECT_EQ(b.values, (std::vector<std::string>{"1e-3", "3e-3"}));
  VaryAxis c = parse_vary("sample.prompt=\"And, lo\",In the beginning");
  EXPECT_EQ(c.values, (std::vector<std::string>{"\"And, lo\"", "In the beginning"}));
  auto combos = variant_overrides({a, b});
  ASSERT_EQ(combos.size(), 4u);
  EXPECT_EQ(combos[0], (std::vector<std::string>{"train.accumulation=1", "optim.lr=1e-3"}));
  EXPECT_EQ(combos[1], (std::vector<std::string>{"train.accumulation=1", "optim.lr=3e-3"}));
  EXPECT_EQ(combos[3], (std::vector<std::string>{"train.accumulation=2", "optim.lr=3e-3"}));
}

std::string error_of(const std::string& vary) {
  try {
    parse_vary(vary);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Ablate, BadVaryIsAClearError) {
  const std::string unknown = error_of("train.acumulation=1,2");
  EXPECT_NE(unknown.find("--vary 'train.acumulation=1,2'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("did you mean 'train.accumulation'"), std::string::npos) << unknown;
  EXPECT_NE(error_of("accumulation=1,2").find("did you mean 'train.accumulation'"), std::string::npos);
  EXPECT_NE(error_of("train.accumulation=1,two").find("must be an integer"), std::string::npos);
  EXPECT_NE(error_of("train.accumulation").find("section.key=v1,v2"), std::string::npos);
  EXPECT_NE(error_of("train.accumulation=1,,2").find("empty value"), std::string::npos);
  EXPECT_NE(error_of("run.out_dir=a,b").find("--out"), std::string::npos);
}

TEST(Ablate, TableHasOneRowPerVariantAndChangesAgainstTheBaseline) {
  std::vector<VariantResult> vs(3);
  for (size_t i = 0; i < vs.size(); ++i) {
    vs[i].label = "train.accumulation=" + std::to_string(i + 1);
    vs[i].ok = true;
    vs[i].steps = 10;
    vs[i].items_per_s = 1000.0 * double(i + 1);
    vs[i].peak = {1 << 20, 1 << 20, 2 << 20, 10 << 20, 0, 0};
    vs[i].peak_total = 14 << 20;
    vs[i].final_loss = 3.0;
    vs[i].final_val_loss = 3.5;
    vs[i].metrics.steps = {1, 2, 3};
    vs[i].metrics.losses = {4.0, 3.5, 3.0};
  }
  vs[2].ok = false;
  vs[2].error = "exit 1: boom";
  vs[2].label = "a|b";
  const std::string t = ablation_table(vs);
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 2 + 3);
  EXPECT_NE(t.find("| 1 | train.accumulation=1 | 10 | 1000 | base |"), std::string::npos) << t;
  EXPECT_NE(t.find("| 2 | train.accumulation=2 | 10 | 2000 | +100.0% | 1.0 | 1.0 | 2.0 | 10.0 | 14.0 | +0.0% |"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("| 3 | a\\|b | failed |"), std::string::npos) << t;
  vs[2].error = "";
  EXPECT_NE(ablation_table(vs).find("| 3 | a\\|b | not run |"), std::string::npos);
  const std::string svg = ablation_plot_svg(vs, "t");
  EXPECT_TRUE(well_formed(svg));
  EXPECT_EQ(polyline_points(svg), (std::vector<size_t>{3, 3}));  // the failed variant has no curve
}

}  // namespace
}  // namespace brigade::train
