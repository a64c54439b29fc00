// `brigade ablate --ladder`: parse the ladder, build its rows, predict and run each distinct row, and
// write the report; see ladder.h.
#include "brigade/cli/ladder.h"

#include <toml++/toml.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"

namespace brigade::cli {

using namespace brigade::train;

namespace fs = std::filesystem;

namespace {

bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("_+-", c)) return false;
  return true;
}

// Checks one technique (its name, its overrides against a scratch recipe) and adds it to `ladder`;
// `where` says where it was written ("--ladder" or "FILE, technique 2").
void add_technique(std::vector<Technique>& ladder, Technique t, const std::string& where) {
  BRIGADE_CHECK(valid_name(t.name), ConfigError,
                "{}: technique name '{}' must be a word of letters, digits, '_', '+' or '-' (e.g. bf16, zero1); "
                "write NAME=section.key=value",
                where, t.name);
  for (const Technique& other : ladder)
    BRIGADE_CHECK(other.name != t.name, ConfigError, "{}: technique '{}' is given twice; give each a distinct name",
                  where, t.name);
  BRIGADE_CHECK(!t.sets.empty(), ConfigError,
                "{}: technique '{}' has no overrides; write {}=section.key=value[,section.key=value]", where, t.name,
                t.name);
  std::set<std::string> keys;
  for (std::string& s : t.sets) {
    s = trim(s);
    const size_t eq = s.find('=');
    const std::string key = trim(s.substr(0, eq == std::string::npos ? s.size() : eq));
    BRIGADE_CHECK(eq != std::string::npos && !key.empty(), ConfigError,
                  "{}: technique '{}': '{}' must look like section.key=value (e.g. precision.level=O2); separate a "
                  "technique's overrides by ',' and techniques by ';'",
                  where, t.name, s);
    BRIGADE_CHECK(key != "run.out_dir", ConfigError,
                  "{}: technique '{}': ablate gives every row its own folder under --out; set another key than "
                  "run.out_dir",
                  where, t.name);
    BRIGADE_CHECK(keys.insert(key).second, ConfigError, "{}: technique '{}' sets {} twice; keep one value", where,
                  t.name, key);
    Recipe scratch;
    try {
      apply_override(scratch, s);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}: technique '{}': {}", where, t.name, e.what()));
    }
  }
  ladder.push_back(std::move(t));
}

constexpr size_t kMaxTechniques = 16;  // 2n + 1 rows of training

void check_size(const std::vector<Technique>& ladder, const std::string& where) {
  BRIGADE_CHECK(!ladder.empty(), ConfigError,
                "{}: no techniques; give at least one, e.g. --ladder \"bf16=precision.level=O2\" (or --ladder "
                "default)",
                where);
  BRIGADE_CHECK(ladder.size() <= kMaxTechniques, ConfigError,
                "{}: {} techniques give {} rows to train; that is too many (at most {} techniques)", where,
                ladder.size(), 2 * ladder.size() + 1, kMaxTechniques);
}

std::string mem_key(int t) { return std::string(mem_tag_name(MemTag(t))); }

}  // namespace

std::vector<Technique> parse_ladder(const std::string& spec) {
  std::vector<Technique> ladder;
  for (const std::string& piece : split_top(spec, ';')) {
    if (piece.empty()) continue;  // "a;;b" or a trailing ';'
    const size_t eq = piece.find('=');
    Technique t;
    t.name = trim(piece.substr(0, eq == std::string::npos ? piece.size() : eq));
    BRIGADE_CHECK(eq != std::string::npos, ConfigError,
                  "--ladder '{}': technique '{}' has no overrides; write {}=section.key=value[,section.key=value] "
                  "(techniques separated by ';')",
                  spec, piece, t.name);
    BRIGADE_CHECK(t.name.find('.') == std::string::npos, ConfigError,
                  "--ladder '{}': '{}' starts with a key, not a name; every technique starts with its name: "
                  "NAME={} (e.g. bf16=precision.level=O2)",
                  spec, piece, piece);
    const std::string rest = trim(piece.substr(eq + 1));
    if (!rest.empty()) t.sets = split_top(rest, ',');
    for (const std::string& s : t.sets)
      BRIGADE_CHECK(!s.empty(), ConfigError,
                    "--ladder '{}': technique '{}' has an empty override; separate its overrides by single commas",
                    spec, t.name);
    add_technique(ladder, std::move(t), fmt::format("--ladder '{}'", spec));
  }
  check_size(ladder, fmt::format("--ladder '{}'", spec));
  return ladder;
}

