// calibration.json: the data `brigade calibrate` writes and `brigade plan` reads; see calibration.h.
#include "brigade/plan/calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"

namespace brigade::plan {

double Calibration::fwd_bwd_seconds(int ranks, int threads, const std::string& level, const std::string& recompute,
                                    double rows) const {
  std::vector<std::pair<double, double>> pts;  // (rows, seconds), sorted by rows
  for (const ComputePoint& p : compute)
    if (p.ranks == ranks && p.threads == threads && p.level == level && p.recompute == recompute)
      pts.emplace_back(double(p.rows), p.fwd_bwd_s);
  if (pts.empty()) return -1.0;
  std::sort(pts.begin(), pts.end());
  if (pts.size() == 1) return pts[0].second * rows / pts[0].first;
  for (const auto& [x, y] : pts)
    if (x == rows) return y;
  if (rows < pts.front().first) return pts.front().second * rows / pts.front().first;
  if (rows > pts.back().first) return pts.back().second * rows / pts.back().first;
  for (size_t i = 1; i < pts.size(); ++i)
    if (rows < pts[i].first) {
      const auto [x0, y0] = pts[i - 1];
      const auto [x1, y1] = pts[i];
      return y0 + (y1 - y0) * (rows - x0) / (x1 - x0);
    }
  return pts.back().second;
}

std::map<std::string, std::string> calibration_key(const train::Recipe& r) {
  std::map<std::string, std::string> key;
  for (const auto& [k, v] : train::recipe_values(r))
    if ((k.rfind("model.", 0) == 0 && k != "model.init_from") || k == "train.seq_len" || k == "optim.name" ||
        k == "optim.nesterov" || k == "finetune.method" || k == "lora.r" || k == "lora.target_modules")
      key[k] = v;
  return key;
}

std::string calibration_mismatch(const Calibration& c, const train::Recipe& r) {
  std::string out;
  const auto want = calibration_key(r);
  for (const auto& [k, v] : want) {
    auto it = c.model.find(k);
    const std::string have = it == c.model.end() ? "(absent)" : it->second;
    if (have != v) out += fmt::format("{}{}: {} (calibrated) vs {}", out.empty() ? "" : "; ", k, have, v);
  }
  return out;
}

nlohmann::json calibration_to_json(const Calibration& c) {
  nlohmann::json j;
  j["format"] = "brigade-calibration-1";
  j["created"] = c.created;
  j["host"] = c.host;
  j["cores"] = c.cores;
  j["gemm_peak_f32_gflops"] = c.gemm_peak_f32;
  j["gemm_peak_bf16_gflops"] = c.gemm_peak_bf16;
  j["model"] = c.model;
  j["parameters"] = c.parameters;
  j["num_blocks"] = c.num_blocks;
  j["flops_per_item"] = c.flops_per_item;
  j["items_per_row"] = c.items_per_row;
  j["item"] = c.item;
  j["hidden_per_row"] = c.hidden_per_row;
  j["has_stages"] = c.has_stages;
  j["tp_plan"] = c.tp_plan;
  j["proxy_layers"] = c.proxy_layers;
  auto units_json = [](const std::vector<train::PlannedUnit>& us) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& u : us) a.push_back({{"name", u.name}, {"params", u.params}});
    return a;
  };
  j["units"] = units_json(c.units);
  j["units_zero3"] = units_json(c.units_zero3);
  j["frozen"] = nlohmann::json::array();
  for (const auto& f : c.frozen) j["frozen"].push_back({f.numel, f.element_bytes});
  j["compute"] = nlohmann::json::array();
  for (const ComputePoint& p : c.compute) {
    nlohmann::json e = {{"ranks", p.ranks},
                        {"threads", p.threads},
                        {"level", p.level},
                        {"recompute", p.recompute},
                        {"rows", p.rows},
                        {"fwd_bwd_s", p.fwd_bwd_s},
                        {"update_s", p.update_s},
                        {"act_peak", p.act_peak},
                        {"act_live", p.act_live},
                        {"work_compute", p.work_compute},
                        {"params_work", p.params_work}};
    if (p.params_work_backward >= 0) e["params_work_backward"] = p.params_work_backward;
    if (!p.early_grads.empty()) e["early_grads"] = p.early_grads;
    j["compute"].push_back(std::move(e));
  }
  j["stages"] = nlohmann::json::array();
  for (const StagePoint& p : c.stages)
    j["stages"].push_back({{"ranks", p.ranks},
                           {"threads", p.threads},
                           {"level", p.level},
                           {"rows", p.rows},
                           {"block_f", p.block_f},
                           {"block_bi", p.block_bi},
                           {"block_w", p.block_w},
                           {"head_f", p.head_f},
                           {"head_bi", p.head_bi},
                           {"head_w", p.head_w}});
  j["mesh"] = nlohmann::json::array();
  for (const MeshPoint& p : c.mesh) {
    nlohmann::json e{
        {"tp", p.tp},           {"pp", p.pp},       {"schedule", p.schedule},   {"microbatches", p.microbatches},
        {"threads", p.threads}, {"level", p.level}, {"recompute", p.recompute}, {"rows", p.rows}};
    e["ranks"] = nlohmann::json::array();
    for (const MeshPoint::Rank& k : p.ranks) {
      nlohmann::json peak;
      for (int i = 0; i < kNumMemTags; ++i) peak[std::string(mem_tag_name(MemTag(i)))] = k.peak[size_t(i)];
      e["ranks"].push_back({{"peak", peak}, {"peak_total", k.total}});
    }
    j["mesh"].push_back(e);
  }
  j["sync"] = nlohmann::json::array();
  for (const SyncPoint& p : c.sync)
    j["sync"].push_back({{"kind", p.kind},
                         {"ranks", p.ranks},
                         {"threads", p.threads},
                         {"level", p.level},
                         {"rows", p.rows},
                         {"fwd_bwd_s", p.fwd_bwd_s},
                         {"update_s", p.update_s}});
  j["comm"] = nlohmann::json::object();
  for (const auto& [ranks, cc] : c.comm) j["comm"][std::to_string(ranks)] = comm_to_json(cc);
  return j;
}

