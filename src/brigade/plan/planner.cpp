// The planner: plan enumeration, step-time and memory prediction; see planner.h.
#include "brigade/plan/planner.h"

#include <toml++/toml.h>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include "brigade/core/error.h"
#include "brigade/parallel/pipeline_schedule.h"
#include "brigade/train/memory_plan.h"

namespace brigade::plan {

using train::Recipe;

// ---------------------------------------------------------------- tp / pp memory from mesh points

// The busiest rank's memory of a tp or pp plan from the calibration's mesh points (MeshPoint), or
// false when none was measured for it (another degree, tp x pp, dp above 1, interleaving, another
// level, recompute mode or thread count):
// - tp: the point at the same tp; activations scale with the plan's rows, every other category is
//   the point's.
// - pp: four points of the same degree: GPipe at (R rows, m1), (R, m2) and (R / 2, m1), 1F1B at
//   (R, m2). Stage i holds F + f s r + t r + u b in activations when f micro-batches of r rows each
//   are in flight in a batch of b rows: F what it keeps whatever the batch, s per row of a
//   micro-batch in flight, t per row of the one micro-batch whose backward runs, u per row of the
//   whole batch (what lives until the step's end: the sends the executor completes there). Under
//   GPipe f = m and f r = b, so its three points give F, t and s + u:
//     t = (A(R, m1) - A(R, m2)) / (R / m1 - R / m2),  s + u = 2 (A(R, m1) - A(R/2, m1)) / R - t / m1,
//     F = A(R, m1) - (s + u) R - t R / m1,
//   and the 1F1B point, where stage i holds f1 = min(m2, pp - i) < m2, gives u:
//     u = (A1f1b - F - f1 (s + u) R / m2 - t R / m2) / (R (1 - f1 / m2)).
//   The plan's f_i is the simulator's peak in flight on rank i (`in_flight`: from a forward to its
//   backward, to its weight gradient under ZB-H1). ZB-H1 is marked approximate: between a
//   micro-batch's input gradient and its deferred weight gradient a stage keeps what the weight
//   GEMMs read, which with recompute includes the recomputed activations and at O1-O3 the 16-bit
//   weight copies, none of which the four points measure (the runs measured up to 30% above this
//   estimate, docs/planning.md). Under O1-O3 the parameters' 16-bit working copies are kept for
//   every micro-batch in flight too: params = P + f_i W, W = (p2 - p1) / (m2 - m1) (0 in fp32). The
//   other categories are the GPipe (R, m2) point's: the cut of the blocks into stages and the tied
//   embedding's buffers do not depend on the schedule.
bool mesh_memory(const Calibration& c, const Plan& p, const std::vector<int>& in_flight, Prediction& out) {
  if (p.dp != 1 || (p.tp > 1) == (p.pp > 1)) return false;
  auto find = [&](int64_t tp, int64_t pp, int64_t m, int64_t rows, const char* sched = "gpipe") -> const MeshPoint* {
    const MeshPoint* best = nullptr;
    for (const MeshPoint& q : c.mesh)
      if (q.tp == tp && q.pp == pp && (pp == 1 || (q.schedule == sched && q.microbatches == m)) &&
          (rows == 0 || q.rows == rows) && q.threads == p.threads && q.level == p.level && q.recompute == p.recompute)
        best = &q;
    return best;
  };
  const size_t act = size_t(MemTag::Activations), par = size_t(MemTag::Params);
  const double b = double(p.batch_size);
  std::vector<MeshPoint::Rank> ranks;
  if (p.tp > 1) {
    const MeshPoint* q = find(p.tp, 1, 1, 0);
    if (!q) return false;
    for (MeshPoint::Rank k : q->ranks) {
      const int64_t a = int64_t(std::llround(double(k.peak[act]) * b / double(q->rows)));
      k.total += a - k.peak[act];
      k.peak[act] = a;
      ranks.push_back(k);
    }
  } else {
    if (p.virtual_stages != 1 || int64_t(in_flight.size()) != p.pp) return false;
    // the largest rows measured, with two micro-batch counts there and the fewer again at half the rows
    const MeshPoint *q1 = nullptr, *q2 = nullptr, *q3 = nullptr;
    for (const MeshPoint& q : c.mesh)
      if (q.tp == 1 && q.pp == p.pp && q.schedule == "gpipe" && find(1, p.pp, q.microbatches, q.rows) == &q &&
          (!q1 || q.rows > q1->rows || (q.rows == q1->rows && q.microbatches < q1->microbatches)))
        q1 = &q;
    if (!q1) return false;
    for (const MeshPoint& q : c.mesh)
      if (&q != q1 && find(1, p.pp, q.microbatches, q.rows) == &q) {
        if (q.rows == q1->rows && q.microbatches > q1->microbatches && (!q2 || q.microbatches < q2->microbatches))
          q2 = &q;
        if (q.microbatches == q1->microbatches && 2 * q.rows == q1->rows) q3 = &q;
      }
    const MeshPoint* q4 = q2 ? find(1, p.pp, q2->microbatches, q2->rows, "1f1b") : nullptr;
    if (!q2 || !q3 || !q4) return false;
    for (const MeshPoint* q : {q2, q3, q4})
      if (q->ranks.size() != size_t(p.pp) || q1->ranks.size() != size_t(p.pp)) return false;
    const double R = double(q1->rows), m1 = double(q1->microbatches), m2 = double(q2->microbatches);
    const double m = double(p.microbatches), r = b / m;  // the plan's micro-batch rows
    for (size_t i = 0; i < q1->ranks.size(); ++i) {
      const double a1 = double(q1->ranks[i].peak[act]), a2 = double(q2->ranks[i].peak[act]);
      const double a3 = double(q3->ranks[i].peak[act]);
      const double t = (a1 - a2) / (R / m1 - R / m2);
      const double su = 2.0 * (a1 - a3) / R - t / m1;  // s + u
      const double F = a1 - su * R - t * R / m1;
      const double f1 = std::min(m2, double(p.pp) - double(i));
      if (f1 >= m2) return false;  // that 1F1B point ran as GPipe: u is not separable
      const double u = (double(q4->ranks[i].peak[act]) - F - f1 * su * R / m2 - t * R / m2) / (R * (1.0 - f1 / m2));
      const double sr = su - u;
      const double p1 = double(q1->ranks[i].peak[par]), p2 = double(q2->ranks[i].peak[par]);
      const double W = (p2 - p1) / (m2 - m1), P = p1 - m1 * W;
      const double f = double(in_flight[i]);
      MeshPoint::Rank k = q2->ranks[i];
      const int64_t a = int64_t(std::llround(F + f * sr * r + t * r + u * b));
      const int64_t w = int64_t(std::llround(P + f * W));
      k.total += a - k.peak[act] + w - k.peak[par];
      k.peak[act] = a;
      k.peak[par] = w;
      ranks.push_back(k);
    }
  }
  const MeshPoint::Rank& busiest =
      *std::max_element(ranks.begin(), ranks.end(), [](const auto& x, const auto& y) { return x.total < y.total; });
  out.peak = out.peak_low = busiest.peak;
  out.peak_total = busiest.total;
  out.memory_approximate = p.schedule == "zb-h1";
  return true;
}

// ---------------------------------------------------------------- clusters

Cluster parse_cluster(const std::string& text, const std::string& origin) {
  toml::table t;
  try {
    t = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}: {} (line {})", origin, e.description(), e.source().begin.line));
  }
  const toml::table* c = t["cluster"].as_table();
  BRIGADE_CHECK(c, ConfigError, "{}: no [cluster] table; see docs/planning.md for the keys", origin);
  Cluster cl;
  cl.described = true;
  const std::vector<std::string> keys = {"name",
                                         "nodes",
                                         "ranks_per_node",
                                         "cores_per_node",
                                         "memory_per_rank_gb",
                                         "gemm_gflops_f32",
                                         "gemm_gflops_bf16",
                                         "efficiency",
                                         "intra",
                                         "inter"};
  for (const auto& [k, v] : *c) {
    const std::string key(k.str());
    BRIGADE_CHECK(std::find(keys.begin(), keys.end(), key) != keys.end(), ConfigError,
                  "{}: unknown key cluster.{}{}; the keys are name, nodes, ranks_per_node, cores_per_node, "
                  "memory_per_rank_gb, gemm_gflops_f32, gemm_gflops_bf16, efficiency, [cluster.intra], [cluster.inter]",
                  origin, key, train::did_you_mean(key, keys));
  }
  auto num = [&](const toml::table& tb, const char* key, double dflt, const std::string& where) {
    const toml::node* n = tb.get(key);
    if (!n) return dflt;
    if (auto i = n->value<int64_t>()) return double(*i);
    if (auto d = n->value<double>()) return *d;
    throw ConfigError(fmt::format("{}: {}.{} must be a number", origin, where, key));
  };
  cl.name = (*c)["name"].value_or(std::string("described cluster"));
  cl.nodes = int(num(*c, "nodes", 1, "cluster"));
  cl.ranks_per_node = int(num(*c, "ranks_per_node", 1, "cluster"));
  cl.cores_per_node = int(num(*c, "cores_per_node", 0, "cluster"));
  cl.memory_per_rank = int64_t(num(*c, "memory_per_rank_gb", 0, "cluster") * double(1LL << 30));
  cl.gemm_gflops_f32 = num(*c, "gemm_gflops_f32", 0, "cluster");
  cl.gemm_gflops_bf16 = num(*c, "gemm_gflops_bf16", 0, "cluster");
  cl.efficiency = num(*c, "efficiency", 0, "cluster");
  BRIGADE_CHECK(cl.nodes >= 1 && cl.ranks_per_node >= 1 && cl.cores_per_node >= 0 && cl.memory_per_rank >= 0 &&
                    cl.efficiency >= 0 && cl.efficiency <= 1,
                ConfigError,
                "{}: cluster.nodes and ranks_per_node must be >= 1, cores_per_node, memory_per_rank_gb >= 0 and "
                "efficiency in [0, 1]",
                origin);
  auto link = [&](const char* which, Link& l) {
    const toml::table* lt = (*c)[which].as_table();
    BRIGADE_CHECK(lt || (std::string(which) == "inter" && cl.nodes == 1), ConfigError,
                  "{}: [cluster.{}] is missing: give latency_us and gbps (gigabits per second) of the links {} nodes",
                  origin, which, std::string(which) == "intra" ? "within" : "between");
    if (!lt) return;
    for (const auto& [k, v] : *lt)
      BRIGADE_CHECK(k.str() == "latency_us" || k.str() == "gbps", ConfigError,
                    "{}: unknown key cluster.{}.{}; the keys are latency_us and gbps", origin, which, k.str());
    l.latency_s = num(*lt, "latency_us", 0, std::string("cluster.") + which) * 1e-6;
    const double gbps = num(*lt, "gbps", 0, std::string("cluster.") + which);
    BRIGADE_CHECK(gbps > 0, ConfigError, "{}: cluster.{}.gbps must be > 0 (gigabits per second)", origin, which);
    l.bytes_per_s = gbps * 1e9 / 8.0;
  };
  link("intra", cl.intra);
  link("inter", cl.inter);
  return cl;
}