std::vector<Technique> parse_ladder_toml(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError(fmt::format("ladder file {}: line {}, column {}: {}; it holds [[technique]] tables", origin,
                                  b.line, b.column, e.description()));
  }
  for (const auto& [k, v] : root)
    BRIGADE_CHECK(k.str() == "technique", ConfigError,
                  "ladder file {}: unknown top-level key '{}'; write each technique as a [[technique]] table with "
                  "name = \"...\" and its overrides as keys (precision.level = \"O2\")",
                  origin, k.str());
  const toml::array* arr = root["technique"].as_array();
  BRIGADE_CHECK(arr != nullptr, ConfigError,
                "ladder file {}: no [[technique]] tables; write e.g.\n[[technique]]\nname = \"bf16\"\n"
                "precision.level = \"O2\"",
                origin);
  std::vector<Technique> ladder;
  for (size_t i = 0; i < arr->size(); ++i) {
    const std::string where = fmt::format("ladder file {}, technique {}", origin, i + 1);
    const toml::table* t = (*arr)[i].as_table();
    BRIGADE_CHECK(t != nullptr, ConfigError, "{}: must be a table ([[technique]])", where);
    Technique tech;
    const auto name = (*t)["name"].value<std::string>();
    BRIGADE_CHECK(name.has_value(), ConfigError, "{}: needs name = \"...\" (a string)", where);
    tech.name = *name;
    for (const auto& [section, node] : *t) {
      if (section.str() == "name") continue;
      const toml::table* keys = node.as_table();
      BRIGADE_CHECK(keys != nullptr, ConfigError,
                    "{} ('{}'): '{}' is not a recipe section; write the override as section.key = value "
                    "(e.g. precision.level = \"O2\")",
                    where, tech.name, section.str());
      for (const auto& [key, value] : *keys) {
        BRIGADE_CHECK(!value.is_table() && !value.is_array_of_tables(), ConfigError,
                      "{} ('{}'): {}.{} is a table; recipe keys are section.key = value", where, tech.name,
                      section.str(), key.str());
        std::ostringstream os;
        value.visit([&](const auto& v) { os << v; });  // the value as TOML (strings quoted)
        tech.sets.push_back(fmt::format("{}.{}={}", section.str(), key.str(), os.str()));
      }
    }
    add_technique(ladder, std::move(tech), where);
  }
  check_size(ladder, fmt::format("ladder file {}", origin));
  return ladder;
}