namespace {
template <class T>
T field(const nlohmann::json& j, const char* name, const std::string& where) {
  BRIGADE_CHECK(j.is_object() && j.contains(name), ConfigError,
                "{}: field \"{}\" is missing; re-run `brigade calibrate` to write a complete file", where, name);
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(
        fmt::format("{}: field \"{}\" has the wrong type ({}); re-run `brigade calibrate`", where, name, e.what()));
  }
}

}  // namespace

Calibration calibration_from_json(const nlohmann::json& j, const std::string& origin) {
  BRIGADE_CHECK(j.is_object() && j.value("format", "") == "brigade-calibration-1", ConfigError,
                "{}: not a calibration file (no \"format\": \"brigade-calibration-1\"); write one with `brigade "
                "calibrate RECIPE --out FILE`",
                origin);
  Calibration c;
  c.created = field<std::string>(j, "created", origin);
  c.host = field<std::string>(j, "host", origin);
  c.cores = field<int>(j, "cores", origin);
  c.gemm_peak_f32 = field<double>(j, "gemm_peak_f32_gflops", origin);
  c.gemm_peak_bf16 = field<double>(j, "gemm_peak_bf16_gflops", origin);
  c.model = field<std::map<std::string, std::string>>(j, "model", origin);
  c.parameters = field<int64_t>(j, "parameters", origin);
  c.num_blocks = field<int64_t>(j, "num_blocks", origin);
  c.flops_per_item = field<double>(j, "flops_per_item", origin);
  c.items_per_row = field<int64_t>(j, "items_per_row", origin);
  c.item = field<std::string>(j, "item", origin);
  c.hidden_per_row = field<int64_t>(j, "hidden_per_row", origin);
  c.has_stages = field<bool>(j, "has_stages", origin);
  c.tp_plan = field<bool>(j, "tp_plan", origin);
  if (j.contains("proxy_layers")) c.proxy_layers = j.at("proxy_layers").get<std::vector<int64_t>>();
  auto units_from = [&](const char* key) {
    std::vector<train::PlannedUnit> us;
    for (const auto& e : field<nlohmann::json>(j, key, origin)) {
      const std::string where = fmt::format("{}: {}[{}]", origin, key, us.size());
      us.push_back({field<std::string>(e, "name", where),
                    field<std::vector<std::pair<std::string, int64_t>>>(e, "params", where)});
    }
    return us;
  };
  c.units = units_from("units");
  c.units_zero3 = units_from("units_zero3");
  for (const auto& e : field<nlohmann::json>(j, "frozen", origin)) {
    BRIGADE_CHECK(e.is_array() && e.size() == 2, ConfigError, "{}: frozen: each entry is [numel, element bytes]",
                  origin);
    c.frozen.push_back({e[0].get<int64_t>(), e[1].get<int64_t>()});
  }
  int i = 0;
  for (const auto& e : field<nlohmann::json>(j, "compute", origin)) {
    const std::string where = fmt::format("{}: compute[{}]", origin, i++);
    ComputePoint p;
    p.ranks = field<int>(e, "ranks", where);
    p.threads = field<int>(e, "threads", where);
    p.level = field<std::string>(e, "level", where);
    p.recompute = field<std::string>(e, "recompute", where);
    p.rows = field<int64_t>(e, "rows", where);
    p.fwd_bwd_s = field<double>(e, "fwd_bwd_s", where);
    p.update_s = field<double>(e, "update_s", where);
    p.act_peak = field<int64_t>(e, "act_peak", where);
    p.act_live = field<int64_t>(e, "act_live", where);
    p.work_compute = field<int64_t>(e, "work_compute", where);
    p.params_work = field<int64_t>(e, "params_work", where);
    if (e.contains("params_work_backward")) p.params_work_backward = field<int64_t>(e, "params_work_backward", where);
    if (e.contains("early_grads")) p.early_grads = field<std::vector<std::string>>(e, "early_grads", where);
    c.compute.push_back(p);
  }
  i = 0;
  for (const auto& e : field<nlohmann::json>(j, "stages", origin)) {
    const std::string where = fmt::format("{}: stages[{}]", origin, i++);
    StagePoint p;
    p.ranks = field<int>(e, "ranks", where);
    p.threads = field<int>(e, "threads", where);
    p.level = field<std::string>(e, "level", where);
    p.rows = field<int64_t>(e, "rows", where);
    p.block_f = field<double>(e, "block_f", where);
    p.block_bi = field<double>(e, "block_bi", where);
    p.block_w = field<double>(e, "block_w", where);
    p.head_f = field<double>(e, "head_f", where);
    p.head_bi = field<double>(e, "head_bi", where);
    p.head_w = field<double>(e, "head_w", where);
    c.stages.push_back(p);
  }
  i = 0;
  if (j.contains("mesh"))  // optional: calibrations written before the mesh points plan tp / pp by the model alone
    for (const auto& e : field<nlohmann::json>(j, "mesh", origin)) {
      const std::string where = fmt::format("{}: mesh[{}]", origin, i++);
      MeshPoint p;
      p.tp = field<int64_t>(e, "tp", where);
      p.pp = field<int64_t>(e, "pp", where);
      p.schedule = field<std::string>(e, "schedule", where);
      p.microbatches = field<int64_t>(e, "microbatches", where);
      p.threads = field<int>(e, "threads", where);
      p.level = field<std::string>(e, "level", where);
      p.recompute = field<std::string>(e, "recompute", where);
      p.rows = field<int64_t>(e, "rows", where);
      for (const auto& k : field<nlohmann::json>(e, "ranks", where)) {
        MeshPoint::Rank rk;
        const nlohmann::json peak = field<nlohmann::json>(k, "peak", where);
        for (int t = 0; t < kNumMemTags; ++t)
          rk.peak[size_t(t)] = field<int64_t>(peak, std::string(mem_tag_name(MemTag(t))).c_str(), where);
        rk.total = field<int64_t>(k, "peak_total", where);
        p.ranks.push_back(rk);
      }
      BRIGADE_CHECK(int64_t(p.ranks.size()) == p.tp * p.pp, ConfigError,
                    "{}: {} ranks for tp {} x pp {}; re-run `brigade calibrate`", where, p.ranks.size(), p.tp, p.pp);
      c.mesh.push_back(p);
    }
  i = 0;
  if (j.contains("sync"))  // optional: calibrations written before the lockstep steps price them from the points
    for (const auto& e : field<nlohmann::json>(j, "sync", origin)) {
      const std::string where = fmt::format("{}: sync[{}]", origin, i++);
      SyncPoint p;
      p.kind = field<std::string>(e, "kind", where);
      BRIGADE_CHECK(p.kind == "dp" || p.kind == "zero3" || p.kind == "tp", ConfigError,
                    "{}: kind \"{}\" is not dp, zero3 or tp; re-run `brigade calibrate`", where, p.kind);
      p.ranks = field<int>(e, "ranks", where);
      p.threads = field<int>(e, "threads", where);
      p.level = field<std::string>(e, "level", where);
      p.rows = field<int64_t>(e, "rows", where);
      p.fwd_bwd_s = field<double>(e, "fwd_bwd_s", where);
      p.update_s = field<double>(e, "update_s", where);
      c.sync.push_back(p);
    }
  const nlohmann::json comm = field<nlohmann::json>(j, "comm", origin);
  for (const auto& [k, v] : comm.items()) {
    int ranks = 0;
    try {
      ranks = std::stoi(k);
    } catch (const std::exception&) {
      throw ConfigError(fmt::format("{}: comm key \"{}\" is not a rank count", origin, k));
    }
    c.comm[ranks] = comm_from_json(v);
  }
  return c;
}

Calibration read_calibration(const std::string& path) {
  std::ifstream in(path);
  BRIGADE_CHECK(in.good(), IoError, "cannot read the calibration {}; write it with `brigade calibrate RECIPE --out {}`",
                path, path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON ({}); re-run `brigade calibrate`", path, e.what()));
  }
  return calibration_from_json(j, path);
}

void write_calibration(const std::string& path, const Calibration& c) {
  data::write_file_atomic(path, calibration_to_json(c).dump(1) + "\n");
}

}  // namespace brigade::plan
