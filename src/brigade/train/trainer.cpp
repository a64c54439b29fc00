// The one training loop; see trainer.h.
#include "brigade/train/trainer.h"

#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"
#include "brigade/data/sampler.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/dist/process_group.h"
#include "brigade/dist/watchdog.h"
#include "brigade/nn/layers.h"
#include "brigade/nn/lora.h"
#include "brigade/parallel/sync_batch_norm.h"
#include "brigade/train/accumulation.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/early_stop.h"
#include "brigade/train/executor.h"
#include "brigade/train/finetune.h"
#include "brigade/train/memory_plan.h"
#include "brigade/train/model_configs.h"
#include "brigade/train/registry.h"
#include "brigade/train/run_metrics.h"
#include "brigade/train/step_guard.h"

namespace brigade::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

nlohmann::json memory_json(const MemStats& m) {
  nlohmann::json j;
  for (int i = 0; i < kNumMemTags; ++i) {
    const std::string name(mem_tag_name(MemTag(i)));
    j["live"][name] = m.live[size_t(i)];
    j["peak"][name] = m.peak[size_t(i)];
  }
  j["peak_total"] = m.peak_total;
  return j;
}

// Settings that may differ on resume without changing the numbers beyond float rounding, as
// long as the global batch stays the same: how the batch is split.
bool is_layout_key(const std::string& key) {
  return key.rfind("parallel.", 0) == 0 || key == "train.batch_size" || key == "train.accumulation";
}

// Settings that change the numbers of a resumed run (everything except logging, evaluation,
// sampling, naming and the run length). layout = false: every other setting; layout = true: only
// the batch split (is_layout_key).
std::string resume_differences(const Recipe& saved, const Recipe& now, bool layout) {
  static const std::set<std::string> harmless{"run.name",
                                              "run.out_dir",
                                              "train.steps",
                                              "train.eval_every",
                                              "train.eval_batches",
                                              "train.log_every",
                                              "train.checkpoint_every",
                                              "train.early_stop",
                                              "train.patience",
                                              "train.min_delta",
                                              "train.eval_at_start",
                                              "train.nonfinite",
                                              "parallel.timeout_s"};
  const auto a = recipe_values(saved), b = recipe_values(now);
  std::string diff;
  for (const auto& [key, value] : b) {
    // memory.*: activation recompute leaves every number bitwise the same
    if (harmless.count(key) || key.rfind("sample.", 0) == 0 || key.rfind("memory.", 0) == 0) continue;
    if (is_layout_key(key) != layout) continue;
    auto it = a.find(key);
    if (it != a.end() && it->second != value)
      diff += fmt::format("{}{} ({} -> {})", diff.empty() ? "" : ", ", key, it->second, value);
  }
  return diff;
}

// Removes the evaluation record of `step` from metrics.jsonl (a run stopped there by --stop-at
// evaluated at its last step; an uninterrupted run does not, unless it is a periodic step).
void drop_eval_record(const fs::path& p, int64_t step) {
  std::ifstream in(p);
  if (!in) return;
  std::vector<std::string> keep;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("step", int64_t(-1)) == step && j.contains("val_loss")) continue;
    keep.push_back(line);
  }
  in.close();
  std::ofstream out(p, std::ios::trunc);
  for (const std::string& l : keep) out << l << '\n';
}

// Test hook (docs/distributed.md, docs/mixed-precision.md, docs/reliability.md):
// BRIGADE_FAULT="<rank>:<step>:<kind>[@<attempt>],..." (one or more, comma-separated).
// kill|raise|stop: that rank dies (SIGKILL), throws or stops (SIGSTOP) in the middle of that step,
// after its forward pass; kill_backward: SIGKILL after the step's first backward (gradient buckets
// may be in flight); kill_reduce: SIGKILL just before the step's gradient reduction (the other
// ranks wait in it); kill_save: SIGKILL inside the checkpoint written after that step (its files
// partly written: rank 0 before the commit, the others after their optimizer shard); inf_grad|nan_grad: that rank's
// first gradient element becomes +Inf / NaN once the step's gradients are complete (before loss-scaler unscaling and
// the optimizer); nan_loss / big_loss: that rank's loss of the step is NaN / 1000 times what it is (the gradients
// unchanged). "@n": only in attempt n (0 = the first start; each restart after a crash
// (BRIGADE_ATTEMPT, set by --max-restarts) and each rollback counts one); without it, in every
// attempt.
struct Fault {
  int rank = -1;
  int64_t step = -1;
  std::string kind;
  int attempt = -1;  // -1 = every attempt
};
std::vector<Fault> faults_from_env() {
  std::vector<Fault> out;
  const char* e = std::getenv("BRIGADE_FAULT");
  if (!e) return out;
  const std::string all(e);
  size_t pos = 0;
  while (pos <= all.size()) {
    size_t end = all.find(',', pos);
    if (end == std::string::npos) end = all.size();
    const std::string one = all.substr(pos, end - pos);
    Fault f;
    char kind[16] = {0};
    long long step = -1;
    int attempt = -1;
    const int n = std::sscanf(one.c_str(), "%d:%lld:%15[a-z_]@%d", &f.rank, &step, kind, &attempt);
    if (n >= 3) {
      f.step = step;
      f.kind = kind;
      f.attempt = n == 4 ? attempt : -1;
      out.push_back(f);
    }
    pos = end + 1;
  }
  return out;
}
// The attempt this process starts as: restarts by --max-restarts so far.
int attempt_from_env() {
  const char* e = std::getenv("BRIGADE_ATTEMPT");
  return e ? std::atoi(e) : 0;
}

// train.nonfinite = "rollback": thrown out of an attempt (every rank at the same step, the
// decision is on global values) for train() to resume from the last checkpoint.
struct RollbackRequest {
  int64_t step;
  std::string reason;
};
constexpr int kMaxRollbacks = 10;  // per process: beyond, the run stops (the checkpoint itself is bad)

