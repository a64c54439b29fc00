// Pipeline schedules as data and their simulator; see pipeline_schedule.h.
#include "brigade/parallel/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <tuple>

#include "brigade/core/enum_names.h"
#include "brigade/core/error.h"

namespace brigade::parallel {

// The names, indexed by PipeSchedule.
constexpr std::string_view kScheduleNames[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};

std::string_view pipe_schedule_name(PipeSchedule s) { return enum_name(s, kScheduleNames); }

PipeSchedule pipe_schedule_from_name(std::string_view s) {
  return enum_from_name<PipeSchedule>(s, kScheduleNames, "pipeline schedule",
                                      R"("gpipe", "1f1b", "interleaved" or "zb-h1")");
}

std::string_view pipe_op_name(PipeOp op) {
  constexpr std::string_view names[] = {"F", "B", "Bi", "W", "sendA", "recvA", "sendG", "recvG"};
  return names[size_t(op)];
}

PipeCosts PipeCosts::uniform(int stages, double f, double b_input, double b_weight, double comm) {
  PipeCosts c;
  c.forward.assign(size_t(stages), f);
  c.backward_input.assign(size_t(stages), b_input);
  c.backward_weight.assign(size_t(stages), b_weight);
  c.comm = comm;
  return c;
}

namespace {

void check_costs(const PipeCosts& c, int stages, const char* what) {
  BRIGADE_CHECK(int(c.forward.size()) == stages && int(c.backward_input.size()) == stages &&
                    int(c.backward_weight.size()) == stages,
                ValueError,
                "{}: the costs give {} / {} / {} stages (forward / backward-input / backward-weight) "
                "but the plan has {}",
                what, c.forward.size(), c.backward_input.size(), c.backward_weight.size(), stages);
}

double cost_of(const PipeCosts& c, const PipeAction& a) {
  const size_t s = size_t(a.stage);
  switch (a.op) {
    case PipeOp::Forward: return c.forward[s];
    case PipeOp::Backward: return c.backward_input[s] + c.backward_weight[s];
    case PipeOp::BackwardInput: return c.backward_input[s];
    case PipeOp::BackwardWeight: return c.backward_weight[s];
    default: return 0.0;
  }
}

// The compute order of rank r under 1F1B-style scheduling over `fwd` / `bwd` sequences of
// (stage, mb): `warmup` forwards, then forward/backward pairs, then the remaining backwards.
std::vector<PipeAction> one_f_one_b(const std::vector<PipeAction>& fwd, const std::vector<PipeAction>& bwd,
                                    int warmup) {
  std::vector<PipeAction> out;
  const int n = int(fwd.size());
  warmup = std::min(warmup, n);
  for (int i = 0; i < warmup; ++i) out.push_back(fwd[size_t(i)]);
  for (int i = 0; i < n - warmup; ++i) {
    out.push_back(fwd[size_t(warmup + i)]);
    out.push_back(bwd[size_t(i)]);
  }
  for (int i = n - warmup; i < n; ++i) out.push_back(bwd[size_t(i)]);
  return out;
}

// Sends and receives around each compute action (a stage's input arrives before its
// forward; its output gradient before its backward).
std::vector<PipeAction> with_communication(const std::vector<PipeAction>& compute, int stages) {
  std::vector<PipeAction> out;
  for (const PipeAction& a : compute) {
    if (a.op == PipeOp::Forward) {
      if (a.stage > 0) out.push_back({PipeOp::RecvActivation, a.stage, a.mb});
      out.push_back(a);
      if (a.stage < stages - 1) out.push_back({PipeOp::SendActivation, a.stage, a.mb});
    } else if (a.op == PipeOp::Backward || a.op == PipeOp::BackwardInput) {
      if (a.stage < stages - 1) out.push_back({PipeOp::RecvGrad, a.stage, a.mb});
      out.push_back(a);
      if (a.stage > 0) out.push_back({PipeOp::SendGrad, a.stage, a.mb});
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// ZB-H1's compute order, found by list scheduling with the given costs: each rank runs
// its 1F1B order of forwards and backward-inputs; a backward-weight is deferred and run
// (oldest first) when the rank would otherwise wait for an input, or before a forward
// that would hold more than p micro-batches (1F1B's peak, on its first rank), or at the end.
std::vector<std::vector<PipeAction>> zb_h1_order(int p, int m, const PipeCosts& costs) {
  using Key = std::tuple<int, int, int>;  // op, stage, mb
  std::map<Key, double> end;
  struct Rank {
    std::vector<PipeAction> core;
    size_t next = 0;
    std::deque<PipeAction> pending_w;
    double free = 0;
    int in_flight = 0, limit = 0;
    std::vector<PipeAction> out;
    bool done() const { return next == core.size() && pending_w.empty(); }
  };
  std::vector<Rank> ranks(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    std::vector<PipeAction> f, b;
    for (int i = 0; i < m; ++i) {
      f.push_back({PipeOp::Forward, r, i});
      b.push_back({PipeOp::BackwardInput, r, i});
    }
    ranks[size_t(r)].core = one_f_one_b(f, b, p - r - 1);
    ranks[size_t(r)].limit = std::min(p, m);  // 1F1B's peak: rank 0 holds p micro-batches
  }
  // When the inputs of `a` are available (infinity while their producer is unscheduled).
  auto ready = [&](const PipeAction& a) {
    const double inf = std::numeric_limits<double>::infinity();
    if (a.op == PipeOp::Forward && a.stage > 0) {
      auto it = end.find({int(PipeOp::Forward), a.stage - 1, a.mb});
      return it == end.end() ? inf : it->second + costs.comm;
    }
    if (a.op == PipeOp::BackwardInput && a.stage < p - 1) {
      auto it = end.find({int(PipeOp::BackwardInput), a.stage + 1, a.mb});
      return it == end.end() ? inf : it->second + costs.comm;
    }
    return 0.0;
  };
  auto run = [&](Rank& rk, const PipeAction& a, double start) {
    rk.free = start + cost_of(costs, a);
    end[{int(a.op), a.stage, a.mb}] = rk.free;
    rk.out.push_back(a);
    if (a.op == PipeOp::Forward) ++rk.in_flight;
    if (a.op == PipeOp::BackwardInput) rk.pending_w.push_back({PipeOp::BackwardWeight, a.stage, a.mb});
    if (a.op == PipeOp::BackwardWeight) --rk.in_flight;
  };
  for (;;) {
    // the unfinished rank that is free earliest and can act (run a W, or its next action
    // whose inputs are scheduled)
    int pick = -1;
    for (int r = 0; r < p; ++r) {
      Rank& rk = ranks[size_t(r)];
      if (rk.done()) continue;
      const bool can = !rk.pending_w.empty() ||
                       (rk.next < rk.core.size() && ready(rk.core[rk.next]) < std::numeric_limits<double>::infinity());
      if (can && (pick < 0 || rk.free < ranks[size_t(pick)].free)) pick = r;
    }
    if (pick < 0) break;
    Rank& rk = ranks[size_t(pick)];
    if (rk.next == rk.core.size()) {  // cool-down: the deferred W's
      run(rk, rk.pending_w.front(), rk.free);
      rk.pending_w.pop_front();
      continue;
    }
    const PipeAction& a = rk.core[rk.next];
    const double at = ready(a);
    const bool over_memory = a.op == PipeOp::Forward && rk.in_flight >= rk.limit;
    if (!rk.pending_w.empty() && (over_memory || at > rk.free)) {
      run(rk, rk.pending_w.front(), rk.free);
      rk.pending_w.pop_front();
      continue;
    }
    BRIGADE_CHECK(!over_memory, InternalError, "zb-h1: rank {} over its in-flight limit with no W to run", pick);
    run(rk, a, std::max(rk.free, at));
    ++rk.next;
  }
  std::vector<std::vector<PipeAction>> out;
  for (Rank& rk : ranks) {
    BRIGADE_CHECK(rk.done(), InternalError, "zb-h1: the list scheduler stopped with work left");
    out.push_back(std::move(rk.out));
  }
  return out;
}

}  // namespace

PipePlan build_pipe_plan(PipeSchedule kind, int p, int m, int v, const PipeCosts& costs) {
  BRIGADE_CHECK(p >= 1 && m >= 1 && v >= 1, ValueError,
                "pipeline plan: need p >= 1 ranks, m >= 1 micro-batches and v >= 1 virtual stages, got p = {}, "
                "m = {}, v = {}",
                p, m, v);
  BRIGADE_CHECK(v == 1 || kind == PipeSchedule::Interleaved, ValueError,
                "pipeline plan: {} virtual stages per rank need the \"interleaved\" schedule, not \"{}\"", v,
                pipe_schedule_name(kind));
  PipePlan plan;
  plan.kind = kind;
  plan.p = p;
  plan.v = v;
  plan.m = m;
  const int S = p * v;
  std::vector<std::vector<PipeAction>> compute(static_cast<size_t>(p));
  switch (kind) {
    case PipeSchedule::GPipe:
      for (int r = 0; r < p; ++r) {
        for (int i = 0; i < m; ++i) compute[size_t(r)].push_back({PipeOp::Forward, r, i});
        for (int i = 0; i < m; ++i) compute[size_t(r)].push_back({PipeOp::Backward, r, i});
      }
      break;
    case PipeSchedule::OneFOneB:
      for (int r = 0; r < p; ++r) {
        std::vector<PipeAction> f, b;
        for (int i = 0; i < m; ++i) {
          f.push_back({PipeOp::Forward, r, i});
          b.push_back({PipeOp::Backward, r, i});
        }
        compute[size_t(r)] = one_f_one_b(f, b, p - r - 1);
      }
      break;
    case PipeSchedule::Interleaved: {
      BRIGADE_CHECK(m % p == 0, ValueError,
                    "pipeline plan: the interleaved schedule runs micro-batches in groups of p = {}, so m = {} must "
                    "be a multiple of it; use m = {} or {}",
                    p, m, (m / p) * p == 0 ? p : (m / p) * p, (m / p + 1) * p);
      const int total = m * v;
      for (int r = 0; r < p; ++r) {
        // k-th forward of rank r: micro-batch (k / (p v)) p + k % p of chunk (k / p) % v; the
        // k-th backward: the same micro-batch of chunk v - 1 - (k / p) % v
        std::vector<PipeAction> f, b;
        for (int k = 0; k < total; ++k) {
          const int mb = (k / (p * v)) * p + k % p, chunk = (k / p) % v;
          f.push_back({PipeOp::Forward, chunk * p + r, mb});
          b.push_back({PipeOp::Backward, (v - 1 - chunk) * p + r, mb});
        }
        const int warmup = v == 1 ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * p;
        compute[size_t(r)] = one_f_one_b(f, b, warmup);
      }
      break;
    }
    case PipeSchedule::ZeroBubbleH1: {
      PipeCosts c = costs;
      if (c.forward.empty()) c = PipeCosts::uniform(S, 1.0, 1.0, 1.0);
      check_costs(c, S, "pipeline plan zb-h1");
      compute = zb_h1_order(p, m, c);
      break;
    }
  }
  for (int r = 0; r < p; ++r) plan.ranks.push_back(with_communication(compute[size_t(r)], S));
  return plan;
}

PipeSimulation simulate_pipe_plan(const PipePlan& plan, const PipeCosts& costs) {
  const int p = plan.p, S = plan.stages();
  check_costs(costs, S, "simulate_pipe_plan");
  BRIGADE_CHECK(int(plan.ranks.size()) == p, ValueError, "simulate_pipe_plan: the plan has {} rank lists for p = {}",
                plan.ranks.size(), p);
  using Key = std::tuple<int, int, int>;  // kind (0 activation, 1 gradient), receiving stage, mb
  std::map<Key, double> arrival;
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> t(size_t(p), 0.0), busy(size_t(p), 0.0);
  PipeSimulation sim;
  std::vector<std::vector<PipeEvent>> per_rank(static_cast<size_t>(p));
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = plan.ranks[size_t(r)];
      while (next[size_t(r)] < list.size()) {
        const PipeAction& a = list[next[size_t(r)]];
        double& now = t[size_t(r)];
        if (a.op == PipeOp::SendActivation) {
          arrival[{0, a.stage + 1, a.mb}] = now + costs.comm;
        } else if (a.op == PipeOp::SendGrad) {
          arrival[{1, a.stage - 1, a.mb}] = now + costs.comm;
        } else if (a.op == PipeOp::RecvActivation || a.op == PipeOp::RecvGrad) {
          auto it = arrival.find({a.op == PipeOp::RecvActivation ? 0 : 1, a.stage, a.mb});
          if (it == arrival.end()) break;  // blocked until the sender gets there
          now = std::max(now, it->second);
        } else {
          const double c = cost_of(costs, a);
          per_rank[size_t(r)].push_back({r, a, now, now + c});
          now += c;
          busy[size_t(r)] += c;
        }
        ++next[size_t(r)];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < p; ++r)
    if (next[size_t(r)] < plan.ranks[size_t(r)].size()) {
      const PipeAction& a = plan.ranks[size_t(r)][next[size_t(r)]];
      stuck += fmt::format(" rank {} at {}(stage {}, mb {});", r, pipe_op_name(a.op), a.stage, a.mb);
    }
  BRIGADE_CHECK(stuck.empty(), ValueError,
                "simulate_pipe_plan: the schedule cannot complete (a receive with no matching send, or a cycle):{}",
                stuck);
  sim.peak_in_flight.assign(size_t(p), 0);
  for (int r = 0; r < p; ++r) {
    int live = 0;
    for (const PipeEvent& e : per_rank[size_t(r)]) {
      if (e.action.op == PipeOp::Forward) ++live;
      if (e.action.op == PipeOp::Backward || e.action.op == PipeOp::BackwardWeight) --live;
      sim.peak_in_flight[size_t(r)] = std::max(sim.peak_in_flight[size_t(r)], live);
    }
    sim.makespan = std::max(sim.makespan, t[size_t(r)]);
    sim.ideal = std::max(sim.ideal, busy[size_t(r)]);
    sim.events.insert(sim.events.end(), per_rank[size_t(r)].begin(), per_rank[size_t(r)].end());
  }
  sim.bubble = sim.ideal > 0 ? (sim.makespan - sim.ideal) / sim.ideal : 0.0;
  return sim;
}

PipeChoice choose_pipe_plan(int p, int m, const std::vector<int>& virtual_stages, int max_in_flight,
                            const std::function<PipeCosts(int v)>& costs_for_v) {
  struct Candidate {
    PipeSchedule kind;
    int v;
  };
  std::vector<Candidate> cands = {
      {PipeSchedule::OneFOneB, 1}, {PipeSchedule::ZeroBubbleH1, 1}, {PipeSchedule::GPipe, 1}};
  for (int v : virtual_stages)
    if (v > 1 && m % p == 0) cands.push_back({PipeSchedule::Interleaved, v});
  PipeChoice best;
  bool found = false;
  best.table =
      "| schedule | v | predicted time | bubble | peak in-flight (max over ranks) | fits |\n"
      "|---|---:|---:|---:|---:|---|\n";
  for (const Candidate& c : cands) {
    const PipeCosts costs = costs_for_v(c.v);
    PipePlan plan = build_pipe_plan(c.kind, p, m, c.v, costs);
    PipeSimulation sim = simulate_pipe_plan(plan, costs);
    const int peak = *std::max_element(sim.peak_in_flight.begin(), sim.peak_in_flight.end());
    const bool fits = max_in_flight <= 0 || peak <= max_in_flight;
    best.table += fmt::format("| {} | {} | {:.4g} | {:.3f} | {} | {} |\n", pipe_schedule_name(c.kind), c.v,
                              sim.makespan, sim.bubble, peak, fits ? "yes" : "no");
    if (fits && (!found || sim.makespan < best.sim.makespan)) {
      best.plan = std::move(plan);
      best.sim = std::move(sim);
      found = true;
    }
  }
  BRIGADE_CHECK(found, ValueError,
                "pipeline schedule \"dynamic\": no schedule keeps at most {} micro-batches in flight per rank with "
                "p = {}, m = {}; raise the memory limit or lower the micro-batch count\n{}",
                max_in_flight, p, m, best.table);
  return best;
}

void write_pipe_timeline_svg(const std::string& path, const std::vector<PipeEvent>& events, int p,
                             const std::string& title) {
  double t_end = 0;
  for (const PipeEvent& e : events) t_end = std::max(t_end, e.end);
  const double W = 1000, row = 28, left = 60, top = 40;
  const double H = top + row * p + 40;
  const double sx = t_end > 0 ? (W - left - 20) / t_end : 1.0;
  std::ofstream f(path);
  BRIGADE_CHECK(f.good(), IoError, "cannot write {}: check the folder exists and is writable", path);
  f << fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"10\">\n",
      W, H);
  f << fmt::format("<text x=\"{}\" y=\"20\" font-size=\"14\">{}</text>\n", left, title);
  for (int r = 0; r < p; ++r)
    f << fmt::format("<text x=\"5\" y=\"{:.1f}\">rank {}</text>\n", top + row * r + row * 0.6, r);
  for (const PipeEvent& e : events) {
    const char* colour = e.action.op == PipeOp::Forward          ? "#6fa8dc"
                         : e.action.op == PipeOp::BackwardWeight ? "#93c47d"
                                                                 : "#e69138";
    const double x = left + e.start * sx, w = std::max(0.5, (e.end - e.start) * sx), y = top + row * e.rank;
    f << fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" "
        "stroke=\"#333\" stroke-width=\"0.5\"><title>{} stage {} mb {}: {:.4g} to {:.4g}</title></rect>\n",
        x, y + 2, w, row - 4, colour, pipe_op_name(e.action.op), e.action.stage, e.action.mb, e.start, e.end);
    if (w > 12)
      f << fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x + w / 2, y + row * 0.62,
                       e.action.mb);
  }
  const double axis_y = top + row * p + 12;
  f << fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n", left, axis_y, W - 20, axis_y);
  f << fmt::format("<text x=\"{}\" y=\"{}\">0</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.4g}</text>\n", left,
                   axis_y + 14, W - 20, axis_y + 14, t_end);
  f << fmt::format(
      "<text x=\"{}\" y=\"{}\">F = forward (blue), B / Bi = backward (orange), W = backward-weight "
      "(green); the number is the micro-batch</text>\n",
      left + 80, axis_y + 14);
  f << "</svg>\n";
}

}  // namespace brigade::parallel
