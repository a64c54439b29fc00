// `brigade ablate RECIPE --ladder SPEC`: what each technique of a ladder buys, measured beside the
// planner's prediction. The rows are the baseline (the recipe as given), each technique added in turn
// (cumulative: 1, 1+2, 1+2+3, ...) and each left out of the full set; a row whose overrides equal an
// earlier row's reuses its run. Each row trains as an ablate variant (ablate.h, run_variants) and is
// predicted by `<predictor> RECIPE --predict --set ...` (one JSON object on stdout; default `brigade plan`).
// Writes OUT/ladder.md, OUT/ladder.json and OUT/ladder.svg and prints the table.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "brigade/cli/ablate.h"
#include "brigade/train/config.h"

namespace brigade::cli {

// One rung of the ladder: a name and the "section.key=value" overrides that switch it on.
struct Technique {
  std::string name;
  std::vector<std::string> sets;
  bool operator==(const Technique&) const = default;
};

// Parses "NAME=section.key=value[,section.key=value...][;NAME=...]": techniques separated by ';', a
// technique's overrides by ',' (both outside double quotes and brackets), e.g.
// "bf16=precision.level=O2;accum=train.accumulation=2,train.batch_size=4". Every key and value must be
// what --set accepts. ConfigError saying what is wrong and how to write it.
std::vector<Technique> parse_ladder(const std::string& spec);
// The same from TOML text: one [[technique]] table per rung, its `name` and its overrides as keys
// (`precision.level = "O2"`); `origin` names the file in messages.
std::vector<Technique> parse_ladder_toml(const std::string& toml_text, const std::string& origin);
// --ladder default: bf16 (precision.level O2), ZeRO-1 and ZeRO-2 (only when base.parallel.dp > 1),
// selective recompute and accumulation x2 at half the batch (the same global batch), each only where it
// changes `base` and gives a valid recipe; the others are listed in `skipped` with the reason.
std::vector<Technique> default_ladder(const train::Recipe& base, std::vector<std::string>* skipped = nullptr);

enum class RowKind { Baseline, Cumulative, LeaveOneOut };
const char* row_kind_name(RowKind k);  // "baseline", "cumulative", "leave-one-out"

struct LadderRow {
  RowKind kind = RowKind::Baseline;
  std::string label;                   // "baseline", "bf16 + zero1", "all but zero1"
  std::vector<size_t> techniques;      // indices into the ladder, in ladder order
  std::vector<std::string> overrides;  // their sets in ladder order (a later technique wins on a shared key)
  int same_as = -1;                    // index of an earlier row with the same effective overrides (reused)
};

// The effective overrides: key -> value after applying `overrides` in order (keys and values trimmed).
std::map<std::string, std::string> effective_overrides(const std::vector<std::string>& overrides);
// Baseline, then cumulative rows 1..n, then leave-one-out rows 1..n; same_as set where the effective
// overrides equal an earlier row's (e.g. leaving out the last technique gives cumulative row n-1).
std::vector<LadderRow> ladder_rows(const std::vector<Technique>& ladder);

// What the predictor printed for a row.
struct Prediction {
  bool ok = false;    // it answered with a usable object (else `error` says why)
  std::string error;  // e.g. the predictor's last stderr line
  bool feasible = false;
  std::string reason;  // why not feasible (or the predictor's note)
  double step_s = 0.0, items_per_s = 0.0;
  std::string item = "tokens";
  std::array<int64_t, 6> peak{};  // bytes by MemTag: params grads optimizer activations workspace other
  int64_t peak_total = 0;
};
// Reads the predictor's stdout: one JSON object {"feasible", "reason", "step_s", "items_per_s", "item",
// "peak_bytes": {"params", ..., "total"}} (the whole text, else its last line). ok = false with the
// reason when it is missing or malformed; a feasible prediction needs items_per_s > 0 and peak_bytes.total.
Prediction parse_prediction(const std::string& stdout_text);

// Training time read from a run's metrics.jsonl: each logged step's seconds are its items (the change
// in <item>_seen) over its <item>_per_s, so with train.log_every = 1 the sum is the time spent in
// training steps (evaluations and start-up excluded).
struct LossTiming {
  double train_seconds = 0.0;  // all logged steps
  double to_target = -1.0;     // seconds until the first logged train loss <= target (-1: not reached)
  int64_t target_step = 0;     // that step (0: not reached)
};
LossTiming time_to_loss(const std::string& metrics_jsonl, double target);

// One row of the report: the row, its measurement (reused from row.same_as when set) and its prediction.
struct LadderResult {
  LadderRow row;
  VariantResult measured;
  Prediction predicted;
  LossTiming timing;
};
// The markdown table: per row the measured tokens/s, peak memory (total and by category), final train
// loss and time to `target` (NaN: no column values), the changes against rows[0] in %, and the
// prediction with its error (measured / predicted - 1, in %).
std::string ladder_table(const std::vector<LadderResult>& rows, double target);

}  // namespace brigade::cli