// What an attempt after a rollback carries over.
struct Attempt {
  int index = 0;                  // for BRIGADE_FAULT's "@n"
  std::set<int64_t> rolled_back;  // steps whose batch the replay skips
  int64_t from_step = 0;          // the rollback that led here (0: none)
  std::string reason;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

Recipe deterministic_split(const Recipe& recipe) {
  if (!recipe.parallel.deterministic) return recipe;
  Recipe r = recipe;
  // validate_recipe checked: a power-of-two number of atoms of atom_rows rows per rank
  const int64_t rows = r.train.batch_size * r.train.accumulation;
  r.train.batch_size = r.parallel.atom_rows;
  r.train.accumulation = rows / r.parallel.atom_rows;
  return r;
}

TrainResult train(const Recipe& recipe, const TrainOptions& opts) {
  const Recipe r = deterministic_split(recipe);
  set_threads(r.run.threads);
  std::unique_ptr<Task> task = make_task(r, /*init_weights=*/!opts.resume);  // resume: the checkpoint's weights
  return train(r, opts, *task);
}

namespace {
TrainResult train_attempt(const Recipe& r, const TrainOptions& opts, Task& task, const Attempt& attempt);
}  // namespace

TrainResult train(const Recipe& r, const TrainOptions& opts, Task& task) {
  BRIGADE_CHECK(!r.parallel.deterministic || r.train.batch_size == r.parallel.atom_rows, InternalError,
                "train(): a deterministic recipe must be split into atoms first (deterministic_split), and the task "
                "made from the split recipe");
  // Hung collectives end the job naming the ranks that did not arrive (parallel.timeout_s)
  const std::string no_watchdog = dist::Watchdog::start(r.parallel.timeout_s);
  if (!no_watchdog.empty() && dist::Env::world_rank() == 0) fmt::print(stderr, "warning: {}\n", no_watchdog);
  struct StopWatchdog {
    ~StopWatchdog() { dist::Watchdog::stop(); }
  } stop_watchdog;
  Attempt attempt;
  attempt.index = attempt_from_env();
  TrainOptions o = opts;
  for (int rollbacks = 0;; ++rollbacks) {
    try {
      return train_attempt(r, o, task, attempt);
    } catch (const RollbackRequest& rb) {
      BRIGADE_CHECK(rollbacks < kMaxRollbacks, ValueError,
                    "{} at step {}, after {} rollbacks in this run: the checkpoint in {}/checkpoint itself leads to "
                    "non-finite steps; lower optim.lr or resume from an earlier copy of the run",
                    rb.reason, rb.step, kMaxRollbacks, r.run.out_dir);
      attempt.rolled_back.insert(rb.step);
      attempt.from_step = rb.step;
      attempt.reason = rb.reason;
      ++attempt.index;
      o.resume = true;  // the last checkpoint (one at step 0 is written for this)
    }
  }
}

namespace {

TrainResult train_attempt(const Recipe& r, const TrainOptions& opts, Task& task, const Attempt& attempt) {
  set_threads(r.run.threads);
  std::shared_ptr<dist::ProcessGroup> world = dist::ProcessGroup::world();
  const int rank = world->rank(), P = world->size();
  const bool lead = rank == 0;  // rank 0 alone prints, writes logs and the shared checkpoint files
  const bool model_parallel = r.parallel.tp > 1 || r.parallel.pp > 1;  // docs/model-parallel.md
  const int64_t ranks_needed = r.parallel.dp * r.parallel.tp * r.parallel.pp;
  if (model_parallel)
    BRIGADE_CHECK(P == ranks_needed, ConfigError,
                  "{}: parallel.dp = {} x parallel.tp = {} x parallel.pp = {} = {} ranks, but this job has {} "
                  "process{}; launch with `mpirun -np {} brigade train ...` or change parallel.dp / tp / pp",
                  r.path, r.parallel.dp, r.parallel.tp, r.parallel.pp, ranks_needed, P, P == 1 ? "" : "es",
                  ranks_needed);
  BRIGADE_CHECK(P == ranks_needed, ConfigError,
                "{}: parallel.dp = {} but this job has {} process{}; launch with `mpirun -np {} brigade train ...` "
                "or set parallel.dp = {}",
                r.path, r.parallel.dp, P, P == 1 ? "" : "es", r.parallel.dp, P);
  BRIGADE_CHECK(opts.stop_at == -1 || opts.stop_at >= 1, ConfigError, "--stop-at {}: must be a step >= 1",
                opts.stop_at);

  // Gradients travel on `world`; the trainer's own small messages (loss, stop flag, eval, memory)
  // on a duplicate, so the gradient group's byte counter measures the algorithm alone.
  std::shared_ptr<dist::ProcessGroup> ctrl = world->split(0, rank);
  const bool tty = lead && isatty(fileno(stderr)) && !opts.quiet;
  auto say = [&](const std::string& s) {
    if (lead && !opts.quiet) fmt::print(stderr, "{}\n", s);
  };
  const ModelEntry* entry = nullptr;
  for (const ModelEntry& e : model_registry())
    if (e.type == r.model.type) entry = &e;

  // ---- data (prepared on first use by rank 0) and the model's recompute plan
  task.open_data(*ctrl, say);
  if (opts.sample && task.can_sample()) task.check_sample();  // fail now, not after the run
  const std::vector<nn::Recompute> modes = apply_recompute(r, task);
  const ItemKind item = task.item_kind();
  const int64_t B = r.train.batch_size, A = r.train.accumulation, D = r.parallel.dp;
  AccumulationPolicy accumulation(r.train, B * D);  // micro-steps per step (static, ramp or noise_scale)

  const fs::path out_dir(r.run.out_dir);
  std::error_code ec;
  if (lead) fs::create_directories(out_dir, ec);
  BRIGADE_CHECK(!ec, IoError, "cannot create run.out_dir {}: {}; choose a writable folder", out_dir.string(),
                ec.message());
  ctrl->barrier();
  const std::string ckpt_dir = (out_dir / "checkpoint").string();
  const fs::path metrics_path = out_dir / "metrics.jsonl";
  const int64_t last_step = opts.stop_at >= 1 ? std::min(opts.stop_at, r.train.steps) : r.train.steps;
  TrainState state;
  state.last_val_loss = std::numeric_limits<double>::quiet_NaN();
  if (opts.resume) {
    BRIGADE_CHECK(checkpoint_exists(ckpt_dir), CheckpointError,
                  "--resume: no checkpoint in {}; run without --resume to start training", ckpt_dir);
    state = checkpoint_state(ckpt_dir);
    const Recipe saved = checkpoint_recipe(ckpt_dir);
    BRIGADE_CHECK(saved.model.type == r.model.type, CheckpointError,
                  "--resume: the checkpoint in {} holds a model.type = \"{}\" model, this recipe trains \"{}\"; "
                  "resume with the checkpoint's recipe or start a new run.out_dir",
                  ckpt_dir, saved.model.type, r.model.type);
    {  // the model's shape must be the checkpoint's (dropout may change: it holds no weights)
      ModelConfig a = saved.model, b = r.model;
      a.dropout = b.dropout = 0.0;
      BRIGADE_CHECK(a == b, CheckpointError,
                    "--resume: the checkpoint in {} holds a different model (model.* in its recipe.toml differs from "
                    "this recipe's); resume with the same model settings or start a new run.out_dir",
                    ckpt_dir);
    }
    const std::string diff = resume_differences(saved, r, /*layout=*/false);
    if (!diff.empty())
      say("warning: resuming with settings that differ from the checkpoint's recipe: " + diff +
          "; the continuation will not match an uninterrupted run");
    const std::string layout_diff = resume_differences(saved, r, /*layout=*/true);
    const int64_t saved_global = saved.train.batch_size * saved.train.accumulation * saved.parallel.dp;
    if (!layout_diff.empty())
      say(saved_global == B * A * D
              ? "resuming with a different batch split (" + layout_diff +
                    "): same global batch, so the continuation matches an uninterrupted run up to float rounding"
              : fmt::format("warning: the global batch changes from {} to {} rows ({}); the continuation will not "
                            "match an uninterrupted run",
                            saved_global, B * A * D, layout_diff));
    load_state((fs::path(ckpt_dir) / "model.safetensors").string(), task.state_dict());
    if (task.dropout_generator() && !state.rng_state.empty()) task.dropout_generator()->set_state(state.rng_state);
    accumulation.set_state(state.accumulation_state);
    BRIGADE_CHECK(state.step < last_step, ConfigError,
                  "nothing to train: the checkpoint in {} is at step {} and this run ends at step {}; raise "
                  "train.steps (e.g. --set train.steps={}) or --stop-at to continue",
                  ckpt_dir, state.step, last_step, r.train.steps + state.step);
  }

  // ---- early stopping (train.early_stop): its state travels in state.json, so --resume decides as an
  // uninterrupted run would; the best model so far is the checkpoint <out_dir>/best
  const std::string best_dir = (out_dir / "best").string();
  std::optional<EarlyStopper> stopper;
  if (!r.train.early_stop) state.early_stop = {};
  if (r.train.early_stop) {
    stopper.emplace(r.train.patience, r.train.min_delta, state.early_stop);
    BRIGADE_CHECK(!stopper->exhausted(), ConfigError,
                  "nothing to train: early stopping ended the run in {} at step {} (val loss did not improve by more "
                  "than train.min_delta = {} in {} evaluations since step {}); the best model is in {}; to train on, "
                  "raise train.patience or set train.early_stop=false",
                  r.run.out_dir, state.step, r.train.min_delta, state.early_stop.evals_since_best,
                  state.early_stop.best_step, best_dir);
  }
  if (lead && !opts.resume) fs::remove_all(best_dir, ec);  // a previous run's best model is not this run's

  // ---- how the step runs: this process's whole model, or cut by tensor / pipeline parallelism
  const double flops_per_item = task.flops_per_item();  // of the whole model, before any split
  const std::unique_ptr<StepExecutor> exec =
      model_parallel ? make_model_parallel_executor(r, task, world, say) : make_local_executor(task, world);
  const Shard shard = exec->shard();

  // ---- data parallelism (one rank: the same code, collectives are no-ops) + optimizer
  parallel::DataParallelOptions dpo;
  dpo.zero = int(r.parallel.zero);
  dpo.algo = dist::allreduce_algo_from_name(r.parallel.allreduce);
  dpo.bucket_bytes = int64_t(r.parallel.bucket_mb * double(1 << 20));
  dpo.overlap = r.parallel.overlap;
  dpo.accumulation = A;
  dpo.communicate_in_backward = exec->communicate_in_backward();
  const bool deterministic = r.parallel.deterministic;  // micro-steps are atoms (deterministic_split)
  BRIGADE_CHECK(!deterministic || task.rows_independent(), ConfigError,
                "{}: parallel.deterministic = true cannot split model.type = \"{}\": its loss couples the whole "
                "global batch (contrastive), so it has no per-atom gradients; set parallel.deterministic = false",
                r.path, r.model.type);
  dpo.deterministic = deterministic;
  // deterministic: the ZeRO-3 units for every stage, so the flat layout (and with it the norm's
  // blocks) is the same whatever the stage (some tasks keep one unit below ZeRO-3)
  parallel::DataParallel dp(exec->units(deterministic ? 3 : dpo.zero), exec->dp_group(), dpo);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, dp.optimizer_params(), dp);
  // BatchNorm over the data-parallel group (parallel.sync_batchnorm): its allreduces go through the
  // buckets' queue, in order with them
  if (r.parallel.sync_batchnorm) parallel::sync_batch_norms(task.model(), exec->dp_group(), dp.comm_queue());
  std::vector<FlatLayoutEntry> layout;
  for (const auto& e : dp.layout()) layout.push_back({e.name, e.offset, e.numel});
  if (opts.resume) {
    // the optimizer's own step count (bias corrections): loss scaling may have skipped updates
    const int64_t opt_steps = state.optimizer_steps >= 0 ? state.optimizer_steps : state.step;
    const Recipe saved = checkpoint_recipe(ckpt_dir);
    const bool saved_mp = saved.parallel.tp > 1 || saved.parallel.pp > 1;
    BRIGADE_CHECK(saved_mp == model_parallel, CheckpointError,
                  "--resume: the checkpoint in {} was saved by a run {} model parallelism, this one runs {} it; the "
                  "optimizer state is kept per rank of the mesh, so resume with the checkpoint's parallel.tp and "
                  "parallel.pp (its model.safetensors loads anywhere, e.g. for `brigade eval`)",
                  ckpt_dir, saved_mp ? "with" : "without", model_parallel ? "with" : "without");
    if (model_parallel) {
      exec->read_optimizer(ckpt_dir, *opt, opt_steps);
    } else if (dpo.zero == 0 && !checkpoint_is_sharded(ckpt_dir)) {
      load_optimizer_state(ckpt_dir, *opt, opt_steps);
    } else if (dpo.zero == 0) {  // a ZeRO checkpoint resumed without ZeRO: re-assemble per parameter
      std::map<std::string, Shape> shapes;
      for (auto& [name, p] : task.model().named_parameters()) shapes[name] = p.shape();
      std::map<std::string, Tensor> named;
      for (auto& [kind, flat] : read_optimizer_flat(ckpt_dir, layout, 0, dp.flat_numel()))
        for (const auto& e : layout)
          named.emplace(kind + "." + e.name, flat.narrow(0, e.offset, e.numel).view(shapes.at(e.name)));
      opt->load_state(named, opt_steps);
    } else {
      dp.load_shard_state(read_optimizer_flat(ckpt_dir, layout, dp.shard_begin(), dp.shard_end()),
                          opt->state_tensors());
      opt->set_steps(opt_steps);
    }
    if (lead) {
      truncate_metrics(metrics_path.string(), state.step);
      // The final evaluation of a run stopped at this step (--stop-at) is not one the
      // uninterrupted run makes, unless the step is a periodic evaluation step.
      if (r.train.eval_every == 0 || state.step % r.train.eval_every != 0) drop_eval_record(metrics_path, state.step);
    }
    say(fmt::format("resumed from {} at step {}", ckpt_dir, state.step));
  } else if (lead) {
    std::ofstream(metrics_path, std::ios::trunc);
  }
  // ---- mixed precision (docs/mixed-precision.md): the forward runs under the level's autocast
  // policy; the loss scaler's state travels in state.json
  const amp::Policy policy = precision_policy(r.precision);
  amp::LossScaler scaler(loss_scaler_options(r.precision));
  if (opts.resume) scaler.set_state(state.scaler_state);
  if (policy.level == amp::Level::O3) round_state_to_low(dp, *opt, policy.low);  // no fp32 master copy
  // Non-finite and spiking steps (train.nonfinite, train.spike_*): decided on the global loss
  // and gradient norm, so every rank agrees; its state travels in state.json.
  StepGuard guard(r.train);
  guard.set_state(state.guard_state);
  for (int64_t s : attempt.rolled_back) guard.mark_rolled_back(s);

