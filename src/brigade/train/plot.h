// A small, dependency-free SVG line plot: loss curves of a run (loss.svg) and of
// an ablation (ablate.svg). Each series is one <polyline class="series"> (plus
// optional dot markers), with axes, "nice" ticks (1, 2, 5 x 10^k), a grid, a
// legend and a linear or logarithmic y axis. Points whose x or y is not finite
// (or y <= 0 on a log axis) are left out. The output is plain SVG 1.1 that
// browsers, GitHub and image viewers render.
#pragma once
#include <string>
#include <vector>

namespace brigade::train {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;  // same length
  bool markers = false;      // a dot on every point (for sparse series, e.g. val loss)
  bool dashed = false;
};

struct PlotOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label = "loss";
  bool log_y = false;
  int width = 800, height = 480;  // pixels
};

// The SVG document (ValueError if a series' x and y differ in length).
std::string line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& opts);
// Writes line_plot_svg() to `path` atomically (IoError naming the path).
void write_line_plot(const std::string& path, const std::vector<PlotSeries>& series, const PlotOptions& opts);

// About `target` round tick values inside [lo, hi] (steps of 1, 2 or 5 x 10^k).
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace brigade::train
