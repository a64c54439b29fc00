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
// Variants with parallel.dp > 1 run under `mpirun -np <dp>` when mpirun is on PATH.
#pragma once
#include <array>
#include <cstdint>
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

// The whole command; returns the exit status (0, 1 when a variant failed, 130 when interrupted).
int run_ablation(const AblateOptions& opts);

}  // namespace brigade::cli