  const optim::Schedule sched = make_schedule(r);
  std::ofstream metrics;
  if (lead) {
    metrics.open(metrics_path, std::ios::app);
    BRIGADE_CHECK(metrics.good(), IoError, "cannot write {}: check the run.out_dir permissions", metrics_path.string());
  }

  // MFU is measured against the GEMM ceiling of the dtype the GEMMs run in
  const DType gemm_dtype = policy.level == amp::Level::O0 ? DType::F32 : policy.low;
  double peak = measure_gemm_peak_gflops(gemm_dtype);  // per rank, measured by all ranks at once
  ctrl->allreduce(&peak, 1);                           // the job's ceiling: the sum over ranks
  say(fmt::format("model: {} | data: {} | {} threads, {} GEMM peak {:.0f} GFLOP/s", task.describe(),
                  task.data_summary(), omp_get_max_threads(), dtype_name(gemm_dtype), peak));
  if (!task.finetune_line.empty()) say("finetune: " + task.finetune_line);
  if (policy.level != amp::Level::O0 || scaler.enabled())
    say(fmt::format("precision: {} {} | loss scaling {}{}", r.precision.level,
                    policy.level == amp::Level::O0 ? "fp32" : r.precision.dtype, amp::scale_mode_name(scaler.mode()),
                    scaler.enabled() ? fmt::format(" (scale {:g})", scaler.scale()) : std::string()));
  if (deterministic)
    say(
        fmt::format("parallel: dp {} x {} atoms of {} row{} = {} rows per step | ZeRO-{} | deterministic: gradients "
                    "summed in a fixed tree over the atoms (bitwise the same for every dp, ZeRO stage and split)",
                    D, A, B, B == 1 ? "" : "s", B * A * D, dpo.zero));
  else if (D > 1 || A > 1)
    say(
        fmt::format("parallel: dp {} x accumulation {} x batch {} = {} rows per step | ZeRO-{} | allreduce {} | "
                    "buckets {} MiB | overlap {}",
                    D, A, B, B * A * D, dpo.zero, r.parallel.allreduce, r.parallel.bucket_mb,
                    r.parallel.overlap && !model_parallel ? "on" : "off"));
  if (model_parallel) say(exec->describe());
  if (r.memory.recompute != "none") {
    std::string blocks;
    for (nn::Recompute m : modes) blocks += models::recompute_name(m)[0];
    auto* gpt = dynamic_cast<models::GPT*>(&task.model());
    say(
        fmt::format("memory: recompute {} (blocks {}: f = full, s = selective, n = none) | estimated activation peak "
                    "{}",
                    r.memory.recompute, blocks,
                    gpt ? format_bytes(models::estimate_activation_peak(gpt->config(), B, r.train.seq_len, modes))
                        : std::string("(not estimated for this model: see --dry-run)")));
  }