Cluster read_cluster(const std::string& path) {
  std::ifstream in(path);
  BRIGADE_CHECK(in.good(), IoError, "cannot read the cluster file {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_cluster(ss.str(), path);
}

Cluster local_cluster(const Calibration& c) {
  Cluster cl;
  cl.name = fmt::format("this machine ({}, {} cores)", c.host, c.cores);
  cl.nodes = 1;
  cl.ranks_per_node = c.cores;
  cl.cores_per_node = c.cores;
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") cl.memory_per_rank = kib * 1024;
  return cl;
}

// ---------------------------------------------------------------- plans

std::string Plan::label() const {
  std::string s;
  if (dp > 1) s += fmt::format("dp{} ", dp);
  if (tp > 1) s += fmt::format("tp{} ", tp);
  if (pp > 1)
    s += fmt::format("pp{} {} m{}{} ", pp, schedule, microbatches,
                     virtual_stages > 1 ? fmt::format(" v{}", virtual_stages) : "");
  if (zero > 0) s += fmt::format("zero{} ", zero);
  s += fmt::format("{} {} acc{} b{} t{}", level, recompute, accumulation, batch_size, threads);
  return s;
}

std::vector<std::string> Plan::overrides() const {
  std::vector<std::string> o = {
      fmt::format("parallel.dp={}", dp),
      fmt::format("parallel.tp={}", tp),
      fmt::format("parallel.pp={}", pp),
      fmt::format("parallel.zero={}", zero),
      fmt::format("precision.level={}", level),
      fmt::format("memory.recompute={}", recompute),
      fmt::format("train.batch_size={}", batch_size),
      fmt::format("train.accumulation={}", accumulation),
      fmt::format("run.threads={}", threads),
  };
  if (pp > 1) {
    o.push_back(fmt::format("parallel.schedule={}", schedule));
    o.push_back(fmt::format("parallel.microbatches={}", microbatches));
    o.push_back(fmt::format("parallel.virtual_stages={}", virtual_stages));
  }
  return o;
}

Recipe apply_plan(const Recipe& r, const Plan& p) {
  Recipe out = r;
  for (const std::string& o : p.overrides()) train::apply_override(out, o);
  if (p.level != "O0" && out.precision.dtype != "bf16") train::apply_override(out, "precision.dtype=bf16");
  return out;
}

namespace {

int64_t params_of(const std::vector<train::PlannedUnit>& us) {
  int64_t n = 0;
  for (const auto& u : us)
    for (const auto& [name, numel] : u.params) n += numel;
  return n;
}

// Seconds of one collective on a group of `size` ranks, each handing `bytes`. Calibrated: the
// measured fit of the launch with `ranks` processes; described: ring costs over the link.
struct CommModel {
  const Calibration& c;
  const Cluster& cl;
  int ranks;  // processes of the whole job
  std::string* missing;
  // The plan's compute threads fill the node's cores: its collectives run beside the compute,
  // so the fits measured beside a compute load apply (when the calibration has them).
  bool busy = false;
  double operator()(const std::string& key, int64_t bytes, int size, bool crosses_nodes) const {
    if (size <= 1 || bytes <= 0) return 0.0;
    if (cl.described) {
      const Link& l = crosses_nodes ? cl.inter : cl.intra;
      const double P = double(size), B = double(bytes);
      if (key.rfind("allreduce", 0) == 0) return 2 * (P - 1) * l.latency_s + 2 * (P - 1) / P * B / l.bytes_per_s;
      if (key.rfind("reduce_scatter", 0) == 0 || key == "allgather")
        return (P - 1) * l.latency_s + (P - 1) / P * B / l.bytes_per_s;
      return l.latency_s + B / l.bytes_per_s;  // sendrecv
    }
    auto it = c.comm.find(ranks);
    if (it == c.comm.end()) {
      if (missing && missing->empty())
        *missing =
            fmt::format("no interconnect calibration for {} ranks (run `brigade calibrate --ranks {}`)", ranks, ranks);
      return 0.0;
    }
    const auto& fits = busy && !it->second.busy_fits.empty() ? it->second.busy_fits : it->second.fits;
    const auto f = fits.find(key);
    if (f == fits.end()) {
      if (missing && missing->empty()) *missing = fmt::format("the calibration has no fit for {}", key);
      return 0.0;
    }
    return f->second.interpolate(bytes);
  }
};

}  // namespace

static Prediction predict_plan(const Recipe& r, const Calibration& c, const Cluster& cl, const Plan& p) {
  Prediction out;
  out.plan = p;
  auto reject = [&](std::string why) {
    out.feasible = false;
    out.reason = std::move(why);
    return out;
  };
  const int64_t R = p.ranks();
  const int64_t nodes_used = (R + cl.ranks_per_node - 1) / cl.ranks_per_node;
  if (nodes_used > cl.nodes)
    return reject(fmt::format("{} ranks need {} nodes of {} ranks; the cluster has {}", R, nodes_used,
                              cl.ranks_per_node, cl.nodes));
  const int local = int(std::min<int64_t>(R, cl.ranks_per_node));  // ranks sharing one node
  if ((p.tp > 1 || p.pp > 1) && !c.has_stages)
    return reject(fmt::format("model.type = {} has no pipeline stages: tp and pp do not apply",
                              c.model.count("model.type") ? c.model.at("model.type") : "?"));
  if (p.tp > 1 && !c.tp_plan) return reject("the model has no tensor-parallel plan");
  if ((p.tp > 1 || p.pp > 1) && p.zero > 1)
    return reject(fmt::format("ZeRO-{} with tp or pp: model parallelism runs ZeRO 0 or 1", p.zero));
  Recipe rp;
  try {
    rp = apply_plan(r, p);
    train::validate_recipe(rp, "plan");
  } catch (const ConfigError& e) {
    std::string w = e.what();
    if (w.rfind("recipe plan: ", 0) == 0) w = w.substr(13);
    return reject(w);
  }
  const int64_t L = std::max<int64_t>(c.num_blocks, 1);
  if (p.pp > 1 && p.pp * p.virtual_stages > L)
    return reject(fmt::format("pp x virtual_stages = {} is more than the {} blocks", p.pp * p.virtual_stages, L));

  // ---- compute
  const double rows = double(p.batch_size);
  double scale = 1.0;  // a described node's GEMM speed against the calibrated machine's
  const bool low = p.level != "O0";
  if (cl.described) {
    const double want = low ? cl.gemm_gflops_bf16 : cl.gemm_gflops_f32;
    const double have = low ? c.gemm_peak_bf16 : c.gemm_peak_f32;
    if (want > 0 && have > 0) scale = have / want;
  }
  if (!cl.described && c.fwd_bwd_seconds(local, p.threads, p.level, p.recompute, rows) < 0)
    return reject(
        fmt::format("not calibrated for {} rank{} x {} thread{} at {} with recompute {} (`brigade calibrate "
                    "--ranks` and --levels / --recompute measure it)",
                    local, local == 1 ? "" : "s", p.threads, p.threads == 1 ? "" : "s", p.level, p.recompute));
  auto fwd_bwd = [&](double rw) -> double {
    const double t = c.fwd_bwd_seconds(local, p.threads, p.level, p.recompute, rw);
    if (t > 0) return t * scale;
    // a described node of another size: the model's FLOPs at a fraction of the GEMM peak
    out.calibrated = false;
    const double peak = (low ? (cl.gemm_gflops_bf16 > 0 ? cl.gemm_gflops_bf16 : c.gemm_peak_bf16)
                             : (cl.gemm_gflops_f32 > 0 ? cl.gemm_gflops_f32 : c.gemm_peak_f32)) *
                        double(p.threads) / double(std::max(c.cores, 1));
    const double eff = cl.efficiency > 0 ? cl.efficiency : 0.5;
    const double recompute = p.recompute == "full" ? 4.0 / 3.0 : 1.0;
    return rw * double(c.items_per_row) * c.flops_per_item * recompute / (peak * 1e9 * eff);
  };
  std::string missing;
  const CommModel comm{c, cl, int(R), &missing, int64_t(local) * p.threads >= std::max(c.cores, 1)};
  // the tp group is the fastest mesh axis (within a node while tp <= ranks per node), then dp, then pp
  const bool tp_cross = p.tp > cl.ranks_per_node;
  const bool dp_cross = p.tp * p.dp > cl.ranks_per_node;
  const bool pp_cross = p.tp * p.dp * p.pp > cl.ranks_per_node;
  const int64_t act_bytes = int64_t(c.hidden_per_row) * 4;  // one row's activation between blocks, fp32
  // tensor parallel: every block all-reduces its attention and MLP outputs in the forward and their
  // input gradients in the backward; the vocabulary-parallel embedding and loss add about two more
  auto tp_comm = [&](double rw) {
    return double(4 * L + 2) * comm("allreduce/mpi", int64_t(rw * double(act_bytes)), int(p.tp), tp_cross);
  };
  // the measured update of one step at this launch and level, before any ZeRO or model-parallel share
  auto update_whole = [&]() -> double {
    std::vector<double> us;
    for (const ComputePoint& pt : c.compute)
      if (pt.ranks == local && pt.threads == p.threads && pt.level == p.level) us.push_back(pt.update_s);
    if (us.empty()) return -1.0;
    std::nth_element(us.begin(), us.begin() + long(us.size() / 2), us.end());
    return us[us.size() / 2] * scale;
  };
  const std::vector<train::PlannedUnit>& units = p.zero == 3 ? c.units_zero3 : c.units;
  const int64_t bucket = int64_t(rp.parallel.bucket_mb * double(1 << 20));
  // Data parallelism's communication in one step at ZeRO stage `zero` over `dp` ranks of this
  // rank's gradients (the whole model's over tp x pp): ZeRO-0 all-reduces the gradient buckets,
  // ZeRO-1 reduce-scatters them and all-gathers the parameters after the update, ZeRO-2
  // reduce-scatters at every micro-step, ZeRO-3 all-gathers every unit twice per micro-step and
  // reduce-scatters it once; then the gradient norm's allreduce.
  auto dp_comm = [&](int zero, int64_t accumulation, int dp, bool cross) {
    const std::vector<train::PlannedUnit>& us = zero == 3 ? c.units_zero3 : c.units;
    const int64_t grad_bytes = 4 * ((params_of(us) + p.tp * p.pp - 1) / (p.tp * p.pp));
    const int64_t nb = std::max<int64_t>(1, (grad_bytes + bucket - 1) / bucket);
    const std::string algo = rp.parallel.allreduce;
    const std::string rs = algo == "ring" ? "reduce_scatter/ring" : "reduce_scatter/mpi";
    double t = 0.0;
    if (zero == 0) {
      t = double(nb) * comm("allreduce/" + algo, grad_bytes / nb, dp, cross);
    } else if (zero == 1) {
      t = double(nb) * comm(rs, grad_bytes / nb, dp, cross) + comm("allgather", grad_bytes, dp, cross);
    } else if (zero == 2) {
      t = double(accumulation * nb) * comm(rs, grad_bytes / nb, dp, cross) + comm("allgather", grad_bytes, dp, cross);
    } else {
      const int64_t nu = std::max<int64_t>(1, int64_t(us.size()));
      const double per_unit = comm("allgather", grad_bytes / nu, dp, cross);
      t = double(accumulation) * double(nu) * (2.0 * per_unit + comm(rs, grad_bytes / nu, dp, cross));
    }
    return t + comm("allreduce/mpi", 8, int(R), pp_cross);  // + the gradient norm
  };
  // Ranks in lockstep (data parallel over the node's ranks, or tensor parallel over them) run
  // slower than the compute points' ranks, which each time their own copy: they wait on each
  // other at every bucket, gathered unit or block, beside the communication the model prices.
  // The calibration's lockstep steps give the ratio, at recompute none, of the measured step to
  // what the model predicts for it (data parallel, ZeRO-0 and ZeRO-3 measured apart: less the
  // update and the stage's priced communication, over the point's forward + backward; tensor
  // parallel: the measured forward + backward over the modelled one); the plan's micro-steps are
  // scaled by it, linear between the measured rows. ZeRO-1/2 take ZeRO-0's (the same buckets).
  const bool dp_sync = p.pp == 1 && p.tp == 1 && p.dp > 1 && p.dp == local && R == local;
  const bool tp_sync = p.pp == 1 && p.dp == 1 && p.tp > 1 && p.tp == local && R == local;
  auto sync_factor = [&](double rw) -> double {
    if (!dp_sync && !tp_sync) return 1.0;
    auto here = [&](const SyncPoint& sp, const char* kind) {
      return sp.kind == kind && sp.ranks == local && sp.threads == p.threads && sp.level == p.level;
    };
    const char* kind = !dp_sync ? "tp"
                       : p.zero == 3 && std::any_of(c.sync.begin(), c.sync.end(),
                                                    [&](const SyncPoint& sp) { return here(sp, "zero3"); })
                           ? "zero3"
                           : "dp";
    std::vector<std::pair<double, double>> at;  // (rows, ratio)
    for (const SyncPoint& sp : c.sync) {
      if (!here(sp, kind)) continue;
      const double n = double(sp.rows);
      const double fb = c.fwd_bwd_seconds(local, p.threads, p.level, "none", n) * scale;
      if (fb <= 0) continue;
      double ratio = 0;
      if (dp_sync) {
        const double u = update_whole();
        if (u < 0) continue;
        const int zero = std::string_view(kind) == "zero3" ? 3 : 0;
        ratio = (sp.fwd_bwd_s + sp.update_s - u / (zero ? double(local) : 1.0) - dp_comm(zero, 1, local, false)) / fb;
      } else {
        ratio = sp.fwd_bwd_s / (fb / double(p.tp) + tp_comm(n));
      }
      if (ratio > 0) at.emplace_back(n, ratio);
    }
    if (at.empty()) return 1.0;
    std::sort(at.begin(), at.end());
    if (rw <= at.front().first) return at.front().second;
    if (rw >= at.back().first) return at.back().second;
    for (size_t i = 1; i < at.size(); ++i)
      if (rw <= at[i].first) {
        const auto& [x0, y0] = at[i - 1];
        const auto& [x1, y1] = at[i];
        return y0 + (y1 - y0) * (rw - x0) / (x1 - x0);
      }
    return at.back().second;
  };
  double micro = 0.0;          // one micro-step (accumulation step) of this rank
  std::vector<int> in_flight;  // pp: the simulated peak of micro-batches in flight, per pp rank
  if (p.pp == 1) {
    out.sync_factor = sync_factor(rows);
    micro = (fwd_bwd(rows) / double(p.tp) + (p.tp > 1 ? tp_comm(rows) : 0.0)) * out.sync_factor;
  } else {
    const double bm = rows / double(p.microbatches);
    // per-block forward / backward-input / backward-weight and the head's, from the stage
    // points (nearest rows, scaled), else the micro-batch's time spread evenly over the blocks
    double f = 0, bi = 0, w = 0, hf = 0, hbi = 0, hw = 0;
    const StagePoint* best = nullptr;
    for (const StagePoint& s : c.stages)
      if (s.ranks == local && s.threads == p.threads && s.level == p.level &&
          (!best || std::abs(std::log(double(s.rows) / bm)) < std::abs(std::log(double(best->rows) / bm))))
        best = &s;
    const double whole = fwd_bwd(bm);
    if (best) {
      const double k = bm / double(best->rows) * scale;
      f = best->block_f * k, bi = best->block_bi * k, w = best->block_w * k;
      hf = best->head_f * k, hbi = best->head_bi * k, hw = best->head_w * k;
      // recompute re-runs the forward in the backward: scale the blocks so their sum and the
      // head's match the measured micro-batch time at this recompute mode
      const double sum = double(L) * (f + bi + w) + hf + hbi + hw;
      if (sum > 0 && whole > 0) {
        const double g = whole / sum;
        f *= g, bi *= g, w *= g, hf *= g, hbi *= g, hw *= g;
      }
    } else {
      f = whole / (3.0 * double(L)), bi = f, w = f;
    }
    const double tpdiv = double(p.tp);
    const double tpc = p.tp > 1 ? tp_comm(bm) / double(L) : 0.0;  // per block
    const int S = int(p.pp * p.virtual_stages);
    parallel::PipeCosts costs;
    for (int s = 0; s < S; ++s) {
      const double blocks = double(L / S + (s < L % S ? 1 : 0));
      costs.forward.push_back(blocks * (f / tpdiv + tpc / 2) + (s == S - 1 ? hf / tpdiv : 0.0));
      costs.backward_input.push_back(blocks * (bi / tpdiv + tpc / 2) + (s == S - 1 ? hbi / tpdiv : 0.0));
      costs.backward_weight.push_back(blocks * w / tpdiv + (s == S - 1 ? hw / tpdiv : 0.0));
    }
    costs.comm = comm("sendrecv", int64_t(bm * double(act_bytes)), 2, pp_cross);
    try {
      const parallel::PipeSchedule kind = parallel::pipe_schedule_from_name(p.schedule);
      const parallel::PipePlan plan =
          parallel::build_pipe_plan(kind, int(p.pp), int(p.microbatches), int(p.virtual_stages), costs);
      const parallel::PipeSimulation sim = parallel::simulate_pipe_plan(plan, costs);
      micro = sim.makespan;
      out.bubble = sim.bubble;
      in_flight = sim.peak_in_flight;
    } catch (const Error& e) {
      return reject(e.what());
    }
  }
  out.compute_s = micro * double(p.accumulation);

  // ---- the update: the measured one, over this rank's share of the parameters
  {
    double u = update_whole();
    if (u < 0) {
      out.calibrated = false;  // about 40 bytes of traffic per parameter (AdamW), at 10 GB/s
      u = double(c.parameters) * 40.0 / 10e9;
    }
    double share = 1.0 / double(p.tp * p.pp);
    if (p.zero >= 1) share /= double(p.dp);
    out.update_s = u * share;
  }

  // ---- data-parallel communication (gradient buckets; ZeRO's gathers)
  if (p.dp > 1) out.comm_s = dp_comm(p.zero, p.accumulation, int(p.dp), dp_cross);
  if (!missing.empty()) return reject(missing);
  out.step_s = out.compute_s + out.update_s + out.comm_s;
  const double items = double(p.batch_size * p.accumulation * p.dp) * double(c.items_per_row);
  out.items_per_s = items / out.step_s;

  // ---- memory of the busiest rank
  train::MemoryInputs in;
  in.measured = true;
  in.frozen = c.frozen;
  const double bm = rows / double(p.pp > 1 ? p.microbatches : 1);
  // the one-process points carry the measured dry step (memory does not depend on the launch):
  // the nearest rows, preferring this thread count; the attention tiles scale with the threads
  const ComputePoint* near = nullptr;
  auto closer = [&](const ComputePoint& a, const ComputePoint* b) {
    if (!b) return true;
    if ((a.threads == p.threads) != (b->threads == p.threads)) return a.threads == p.threads;
    return std::abs(double(a.rows) - bm) < std::abs(double(b->rows) - bm);
  };
  for (const ComputePoint& pt : c.compute)
    if (pt.ranks == 1 && pt.act_peak > 0 && pt.level == p.level && pt.recompute == p.recompute && closer(pt, near))
      near = &pt;
  if (!near) return reject(fmt::format("no calibrated memory point at {} with recompute {}", p.level, p.recompute));
  const double k = bm / double(near->rows);
  in.act_peak = near->rows == int64_t(bm) ? near->act_peak : int64_t(double(near->act_peak) * k);
  in.act_live = near->rows == int64_t(bm) ? near->act_live : int64_t(double(near->act_live) * k);
  in.work_compute = near->threads == p.threads ? near->work_compute : near->work_compute * p.threads / near->threads;
  in.params_work = near->params_work;
  in.params_work_backward = near->params_work_backward;
  in.early_grads = near->early_grads;
  if (p.tp == 1 && p.pp == 1) {
    in.units = units;
  } else if (mesh_memory(c, p, in_flight, out)) {
    if (cl.memory_per_rank > 0 && out.peak_total > cl.memory_per_rank)
      return reject(fmt::format("needs {} per rank; the cluster has {}", train::format_bytes(out.peak_total),
                                train::format_bytes(cl.memory_per_rank)));
    return out;
  } else {
    // model parallel, not measured (mesh_memory): this rank's share of the parameters (the first
    // stage's blocks and the embeddings, split tp ways), and the activations of the micro-batches
    // its stage holds
    out.memory_approximate = true;
    const int S = int(p.pp * p.virtual_stages);
    const int64_t blocks0 = int64_t(p.virtual_stages) * (L / S + (L % S ? 1 : 0));
    int64_t outside = 0, per_block = 0;
    if (!c.units_zero3.empty()) {
      outside = params_of({c.units_zero3.front()});
      per_block = (params_of(c.units_zero3) - outside) / L;
    }
    in.units = {{"rank", {{"stage0", (outside + blocks0 * per_block) / p.tp}}}};
    const double in_flight = p.pp == 1               ? 1.0
                             : p.schedule == "gpipe" ? double(p.microbatches)
                                                     : double(std::min<int64_t>(p.microbatches, p.pp));
    in.act_peak = int64_t(double(in.act_peak) * in_flight * double(blocks0) / double(L) / double(p.tp));
    in.params_work = in.params_work * (outside + blocks0 * per_block) / std::max<int64_t>(1, c.parameters) / p.tp;
  }
  Recipe rm = rp;
  rm.parallel.tp = rm.parallel.pp = 1;
  const train::MemoryPrediction mp = train::predict_memory(rm, 0, in);
  for (int i = 0; i < kNumMemTags; ++i) {
    out.peak[size_t(i)] = mp.tags[size_t(i)].peak;
    out.peak_low[size_t(i)] = mp.tags[size_t(i)].peak_low;
  }
  out.peak_total = mp.total_peak;
  if (cl.memory_per_rank > 0 && out.peak_total > cl.memory_per_rank)
    return reject(fmt::format("needs {} per rank; the cluster has {}", train::format_bytes(out.peak_total),
                              train::format_bytes(cl.memory_per_rank)));
  return out;
}

Prediction predict(const Recipe& r, const Calibration& c, const Cluster& cl) {
  Plan p;
  p.dp = r.parallel.dp, p.tp = r.parallel.tp, p.pp = r.parallel.pp;
  p.microbatches = r.parallel.microbatches, p.virtual_stages = r.parallel.virtual_stages;
  p.schedule = r.parallel.schedule;
  p.zero = r.parallel.zero;
  p.recompute = r.memory.recompute;
  p.level = r.precision.level;
  p.accumulation = r.train.accumulation, p.batch_size = r.train.batch_size;
  const int64_t local = std::min<int64_t>(p.ranks(), cl.ranks_per_node);
  const int cores = cl.cores_per_node > 0 ? cl.cores_per_node : c.cores;
  p.threads = r.run.threads > 0 ? int(r.run.threads) : std::max(1, int(cores / local));
  return predict_plan(r, c, cl, p);
}

std::vector<Prediction> enumerate_plans(const Recipe& r, const Calibration& c, const Cluster& cl,
                                        const PlanOptions& o) {
  const int64_t G = r.train.batch_size * r.train.accumulation * r.parallel.dp;  // rows per optimizer step
  const int cores = cl.cores_per_node > 0 ? cl.cores_per_node : c.cores;
  int64_t max_ranks = int64_t(cl.nodes) * cl.ranks_per_node;
  if (o.max_ranks > 0) max_ranks = std::min(max_ranks, o.max_ranks);
  std::vector<std::string> levels = o.levels, recomputes = o.recompute;
  for (const ComputePoint& pt : c.compute) {
    if (o.levels.empty() && std::find(levels.begin(), levels.end(), pt.level) == levels.end())
      levels.push_back(pt.level);
    if (o.recompute.empty() && std::find(recomputes.begin(), recomputes.end(), pt.recompute) == recomputes.end())
      recomputes.push_back(pt.recompute);
  }
  if (levels.empty()) levels = {"O0", "O1", "O2"};
  if (recomputes.empty()) recomputes = {"none", "selective", "full"};
  std::vector<Prediction> all;
  auto pow2_upto = [](int64_t n) {
    std::vector<int64_t> v;
    for (int64_t x = 1; x <= n; x *= 2) v.push_back(x);
    return v;
  };
  for (int64_t R : pow2_upto(max_ranks)) {
    if (o.only_ranks > 0 && R != o.only_ranks) continue;
    const int64_t local = std::min<int64_t>(R, cl.ranks_per_node);
    const int threads = std::max(1, int(cores / local));
    for (int64_t tp : pow2_upto(R))
      for (int64_t pp : pow2_upto(R / tp)) {
        const int64_t dp = R / tp / pp;
        if (dp * tp * pp != R || G % dp != 0) continue;
        for (int64_t acc : pow2_upto(G / dp)) {
          if ((G / dp) % acc) continue;
          const int64_t b = G / dp / acc;
          std::vector<std::pair<std::string, int64_t>> pipes = {{"1f1b", 1}};  // (schedule, v) for pp = 1: unused
          std::vector<int64_t> ms = {1};
          if (pp > 1) {
            pipes = {{"gpipe", 1}, {"1f1b", 1}, {"zb-h1", 1}, {"interleaved", 2}};
            ms.clear();
            for (int64_t m : pow2_upto(b))
              if (m >= pp && b % m == 0) ms.push_back(m);
          }
          for (const auto& [sched, v] : pipes)
            for (int64_t m : ms)
              for (int64_t zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero)
                for (const std::string& level : levels)
                  for (const std::string& rc : recomputes) {
                    Plan p;
                    p.dp = dp, p.tp = tp, p.pp = pp, p.schedule = sched, p.virtual_stages = v, p.microbatches = m;
                    p.zero = zero, p.level = level, p.recompute = rc, p.accumulation = acc, p.batch_size = b;
                    p.threads = threads;
                    all.push_back(predict_plan(r, c, cl, p));
                  }
        }
      }
  }
  std::stable_sort(all.begin(), all.end(), [](const Prediction& a, const Prediction& b) {
    if (a.feasible != b.feasible) return a.feasible;
    return a.feasible && a.items_per_s > b.items_per_s;
  });
  return all;
}

nlohmann::json prediction_json(const Prediction& p, const std::string& item) {
  nlohmann::json peak, low;
  for (int i = 0; i < kNumMemTags; ++i) {
    peak[std::string(mem_tag_name(MemTag(i)))] = p.peak[size_t(i)];
    low[std::string(mem_tag_name(MemTag(i)))] = p.peak_low[size_t(i)];
  }
  peak["total"] = p.peak_total;
  nlohmann::json j{{"plan", p.plan.label()},
                   {"overrides", p.plan.overrides()},
                   {"ranks", p.plan.ranks()},
                   {"threads", p.plan.threads},
                   {"feasible", p.feasible},
                   {"reason", p.reason},
                   {"item", item}};
  if (p.feasible || p.peak_total > 0) {  // a plan over the memory per rank still has its prediction
    j["step_s"] = p.step_s;
    j["items_per_s"] = p.items_per_s;
    j["compute_s"] = p.compute_s;
    j["update_s"] = p.update_s;
    j["comm_s"] = p.comm_s;
    j["sync_factor"] = p.sync_factor;
    j["bubble"] = p.bubble;
    j["peak_bytes"] = peak;
    j["peak_bytes_low"] = low;
    j["memory_approximate"] = p.memory_approximate;
    j["calibrated"] = p.calibrated;
  }
  return j;
}

std::string plan_table(const std::vector<Prediction>& ps, const std::string& item, int top) {
  std::string t = fmt::format(
      "| # | plan | ranks x threads | {}/s | step s | compute | update | comm | bubble | peak memory |\n", item);
  t += "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  int shown = 0;
  std::map<std::string, int> reasons;
  int rejected = 0;
  for (const Prediction& p : ps) {
    if (!p.feasible) {
      ++rejected;
      std::string why = p.reason.substr(0, p.reason.find(';'));
      ++reasons[why.substr(0, 90)];
      continue;
    }
    if (shown >= top) continue;
    ++shown;
    t += fmt::format("| {} | {} | {} x {} | {:.1f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {} | {}{} |\n", shown,
                     p.plan.label(), p.plan.ranks(), p.plan.threads, p.items_per_s, p.step_s, p.compute_s, p.update_s,
                     p.comm_s, p.plan.pp > 1 ? fmt::format("{:.0f}%", 100 * p.bubble) : "-",
                     train::format_bytes(p.peak_total), p.memory_approximate ? " (approx.)" : "");
  }
  int feasible = 0;
  for (const Prediction& p : ps) feasible += p.feasible;
  t += fmt::format("\n{} plans: {} feasible (top {} shown), {} rejected", ps.size(), feasible, shown, rejected);
  if (!reasons.empty()) {
    std::vector<std::pair<int, std::string>> rs;
    for (const auto& [w, n] : reasons) rs.emplace_back(n, w);
    std::sort(rs.rbegin(), rs.rend());
    t += ":\n";
    for (size_t i = 0; i < std::min<size_t>(rs.size(), 6); ++i)
      t += fmt::format("  {:4} x {}\n", rs[i].first, rs[i].second);
  } else {
    t += "\n";
  }
  return t;
}

}  // namespace brigade::plan
