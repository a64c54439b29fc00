// metrics.jsonl reader and the loss plot; see run_metrics.h.
#include "brigade/train/run_metrics.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"
#include "brigade/train/plot.h"

namespace brigade::train {

RunMetrics read_run_metrics(const std::string& path) {
  std::ifstream in(path);
  BRIGADE_CHECK(in.good(), IoError, "cannot read metrics file {}; was the run started in that folder?", path);
  RunMetrics m;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a torn last line from a crash
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) continue;
    const double step = j["step"].get<double>();
    auto number = [&](const char* key, double& out) {
      if (!j.contains(key) || !j[key].is_number()) return false;
      out = j[key].get<double>();
      return true;
    };
    double v = 0;
    if (number("loss", v)) {
      m.steps.push_back(step);
      m.losses.push_back(v);
      double t = 0;
      for (const char* item : {"tokens", "images", "pairs"})
        if (number((std::string(item) + "_per_s").c_str(), t)) {
          m.items_per_s.push_back(t);
          m.item = item;
        }
    }
    if (number("val_loss", v)) {
      m.val_steps.push_back(step);
      m.val_losses.push_back(v);
    }
    if (j.contains("early_stop") && j["early_stop"].is_boolean() && j["early_stop"].get<bool>()) {
      m.early_stopped = true;
      m.stop_step = int64_t(step);
      m.best_step = j.value("best_step", int64_t(0));
      m.best_val_loss = j.value("best_val_loss", 0.0);
    }
  }
  return m;
}

double median_items_per_s(const RunMetrics& m) {
  if (m.items_per_s.empty()) return 0.0;
  std::vector<double> s = m.items_per_s;
  std::nth_element(s.begin(), s.begin() + long(s.size() / 2), s.end());
  return s[s.size() / 2];
}

void write_loss_plot(const RunMetrics& m, const std::string& svg_path, const std::string& title) {
  std::vector<PlotSeries> series;
  series.push_back({"train loss", m.steps, m.losses, m.steps.size() == 1, false});
  if (!m.val_steps.empty()) series.push_back({"val loss", m.val_steps, m.val_losses, true, false});
  if (m.early_stopped && m.best_step > 0)
    series.push_back({"best (early stop)", {double(m.best_step)}, {m.best_val_loss}, true, false});
  PlotOptions o;
  o.title = title;
  write_line_plot(svg_path, series, o);
}

}  // namespace brigade::train