  // Evaluation: this replica's part of the task's batches, through the executor (a pipeline
  // scores on its last stage), summed over the job (one reporting rank per replica).
  const Task::Scorer scorer = exec->scorer(task, policy);
  auto evaluate = [&](bool final) {
    autograd::NoGradGuard ng;
    task.model().train(false);
    dp.gather_persistent();
    Metrics m = task.evaluate(final, shard, [&](const Batch& b, Metrics& into) {
      if (exec->reports()) {
        scorer(b, into);
      } else {
        Metrics dropped;  // the pipeline's other ranks take part in the forward; their sums do not count
        scorer(b, dropped);
      }
    });
    dp.release_persistent();
    task.model().train(true);
    m.allreduce(*ctrl, task.eval_metric_keys());
    return m;
  };
  // BatchNorm running statistics: rank 0's on every rank, as torch's DDP broadcasts them.
  const nn::NamedTensors buffers = task.buffers();
  auto sync_buffers = [&]() {
    if (P == 1 || r.parallel.sync_batchnorm) return;  // synchronised: equal on every rank already
    for (auto& [name, t] : buffers) world->broadcast(t.raw_data(), t.nbytes(), 0);
  };

  const std::string tokenizer_dir = task.tokenizer_dir();
  const std::vector<Fault> faults = faults_from_env();
  // the fault of `kind` (one of kinds) at this rank, step and attempt, if any
  auto fault_at = [&](int64_t step1, std::initializer_list<const char*> kinds) -> const Fault* {
    for (const Fault& f : faults)
      if (f.rank == rank && f.step == step1 && (f.attempt < 0 || f.attempt == attempt.index))
        for (const char* k : kinds)
          if (f.kind == k) return &f;
    return nullptr;
  };
  auto save = [&](const std::string& dir) {  // collective: every rank calls it; dir = ckpt_dir or best_dir
    state.rng_state = task.dropout_generator() ? task.dropout_generator()->state() : std::string();
    state.accumulation_state = accumulation.state();
    state.scaler_state = scaler.state();
    state.guard_state = guard.state();
    state.optimizer_steps = opt->steps();
    const std::string tmp = dir + ".tmp";
    const bool kill_in_save = fault_at(state.step, {"kill_save"}) != nullptr;
    if (exec->holds_shards()) {  // the whole model gathered on rank 0 (HF names); the optimizer state per rank of the
                                 // mesh
      const nn::NamedTensors whole = exec->gather_full();
      if (lead) begin_checkpoint(dir);
      ctrl->barrier();
      exec->write_optimizer(tmp, *opt);
      ctrl->barrier();
      if (lead) {
        write_checkpoint_files(tmp, whole, nullptr, state, r, tokenizer_dir);
        commit_checkpoint(dir);
      }
      ctrl->barrier();
      return;
    }
    // Rank 0 copies every parameter (ZeRO-3: one gathered unit at a time, so no rank ever holds
    // the whole model as parameters; the copies are checkpoint staging, tagged "other").
    std::map<std::string, Tensor> copies;
    dp.for_each_unit_gathered([&](const nn::NamedTensors& ps) {
      if (!lead) return;
      MemTagScope tag(MemTag::Other);
      for (auto& [name, p] : ps) copies[name] = dpo.zero == 3 ? p.clone() : p;
    });
    nn::NamedTensors full;
    if (lead) {
      for (auto& [name, p] : task.model().named_parameters())  // a frozen parameter is in no unit: the model's own
        full.emplace_back(name, p.requires_grad() ? copies.at(name) : p);
      for (auto& b : buffers) full.push_back(b);
    }
    if (lead) begin_checkpoint(dir);
    ctrl->barrier();
    const std::map<std::string, Tensor> zshard = [&] {
      MemTagScope tag(MemTag::Other);  // checkpoint staging, as the parameter copies above
      return dpo.zero >= 1 ? dp.shard_state(opt->state_tensors()) : std::map<std::string, Tensor>();
    }();
    if (dpo.zero >= 1) write_optimizer_shard(tmp, rank, P, dp.shard_begin(), dp.shard_end(), zshard);
    if (kill_in_save && !lead) ::raise(SIGKILL);
    ctrl->barrier();
    if (lead) {
      write_checkpoint_files(tmp, full, dpo.zero == 0 ? opt.get() : nullptr, state, r, tokenizer_dir);
      if (kill_in_save) ::raise(SIGKILL);  // the checkpoint's files written, not committed
      // a LoRA run's adapters also as PEFT saves them, for peft.PeftModel.from_pretrained
      if (r.finetune.method == "lora")
        save_lora_adapter(r, full, nn::lora_fan_in_fan_out(task.model()), (fs::path(tmp) / "adapter").string());
      if (dpo.zero >= 1) {
        std::vector<std::pair<int64_t, int64_t>> ranges;
        for (int p = 0; p < P; ++p) ranges.push_back(dp.shard_range(p));
        std::vector<std::string> kinds;
        for (auto& [kind, t] : zshard) kinds.push_back(kind);
        write_optimizer_index(tmp, P, dp.flat_numel(), layout, ranges, kinds);
      }
      commit_checkpoint(dir);
    }
    ctrl->barrier();
  };

