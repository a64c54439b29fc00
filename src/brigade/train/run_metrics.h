// Reading a run's metrics.jsonl back (for its loss plot and for `brigade ablate`)
// and drawing its loss curves. The records are the trainer's (docs/recipes.md,
// "Outputs of a run"); unknown fields are ignored and a torn last line is skipped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace brigade::train {

struct RunMetrics {
  std::vector<double> steps, losses;          // every {"step", "loss", ...} record
  std::vector<double> items_per_s;            // from the same records: tokens_per_s, images_per_s or pairs_per_s
  std::string item = "tokens";                // which of them: "tokens", "images", "pairs"
  std::vector<double> val_steps, val_losses;  // every {"step", "val_loss"} record
  bool early_stopped = false;                 // a {"early_stop": true, ...} record
  int64_t stop_step = 0, best_step = 0;
  double best_val_loss = 0.0;
};

// IoError if the file cannot be read.
RunMetrics read_run_metrics(const std::string& metrics_jsonl);
// Median of the logged items/s (0 when none).
double median_items_per_s(const RunMetrics& m);
// Train and val loss against step as an SVG (plot.h), written atomically.
void write_loss_plot(const RunMetrics& m, const std::string& svg_path, const std::string& title);

}  // namespace brigade::train
