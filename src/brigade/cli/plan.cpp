// `brigade calibrate` and `brigade plan`; see plan.h.
#include "brigade/cli/plan.h"

#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>

#include "brigade/autograd/engine.h"
#include "brigade/cli/ablate.h"
#include "brigade/cli/bench.h"
#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"
#include "brigade/dist/process_group.h"
#include "brigade/plan/comm_bench.h"
#include "brigade/train/memory_plan.h"
#include "brigade/train/registry.h"
#include "brigade/train/stage_timing.h"
#include "brigade/train/trainer.h"

namespace brigade::cli {

namespace fs = std::filesystem;
using train::Recipe;

std::string calibration_path(const Recipe& r) {
  return (fs::path(r.run.out_dir).parent_path() / (r.run.name + "-calibration.json")).string();
}

namespace {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// The recipe of one measured point: one process, one micro-step of `rows` rows.
Recipe point_recipe(const Recipe& base, const std::string& level, const std::string& recompute, int64_t rows,
                    int threads) {
  Recipe r = base;
  for (const std::string& o : {std::string("parallel.dp=1"), std::string("parallel.tp=1"), std::string("parallel.pp=1"),
                               std::string("parallel.zero=0"), std::string("parallel.microbatches=1"),
                               std::string("train.accumulation=1"), std::string("train.accumulation_mode=static"),
                               fmt::format("train.batch_size={}", rows), fmt::format("precision.level={}", level),
                               fmt::format("memory.recompute={}", recompute), fmt::format("run.threads={}", threads)})
    train::apply_override(r, o);
  if (level != "O0") train::apply_override(r, "precision.dtype=bf16");
  train::validate_recipe(r, "calibrate");
  return r;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// How a calibration point is benched: the calibration's steps and warm-up, over `group` (null:
// the world), without the GEMM peaks (measured once) and quiet (the caller prints the line).
BenchOptions point_bench_options(const CalibrateOptions& o, std::shared_ptr<dist::ProcessGroup> group) {
  BenchOptions bo;
  bo.steps = o.steps;
  bo.warmup = o.warmup;
  bo.group = std::move(group);
  bo.gemm_peaks = false;
  bo.quiet = true;
  return bo;
}

// The points of one launch: every rank of `world` measures its own model copy (a one-rank group
// each) at the same time, point after point (a barrier between them); rank 0's numbers are kept.
void measure_points(const Recipe& base, const CalibrateOptions& o, const std::vector<int64_t>& rows, int ranks,
                    int threads, dist::ProcessGroup& world, plan::Calibration& c) {
  const std::shared_ptr<dist::ProcessGroup> self = world.split(world.rank(), 0);
  const bool speak = world.rank() == 0;
  const size_t total = o.levels.size() * o.recompute.size() * rows.size();
  size_t k = 0;
  for (const std::string& level : o.levels)
    for (const std::string& rc : o.recompute)
      for (int64_t n : rows) {
        ++k;
        const Recipe r = point_recipe(base, level, rc, n, threads);
        world.barrier();
        const BenchResult b = run_bench(r, point_bench_options(o, self));
        plan::ComputePoint p;
        p.ranks = ranks, p.threads = threads, p.level = level, p.recompute = rc, p.rows = n;
        p.fwd_bwd_s = b.median_fwd_bwd_s;
        p.update_s = b.median_update_s;
        if (ranks == 1) {  // memory does not depend on the launch: measured once
          const train::MemoryInputs in = train::measured_inputs(r);
          p.act_peak = in.act_peak, p.act_live = in.act_live, p.work_compute = in.work_compute;
          p.params_work = in.params_work;
          p.params_work_backward = in.params_work_backward, p.early_grads = in.early_grads;
        }
        c.compute.push_back(p);
        if (speak)
          fmt::print(stderr,
                     "calibrate: {} rank{} x {} thread{} [{}/{}] {} {} rows {}: fwd+bwd {:.4f} s, update {:.4f} s\n",
                     ranks, ranks == 1 ? "" : "s", threads, threads == 1 ? "" : "s", k, total, level, rc, n,
                     p.fwd_bwd_s, p.update_s);
      }
  // per-block and head times for the pipeline simulator (recompute none; the planner rescales)
  for (const std::string& level : o.levels)
    for (int64_t n : rows) {
      const Recipe r = point_recipe(base, level, "none", n, threads);
      world.barrier();
      const std::unique_ptr<train::Task> task = train::make_task(r);
      const train::Stages* st = task->stages();
      if (!st) break;
      const train::StageTimes t = train::measure_stage_times(task->model(), *st, task->synthetic_batch(r.run.seed, n),
                                                             st->hidden(n), train::precision_policy(r.precision));
      c.stages.push_back({ranks, threads, level, n, t.block_f, t.block_bi, t.block_w, t.head_f, t.head_bi, t.head_w});
    }
}

// The lockstep steps of one launch of R ranks: for every level and calibrated row count, the
// training step as it runs over the whole launch, data parallel (ZeRO-0 with the recipe's buckets,
// algorithm and overlap, and ZeRO-3) and, for a model with a tensor-parallel plan, tensor parallel. The ranks
// wait on each other at every bucket or block, which two ranks timing their own copies (the
// compute points) do not; the planner prices that from these (planner.cpp, sync_factor).
void measure_sync_points(const Recipe& base, const CalibrateOptions& o, const std::vector<int64_t>& rows, int threads,
                         dist::ProcessGroup& world, plan::Calibration& c) {
  const int R = world.size();
  bool tp = false;
  {
    const std::unique_ptr<train::Task> probe = train::make_task(base);
    tp = probe->stages() && !probe->stages()->tp_plan.empty();
  }
  std::vector<std::string> kinds = {"dp", "zero3"};
  if (tp) kinds.push_back("tp");
  const size_t total = kinds.size() * o.levels.size() * rows.size();
  size_t k = 0;
  for (const std::string& kind : kinds)
    for (const std::string& level : o.levels)
      for (int64_t n : rows) {
        ++k;
        const std::string what = kind == "zero3" ? fmt::format("dp {} ZeRO-3", R) : fmt::format("{} {}", kind, R);
        Recipe r = point_recipe(base, level, "none", n, threads);
        train::apply_override(r, fmt::format("parallel.{}={}", kind == "tp" ? "tp" : "dp", R));
        if (kind == "zero3") train::apply_override(r, "parallel.zero=3");
        try {  // every rank decides alike: the recipe alone
          train::validate_recipe(r, "calibrate");
        } catch (const ConfigError& e) {
          if (world.rank() == 0)
            fmt::print(stderr, "calibrate: {} ranks {} [{}/{}] {} rows {} skipped: {}\n", R, what, k, total, level, n,
                       e.what());
          continue;
        }
        world.barrier();
        const BenchResult b = run_bench(r, point_bench_options(o, nullptr));
        plan::SyncPoint p;
        p.kind = kind, p.ranks = R, p.threads = threads, p.level = level, p.rows = n;
        p.fwd_bwd_s = b.median_fwd_bwd_s, p.update_s = b.median_update_s;
        c.sync.push_back(p);
        if (world.rank() == 0)
          fmt::print(stderr,
                     "calibrate: {} ranks x {} thread{} {} [{}/{}] {} rows {}: fwd+bwd {:.4f} s, update {:.4f} s\n", R,
                     threads, threads == 1 ? "" : "s", what, k, total, level, n, p.fwd_bwd_s, p.update_s);
      }
}

// The mesh points of one launch of R ranks (model-parallel tasks): for every level and recompute
// mode, the memory of every rank under tp = R at the largest calibrated rows, and under pp = R with
// GPipe over R and 2R micro-batches of those rows and over R micro-batches of half of them, and 1F1B
// over 2R micro-batches (what the planner separates a stage's fixed, per-micro-batch, transient and
// whole-batch memory with: planner.cpp, mesh_memory), each by the mesh dry step of `brigade train
// --dry-run`.
void measure_mesh_points(const Recipe& base, const CalibrateOptions& o, int64_t rows, int threads,
                         dist::ProcessGroup& world, plan::Calibration& c) {
  const int64_t R = world.size();
  struct Mesh {
    int64_t tp, pp, m, rows;
    std::string schedule = "1f1b";
  };
  std::vector<Mesh> meshes;
  {  // the model's stages, from a copy freed before measuring (every rank's peaks are its whole process's)
    const std::unique_ptr<train::Task> probe = train::make_task(base);
    const train::Stages* st = probe->stages();
    if (!st) return;
    if (!st->tp_plan.empty()) meshes.push_back({R, 1, 1, rows});
    if (st->num_blocks >= R && rows % (2 * R) == 0)
      meshes.insert(meshes.end(), {{1, R, R, rows, "gpipe"},
                                   {1, R, 2 * R, rows, "gpipe"},
                                   {1, R, R, rows / 2, "gpipe"},
                                   {1, R, 2 * R, rows, "1f1b"}});
  }
  const size_t total = o.levels.size() * o.recompute.size() * meshes.size();
  size_t k = 0;
  for (const std::string& level : o.levels)
    for (const std::string& rc : o.recompute)
      for (const Mesh& mesh : meshes) {
        Recipe r = point_recipe(base, level, rc, mesh.rows, threads);
        train::apply_override(r, fmt::format("parallel.tp={}", mesh.tp));
        train::apply_override(r, fmt::format("parallel.pp={}", mesh.pp));
        if (mesh.pp > 1) {
          train::apply_override(r, "parallel.schedule=" + mesh.schedule);
          train::apply_override(r, fmt::format("parallel.microbatches={}", mesh.m));
        }
        ++k;
        try {  // every rank decides alike: the recipe alone
          train::validate_recipe(r, "calibrate");
        } catch (const ConfigError& e) {
          if (world.rank() == 0)
            fmt::print(stderr, "calibrate: {} ranks mesh [{}/{}] tp {} pp {} skipped: {}\n", R, k, total, mesh.tp,
                       mesh.pp, e.what());
          continue;
        }
        world.barrier();
        const BenchResult b = mesh_dry_step(r);
        plan::MeshPoint p;
        p.tp = mesh.tp, p.pp = mesh.pp, p.schedule = mesh.schedule, p.microbatches = mesh.m;
        p.threads = threads, p.level = level, p.recompute = rc, p.rows = mesh.rows;
        for (const BenchResult::RankPeaks& rp : b.rank_peaks) p.ranks.push_back({rp.peak, rp.total});
        c.mesh.push_back(p);
        if (world.rank() == 0)
          fmt::print(
              stderr, "calibrate: {} ranks mesh [{}/{}] tp {} pp {}{} {} {} rows {}: busiest rank {}\n", R, k, total,
              mesh.tp, mesh.pp, mesh.pp > 1 ? fmt::format(" {} m {}", mesh.schedule, mesh.m) : std::string(), level, rc,
              mesh.rows,
              train::format_bytes(std::max_element(p.ranks.begin(), p.ranks.end(), [](const auto& a, const auto& b) {
                                    return a.total < b.total;
                                  })->total));
      }
}

// ---- proxies: a model too large to build here, measured with A and B blocks at its width

double lerp_layers(double a, double b, int64_t A, int64_t B, int64_t L) {
  return a + (b - a) * double(L - A) / double(B - A);
}

// The parameter units of the L-block model from those of the A- and B-block models. A unit only
// the B-block model has is a block's: it is repeated. A unit both have keeps its parameters, and
// those only the B-block one holds (blocks inside one unit) are repeated in it. Copies are named
// "<name>#k"; (L - B) must be a multiple of (B - A).
std::vector<train::PlannedUnit> extrapolate_units(const std::vector<train::PlannedUnit>& ua,
                                                  const std::vector<train::PlannedUnit>& ub, int64_t A, int64_t B,
                                                  int64_t L) {
  const int64_t copies = (L - B) / (B - A);
  std::map<std::string, const train::PlannedUnit*> in_a;
  for (const auto& u : ua) in_a[u.name] = &u;
  std::vector<train::PlannedUnit> out, blocks;
  for (const auto& u : ub) {
    auto it = in_a.find(u.name);
    if (it == in_a.end()) {
      out.push_back(u);
      blocks.push_back(u);
      continue;
    }
    std::set<std::string> had;
    for (const auto& pr : it->second->params) had.insert(pr.first);
    train::PlannedUnit v = u;
    for (int64_t k = 1; k <= copies; ++k)
      for (const auto& [name, numel] : u.params)
        if (!had.count(name)) v.params.emplace_back(fmt::format("{}#{}", name, k), numel);
    out.push_back(std::move(v));
  }
  for (int64_t k = 1; k <= copies; ++k)
    for (train::PlannedUnit u : blocks) {
      u.name += fmt::format("#{}", k);
      for (auto& pr : u.params) pr.first += fmt::format("#{}", k);
      out.push_back(std::move(u));
    }
  return out;
}

// One micro-batch's forward + backward on a built task, median seconds of `steps` (the caller
// has run one already: the dry step that measured its memory, which warms the allocator).
double time_fwd_bwd(const Recipe& r, train::Task& task, int64_t steps) {
  const amp::Policy policy = train::precision_policy(r.precision);
  const train::Batch b = task.synthetic_batch(r.run.seed + 2, r.train.batch_size);
  task.model().train(true);
  std::vector<double> ts;
  for (int64_t s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      train::Metrics extras;
      std::vector<train::Batch> micro{b};
      const std::shared_ptr<dist::ProcessGroup> one = dist::ProcessGroup::world();
      if (task.needs_whole_step()) task.begin_step(micro, train::Shard{0, 1, one.get()});
      train::Loss l;
      {
        amp::AutocastScope autocast(policy);
        l = task.loss(micro[0], 0, extras);
      }
      autograd::backward(l.loss);
    }
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (auto& [name, p] : task.model().named_parameters()) p.set_grad(Tensor());
  }
  std::nth_element(ts.begin(), ts.begin() + long(ts.size() / 2), ts.end());
  return ts[ts.size() / 2];
}

// The model at A and B blocks: its structure, each (level, recompute, rows) point's memory (the
// measured dry step) and forward + backward time, the stage times at A blocks, and the update's
// seconds per parameter from a `brigade bench` of the A-block model; then every per-block
// quantity extrapolated linearly to model.n_layer. One process, all cores.
void measure_proxies(const Recipe& base, const CalibrateOptions& o, const std::vector<int64_t>& rows, int cores,
                     plan::Calibration& c) {
  const int64_t A = o.proxy_layers[0], B = o.proxy_layers[1], L = base.model.n_layer;
  struct At {
    int64_t params = 0;
    double flops = 0;
    std::vector<train::PlannedUnit> units, units3;
    std::vector<plan::ComputePoint> points;
  } at[2];
  const size_t total = 2 * rows.size() * o.levels.size() * o.recompute.size();
  size_t k = 0;
  for (int i = 0; i < 2; ++i) {
    Recipe rl = base;
    train::apply_override(rl, fmt::format("model.n_layer={}", o.proxy_layers[size_t(i)]));
    for (int64_t n : rows) {
      const std::unique_ptr<train::Task> task = train::make_task(point_recipe(rl, "O0", "none", n, cores));
      if (n == rows.front()) {
        for (auto& [name, p] : task->model().named_parameters()) at[i].params += p.numel();
        auto planned = [&](int zero) {
          std::vector<train::PlannedUnit> us;
          for (const parallel::ParamUnit& u : task->units(zero)) {
            train::PlannedUnit pu{u.name, {}};
            for (auto& [name, p] : u.params) pu.params.emplace_back(name, p.numel());
            us.push_back(std::move(pu));
          }
          return us;
        };
        at[i].units = planned(0);
        at[i].units3 = planned(3);
        at[i].flops = task->flops_per_item();
      }
      for (const std::string& level : o.levels)
        for (const std::string& rc : o.recompute) {
          ++k;
          const Recipe r = point_recipe(rl, level, rc, n, cores);
          const train::MemoryInputs in = train::measured_inputs(r, *task);
          plan::ComputePoint p;
          p.ranks = 1, p.threads = cores, p.level = level, p.recompute = rc, p.rows = n;
          p.fwd_bwd_s = time_fwd_bwd(r, *task, o.steps);
          p.act_peak = in.act_peak, p.act_live = in.act_live, p.work_compute = in.work_compute;
          p.params_work = in.params_work;
          p.params_work_backward = in.params_work_backward, p.early_grads = in.early_grads;
          at[i].points.push_back(p);
          fmt::print(stderr, "calibrate: proxy of {} blocks [{}/{}] {} {} rows {}: fwd+bwd {:.3f} s, activations {}\n",
                     o.proxy_layers[size_t(i)], k, total, level, rc, n, p.fwd_bwd_s, train::format_bytes(in.act_peak));
        }
      if (i == 0)  // per block and head: the A-block model's are the model's
        for (const std::string& level : o.levels) {
          const Recipe r = point_recipe(rl, level, "none", n, cores);
          apply_recompute(r, *task);
          const train::Stages* st = task->stages();
          const train::StageTimes t =
              train::measure_stage_times(task->model(), *st, task->synthetic_batch(r.run.seed, n), st->hidden(n),
                                         train::precision_policy(r.precision));
          c.stages.push_back({1, cores, level, n, t.block_f, t.block_bi, t.block_w, t.head_f, t.head_bi, t.head_w});
        }
    }
  }
  // the update is elementwise over the parameters: seconds per parameter at A blocks
  std::map<std::string, double> update_per_param;
  {
    Recipe ra = base;
    train::apply_override(ra, fmt::format("model.n_layer={}", A));
    for (const std::string& level : o.levels) {
      BenchOptions bo;
      bo.steps = o.steps;
      bo.warmup = o.warmup;
      bo.gemm_peaks = false;
      const BenchResult b = run_bench(point_recipe(ra, level, "none", rows.front(), cores), bo);
      update_per_param[level] = b.median_update_s / double(at[0].params);
      fmt::print(stderr, "calibrate: proxy of {} blocks: {} update {:.3f} s ({:.2f} ns per parameter)\n", A, level,
                 b.median_update_s, 1e9 * update_per_param[level]);
    }
  }
  c.proxy_layers = o.proxy_layers;
  c.parameters = int64_t(std::llround(lerp_layers(double(at[0].params), double(at[1].params), A, B, L)));
  c.flops_per_item = lerp_layers(at[0].flops, at[1].flops, A, B, L);
  c.units = extrapolate_units(at[0].units, at[1].units, A, B, L);
  c.units_zero3 = extrapolate_units(at[0].units3, at[1].units3, A, B, L);
  c.num_blocks = L;
  for (size_t j = 0; j < at[0].points.size(); ++j) {
    const plan::ComputePoint &a = at[0].points[j], &b = at[1].points[j];
    plan::ComputePoint p = b;
    auto ext = [&](double x, double y) { return lerp_layers(x, y, A, B, L); };
    p.fwd_bwd_s = ext(a.fwd_bwd_s, b.fwd_bwd_s);
    if (b.fwd_bwd_s <= a.fwd_bwd_s) {
      // the timing noise is larger than B - A blocks (a small model on a busy machine): take one
      // block's cost from its own stage timing (forward, input and weight backward; full
      // recompute runs the forward twice) instead of the difference
      double block = 0;
      for (const plan::StagePoint& s : c.stages)
        if (s.level == p.level && s.rows == p.rows)
          block = s.block_f + s.block_bi + s.block_w + (p.recompute == "full" ? s.block_f : 0.0);
      fmt::print(stderr,
                 "calibrate: warning: {} {} rows {}: the proxy of {} blocks measured {:.4f} s, not more than the one "
                 "of {} ({:.4f} s); extrapolating with the stage-timed block ({:.4f} s). Calibrate on an idle "
                 "machine or with more --steps.\n",
                 p.level, p.recompute, p.rows, B, b.fwd_bwd_s, A, a.fwd_bwd_s, block);
      p.fwd_bwd_s = a.fwd_bwd_s + double(L - A) * block;
    }
    p.update_s = update_per_param[p.level] * double(c.parameters);
    p.act_peak = int64_t(ext(double(a.act_peak), double(b.act_peak)));
    p.work_compute = std::max(a.work_compute, b.work_compute);
    p.params_work = int64_t(ext(double(a.params_work), double(b.params_work)));
    // the blocks' working copies grow with the blocks; the head's gradients do not
    if (a.params_work_backward >= 0 && b.params_work_backward >= 0)
      p.params_work_backward = int64_t(ext(double(a.params_work_backward), double(b.params_work_backward)));
    p.early_grads = a.early_grads;
    c.compute.push_back(p);
  }
}

}  // namespace

int run_calibrate(const CalibrateOptions& o) {
  const Recipe base = train::load_recipe(o.recipe, o.sets);
  const auto world = dist::ProcessGroup::world();
  for (const std::string& l : o.levels)
    BRIGADE_CHECK(l == "O0" || l == "O1" || l == "O2" || l == "O3", ConfigError,
                  "--levels {}: precision levels are O0, O1, O2, O3", l);
  for (const std::string& m : o.recompute)
    BRIGADE_CHECK(m == "none" || m == "selective" || m == "full", ConfigError,
                  "--recompute {}: the planner's recompute modes are none, selective, full", m);
  BRIGADE_CHECK(o.steps >= 1 && o.warmup >= 0, ConfigError, "--steps must be >= 1 and --warmup >= 0");
  std::vector<int64_t> rows = o.rows;
  if (rows.empty()) {
    const int64_t G = base.train.batch_size * base.train.accumulation * base.parallel.dp;
    for (int64_t n = 1; n <= G; n *= 2) rows.push_back(n);
  }
  const int cores = omp_get_num_procs();
  if (!o.proxy_layers.empty()) {
    const int64_t L = base.model.n_layer;
    BRIGADE_CHECK(o.proxy_layers.size() == 2 && o.proxy_layers[0] >= 1 && o.proxy_layers[0] < o.proxy_layers[1] &&
                      o.proxy_layers[1] <= L && (L - o.proxy_layers[1]) % (o.proxy_layers[1] - o.proxy_layers[0]) == 0,
                  ConfigError,
                  "--proxy-layers {}: give two block counts A,B with 1 <= A < B <= model.n_layer = {} and "
                  "n_layer - B a multiple of B - A (e.g. --proxy-layers 1,2)",
                  join(
                      [&] {
                        std::vector<std::string> v;
                        for (int64_t x : o.proxy_layers) v.push_back(std::to_string(x));
                        return v;
                      }(),
                      ","),
                  L);
    BRIGADE_CHECK(o.ranks == std::vector<int>{1}, ConfigError,
                  "--proxy-layers measures one process: use --ranks 1 (a described cluster gives the links; "
                  "docs/planning.md)");
    BRIGADE_CHECK(base.finetune.method != "lora", ConfigError,
                  "--proxy-layers extrapolates trainable blocks only; a LoRA recipe's frozen base is not extrapolated");
    const train::ModelEntry& e = train::model_entry(base.model.type);
    BRIGADE_CHECK(e.caps.pipeline_parallel, ConfigError,
                  "--proxy-layers needs a model built of repeated blocks (one with pipeline stages: {}); model.type = "
                  "\"{}\" has none",
                  train::model_types_with(&train::Capabilities::pipeline_parallel), base.model.type);
  }

  if (!o.child_out.empty()) {  // a child launched under mpirun: this launch's points and the interconnect
    const int R = world->size();
    plan::Calibration c;
    measure_points(base, o, rows, R, std::max(1, cores / R), *world, c);
    measure_sync_points(base, o, rows, std::max(1, cores / R), *world, c);
    measure_mesh_points(base, o, *std::max_element(rows.begin(), rows.end()), std::max(1, cores / R), *world, c);
    plan::CommBenchOptions co;
    co.busy_threads = std::max(1, cores / R);  // this rank's compute threads, as a plan of R ranks runs them
    plan::CommCalibration comm = plan::measure_comm(*world, co);
    if (world->rank() == 0) {
      c.comm[R] = comm;
      data::write_file_atomic(o.child_out, plan::calibration_to_json(c).dump() + "\n");
    }
    return 0;
  }
  BRIGADE_CHECK(world->size() == 1, ConfigError,
                "brigade calibrate runs as one process and launches itself under mpirun for --ranks above 1; run it "
                "without mpirun");
  for (int R : o.ranks)
    BRIGADE_CHECK(R >= 1 && R <= cores, ConfigError,
                  "--ranks {}: must be between 1 and this machine's {} cores (one thread per rank at least)", R, cores);
  const std::string out = o.out.empty() ? calibration_path(base) : o.out;
  const auto t_start = std::chrono::steady_clock::now();

  plan::Calibration c;
  c.created = utc_now();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  c.host = host;
  c.cores = cores;
  c.model = plan::calibration_key(base);
  if (!o.proxy_layers.empty()) {
    fmt::print(stderr, "calibrate: {} on {} ({} cores): proxies of {} and {} blocks, extrapolated to {} -> {}\n",
               o.recipe, c.host, cores, o.proxy_layers[0], o.proxy_layers[1], base.model.n_layer, out);
    Recipe ra = base;
    train::apply_override(ra, fmt::format("model.n_layer={}", o.proxy_layers[0]));
    const std::unique_ptr<train::Task> task = train::make_task(ra);
    c.items_per_row = task->items_per_row();
    c.item = train::item_name(task->item_kind());
    const train::Stages* st = task->stages();
    c.has_stages = st != nullptr;
    c.hidden_per_row = st ? shape_numel(st->hidden(1)) : 0;
    c.tp_plan = st && !st->tp_plan.empty();
  } else {
    fmt::print(stderr, "calibrate: {} on {} ({} cores), {} -> {}\n", o.recipe, c.host, cores,
               "GEMM peaks, compute points, stages, interconnect", out);
    const std::unique_ptr<train::Task> task = train::make_task(base);
    c.parameters = 0;
    for (auto& [name, p] : task->model().named_parameters())
      if (p.requires_grad())
        c.parameters += p.numel();
      else
        c.frozen.push_back({p.numel(), int64_t(p.element_size())});
    auto planned = [&](int zero) {
      std::vector<train::PlannedUnit> us;
      for (const parallel::ParamUnit& u : task->units(zero)) {
        train::PlannedUnit pu{u.name, {}};
        for (auto& [name, p] : u.params) pu.params.emplace_back(name, p.numel());
        us.push_back(std::move(pu));
      }
      return us;
    };
    c.units = planned(0);
    c.units_zero3 = planned(3);
    c.flops_per_item = task->flops_per_item();
    c.items_per_row = task->items_per_row();
    c.item = train::item_name(task->item_kind());
    if (const train::Stages* st = task->stages()) {
      c.has_stages = true;
      c.num_blocks = st->num_blocks;
      c.hidden_per_row = shape_numel(st->hidden(1));
      c.tp_plan = !st->tp_plan.empty();
    }
  }
  omp_set_num_threads(cores);
  c.gemm_peak_f32 = train::measure_gemm_peak_gflops(DType::F32);
  c.gemm_peak_bf16 = train::measure_gemm_peak_gflops(DType::BF16);
  fmt::print(stderr, "calibrate: GEMM peaks {:.0f} GFLOP/s fp32, {:.0f} bf16\n", c.gemm_peak_f32, c.gemm_peak_bf16);

  std::string binary = o.binary;
  if (binary.empty()) binary = brigade_binary({});
  // A launch that cannot start (no mpirun, root without OMPI_ALLOW_RUN_AS_ROOT) fails here, in a
  // second, not after the one-process points have been measured for minutes and then lost.
  for (int R : o.ranks) {
    if (R == 1 || !o.proxy_layers.empty()) continue;
    const std::string probe = fmt::format("mpirun --oversubscribe --bind-to none -np {} /bin/true", R);
    const int st = std::system((probe + " > /dev/null 2>&1").c_str());
    BRIGADE_CHECK(st == 0, IoError,
                  "cannot launch {} ranks for the calibration: `{}` exited with {}; check that mpirun runs here "
                  "(as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1), or calibrate with --ranks 1",
                  R, probe, WIFEXITED(st) ? WEXITSTATUS(st) : st);
  }
  if (!o.proxy_layers.empty()) measure_proxies(base, o, rows, cores, c);
  for (int R : o.ranks) {
    if (!o.proxy_layers.empty()) break;
    if (R == 1) {
      measure_points(base, o, rows, 1, cores, *world, c);
      continue;
    }
    const std::string tmp = out + fmt::format(".ranks{}.json", R);
    // the child's points and the launch's log go beside the calibration (runs/ in a fresh checkout)
    if (const fs::path dir = fs::path(out).parent_path(); !dir.empty()) fs::create_directories(dir);
    const std::string log = out + fmt::format(".ranks{}.log", R);
    std::string cmd = fmt::format("mpirun --oversubscribe --bind-to none -np {} {} calibrate {}", R,
                                  shell_quote(binary), shell_quote(o.recipe));
    for (const auto& s : o.sets) cmd += " --set " + shell_quote(s);
    std::vector<std::string> rs;
    for (int64_t n : rows) rs.push_back(std::to_string(n));
    cmd += fmt::format(" --levels {} --recompute {} --rows {} --steps {} --warmup {} --child-out {} 2>&1 | tee {} >&2",
                       join(o.levels, ","), join(o.recompute, ","), join(rs, ","), o.steps, o.warmup, shell_quote(tmp),
                       shell_quote(log));
    fmt::print(stderr, "calibrate: launching {} ranks: {}\n", R, cmd);
    const int rc = std::system(("bash -o pipefail -c " + shell_quote(cmd)).c_str());
    BRIGADE_CHECK(rc == 0 && fs::exists(tmp), IoError,
                  "the {}-rank calibration failed (exit {}; log {}); check that mpirun runs here (as root: "
                  "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1), or calibrate with --ranks 1",
                  R, WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, log);
    std::ifstream in(tmp);
    const plan::Calibration part = [&] {
      nlohmann::json j = nlohmann::json::parse(in);
      // the child wrote only its measurements: give it the header the parser expects
      nlohmann::json whole = plan::calibration_to_json(c);
      whole["compute"] = j["compute"];
      whole["stages"] = j["stages"];
      whole["mesh"] = j["mesh"];
      whole["sync"] = j["sync"];
      whole["comm"] = j["comm"];
      return plan::calibration_from_json(whole, tmp);
    }();
    c.compute.insert(c.compute.end(), part.compute.begin(), part.compute.end());
    c.stages.insert(c.stages.end(), part.stages.begin(), part.stages.end());
    c.mesh.insert(c.mesh.end(), part.mesh.begin(), part.mesh.end());
    c.sync.insert(c.sync.end(), part.sync.begin(), part.sync.end());
    for (const auto& [k, v] : part.comm) c.comm[k] = v;
    fs::remove(tmp);
  }
  plan::write_calibration(out, c);
  fmt::print(
      stderr,
      "calibrate: wrote {} ({} compute points, {} stage points, {} mesh points, {} lockstep steps, interconnect for "
      "{} launch{}) in {:.0f} s\n",
      out, c.compute.size(), c.stages.size(), c.mesh.size(), c.sync.size(), c.comm.size(),
      c.comm.size() == 1 ? "" : "es",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  return 0;
}

plan::Calibration load_calibration_for(const Recipe& r, const std::string& path) {
  const std::string p = path.empty() ? calibration_path(r) : path;
  BRIGADE_CHECK(fs::exists(p), IoError,
                "no calibration at {}: measure this machine first with `brigade calibrate {}` (a few minutes), or "
                "give --calibration FILE",
                p, r.path);
  plan::Calibration c = plan::read_calibration(p);
  const std::string diff = plan::calibration_mismatch(c, r);
  BRIGADE_CHECK(diff.empty(), ConfigError,
                "{} was measured for another model or shape ({}); re-run `brigade calibrate {}` for this one", p, diff,
                r.path);
  for (const auto& [ranks, cc] : c.comm)
    if (cc.busy_fits.empty()) {
      fmt::print(stderr,
                 "plan: warning: {} timed the {}-rank collectives on idle cores only (it predates the timings beside "
                 "a compute load); plans whose threads fill the cores are priced with those idle times, which ran "
                 "2-5x low on this project's machine; re-run `brigade calibrate {}` to measure them\n",
                 p, ranks, r.path);
      break;
    }
  {
    bool launched = false;
    for (const plan::ComputePoint& pt : c.compute) launched = launched || pt.ranks > 1;
    if (launched && c.sync.empty())
      fmt::print(stderr,
                 "plan: warning: {} has no lockstep steps (it predates them): data- and tensor-parallel plans are "
                 "priced from ranks that each timed their own copy, which ran up to 15% fast on this project's "
                 "machine; re-run `brigade calibrate {}` to measure them\n",
                 p, r.path);
  }
  return c;
}

int run_plan(const PlanCommandOptions& o) {
  const Recipe r = train::load_recipe(o.recipe, o.sets);
  const plan::Calibration c = load_calibration_for(r, o.calibration);
  const plan::Cluster cl = o.cluster.empty() ? plan::local_cluster(c) : plan::read_cluster(o.cluster);
  if (o.predict) {
    fmt::print("{}\n", plan::prediction_json(plan::predict(r, c, cl), c.item).dump());
    return 0;
  }
  plan::PlanOptions po;
  po.max_ranks = o.max_ranks;
  const std::vector<plan::Prediction> ps = plan::enumerate_plans(r, c, cl, po);
  const plan::Prediction* best = nullptr;
  for (const auto& p : ps)
    if (p.feasible) {
      best = &p;
      break;
    }
  if (o.json) {
    for (const auto& p : ps) fmt::print("{}\n", plan::prediction_json(p, c.item).dump());
  } else {
    fmt::print("plans for {} on {} (calibrated {} on {}):\n\n{}", o.recipe, cl.name, c.created, c.host,
               plan::plan_table(ps, c.item, o.top));
  }
  if (!best) {
    // what the smallest plan would need
    const plan::Prediction* least = nullptr;
    for (const auto& p : ps)
      if (p.peak_total > 0 && (!least || p.peak_total < least->peak_total)) least = &p;
    throw ConfigError(fmt::format("no plan of {} fits {}{}", o.recipe, cl.name,
                                  least ? fmt::format(": the least memory any plan needs is {} per rank ({})",
                                                      train::format_bytes(least->peak_total), least->plan.label())
                                        : ""));
  }
  if (!o.apply.empty()) {
    const Recipe applied = plan::apply_plan(r, best->plan);
    data::write_file_atomic(
        o.apply,
        fmt::format("# brigade plan {}: {} (predicted {:.0f} {}/s, peak {})\n{}", o.recipe, best->plan.label(),
                    best->items_per_s, c.item, train::format_bytes(best->peak_total), train::recipe_to_toml(applied)));
    if (!o.json) fmt::print("\nwrote the best plan's recipe to {}\n", o.apply);
  }
  return 0;
}

int plan_for_training(const std::string& recipe, const std::vector<std::string>& sets, const std::string& calibration,
                      int argc, char** argv, std::vector<std::string>& plan_sets) {
  const Recipe r = train::load_recipe(recipe, sets);
  const plan::Calibration c = load_calibration_for(r, calibration);
  const plan::Cluster cl = plan::local_cluster(c);
  const int W = dist::Env::world_size();
  plan::PlanOptions po;
  if (W > 1) po.only_ranks = W;
  const std::vector<plan::Prediction> ps = plan::enumerate_plans(r, c, cl, po);
  BRIGADE_CHECK(!ps.empty() && ps.front().feasible, ConfigError,
                "--plan auto: no plan of {}{} fits this machine (`brigade plan {}` lists why)", recipe,
                W > 1 ? fmt::format(" on {} ranks", W) : "", recipe);
  const plan::Prediction& best = ps.front();
  if (dist::Env::world_rank() == 0)
    fmt::print(stderr, "plan: {} (predicted {:.0f} {}/s, peak {} per rank): --set {}\n", best.plan.label(),
               best.items_per_s, c.item, train::format_bytes(best.peak_total), join(best.plan.overrides(), " --set "));
  if (W == 1 && best.plan.ranks() > 1) {
    const std::string binary = brigade_binary({});
    std::string cmd =
        fmt::format("mpirun --oversubscribe --bind-to none -np {} {}", best.plan.ranks(), shell_quote(binary));
    for (int i = 1; i < argc; ++i) cmd += " " + shell_quote(argv[i]);
    fmt::print(stderr, "plan: launching {}\n", cmd);
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
  }
  plan_sets = best.plan.overrides();
  if (best.plan.level != "O0") plan_sets.push_back("precision.dtype=bf16");
  return -1;
}

}  // namespace brigade::cli