  std::vector<double> step_times, step_rates, comm_waits;
  double last_loss = 0.0;
  TrainResult res;
  res.item = item;
  const auto t_start = Clock::now();
  const int64_t start_step = state.step;
  Allocator::instance().reset_peak();
  task.model().train(true);
  StopSignalGuard stop_guard;
  bool interrupted = false, stopped_early = false;
  int64_t logged_skipped = scaler.skipped(), logged_overflows = scaler.overflows();
  const std::vector<std::string> train_keys = task.train_metric_keys();
  const bool whole_step = task.needs_whole_step();
  auto after_update = [&task](const nn::NamedTensors& master) { task.after_update(master); };
  // The model as it starts (a pretrained one's numbers before fine-tuning): the whole val set, as
  // the final evaluation sees it, recorded at step 0; not an early-stopping observation.
  if (r.train.eval_at_start && state.step == 0 && !opts.resume) {
    const Metrics ev = evaluate(/*final=*/true);
    if (lead) {
      nlohmann::json j{{"step", 0}};
      const nlohmann::json fields = task.eval_fields(ev);
      for (auto& [k, v] : fields.items()) j[k] = v;
      metrics << j.dump() << '\n';
      metrics.flush();
    }
    say(fmt::format("step {:>5}/{} | {} (before training)", 0, last_step, task.eval_line(ev)));
  }
  if (attempt.from_step > 0) {  // this attempt replays from the last checkpoint after a rollback
    if (lead) {
      metrics << nlohmann::json{{"step", state.step}, {"rollback_from", attempt.from_step}, {"reason", attempt.reason}}
                     .dump()
              << '\n';
      metrics.flush();
    }
    say(fmt::format("step {}: {}: rolled back to the checkpoint at step {}; the replay skips step {}'s batch",
                    attempt.from_step, attempt.reason, state.step, attempt.from_step));
  } else if (r.train.nonfinite == "rollback" && !opts.resume) {
    save(ckpt_dir);  // a checkpoint to go back to before the first periodic one
  }
  for (int64_t step = state.step; step < last_step; ++step) {
    const auto t0 = Clock::now();
    // Dropout masks: one stream per replica, re-seeded from (seed, step, replica) every step, so a
    // run resumes exactly at any dp size without saving per-rank generator states.
    if (Generator* g = task.dropout_generator())
      g->manual_seed(data::splitmix64(r.run.seed ^ data::splitmix64((uint64_t(step) << 16) + uint64_t(shard.rank))));
    const int64_t acc = accumulation.at(step);
    const int64_t items_per_step = B * acc * D * task.items_per_row();  // this step's global batch
    dp.set_accumulation(acc);
    dp.reset_stats();
    dp.begin_step();
    // Micro-batches are drawn as they run, or all first when the task needs the whole step
    // (counts that differ between micro-batches, or a loss over the whole global batch).
    std::vector<Batch> micro;
    // Deterministic mode: this replica's atoms are the contiguous block [rank x acc, +acc) of the
    // step's D x acc atoms (an aligned subtree of the canonical sum), drawn as atom = micro-batch.
    const auto draw = [&](int64_t m) {
      return deterministic ? task.batch(step, int64_t(shard.rank) * acc + m, D * acc, Shard{0, 1, shard.group})
                           : task.batch(step, m, acc, shard);
    };
    std::vector<double> atom_loss;
    double global_count = double(B * acc * D);  // equal-count tasks: rows; otherwise measured
    if (whole_step) {
      double local = 0.0;
      for (int64_t m = 0; m < acc; ++m) {
        micro.push_back(draw(m));
        local += double(micro.back().count);
      }
      // every rank of a replica holds the same rows: the sum over the job counts each replica's
      // rows tp x pp times
      global_count = local;
      ctrl->allreduce(&global_count, 1);
      global_count /= double(ranks_needed / D);
      amp::AutocastScope autocast(policy);
      task.begin_step(micro, shard);
    }
    Metrics train_metrics;
    double loss_sum = 0.0, small_sq = 0.0;
    for (int64_t m = 0; m < acc; ++m) {
      if (m == 1 && accumulation.measures_noise()) {
        // |G_small|^2: the gradient of one micro-batch (B rows), averaged over the ranks
        small_sq = dp.local_grad_sq();
        ctrl->allreduce(&small_sq, 1);
        small_sq /= double(D) * scaler.scale() * scaler.scale();  // the loss scale is still in these gradients
      }
      dp.begin_micro_step(m);
      const Batch b = whole_step ? micro[size_t(m)] : draw(m);
      if (Generator* g = deterministic ? task.dropout_generator() : nullptr)  // masks follow the atom, not the rank
        g->manual_seed(data::splitmix64(
            r.run.seed ^ data::splitmix64((uint64_t(step) << 24) + uint64_t(int64_t(shard.rank) * acc + m))));
      // The micro-batch's share of the global batch's mean: 1 when every micro-batch holds the
      // same number of items.
      const double weight = whole_step ? double(b.count) * double(acc * D) / global_count : 1.0;
      const double factor = (scaler.enabled() ? scaler.scale() : 1.0) * weight;
      const double micro_loss = exec->train_micro(task, b, m, factor, weight, policy, train_metrics, [&] {
        if (const Fault* f = fault_at(step + 1, {"kill", "raise", "stop"})) {
          if (f->kind == "kill") ::raise(SIGKILL);
          if (f->kind == "stop") ::raise(SIGSTOP);  // a hung rank, for the watchdog
          throw ValueError(
              fmt::format("injected fault at step {} (BRIGADE_FAULT={}:{}:{})", step + 1, f->rank, f->step, f->kind));
        }
      });
      if (m == 0 && fault_at(step + 1, {"kill_backward"})) ::raise(SIGKILL);
      loss_sum += micro_loss;
      if (deterministic) atom_loss.push_back(micro_loss);
    }
    micro.clear();
    if (fault_at(step + 1, {"nan_loss"})) loss_sum = std::numeric_limits<double>::quiet_NaN();
    if (fault_at(step + 1, {"big_loss"})) loss_sum *= 1000.0;  // an outlier for spike detection
    if (deterministic && !atom_loss.empty()) {
      if (fault_at(step + 1, {"nan_loss"})) atom_loss[0] = std::numeric_limits<double>::quiet_NaN();
      if (fault_at(step + 1, {"big_loss"}))
        for (double& v : atom_loss) v *= 1000.0;
    }
    exec->finish_backward();  // e.g. the tied embedding's two halves, before the dp reduction
    if (fault_at(step + 1, {"kill_reduce"})) ::raise(SIGKILL);
    dp.finish_gradients();
    double agreed[2] = {loss_sum / double(acc), stop_requested() ? 1.0 : 0.0};
    ctrl->allreduce(agreed, 1);          // the global batch's mean loss (x replicas)
    ctrl->allreduce_max(agreed + 1, 1);  // stop when any rank was asked to
    last_loss = agreed[0] / double(D);   // one reporting rank per replica
    if (deterministic) {
      // every atom's loss in its slot (an allreduce over zeros elsewhere is an exact gather), summed
      // in the atoms' order: the same number whatever the layout
      std::vector<double> all(size_t(D * acc), 0.0);
      for (int64_t m = 0; m < acc; ++m) all[size_t(int64_t(shard.rank) * acc + m)] = atom_loss[size_t(m)];
      ctrl->allreduce(all.data(), int64_t(all.size()));
      double sum = 0.0;
      for (double v : all) sum += v;
      last_loss = sum / double(D * acc);
    }
    if (!train_keys.empty()) {
      if (!exec->reports()) train_metrics = Metrics();
      train_metrics.allreduce(*ctrl, train_keys);
    }
    StepGuard::Verdict verdict = guard.check_loss(step + 1, last_loss);
    GradientStep gs;
    if (verdict.action == StepGuard::Action::Apply) {
      if (const Fault* f = fault_at(step + 1, {"inf_grad", "nan_grad"})) {
        for (auto& [name, p] : dp.optimizer_params())
          if (p.grad().defined() && p.grad().numel() > 0) {
            p.grad().data<float>()[0] = f->kind == "inf_grad" ? std::numeric_limits<float>::infinity()
                                                              : std::numeric_limits<float>::quiet_NaN();
            break;
          }
      }
      gs = apply_gradients(dp, *opt, scaler, policy, r.train, sched.lr_at(step), *ctrl, exec->clip(dp, *ctrl),
                           after_update, [&](double norm) {
                             verdict = guard.check_update(step + 1, last_loss, norm);
                             return verdict.action == StepGuard::Action::Apply;
                           });
    }
    if (verdict.action == StepGuard::Action::Stop)
      throw ValueError(fmt::format(
          "{} at step {}; the run diverged: lower optim.lr, keep train.grad_clip on, set train.nonfinite = "
          "\"skip\" or \"rollback\", or resume from the last checkpoint in {}{}",
          verdict.reason, step + 1, ckpt_dir,
          policy.level != amp::Level::O0 && policy.low == DType::F16
              ? " (under fp16 the forward itself may have overflowed 65504, which loss scaling cannot fix: try "
                "precision.dtype = \"bf16\")"
              : ""));
    if (verdict.action == StepGuard::Action::Rollback) {
      dp.gather_all();  // ZeRO-3: the parameters whole again, for the checkpoint to load into
      if (tty) fmt::print(stderr, "\n");
      throw RollbackRequest{step + 1, verdict.reason};
    }
    if (verdict.action == StepGuard::Action::Skip) {
      if (lead) {
        metrics << nlohmann::json{{"step", step + 1}, {"skipped_update", verdict.reason}}.dump() << '\n';
        metrics.flush();
      }
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("step {}: update skipped: {}", step + 1, verdict.reason));
    }
    const double lr = sched.lr_at(step);
    sync_buffers();
    const double norm = gs.grad_norm;
    if (verdict.action == StepGuard::Action::Apply && !gs.skipped && accumulation.measures_noise())
      accumulation.observe(small_sq, B, norm * norm, B * acc * D);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    step_times.push_back(dt);
    comm_waits.push_back(dp.comm_wait_seconds());
    state.step = step + 1;
    state.tokens_seen += items_per_step;
    const double rate = double(items_per_step) / dt;
    step_rates.push_back(rate);
    const double mfu = rate * flops_per_item / (peak * 1e9);
    const bool stop_signal = agreed[1] > 0.0 && state.step < last_step;

