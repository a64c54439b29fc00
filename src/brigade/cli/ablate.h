// `brigade ablate RECIPE --vary key=v1,v2 [--vary ...]`: what did this setting buy?
// Runs the recipe once per combination of the --vary values (the cartesian
// product, first --vary slowest), each as a child process of the brigade binary
// (`brigade train ... --stop-at STEPS`, so every variant has its own allocator
// peaks and the recipe's own learning-rate schedule), one after another, in
// OUT/<nn>_<variant>/. Then it reads every variant's metrics.jsonl and
// memory.json and writes
//   OUT/ablate.md    a markdown table: items/s (median; tokens, images or pairs), peak memory by category,
//                    final train and val loss, changes against the baseline
//   OUT/ablate.svg   the train-loss curves of all variants
//   OUT/ablate.json  the same numbers, machine-readable
// and prints the table. The baseline is the first variant (the first value of
// every --vary): list the recipe's own value first to compare against it.
// Variants of more than one process run under `mpirun -np <dp x tp x pp>` when mpirun is on PATH.
// With --ladder (ladder.h) the variants are a technique ladder instead, beside the planner's prediction.
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "brigade/train/run_metrics.h"

namespace brigade::cli {

struct AblateOptions {
  std::string recipe;             // recipe file
  std::vector<std::string> sets;  // --set overrides applied to every variant
  std::vector<std::string> vary;  // "section.key=v1,v2,..." (repeatable)
  int64_t steps = 100;            // steps per variant (train --stop-at)
  std::string out_dir;            // "" = <run.out_dir's parent>/<run.name>-ablate
  std::string binary;             // the brigade executable ("" = this process's)
  bool quiet = false;             // no per-variant progress lines
  // --ladder (ladder.h): techniques added in turn, then each left out, beside the planner's prediction
  std::string ladder;       // "NAME=section.key=value[,section.key=value...][;NAME=...]", or "default"
  std::string ladder_file;  // the same as TOML: [[technique]] tables of a name and the overrides as keys
  double target_loss = std::numeric_limits<double>::quiet_NaN();  // time to this train loss (NaN = baseline's final)
  std::string predictor;  // prediction command, run as `CMD RECIPE --predict --set ...` ("" = "<binary> plan")
};

struct VaryAxis {
  std::string key;
  std::vector<std::string> values;  // as typed (TOML values or bare words)
};

// Parses "section.key=v1,v2,..." (values split at commas outside double quotes).
// ConfigError (with a did-you-mean for unknown keys) when malformed.
VaryAxis parse_vary(const std::string& text);
// Every combination as "key=value" overrides, first axis slowest.
std::vector<std::vector<std::string>> variant_overrides(const std::vector<VaryAxis>& axes);

struct VariantResult {
  std::string label;  // "train.accumulation=2, optim.lr=3e-3"
  std::string dir;    // its run.out_dir
  std::vector<std::string> overrides;
  bool ok = false;
  std::string error;         // why it failed (when !ok)
  double seconds = 0.0;      // wall time of the child
  double items_per_s = 0.0;  // median over the logged steps (tokens, images or pairs)
  std::string item = "tokens";
  std::array<int64_t, 6> peak{};  // bytes by MemTag: params grads optimizer activations workspace other
  int64_t peak_total = 0;
  int64_t steps = 0;  // steps completed
  double final_loss = 0.0, final_val_loss = -1.0;
  train::RunMetrics metrics;
};

// Fills the measured fields of `v` from its run folder (v.dir); false + v.error when missing.
bool read_variant_result(VariantResult& v);
// The markdown table (header + one row per variant; changes against variants[0]).
std::string ablation_table(const std::vector<VariantResult>& variants);
// ablate.svg's content: the train-loss curve of every variant that ran.
std::string ablation_plot_svg(const std::vector<VariantResult>& variants, const std::string& title);

// `s` without leading and trailing blanks.
std::string trim(const std::string& s);
// Splits `s` at `sep` outside double quotes (with \" escapes) and brackets, so a value may be "a, b" or
// [1, 2]; each piece trimmed of blanks.
std::vector<std::string> split_top(const std::string& s, char sep);
// The strings with `sep` between them.
std::string join(const std::vector<std::string>& v, const std::string& sep);
// "+12.3%": the change from `base` to `now` ("" when base is 0 or either is not finite).
std::string percent_change(double now, double base);
// Bytes as MiB with one decimal.
std::string mib_text(int64_t bytes);
// `s` with '|' escaped, for a markdown table cell.
std::string markdown_escape(const std::string& s);

// The brigade executable children are launched from: opts.binary, else this process's (/proc/self/exe).
std::string brigade_binary(const AblateOptions& opts);
// Runs `args` (args[0] a path, or a program name looked up on PATH) with stdout into `out_path` and stderr
// into `err_path` (into out_path too when ""); returns its exit status (128 + the signal when killed).
int run_command(std::vector<std::string> args, const std::string& out_path, const std::string& err_path = "");
// Loads every variant's recipe (opts.sets, then v.overrides) before anything runs: a ConfigError names the
// first bad variant, or one that needs several processes (parallel.dp x tp x pp) when there is no mpirun.
// Returns the mpirun path ("" when every variant is one process).
std::string check_variants(const AblateOptions& opts, const std::vector<VariantResult>& variants);
// Runs each variant (label, dir and overrides set by the caller) as a child `brigade train RECIPE --no-sample
// --stop-at opts.steps` in v.dir (replaced), one after another, under `mpirun -np <dp x tp x pp>` when it
// takes more than one process, and fills its measured fields (v.ok, or v.error: a failed variant does not
// stop the others). Progress lines on stderr start with "<tag>: " unless opts.quiet. Returns false when
// Ctrl-C / SIGTERM ended it: the running variant's error is "interrupted" and later ones are not run.
bool run_variants(const AblateOptions& opts, std::vector<VariantResult>& variants, const std::string& tag);

// The whole command (run_ladder when opts.ladder or opts.ladder_file is set); returns the exit status
// (0, 1 when a variant failed, 130 when interrupted).
int run_ablation(const AblateOptions& opts);
// `brigade ablate --ladder`; see ladder.h.
int run_ladder(const AblateOptions& opts);

}  // namespace brigade::cli