std::vector<Technique> default_ladder(const Recipe& base, std::vector<std::string>* skipped) {
  std::vector<Technique> candidates;
  auto skip = [&](const std::string& why) {
    if (skipped) skipped->push_back(why);
  };
  if (base.precision.level == "O0")
    candidates.push_back({"bf16", {"precision.level=O2", "precision.dtype=bf16"}});
  else
    skip(fmt::format("bf16: the recipe already runs precision.level = {}", base.precision.level));
  if (base.parallel.dp > 1) {
    if (base.parallel.zero < 1) candidates.push_back({"zero1", {"parallel.zero=1"}});
    if (base.parallel.zero < 2) candidates.push_back({"zero2", {"parallel.zero=2"}});
  } else {
    skip("zero1, zero2: parallel.dp = 1 has nothing to shard (--set parallel.dp=2 to include them)");
  }
  if (base.memory.recompute == "none")
    candidates.push_back({"recompute", {"memory.recompute=selective"}});
  else
    skip(fmt::format("recompute: the recipe already sets memory.recompute = \"{}\"", base.memory.recompute));
  if (base.train.batch_size % 2 == 0)
    candidates.push_back({"accum",
                          {fmt::format("train.accumulation={}", 2 * base.train.accumulation),
                           fmt::format("train.batch_size={}", base.train.batch_size / 2)}});
  else
    skip(
        fmt::format("accum: train.batch_size = {} is odd (accumulation x2 keeps the global batch at half the "
                    "batch)",
                    base.train.batch_size));
  std::vector<Technique> out;
  for (Technique& t : candidates) {
    Recipe r = base;
    try {
      for (const auto& s : t.sets) apply_override(r, s);
      validate_recipe(r, base.path);
    } catch (const ConfigError& e) {
      skip(fmt::format("{}: {}", t.name, e.what()));
      continue;
    }
    out.push_back(std::move(t));
  }
  return out;
}

const char* row_kind_name(RowKind k) {
  switch (k) {
    case RowKind::Baseline: return "baseline";
    case RowKind::Cumulative: return "cumulative";
    case RowKind::LeaveOneOut: return "leave-one-out";
  }
  return "?";
}

std::map<std::string, std::string> effective_overrides(const std::vector<std::string>& overrides) {
  std::map<std::string, std::string> m;
  for (const std::string& s : overrides) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos) continue;
    m[trim(s.substr(0, eq))] = trim(s.substr(eq + 1));
  }
  return m;
}

std::vector<LadderRow> ladder_rows(const std::vector<Technique>& ladder) {
  std::vector<LadderRow> rows;
  auto add = [&](RowKind kind, std::string label, std::vector<size_t> techniques) {
    LadderRow r;
    r.kind = kind;
    r.label = std::move(label);
    r.techniques = std::move(techniques);
    for (size_t t : r.techniques) r.overrides.insert(r.overrides.end(), ladder[t].sets.begin(), ladder[t].sets.end());
    const auto eff = effective_overrides(r.overrides);
    for (size_t j = 0; j < rows.size() && r.same_as < 0; ++j)
      if (rows[j].same_as < 0 && effective_overrides(rows[j].overrides) == eff) r.same_as = int(j);
    rows.push_back(std::move(r));
  };
  add(RowKind::Baseline, "baseline", {});
  std::vector<size_t> upto;
  std::string label;
  for (size_t k = 0; k < ladder.size(); ++k) {
    upto.push_back(k);
    label += (k ? " + " : "") + ladder[k].name;
    add(RowKind::Cumulative, label, upto);
  }
  for (size_t k = 0; k < ladder.size(); ++k) {
    std::vector<size_t> others;
    for (size_t j = 0; j < ladder.size(); ++j)
      if (j != k) others.push_back(j);
    add(RowKind::LeaveOneOut, "all but " + ladder[k].name, others);
  }
  return rows;
}

