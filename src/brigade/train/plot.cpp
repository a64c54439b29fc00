// SVG line plots; see plot.h.
#include "brigade/train/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"

namespace brigade::train {
namespace {

// Tableau 10: distinct, colour-blind-friendly enough for a handful of curves.
const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t')
          out += ' ';  // not allowed in XML 1.0
        else
          out += c;
    }
  }
  return out;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3) return fmt::format("{:.3g}", v);
  return fmt::format("{:.6g}", v);
}

double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;
  return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * p;
}

// Ticks for a log axis over [lo, hi] (both > 0): 1-2-5 per decade when the range spans
// a decade or more, else round linear values (placed on the log scale).
std::vector<double> log_ticks(double lo, double hi) {
  if (hi / lo < 10.0) return nice_ticks(lo, hi, 5);
  std::vector<double> out;
  const int d0 = int(std::floor(std::log10(lo))), d1 = int(std::ceil(std::log10(hi)));
  const bool sparse = d1 - d0 > 4;
  for (int d = d0; d <= d1; ++d)
    for (double m : {1.0, 2.0, 5.0}) {
      if (sparse && m != 1.0) continue;
      const double v = m * std::pow(10.0, d);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
    }
  return out;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi < lo || target < 1) return out;
  if (hi == lo) return {lo};
  const double step = nice_step((hi - lo) / double(target));
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (int i = 0; i < 1000; ++i) {
    double v = first + double(i) * step;
    if (v > hi + step * 1e-9) break;
    if (std::fabs(v) < step * 1e-9) v = 0.0;  // no "-0" or "1e-17"
    out.push_back(v);
  }
  return out;
}

std::string line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  for (const auto& s : series)
    BRIGADE_CHECK(s.x.size() == s.y.size(), ValueError, "plot series '{}' has {} x values but {} y values", s.label,
                  s.x.size(), s.y.size());
  auto keep = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!o.log_y || y > 0); };
  const double inf = std::numeric_limits<double>::infinity();
  double x0 = inf, x1 = -inf, y0 = inf, y1 = -inf;
  for (const auto& s : series)
    for (size_t i = 0; i < s.x.size(); ++i)
      if (keep(s.x[i], s.y[i])) {
        x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
        y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
      }
  const bool empty = !(x0 <= x1);
  if (empty) x0 = 0, x1 = 1, y0 = o.log_y ? 1 : 0, y1 = o.log_y ? 10 : 1;
  if (x0 == x1) x0 -= 0.5, x1 += 0.5;
  if (y0 == y1) {
    const double d = o.log_y ? 0.0 : std::max(std::fabs(y0) * 0.05, 0.5);
    if (o.log_y)
      y0 /= 1.1, y1 *= 1.1;
    else
      y0 -= d, y1 += d;
  }
  // A little headroom on y so curves do not touch the frame.
  double ty0 = o.log_y ? std::log10(y0) : y0, ty1 = o.log_y ? std::log10(y1) : y1;
  const double pad = (ty1 - ty0) * 0.04;
  ty0 -= pad, ty1 += pad;

  const double W = std::max(o.width, 200), H = std::max(o.height, 150);
  const double left = 72, right = 24, top = o.title.empty() ? 20 : 40, bottom = 52;
  const double pw = W - left - right, ph = H - top - bottom;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + (1.0 - ((o.log_y ? std::log10(y) : y) - ty0) / (ty1 - ty0)) * ph; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      W, H);
  if (!o.title.empty())
    svg +=
        fmt::format("<text class=\"title\" x=\"{:.1f}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                    left + pw / 2, xml_escape(o.title));
  // grid, ticks and tick labels
  svg += "<g class=\"grid\" stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  const std::vector<double> xt = nice_ticks(x0, x1, 8);
  const std::vector<double> yt =
      o.log_y ? log_ticks(std::pow(10.0, ty0), std::pow(10.0, ty1)) : nice_ticks(ty0, ty1, 6);
  for (double v : xt)
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", px(v), top, top + ph);
  for (double v : yt)
    svg += fmt::format("<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\"/>\n", py(v), left, left + pw);
  svg += "</g>\n<g class=\"ticks\" fill=\"#333\">\n";
  for (double v : xt)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(v), top + ph + 16,
                       xml_escape(tick_label(v)));
  for (double v : yt)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, py(v) + 4,
                       xml_escape(tick_label(v)));
  svg += "</g>\n";
  // frame and axis labels
  svg += fmt::format(
      "<rect class=\"frame\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#333\" stroke-width=\"1\"/>\n",
      left, top, pw, ph);
  svg += fmt::format("<text class=\"xlabel\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                     left + pw / 2, H - 12, xml_escape(o.x_label));
  svg += fmt::format(
      "<text class=\"ylabel\" x=\"16\" y=\"{0:.1f}\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 16 {0:.1f})\">{1}{2}</text>\n",
      top + ph / 2, xml_escape(o.y_label), o.log_y ? " (log scale)" : "");
  if (empty)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#999\">no data</text>\n",
                       left + pw / 2, top + ph / 2);
  // the curves
  for (size_t si = 0; si < series.size(); ++si) {
    const PlotSeries& s = series[si];
    const char* color = kColors[si % std::size(kColors)];
    std::string pts;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (keep(s.x[i], s.y[i])) pts += fmt::format("{}{:.2f},{:.2f}", pts.empty() ? "" : " ", px(s.x[i]), py(s.y[i]));
    svg += fmt::format(
        "<polyline class=\"series\" data-label=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" "
        "stroke-linejoin=\"round\"{} points=\"{}\"/>\n",
        xml_escape(s.label), color, s.dashed ? " stroke-dasharray=\"6 4\"" : "", pts);
    if (s.markers) {
      svg += fmt::format("<g class=\"markers\" fill=\"{}\">", color);
      for (size_t i = 0; i < s.x.size(); ++i)
        if (keep(s.x[i], s.y[i]))
          svg += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"{}\"/>", px(s.x[i]), py(s.y[i]),
                             s.x.size() == 1 ? 5 : 3);  // a lone point (e.g. the best step) stands out
      svg += "</g>\n";
    }
  }
  // legend: top right, inside the frame
  if (!series.empty()) {
    size_t longest = 0;
    for (const auto& s : series) longest = std::max(longest, s.label.size());
    const double lw = 36 + 7.0 * double(longest), lh = 8 + 18.0 * double(series.size());
    const double lx = std::max(left + 4, left + pw - lw - 8), ly = top + 8;
    svg += fmt::format(
        "<g class=\"legend\">\n<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
        "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#bbb\"/>\n",
        lx, ly, lw, lh);
    for (size_t si = 0; si < series.size(); ++si) {
      const double yy = ly + 15 + 18.0 * double(si);
      svg += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"{}/>"
          "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
          lx + 6, yy - 4, lx + 26, yy - 4, kColors[si % std::size(kColors)],
          series[si].dashed ? " stroke-dasharray=\"6 4\"" : "", lx + 31, yy, xml_escape(series[si].label));
    }
    svg += "</g>\n";
  }
  svg += "</svg>\n";
  return svg;
}

void write_line_plot(const std::string& path, const std::vector<PlotSeries>& series, const PlotOptions& opts) {
  data::write_file_atomic(path, line_plot_svg(series, opts));
}

}  // namespace brigade::train