    const bool log_now =
        r.train.log_every > 0 && (state.step % r.train.log_every == 0 || state.step == last_step || stop_signal);
    if (log_now && lead) {
      nlohmann::json j{{"step", state.step},
                       {"loss", last_loss},
                       {"lr", lr},
                       {"grad_norm", norm},
                       {item_rate_key(item), rate},
                       {"mfu", mfu},
                       {items_seen_key(item), state.tokens_seen},
                       {"global_batch", B * acc * D},
                       {"accumulation", acc},
                       {"mem_peak", memory_json(Allocator::instance().stats())["peak"]},
                       {"mem_live", memory_json(Allocator::instance().stats())["live"]}};
      const nlohmann::json extras = task.train_fields(train_metrics, state.step);
      for (auto& [k, v] : extras.items()) j[k] = v;
      if (accumulation.measures_noise()) j["noise_scale"] = accumulation.noise_scale();
      if (scaler.enabled()) {  // per log interval, plus the run's totals
        j["loss_scale"] = scaler.scale();
        j["skipped"] = scaler.skipped() - logged_skipped;
        j["overflows"] = scaler.overflows() - logged_overflows;
        j["skipped_total"] = scaler.skipped();
      }
      if (P > 1) {
        j["comm_wait_s"] = dp.comm_wait_seconds();
        j["comm_task_s"] = dp.comm_task_wall_seconds();
        j["comm_cpu_s"] = dp.comm_task_cpu_seconds();
        j["bytes_sent"] = dp.bytes_sent();
      }
      metrics << j.dump() << '\n';
      metrics.flush();
    }
    if (log_now) {
      logged_skipped = scaler.skipped();
      logged_overflows = scaler.overflows();
    }
    if (!opts.quiet && lead) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double eta = elapsed / double(state.step - start_step) * double(last_step - state.step);
      std::string line = fmt::format("step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | {:.0f} {} | MFU {:.1f}% | ETA {}",
                                     state.step, last_step, last_loss, task.train_progress(train_metrics, state.step),
                                     lr, rate, item_rate_unit(item), 100.0 * mfu, fmt_duration(eta));
      if (scaler.enabled())
        line += fmt::format(" | scale {:g}{}", scaler.scale(),
                            scaler.skipped() ? fmt::format(" ({} skipped)", scaler.skipped()) : std::string());
      if (tty)
        fmt::print(stderr, "\r{}\033[K", line);
      else if (log_now)
        fmt::print(stderr, "{}\n", line);
    }
    const bool eval_now = r.train.eval_every > 0 && state.step % r.train.eval_every == 0;
    if (eval_now || state.step == last_step) {
      // The run's end evaluates everything (a test set whole, where periodic evaluations take a
      // subset); a --stop-at step that is also a periodic step evaluates as the periodic one, so a
      // run split there and resumed keeps the uninterrupted run's records.
      const bool final = state.step == r.train.steps || !eval_now;
      const Metrics ev = evaluate(final);
      const nlohmann::json fields = task.eval_fields(ev);
      state.last_val_loss = fields.at("val_loss").get<double>();
      res.evaluated = true;
      res.eval = ev;
      res.eval_fields = fields;
      if (lead) {
        nlohmann::json j{{"step", state.step}};
        for (auto& [k, v] : fields.items()) j[k] = v;
        metrics << j.dump() << '\n';
        metrics.flush();
      }
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("step {:>5}/{} | {}", state.step, last_step, task.eval_line(ev)));
      // Early stopping counts the periodic evaluations and the one at train.steps, not one at a
      // --stop-at step, so a run split by --stop-at/--resume stops where an uninterrupted one does.
      if (stopper && (eval_now || state.step == r.train.steps)) {
        const EarlyStopper::Verdict verdict = stopper->observe(state.step, state.last_val_loss);
        state.early_stop = stopper->state();
        if (verdict == EarlyStopper::Verdict::Improved) save(best_dir);
        stopped_early = verdict == EarlyStopper::Verdict::Stop && state.step < r.train.steps;
      }
    }
    interrupted = stop_signal && !stopped_early;
    const bool ckpt_now = r.train.checkpoint_every > 0 && state.step % r.train.checkpoint_every == 0;
    if (ckpt_now || state.step == last_step || interrupted || stopped_early) save(ckpt_dir);
    if (stopped_early) {
      const EarlyStopState& es = state.early_stop;
      if (lead) {
        metrics << nlohmann::json{{"step", state.step},
                                  {"early_stop", true},
                                  {"best_step", es.best_step},
                                  {"best_val_loss", es.best_val_loss}}
                       .dump()
                << '\n';
        metrics.flush();
      }
      say(
          fmt::format("early stop at step {}: val loss did not improve by more than {} in {} evaluations; best val "
                      "loss {:.4f} at step {}, kept in {}",
                      state.step, r.train.min_delta, es.evals_since_best, es.best_val_loss, es.best_step, best_dir));
      break;
    }
    if (interrupted) {
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format(
          "interrupted at step {}: checkpoint saved in {} (no evaluation at this step: `brigade eval --ckpt "
          "{}` evaluates it); continue with --resume",
          state.step, ckpt_dir, ckpt_dir));
      break;
    }
  }

  res.interrupted = interrupted;
  res.steps = state.step;
  res.last_loss = last_loss;
  res.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (res.evaluated) {
    res.val_loss = res.eval_fields.at("val_loss").get<double>();
    res.eval_line = task.eval_line(res.eval);
    res.final_line = task.final_line(res.eval);
  }
  if (!step_times.empty()) {
    res.items_per_s = median(step_rates);
    res.comm_wait_share = median(comm_waits) / median(step_times);
  }
  res.skipped_steps = scaler.skipped();
  res.updates_skipped = guard.skipped();
  res.rollbacks = int64_t(attempt.rolled_back.size());
  res.loss_scale = scaler.scale();
  res.memory = Allocator::instance().stats();
  // The peak again, after the run: on a shared machine one measurement can come out low (MFU over
  // 100% against it), so the run's MFU is against the higher of the two. Measured after the memory
  // statistics are taken, so its matrices are not counted in them.
  if (!step_times.empty()) {
    double again = measure_gemm_peak_gflops(gemm_dtype);
    ctrl->allreduce(&again, 1);
    peak = std::max(peak, again);
  }
  res.gemm_peak_gflops = peak;
  res.mfu = res.items_per_s * flops_per_item / (peak * 1e9);
  res.checkpoint_dir = ckpt_dir;
  res.early_stopped = stopped_early;
  if (stopper && state.early_stop.best_step > 0) {
    res.best_step = state.early_stop.best_step;
    res.best_val_loss = state.early_stop.best_val_loss;
    res.best_dir = best_dir;
  }
  const bool predicted = entry && memory_from_formulas(r) && !model_parallel;  // the formulas of memory_plan.h
  {
    // Every rank's memory by tag and its allocator's peak of the sum (the rank the planner calls
    // the busiest), gathered to rank 0 (a sum of vectors that are zero but for one slot).
    const size_t per = 2 * kNumMemTags + 1;
    std::vector<double> all(size_t(P) * per, 0.0);
    for (int i = 0; i < kNumMemTags; ++i) {
      all[size_t(rank) * per + size_t(i)] = double(res.memory.live[size_t(i)]);
      all[size_t(rank) * per + kNumMemTags + size_t(i)] = double(res.memory.peak[size_t(i)]);
    }
    all[size_t(rank) * per + 2 * kNumMemTags] = double(res.memory.peak_total);
    ctrl->allreduce(all.data(), int64_t(all.size()));
    if (lead) {
      nlohmann::json mj = memory_json(res.memory);
      mj["model"] = r.model.type;
      mj["dp"] = D;
      mj["tp"] = r.parallel.tp;
      mj["pp"] = r.parallel.pp;
      mj["zero"] = dpo.zero;
      mj["precision"] = {{"level", r.precision.level},
                         {"dtype", policy.level == amp::Level::O0 ? "f32" : r.precision.dtype}};
      if (predicted) mj["predicted"] = prediction_json(predict_memory(r, 0), /*formulas=*/true);
      for (int p = 0; p < P; ++p) {
        nlohmann::json rj;
        for (int i = 0; i < kNumMemTags; ++i) {
          const std::string name(mem_tag_name(MemTag(i)));
          rj["live"][name] = int64_t(all[size_t(p) * per + size_t(i)]);
          rj["peak"][name] = int64_t(all[size_t(p) * per + kNumMemTags + size_t(i)]);
        }
        rj["peak_total"] = int64_t(all[size_t(p) * per + 2 * kNumMemTags]);
        if (predicted) rj["predicted"] = prediction_json(predict_memory(r, p), /*formulas=*/false);
        mj["ranks"].push_back(rj);
      }
      std::ofstream(out_dir / "memory.json") << mj.dump(2) << '\n';
    }
  }
  if (lead) {  // loss.svg beside metrics.jsonl: the whole run's curves (a resumed run's included)
    metrics.flush();
    try {
      write_loss_plot(read_run_metrics(metrics_path.string()), (out_dir / "loss.svg").string(),
                      fmt::format("{} ({}): loss", r.run.name, r.model.type));
    } catch (const Error& e) {
      say(fmt::format("warning: could not draw {}: {}", (out_dir / "loss.svg").string(), e.what()));
    }
  }
  exec->report(out_dir.string(), r.run.name, say);  // collective (a pipeline's measured timeline)
  if (opts.sample && !interrupted && task.can_sample()) {
    if (exec->holds_shards()) {
      const nn::NamedTensors whole = exec->gather_full();  // collective
      if (lead) res.sample = task.sample(&whole);
    } else {
      dp.gather_all();  // collective
      if (lead) res.sample = task.sample(nullptr);
    }
  }
  if (!opts.quiet && lead) {
    const std::string evaluation = res.evaluated ? res.eval_line : std::string("no evaluation yet");
    if (!predicted) {  // no prediction in memory.json: measured, rank 0
      auto m = [&](MemTag t) {
        return fmt::format("{} {}", mem_tag_name(t), format_bytes(res.memory.peak[size_t(t)]));
      };
      say(
          fmt::format("done: {} steps | final loss {:.4f} | {} | {:.0f} {} (median) | MFU {:.1f}% of {:.0f} GFLOP/s | "
                      "peak memory of rank 0 {} ({}, {}, {}, {}, {}; every rank in memory.json)",
                      res.steps, res.last_loss, evaluation, res.items_per_s, item_rate_unit(item), 100.0 * res.mfu,
                      peak, format_bytes(res.memory.peak_total), m(MemTag::Params), m(MemTag::Grads),
                      m(MemTag::Optimizer), m(MemTag::Activations), m(MemTag::Workspace)));
    } else {
      const MemoryPrediction pred = predict_memory(r, 0);
      auto vs = [&](MemTag t) {
        const PredictedCategory& c = pred[t];
        const std::string p =
            c.peak_low == c.peak ? format_bytes(c.peak) : format_bytes(c.peak_low) + " to " + format_bytes(c.peak);
        return fmt::format("{} {} / {}", mem_tag_name(t), format_bytes(res.memory.peak[size_t(t)]), p);
      };
      say(
          fmt::format("done: {} steps | final loss {:.4f} | {} | {:.0f} {} (median) | MFU {:.1f}% of {:.0f} GFLOP/s | "
                      "peak memory measured / predicted {} / {} ({}, {}, {}, {}, {})",
                      res.steps, res.last_loss, evaluation, res.items_per_s, item_rate_unit(item), 100.0 * res.mfu,
                      peak, format_bytes(res.memory.peak_total), format_bytes(pred.total_peak), vs(MemTag::Params),
                      vs(MemTag::Grads), vs(MemTag::Optimizer), vs(MemTag::Activations), vs(MemTag::Workspace)));
    }
    if (scaler.enabled())
      say(fmt::format("loss scaling: {} | final scale {:g} | {} of {} steps skipped on overflow",
                      amp::scale_mode_name(scaler.mode()), scaler.scale(), scaler.skipped(), res.steps));
    if (guard.skipped() > 0 || !attempt.rolled_back.empty())
      say(
          fmt::format("non-finite / spike guard: {} update{} skipped, {} rollback{} (train.nonfinite = \"{}\"; "
                      "metrics.jsonl has each with its reason)",
                      guard.skipped(), guard.skipped() == 1 ? "" : "s", attempt.rolled_back.size(),
                      attempt.rolled_back.size() == 1 ? "" : "s", r.train.nonfinite));
    if (P > 1)
      say(fmt::format("communication: {:.1f}% of the median step spent waiting (rank 0)", 100.0 * res.comm_wait_share));
    say("checkpoint: " + ckpt_dir);
    if (!res.best_dir.empty())
      say(fmt::format("best: val loss {:.4f} at step {} in {}", res.best_val_loss, res.best_step, res.best_dir));
    say("loss plot: " + (out_dir / "loss.svg").string());
  }
  return res;
}

}  // namespace