Prediction parse_prediction(const std::string& text) {
  Prediction p;
  nlohmann::json j;
  auto parse = [&](const std::string& s) {
    try {
      j = nlohmann::json::parse(s);
      return j.is_object();
    } catch (const nlohmann::json::exception&) {
      return false;
    }
  };
  std::string last;
  {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      if (!trim(line).empty()) last = trim(line);
  }
  if (!parse(text) && !parse(last)) {
    p.error = last.empty() ? "the predictor printed nothing on stdout"
                           : fmt::format("the predictor's output is not one JSON object: {}", last.substr(0, 200));
    return p;
  }
  try {
    BRIGADE_CHECK(j.contains("feasible") && j["feasible"].is_boolean(), ValueError, "no boolean \"feasible\"");
    p.feasible = j["feasible"].get<bool>();
    if (j.contains("reason") && j["reason"].is_string()) p.reason = j["reason"].get<std::string>();
    if (j.contains("item") && j["item"].is_string()) p.item = j["item"].get<std::string>();
    if (j.contains("step_s") && j["step_s"].is_number()) p.step_s = j["step_s"].get<double>();
    if (j.contains("items_per_s") && j["items_per_s"].is_number()) p.items_per_s = j["items_per_s"].get<double>();
    if (j.contains("peak_bytes") && j["peak_bytes"].is_object()) {
      const nlohmann::json& pb = j["peak_bytes"];
      for (int t = 0; t < kNumMemTags && t < int(p.peak.size()); ++t)
        if (pb.contains(mem_key(t)) && pb[mem_key(t)].is_number()) p.peak[size_t(t)] = pb[mem_key(t)].get<int64_t>();
      if (pb.contains("total") && pb["total"].is_number()) p.peak_total = pb["total"].get<int64_t>();
    }
    if (p.feasible) {
      BRIGADE_CHECK(p.items_per_s > 0, ValueError, "a feasible plan without \"items_per_s\" > 0");
      BRIGADE_CHECK(p.peak_total > 0, ValueError, "a feasible plan without \"peak_bytes\": {{\"total\": ...}} > 0");
    }
  } catch (const Error& e) {
    p.error = fmt::format("the predictor's JSON has {}", e.what());
    return p;
  }
  p.ok = true;
  return p;
}

LossTiming time_to_loss(const std::string& path, double target) {
  LossTiming out;
  std::ifstream in(path);
  double seen_before = 0.0;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a torn last line
    }
    if (!j.is_object() || !j.contains("loss") || !j["loss"].is_number()) continue;
    for (const char* item : {"tokens", "images", "pairs"}) {
      const std::string rate_key = std::string(item) + "_per_s", seen_key = std::string(item) + "_seen";
      if (!j.contains(rate_key) || !j.contains(seen_key) || !j[rate_key].is_number() || !j[seen_key].is_number())
        continue;
      const double rate = j[rate_key].get<double>(), seen = j[seen_key].get<double>();
      if (rate > 0) out.train_seconds += (seen - seen_before) / rate;
      seen_before = seen;
      break;
    }
    if (out.target_step == 0 && std::isfinite(target) && j["loss"].get<double>() <= target) {
      out.to_target = out.train_seconds;
      out.target_step = j.value("step", int64_t(0));
    }
  }
  return out;
}

std::string ladder_table(const std::vector<LadderResult>& rows, double target) {
  const std::string item = rows.empty() ? std::string("tokens") : rows[0].measured.item;
  std::string t = fmt::format(
      "| # | row | steps | {0}/s | Δ {0}/s | predicted {0}/s | error | peak MiB | Δ peak | predicted MiB | error | "
      "params MiB | grads MiB | optimizer MiB | activations MiB | train loss | s to loss ≤ {1} |\n"
      "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
      item, std::isfinite(target) ? fmt::format("{:.4f}", target) : std::string("(none)"));
  const VariantResult* base = !rows.empty() && rows[0].measured.ok ? &rows[0].measured : nullptr;
  for (size_t i = 0; i < rows.size(); ++i) {
    const LadderResult& r = rows[i];
    const VariantResult& v = r.measured;
    const Prediction& p = r.predicted;
    std::string label = markdown_escape(r.row.label);
    if (r.row.same_as >= 0) label += fmt::format(" (= row {})", r.row.same_as + 1);
    const std::string pred_rate = !p.ok         ? "no prediction"
                                  : !p.feasible ? "infeasible"
                                                : fmt::format("{:.0f}", p.items_per_s);
    const std::string pred_mem = !p.ok ? "no prediction" : !p.feasible ? "infeasible" : mib_text(p.peak_total);
    const bool predicted = p.ok && p.feasible;
    if (!v.ok) {
      const char* status = v.error.empty() ? "not run" : v.error == "interrupted" ? "interrupted" : "failed";
      t += fmt::format("| {} | {} | {} | | | {} | | | | {} | | | | | | | |\n", i + 1, label, status, pred_rate,
                       pred_mem);
      continue;
    }
    auto delta = [&](double now, double then) {
      if (i == 0) return std::string("base");
      return base ? percent_change(now, then) : std::string();
    };
    std::string reached;
    if (std::isfinite(target))
      reached = r.timing.target_step > 0 ? fmt::format("{:.2f} (step {})", r.timing.to_target, r.timing.target_step)
                                         : std::string("not reached");
    t += fmt::format("| {} | {} | {} | {:.0f} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.4f} | {} |\n",
                     i + 1, label, v.steps, v.items_per_s, delta(v.items_per_s, base ? base->items_per_s : 0),
                     pred_rate, predicted ? percent_change(v.items_per_s, p.items_per_s) : "", mib_text(v.peak_total),
                     delta(double(v.peak_total), base ? double(base->peak_total) : 0), pred_mem,
                     predicted ? percent_change(double(v.peak_total), double(p.peak_total)) : "", mib_text(v.peak[0]),
                     mib_text(v.peak[1]), mib_text(v.peak[2]), mib_text(v.peak[3]), v.final_loss, reached);
  }
  return t;
}

