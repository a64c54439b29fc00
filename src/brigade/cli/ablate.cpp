// `brigade ablate`; see ablate.h.
#include "brigade/cli/ablate.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
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
#include "brigade/dist/process_group.h"
#include "brigade/train/config.h"
#include "brigade/train/plot.h"

extern char** environ;

namespace brigade::cli {

using namespace brigade::train;  // the recipes, tasks and trainer these commands drive

namespace fs = std::filesystem;

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

namespace {

// A folder name from a variant: "03_train.accumulation=2_optim.lr=3e-3" (odd characters -> '_').
std::string folder_name(size_t index, const std::vector<std::string>& overrides) {
  std::string name;
  for (const auto& o : overrides) {
    if (!name.empty()) name += '_';
    for (char c : o) name += (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._=+-", c)) ? c : '_';
  }
  if (name.size() > 100) name.resize(100);
  return fmt::format("{:02}_{}", index + 1, name);
}

std::string find_on_path(const std::string& exe) {
  const char* path = std::getenv("PATH");
  if (!path) return "";
  std::istringstream in(path);
  for (std::string dir; std::getline(in, dir, ':');) {
    const fs::path p = fs::path(dir.empty() ? "." : dir) / exe;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

// Ctrl-C / SIGTERM while a variant runs: remember it and pass SIGTERM on to the child,
// which then checkpoints and exits 130 (a terminal's Ctrl-C reaches it directly too).
std::atomic<bool> g_ablate_stop{false};
extern "C" void on_ablate_signal(int) { g_ablate_stop.store(true); }

class SignalForwarder {
 public:
  SignalForwarder() {
    g_ablate_stop.store(false);
    struct sigaction sa {};
    sa.sa_handler = on_ablate_signal;
    sa.sa_flags = 0;  // no SA_RESTART: waitpid returns EINTR
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalForwarder() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

// Runs argv with stdout into `log` and stderr into `err_log` (into `log` too when empty); returns the
// exit status (128 + signal when killed). A signal caught meanwhile (g_ablate_stop) is passed on as SIGTERM.
int run_child(const std::vector<std::string>& args, const std::string& log, const std::string& err_log = "") {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (err_log.empty())
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  else
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  BRIGADE_CHECK(rc == 0, IoError,
                "cannot start {}: {}; check that the brigade binary (and mpirun for more than one process) "
                "can be executed",
                args[0], std::strerror(rc));
  bool forwarded = false;
  int status = 0;
  for (;;) {
    if (g_ablate_stop.load() && !forwarded) {  // also a signal that came before waitpid started
      ::kill(pid, SIGTERM);
      forwarded = true;
    }
    const pid_t w = ::waitpid(pid, &status, 0);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) return 127;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
}

// The line of a child's log that explains a failure: its "brigade: error:" line, else its last line.
std::string failure_line(const std::string& log) {
  std::ifstream in(log);
  std::string line, last, error;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty()) continue;
    last = line;
    if (line.rfind("brigade: error:", 0) == 0 && error.empty()) error = line.substr(15);
  }
  return trim(error.empty() ? last : error);
}

}  // namespace

std::vector<std::string> split_top(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false, escaped = false;
  int depth = 0;
  for (char c : s) {
    if (quoted && escaped)
      escaped = false;
    else if (quoted && c == '\\')
      escaped = true;
    else if (c == '"')
      quoted = !quoted;
    else if (!quoted && (c == '[' || c == '{'))
      ++depth;
    else if (!quoted && (c == ']' || c == '}') && depth > 0)
      --depth;
    else if (c == sep && !quoted && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
      continue;
    }
    cur += c;
  }
  out.push_back(trim(cur));
  return out;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string percent_change(double now, double base) {
  if (!(base != 0) || !std::isfinite(now) || !std::isfinite(base)) return "";
  return fmt::format("{:+.1f}%", 100.0 * (now - base) / std::fabs(base));
}

std::string mib_text(int64_t bytes) { return fmt::format("{:.1f}", double(bytes) / double(1 << 20)); }

std::string markdown_escape(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

VaryAxis parse_vary(const std::string& text) {
  const size_t eq = text.find('=');
  VaryAxis a;
  a.key = trim(text.substr(0, eq == std::string::npos ? text.size() : eq));
  BRIGADE_CHECK(eq != std::string::npos && !a.key.empty(), ConfigError,
                "--vary '{}' must look like section.key=v1,v2,... (e.g. --vary train.accumulation=1,2)", text);
  a.values = split_top(text.substr(eq + 1), ',');
  for (const auto& v : a.values)
    BRIGADE_CHECK(!v.empty(), ConfigError,
                  "--vary '{}': empty value in the list; separate values by single commas, "
                  "e.g. {}=1,2",
                  text, a.key);
  BRIGADE_CHECK(a.key != "run.out_dir", ConfigError,
                "--vary '{}': ablate gives every variant its own folder under --out; vary another key", text);
  // The key and every value must be what --set accepts (unknown keys get a did-you-mean).
  for (const auto& v : a.values) {
    Recipe scratch;
    try {
      apply_override(scratch, a.key + "=" + v);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("--vary '{}': {}", text, e.what()));
    }
  }
  return a;
}

std::vector<std::vector<std::string>> variant_overrides(const std::vector<VaryAxis>& axes) {
  std::vector<std::vector<std::string>> out{{}};
  for (const auto& a : axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& prefix : out)
      for (const auto& v : a.values) {
        next.push_back(prefix);
        next.back().push_back(a.key + "=" + v);
      }
    out = std::move(next);
  }
  return out;
}

bool read_variant_result(VariantResult& v) {
  const fs::path dir(v.dir);
  try {
    v.metrics = read_run_metrics((dir / "metrics.jsonl").string());
  } catch (const Error& e) {
    v.error = e.what();
    return false;
  }
  const RunMetrics& m = v.metrics;
  if (m.losses.empty()) {
    v.error = fmt::format("no training steps were logged in {}", (dir / "metrics.jsonl").string());
    return false;
  }
  v.items_per_s = median_items_per_s(m);
  v.item = m.item;
  v.final_loss = m.losses.back();
  v.final_val_loss = m.val_losses.empty() ? -1.0 : m.val_losses.back();
  v.steps = int64_t(std::max(m.steps.back(), m.val_steps.empty() ? 0.0 : m.val_steps.back()));
  std::ifstream in(dir / "memory.json");
  if (!in) {
    v.error = fmt::format("no memory.json in {}", dir.string());
    return false;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (int i = 0; i < kNumMemTags && i < int(v.peak.size()); ++i)
      v.peak[size_t(i)] = j.at("peak").value(std::string(mem_tag_name(MemTag(i))), int64_t(0));
    v.peak_total = j.at("peak_total").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    v.error = fmt::format("{}/memory.json is unreadable ({})", dir.string(), e.what());
    return false;
  }
  return true;
}

std::string ablation_table(const std::vector<VariantResult>& vs) {
  std::string t = "| # | variant | steps | " + (vs.empty() ? std::string("tokens") : vs[0].item) +
                  "/s | vs base | params MiB | grads MiB | optimizer MiB | activations MiB | "
                  "peak total MiB | vs base | train loss | val loss | vs base |\n"
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  const VariantResult* base = !vs.empty() && vs[0].ok ? &vs[0] : nullptr;
  for (size_t i = 0; i < vs.size(); ++i) {
    const VariantResult& v = vs[i];
    if (!v.ok) {
      const char* status = v.error.empty() ? "not run" : v.error == "interrupted" ? "interrupted" : "failed";
      t += fmt::format("| {} | {} | {} | | | | | | | | | | | |\n", i + 1, markdown_escape(v.label), status);
      continue;
    }
    auto delta = [&](double now, double then) {
      if (i == 0) return std::string("base");
      return base ? percent_change(now, then) : std::string();
    };
    const bool has_val = v.final_val_loss >= 0;
    t += fmt::format("| {} | {} | {} | {:.0f} | {} | {} | {} | {} | {} | {} | {} | {:.4f} | {} | {} |\n", i + 1,
                     markdown_escape(v.label), v.steps, v.items_per_s,
                     delta(v.items_per_s, base ? base->items_per_s : 0), mib_text(v.peak[0]), mib_text(v.peak[1]),
                     mib_text(v.peak[2]), mib_text(v.peak[3]), mib_text(v.peak_total),
                     delta(double(v.peak_total), base ? double(base->peak_total) : 0), v.final_loss,
                     has_val ? fmt::format("{:.4f}", v.final_val_loss) : "",
                     has_val && (i == 0 || (base && base->final_val_loss >= 0))
                         ? delta(v.final_val_loss, base ? base->final_val_loss : 0)
                         : "");
  }
  return t;
}

std::string ablation_plot_svg(const std::vector<VariantResult>& vs, const std::string& title) {
  std::vector<PlotSeries> series;
  for (size_t i = 0; i < vs.size(); ++i)
    if (vs[i].ok)
      series.push_back({fmt::format("{}: {}", i + 1, vs[i].label), vs[i].metrics.steps, vs[i].metrics.losses,
                        vs[i].metrics.steps.size() == 1, false});
  PlotOptions o;
  o.title = title;
  o.y_label = "train loss";
  o.height = std::max(480, 200 + 18 * int(series.size()));
  return line_plot_svg(series, o);
}

std::string brigade_binary(const AblateOptions& o) {
  if (!o.binary.empty()) return o.binary;
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  BRIGADE_CHECK(!ec, IoError, "cannot find the brigade binary (/proc/self/exe: {}); run ablate on Linux", ec.message());
  return self;
}

int run_command(std::vector<std::string> args, const std::string& out_path, const std::string& err_path) {
  BRIGADE_CHECK(!args.empty() && !args[0].empty(), ConfigError, "no command to run (an empty command line)");
  if (args[0].find('/') == std::string::npos) {
    const std::string found = find_on_path(args[0]);
    BRIGADE_CHECK(!found.empty(), ConfigError, "cannot run '{}': no such program on PATH; give its path", args[0]);
    args[0] = found;
  }
  return run_child(args, out_path, err_path);
}

namespace {

// The recipe of variant i (o.sets, then its overrides); a ConfigError names the variant.
Recipe variant_recipe(const AblateOptions& o, const VariantResult& v, size_t i) {
  std::vector<std::string> sets = o.sets;
  sets.insert(sets.end(), v.overrides.begin(), v.overrides.end());
  try {
    return load_recipe(o.recipe, sets);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("variant {} ({}): {}", i + 1, v.label, e.what()));
  }
}

// Processes a run of `r` takes: one per data-parallel, tensor-parallel and pipeline rank.
int64_t processes(const Recipe& r) { return r.parallel.dp * r.parallel.tp * r.parallel.pp; }

}  // namespace

std::string check_variants(const AblateOptions& o, const std::vector<VariantResult>& variants) {
  std::string mpirun;
  for (size_t i = 0; i < variants.size(); ++i) {
    const Recipe r = variant_recipe(o, variants[i], i);
    if (processes(r) > 1 && mpirun.empty()) {
      mpirun = find_on_path("mpirun");
      BRIGADE_CHECK(!mpirun.empty(), ConfigError,
                    "variant {} ({}) runs as {} processes (parallel.dp x tp x pp = {} x {} x {}), which needs "
                    "mpirun, and there is none on PATH; install openmpi-bin or leave more than one process out of "
                    "the variants",
                    i + 1, variants[i].label, processes(r), r.parallel.dp, r.parallel.tp, r.parallel.pp);
    }
  }
  return mpirun;
}

bool run_variants(const AblateOptions& o, std::vector<VariantResult>& variants, const std::string& tag) {
  const std::string mpirun = check_variants(o, variants);
  const std::string binary = brigade_binary(o);
  auto say = [&](const std::string& s) {
    if (!o.quiet) fmt::print(stderr, "{}: {}\n", tag, s);
  };
  std::error_code ec;
  SignalForwarder forward;
  for (size_t i = 0; i < variants.size(); ++i) {
    VariantResult& v = variants[i];
    if (g_ablate_stop.load()) return false;  // a signal between two variants
    fs::remove_all(v.dir, ec);
    fs::create_directories(v.dir, ec);
    BRIGADE_CHECK(!ec, IoError, "cannot create {}: {}; choose a writable --out", v.dir, ec.message());
    std::vector<std::string> sets = o.sets;
    sets.insert(sets.end(), v.overrides.begin(), v.overrides.end());
    const Recipe r = variant_recipe(o, v, i);
    std::vector<std::string> args;
    if (processes(r) > 1) args = {mpirun, "--oversubscribe", "--bind-to", "none", "-np", std::to_string(processes(r))};
    for (const std::string& a :
         {binary, std::string("train"), o.recipe, std::string("--no-sample"), std::string("--stop-at"),
          std::to_string(o.steps), std::string("--set"), std::string("train.log_every=1")})
      args.push_back(a);
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    args.insert(args.end(), {"--set", "run.out_dir=" + v.dir});
    say(fmt::format("[{}/{}] {}", i + 1, variants.size(), v.label));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string log = (fs::path(v.dir) / "train.log").string();
    const int rc = run_child(args, log);
    v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if ((rc == 130 || g_ablate_stop.load()) && rc != 0) {
      v.error = "interrupted";
      return false;
    }
    if (rc != 0) {
      v.error = fmt::format("exit {}: {} (log: {})", rc, failure_line(log), log);
    } else {
      v.ok = read_variant_result(v);
    }
    if (v.ok)
      say(fmt::format("       {:.1f}s | {:.0f} {}/s | peak {} MiB | loss {:.4f} | val loss {:.4f}", v.seconds,
                      v.items_per_s, v.item, mib_text(v.peak_total), v.final_loss, v.final_val_loss));
    else
      say(fmt::format("       failed: {}", v.error));
  }
  return !g_ablate_stop.load();
}

int run_ablation(const AblateOptions& o) {
  BRIGADE_CHECK(dist::Env::world_size() == 1, ConfigError,
                "brigade ablate runs as one process and launches its variants itself (with mpirun for "
                "more than one process); run it without mpirun");
  const bool ladder = !o.ladder.empty() || !o.ladder_file.empty();
  BRIGADE_CHECK(!(ladder && !o.vary.empty()), ConfigError,
                "--vary and --ladder/--ladder-file: give one of them (a ladder adds and removes techniques; --vary "
                "runs every combination of values)");
  if (ladder) return run_ladder(o);
  BRIGADE_CHECK(!std::isfinite(o.target_loss) && o.predictor.empty(), ConfigError,
                "--target-loss and --predictor go with --ladder (the ladder's rows are timed to a loss and predicted); "
                "remove them or give a --ladder");
  BRIGADE_CHECK(o.steps >= 1, ConfigError, "--steps {}: must be >= 1 (steps per variant)", o.steps);
  BRIGADE_CHECK(!o.vary.empty(), ConfigError,
                "nothing to compare: give at least one --vary section.key=v1,v2 (e.g. --vary train.accumulation=1,2) "
                "or a --ladder");
  std::vector<VaryAxis> axes;
  std::set<std::string> seen;
  for (const auto& text : o.vary) {
    axes.push_back(parse_vary(text));
    BRIGADE_CHECK(seen.insert(axes.back().key).second, ConfigError,
                  "--vary {} is given twice; list all its values in one --vary {}=v1,v2,...", axes.back().key,
                  axes.back().key);
  }
  const Recipe base = load_recipe(o.recipe, o.sets);
  const std::vector<std::vector<std::string>> combos = variant_overrides(axes);
  BRIGADE_CHECK(combos.size() <= 256, ConfigError,
                "--vary gives {} variants; that is too many to run one after another (at most 256): vary fewer keys "
                "or values",
                combos.size());

  const fs::path out =
      o.out_dir.empty() ? fs::path(base.run.out_dir).parent_path() / (base.run.name + "-ablate") : fs::path(o.out_dir);
  (void)brigade_binary(o);

  // Check every variant's recipe before running anything: a bad combination fails now, not after an hour.
  std::vector<VariantResult> results(combos.size());
  for (size_t i = 0; i < combos.size(); ++i) {
    VariantResult& v = results[i];
    v.overrides = combos[i];
    v.label = join(combos[i], ", ");
    v.dir = (out / folder_name(i, combos[i])).string();
  }
  check_variants(o, results);
  std::error_code ec;
  fs::create_directories(out, ec);
  BRIGADE_CHECK(!ec, IoError, "cannot create the ablation folder {}: {}; choose a writable --out", out.string(),
                ec.message());

  if (!o.quiet)
    fmt::print(stderr, "ablate: {} variant{} x {} steps of {} -> {}\n", combos.size(), combos.size() == 1 ? "" : "s",
               o.steps, o.recipe, out.string());
  const bool interrupted = !run_variants(o, results, "ablate");

  // The report (also after a failure or an interrupt: what ran is kept).
  const std::string cmd = fmt::format(
      "brigade ablate {} --steps {}{}{}", o.recipe, o.steps,
      [&] {
        std::string s;
        for (const auto& v : o.vary) s += " --vary " + v;
        return s;
      }(),
      [&] {
        std::string s;
        for (const auto& v : o.sets) s += " --set " + v;
        return s;
      }());
  const std::string table = ablation_table(results);
  std::string md = fmt::format("# Ablation: {}\n\n`{}`\n\n", o.recipe, cmd);
  md += fmt::format(
      "{} variants, {} steps each (`brigade train --stop-at {}`, one after another, each in its own process); the "
      "baseline (\"base\") is variant 1. {}/s is the median over the steps; peak memory is rank 0's high-water "
      "mark per category during training, in MiB (the total includes workspace and other); train loss is the last "
      "step's, val loss the evaluation at the last step.\n\n",
      results.size(), o.steps, o.steps, results.empty() ? std::string("tokens") : results[0].item);
  md += table + "\n![train loss of every variant](ablate.svg)\n\n";
  nlohmann::json js = nlohmann::json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const VariantResult& v = results[i];
    md += fmt::format("- {}: `{}`{}\n", i + 1, v.dir, v.ok ? "" : " — " + (v.error.empty() ? "not run" : v.error));
    nlohmann::json j{{"variant", i + 1}, {"label", v.label}, {"overrides", v.overrides}, {"dir", v.dir}, {"ok", v.ok}};
    if (v.ok) {
      nlohmann::json peak;
      for (int t = 0; t < kNumMemTags && t < int(v.peak.size()); ++t)
        peak[std::string(mem_tag_name(MemTag(t)))] = v.peak[size_t(t)];
      j.update({{"steps", v.steps},
                {"seconds", v.seconds},
                {"items_per_s", v.items_per_s},
                {"item", v.item},
                {"peak", peak},
                {"peak_total", v.peak_total},
                {"final_loss", v.final_loss},
                {"final_val_loss", v.final_val_loss}});
    } else {
      j["error"] = v.error.empty() ? "not run" : v.error;
    }
    js.push_back(j);
  }
  data::write_file_atomic((out / "ablate.md").string(), md);
  data::write_file_atomic((out / "ablate.json").string(), js.dump(2) + "\n");
  data::write_file_atomic((out / "ablate.svg").string(),
                          ablation_plot_svg(results, fmt::format("train loss: {} ({} steps)",
                                                                 fs::path(o.recipe).filename().string(), o.steps)));
  fmt::print("{}\n", table);
  fmt::print("report: {} | plot: {}\n", (out / "ablate.md").string(), (out / "ablate.svg").string());
  std::fflush(stdout);
  if (interrupted) {
    if (!o.quiet) fmt::print(stderr, "ablate: interrupted; the report covers the variants that finished\n");
    return 130;
  }
  std::vector<std::string> failed;
  for (size_t i = 0; i < results.size(); ++i)
    if (!results[i].ok) failed.push_back(fmt::format("{} ({})", i + 1, results[i].error));
  BRIGADE_CHECK(failed.empty(), ValueError, "{} of {} variants failed: {}; the report lists the others", failed.size(),
                results.size(), join(failed, "; "));
  return 0;
}

}  // namespace brigade::cli