EvalReport evaluate_checkpoint(const std::string& ckpt, int threads) {
  const std::string ckpt_dir = open_checkpoint(ckpt);  // repairs a save interrupted between its renames
  Recipe r = checkpoint_recipe(ckpt_dir);
  // A fine-tuned run's text is encoded with its init_from's tokenizer, which the checkpoint holds
  // a copy of: read it there, so the evaluation needs nothing from the init_from directory.
  if (!r.model.init_from.empty()) r.model.init_from = ckpt_dir;
  if (threads > 0)
    omp_set_num_threads(threads);
  else if (r.run.threads > 0)
    omp_set_num_threads(r.run.threads);
  std::unique_ptr<Task> task = make_task(r, /*init_weights=*/false);
  load_state((fs::path(ckpt_dir) / "model.safetensors").string(), task->state_dict());
  // The val numbers of a text task only mean something on data encoded with the checkpoint's own
  // tokenizer.
  if (!task->tokenizer_dir().empty()) {
    const std::string data_dir = task->tokenizer_dir();
    BRIGADE_CHECK(!data::detect_tokenizer(data_dir).empty(), CheckpointError,
                  "--ckpt {}: the run's data.dir \"{}\" has no tokenizer (relative paths are taken from the "
                  "current directory); run `brigade eval` from the directory the run was started in, or `brigade "
                  "prepare` the run's recipe",
                  ckpt_dir, r.data.dir);
    for (const auto& [name, bytes] : data::tokenizer_contents(*data::load_text_tokenizer(data_dir))) {
      std::ifstream f(fs::path(ckpt_dir) / name, std::ios::binary);
      const std::string saved = f.good() ? std::string(std::istreambuf_iterator<char>(f), {}) : std::string();
      BRIGADE_CHECK(f.good() && saved == bytes, CheckpointError,
                    "--ckpt {}: {} differs from the checkpoint's {}, so its val.bin was encoded with another "
                    "vocabulary; prepare the run's data again (`brigade prepare` with its recipe.toml)",
                    ckpt_dir, (fs::path(data_dir) / name).string(), name);
    }
  }
  const std::shared_ptr<dist::ProcessGroup> world = dist::ProcessGroup::world();
  BRIGADE_CHECK(world->size() == 1, ConfigError, "brigade eval runs on one process ({} here); run it without mpirun",
                world->size());
  task->open_data(*world, [](const std::string& s) { fmt::print(stderr, "{}\n", s); });
  autograd::NoGradGuard ng;
  task->model().train(false);
  const amp::Policy policy = precision_policy(r.precision);
  EvalReport rep;
  // The run's replicas one after the other: the same batches and sums as its own final evaluation.
  for (int replica = 0; replica < int(r.parallel.dp); ++replica)
    rep.metrics.merge(task->evaluate(/*final=*/true, Shard{replica, int(r.parallel.dp), world.get()},
                                     [&](const Batch& b, Metrics& m) {
                                       amp::AutocastScope autocast(policy);
                                       task->score(b, m);
                                     }));
  rep.fields = task->eval_fields(rep.metrics);
  rep.line = task->eval_line(rep.metrics);
  rep.model_type = r.model.type;
  return rep;
}

}  // namespace brigade::train