namespace {

// 100 (now / base - 1), or null where it is undefined.
nlohmann::json pct_json(double now, double base) {
  if (!(base != 0) || !std::isfinite(now) || !std::isfinite(base)) return nullptr;
  return 100.0 * (now - base) / std::fabs(base);
}

nlohmann::json peak_json(const std::array<int64_t, 6>& peak, int64_t total) {
  nlohmann::json j;
  for (int t = 0; t < kNumMemTags && t < int(peak.size()); ++t) j[mem_key(t)] = peak[size_t(t)];
  j["total"] = total;
  return j;
}

// A folder name for row i: "03_bf16+zero1", "06_all-but-bf16".
std::string row_folder(size_t i, const LadderRow& row, const std::vector<Technique>& ladder) {
  std::string name;
  if (row.kind == RowKind::Baseline)
    name = "baseline";
  else if (row.kind == RowKind::Cumulative)
    for (size_t t : row.techniques) name += (name.empty() ? "" : "+") + ladder[t].name;
  else
    for (size_t t = 0; t < ladder.size(); ++t)
      if (std::find(row.techniques.begin(), row.techniques.end(), t) == row.techniques.end())
        name = "all-but-" + ladder[t].name;
  if (name.size() > 100) name.resize(100);
  return fmt::format("{:02}_{}", i + 1, name);
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

int run_ladder(const AblateOptions& o) {
  BRIGADE_CHECK(o.steps >= 1, ConfigError, "--steps {}: must be >= 1 (steps per row)", o.steps);
  BRIGADE_CHECK(o.ladder.empty() || o.ladder_file.empty(), ConfigError, "--ladder and --ladder-file: give one of them");
  const Recipe base = load_recipe(o.recipe, o.sets);
  auto say = [&](const std::string& s) {
    if (!o.quiet) fmt::print(stderr, "ladder: {}\n", s);
  };

  std::vector<Technique> ladder;
  std::string source;
  if (!o.ladder_file.empty()) {
    std::ifstream in(o.ladder_file);
    BRIGADE_CHECK(in.good(), IoError, "--ladder-file {}: cannot read it; check the path", o.ladder_file);
    std::stringstream ss;
    ss << in.rdbuf();
    ladder = parse_ladder_toml(ss.str(), o.ladder_file);
    source = "--ladder-file " + o.ladder_file;
  } else if (trim(o.ladder) == "default") {
    std::vector<std::string> skipped;
    ladder = default_ladder(base, &skipped);
    for (const auto& s : skipped) say("default ladder: skipped " + s);
    BRIGADE_CHECK(!ladder.empty(), ConfigError,
                  "--ladder default: no built-in technique applies to {} ({}); give the techniques yourself, e.g. "
                  "--ladder \"name=section.key=value\"",
                  o.recipe, join(skipped, "; "));
    source = "--ladder default";
  } else {
    ladder = parse_ladder(o.ladder);
    source = "--ladder \"" + o.ladder + "\"";
  }

  // The rows; a row whose recipe equals an earlier one's (e.g. a technique that sets the recipe's own
  // value) reuses that row's run too.
  std::vector<LadderRow> rows = ladder_rows(ladder);
  const fs::path out =
      o.out_dir.empty() ? fs::path(base.run.out_dir).parent_path() / (base.run.name + "-ladder") : fs::path(o.out_dir);
  const std::string binary = brigade_binary(o);
  std::vector<VariantResult> runs;  // one per distinct row
  std::vector<size_t> run_of(rows.size());
  std::vector<Recipe> recipes;
  for (size_t i = 0; i < rows.size(); ++i) {
    LadderRow& row = rows[i];
    if (row.same_as < 0) {
      std::vector<std::string> sets = o.sets;
      sets.insert(sets.end(), row.overrides.begin(), row.overrides.end());
      Recipe r;
      try {
        r = load_recipe(o.recipe, sets);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("ladder row {} ({}): {}", i + 1, row.label, e.what()));
      }
      for (size_t k = 0; k < runs.size() && row.same_as < 0; ++k)
        if (recipes[k] == r)
          for (size_t j = 0; j < i; ++j)
            if (rows[j].same_as < 0 && run_of[j] == k) {
              row.same_as = int(j);
              break;
            }
      if (row.same_as < 0) {
        VariantResult v;
        v.label = row.label;
        v.overrides = row.overrides;
        v.dir = (out / row_folder(i, row, ladder)).string();
        run_of[i] = runs.size();
        runs.push_back(std::move(v));
        recipes.push_back(std::move(r));
        continue;
      }
    }
    while (rows[size_t(row.same_as)].same_as >= 0) row.same_as = rows[size_t(row.same_as)].same_as;  // the first
    run_of[i] = run_of[size_t(row.same_as)];
  }
  check_variants(o, runs);  // mpirun where a row needs several processes
  std::error_code ec;
  fs::create_directories(out / "predict", ec);
  BRIGADE_CHECK(!ec, IoError, "cannot create the ladder folder {}: {}; choose a writable --out", out.string(),
                ec.message());
  say(fmt::format(
      "{} techniques ({}) -> {} rows, {} distinct, x {} steps of {} -> {}", ladder.size(),
      [&] {
        std::string s;
        for (const auto& t : ladder) s += (s.empty() ? "" : ", ") + t.name;
        return s;
      }(),
      rows.size(), runs.size(), o.steps, o.recipe, out.string()));

  // Predictions first (seconds each, and no training runs beside them).
  std::vector<std::string> predictor = split_words(o.predictor);
  if (predictor.empty()) predictor = {binary, "plan"};
  std::vector<Prediction> predictions(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) {
    std::vector<std::string> args = predictor;
    args.insert(args.end(), {o.recipe, "--predict"});
    for (const auto& s : o.sets) args.insert(args.end(), {"--set", s});
    for (const auto& s : runs[k].overrides) args.insert(args.end(), {"--set", s});
    const std::string stem = (out / "predict" / fs::path(runs[k].dir).filename()).string();
    int rc = 0;
    try {
      rc = run_command(args, stem + ".json", stem + ".err");
    } catch (const Error& e) {
      predictions[k].error = e.what();
      say(fmt::format("[{}/{}] {}: no prediction: {}", k + 1, runs.size(), runs[k].label, predictions[k].error));
      continue;
    }
    std::ifstream so(stem + ".json");
    std::stringstream text;
    text << so.rdbuf();
    if (rc != 0) {
      std::ifstream se(stem + ".err");
      std::string line, last;
      while (std::getline(se, line))
        if (!trim(line).empty()) last = trim(line);
      if (last.rfind("brigade: error: ", 0) == 0) last = last.substr(16);
      predictions[k].error = fmt::format("exit {}: {}", rc, last.empty() ? "(no message)" : last);
    } else {
      predictions[k] = parse_prediction(text.str());
    }
    const Prediction& p = predictions[k];
    say(fmt::format("[{}/{}] {}: {}", k + 1, runs.size(), runs[k].label,
                    !p.ok         ? "no prediction: " + p.error
                    : !p.feasible ? "predicted infeasible: " + p.reason
                                  : fmt::format("predicted {:.0f} {}/s, peak {} MiB", p.items_per_s, p.item,
                                                mib_text(p.peak_total))));
  }

  const bool interrupted = !run_variants(o, runs, "ladder");

  // The target loss: the given one, else the baseline's final train loss.
  double target = o.target_loss;
  std::string target_source = "--target-loss";
  if (!std::isfinite(target)) {
    target = runs[0].ok ? runs[0].final_loss : std::numeric_limits<double>::quiet_NaN();
    target_source = "the baseline's final train loss";
  }
  std::vector<LadderResult> results;
  for (size_t i = 0; i < rows.size(); ++i) {
    LadderResult r;
    r.row = rows[i];
    r.measured = runs[run_of[i]];
    r.predicted = predictions[run_of[i]];
    if (r.measured.ok) r.timing = time_to_loss((fs::path(r.measured.dir) / "metrics.jsonl").string(), target);
    results.push_back(std::move(r));
  }

  // The report (also after a failure or an interrupt: what ran is kept).
  std::string cmd = fmt::format("brigade ablate {} {} --steps {}", o.recipe, source, o.steps);
  if (std::isfinite(o.target_loss)) cmd += fmt::format(" --target-loss {}", o.target_loss);
  if (!o.predictor.empty()) cmd += " --predictor \"" + o.predictor + "\"";
  for (const auto& s : o.sets) cmd += " --set " + s;
  const std::string table = ladder_table(results, target);
  const std::string item = runs[0].item;
  std::string md = fmt::format("# Technique ladder: {}\n\n`{}`\n\n", o.recipe, cmd);
  md += "| technique | overrides |\n|---|---|\n";
  for (const auto& t : ladder)
    md += fmt::format("| {} | `{}` |\n", markdown_escape(t.name), markdown_escape(join(t.sets, ", ")));
  md += fmt::format(
      "\nRow 1 is the recipe as given (the baseline); then each technique added in turn (cumulative), then each "
      "left out of the full set. A row marked (= row k) has the same recipe as row k and reuses its run. Every "
      "distinct row trains {} steps (`brigade train --stop-at {}`, one after another, each in its own process). "
      "{}/s is the median over the steps; peak memory is rank 0's high-water mark in MiB (the total includes "
      "workspace and other); Δ is the change against the baseline. The prediction is `{} RECIPE --predict` with "
      "the row's overrides; its error is measured / predicted - 1. The time to loss is the seconds spent in "
      "training steps (each logged step's {} over its {}/s) until the train loss first reaches the target "
      "{} ({}).\n\n",
      o.steps, o.steps, item, join(predictor, " "), item, item,
      std::isfinite(target) ? fmt::format("{:.4f}", target) : std::string("(none: the baseline did not run)"),
      target_source);
  md += table + "\n![train loss of every distinct row](ladder.svg)\n\n";
  nlohmann::json rows_js = nlohmann::json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const LadderResult& r = results[i];
    const VariantResult& v = r.measured;
    const Prediction& p = r.predicted;
    std::string note = v.ok ? "" : " — " + (v.error.empty() ? "not run" : v.error);
    if (!p.ok) note += " — no prediction: " + p.error;
    if (p.ok && !p.feasible) note += " — predicted infeasible: " + p.reason;
    md +=
        fmt::format("- {} {} ({}): `{}` in `{}`{}\n", i + 1, r.row.label, row_kind_name(r.row.kind),
                    r.row.overrides.empty() ? std::string("(no overrides)") : join(r.row.overrides, ", "), v.dir, note);
    nlohmann::json techniques = nlohmann::json::array();
    for (size_t t : r.row.techniques) techniques.push_back(ladder[t].name);
    nlohmann::json j{{"row", i + 1},
                     {"kind", row_kind_name(r.row.kind)},
                     {"label", r.row.label},
                     {"techniques", techniques},
                     {"overrides", r.row.overrides},
                     {"same_as", r.row.same_as >= 0 ? nlohmann::json(r.row.same_as + 1) : nlohmann::json(nullptr)},
                     {"dir", v.dir},
                     {"ok", v.ok}};
    if (v.ok) {
      j["measured"] = {{"steps", v.steps},
                       {"seconds", v.seconds},
                       {"train_seconds", r.timing.train_seconds},
                       {"items_per_s", v.items_per_s},
                       {"item", v.item},
                       {"peak_bytes", peak_json(v.peak, v.peak_total)},
                       {"final_loss", v.final_loss}};
      j["time_to_target_s"] = r.timing.target_step > 0 ? nlohmann::json(r.timing.to_target) : nlohmann::json(nullptr);
      j["target_step"] = r.timing.target_step > 0 ? nlohmann::json(r.timing.target_step) : nlohmann::json(nullptr);
      const VariantResult& b = results[0].measured;
      j["delta_pct"] = {{"items_per_s", b.ok ? pct_json(v.items_per_s, b.items_per_s) : nullptr},
                        {"peak_total", b.ok ? pct_json(double(v.peak_total), double(b.peak_total)) : nullptr}};
    } else {
      j["error"] = v.error.empty() ? "not run" : v.error;
    }
    if (p.ok) {
      j["predicted"] = {{"feasible", p.feasible}, {"reason", p.reason},
                        {"step_s", p.step_s},     {"items_per_s", p.items_per_s},
                        {"item", p.item},         {"peak_bytes", peak_json(p.peak, p.peak_total)}};
      if (v.ok && p.feasible)
        j["error_pct"] = {{"items_per_s", pct_json(v.items_per_s, p.items_per_s)},
                          {"peak_total", pct_json(double(v.peak_total), double(p.peak_total))}};
    } else {
      j["predicted"] = {{"error", p.error}};
    }
    rows_js.push_back(j);
  }
  nlohmann::json techniques_js = nlohmann::json::array();
  for (const auto& t : ladder) techniques_js.push_back({{"name", t.name}, {"set", t.sets}});
  const nlohmann::json js{{"recipe", o.recipe},
                          {"command", cmd},
                          {"steps", o.steps},
                          {"target_loss", std::isfinite(target) ? nlohmann::json(target) : nlohmann::json(nullptr)},
                          {"target_source", target_source},
                          {"techniques", techniques_js},
                          {"rows", rows_js}};
  data::write_file_atomic((out / "ladder.md").string(), md);
  data::write_file_atomic((out / "ladder.json").string(), js.dump(2) + "\n");
  data::write_file_atomic((out / "ladder.svg").string(),
                          ablation_plot_svg(runs, fmt::format("train loss: {} ladder ({} steps)",
                                                              fs::path(o.recipe).filename().string(), o.steps)));
  fmt::print("{}\n", table);
  fmt::print("report: {} | plot: {}\n", (out / "ladder.md").string(), (out / "ladder.svg").string());
  std::fflush(stdout);
  if (interrupted) {
    say("interrupted; the report covers the rows that finished");
    return 130;
  }
  std::vector<std::string> failed;
  for (size_t k = 0; k < runs.size(); ++k)
    if (!runs[k].ok) failed.push_back(fmt::format("{} ({})", runs[k].label, runs[k].error));
  BRIGADE_CHECK(failed.empty(), ValueError, "{} of {} ladder rows failed: {}; the report lists the others",
                failed.size(), runs.size(), join(failed, "; "));
  return 0;
}

}  // namespace brigade::cli
