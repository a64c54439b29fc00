// The training loop; see trainer.h.
#include "brigade/train/trainer.h"

#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>

#include "brigade/amp/loss_scaler.h"
#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/data/prepare.h"
#include "brigade/data/sampler.h"
#include "brigade/data/token_file.h"
#include "brigade/data/tokenizer.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/ops/ops.h"
#include "brigade/optim/optimizer.h"
#include "brigade/optim/schedule.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/dist/process_group.h"
#include "brigade/train/accumulation.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/generate.h"
#include "brigade/train/memory_plan.h"
#include "brigade/train/model_parallel.h"
#include "brigade/train/run_metrics.h"

namespace brigade::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

models::GPTConfig gpt_config(const ModelConfig& m) {
  models::GPTConfig c;
  c.vocab_size = m.vocab_size;
  c.block_size = m.block_size;
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.n_embd = m.n_embd;
  c.dropout = m.dropout;
  c.layer_norm_eps = m.layer_norm_eps;
  c.init_std = m.init_std;
  return c;
}

data::PrepareOptions prepare_options(const Recipe& r) {
  data::PrepareOptions po;
  po.corpus = r.data.corpus;
  po.out_dir = r.data.dir;
  po.vocab_size = r.model.vocab_size;
  po.val_fraction = r.data.val_fraction;
  return po;
}

double measure_gemm_peak_gflops(DType dt) {
  const int64_t n = 1024;
  autograd::NoGradGuard ng;
  Tensor a = Tensor::full({n, n}, 0.5, dt), b = Tensor::full({n, n}, 0.25, dt);  // (n, n)
  double best = 1e30;
  for (int i = 0; i < 12; ++i) {  // best of 12 (the first includes primitive creation)
    auto t0 = Clock::now();
    Tensor c = ops::matmul(a, b);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * double(n) * double(n) * double(n) / best / 1e9;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimConfig& o, const nn::NamedTensors& params,
                                                const parallel::DataParallel& dp) {
  if (o.name == "adamw")
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{o.beta1, o.beta2, o.eps, o.weight_decay},
                                          [&dp](const std::string& name, const Tensor&) { return dp.decays(name); });
  if (o.name == "lamb") {
    auto lamb = std::make_unique<optim::LAMB>(params, optim::LAMBOptions{o.beta1, o.beta2, o.eps, o.weight_decay},
                                              [&dp](const std::string& name, const Tensor&) { return dp.decays(name); });
    if (dp.zero() >= 1) {
      // ZeRO: the optimizer holds views of this rank's shard, and a parameter may be split across
      // ranks; the trust ratio needs whole-parameter norms, so LAMB sums its partial norms over
      // the group, indexed by the parameter's place in the flat layout (optimizer.h).
      std::map<std::string, int> index;
      for (size_t k = 0; k < dp.layout().size(); ++k) index[dp.layout()[k].name] = int(k);
      std::vector<int> global;
      for (const auto& [name, p] : params) global.push_back(index.at(name));
      lamb->set_norm_reduction(std::move(global), int(dp.layout().size()),
                               [&dp](double* data, int64_t n) { dp.group().allreduce(data, n); });
    }
    return lamb;
  }
  if (o.name == "sgd")
    return std::make_unique<optim::SGD>(params, optim::SGDOptions{o.momentum, o.weight_decay, o.nesterov});
  throw ConfigError(fmt::format("unknown optimizer '{}': use 'adamw', 'lamb' or 'sgd'", o.name));
}

amp::Policy precision_policy(const PrecisionConfig& p) {
  return {amp::level_from_name(p.level), p.dtype == "fp16" ? DType::F16 : DType::BF16};
}

amp::LossScalerOptions loss_scaler_options(const PrecisionConfig& p) {
  const amp::Policy policy = precision_policy(p);
  amp::LossScalerOptions o;
  if (p.loss_scale == "auto")
    o.mode = policy.level != amp::Level::O0 && policy.low == DType::F16 ? amp::ScaleMode::Dynamic
                                                                         : amp::ScaleMode::None;
  else
    o.mode = amp::scale_mode_from_name(p.loss_scale);
  o.init_scale = p.init_scale;
  o.growth = p.growth;
  o.backoff = p.backoff;
  o.growth_interval = p.growth_interval;
  o.min_scale = p.min_scale;
  o.max_scale = p.max_scale;
  o.hysteresis = p.hysteresis;
  o.dtype = policy.low;
  return o;
}

models::LLaMAConfig llama_config(const ModelConfig& m) {
  models::LLaMAConfig c;
  c.vocab_size = m.vocab_size;
  c.hidden_size = m.n_embd;
  c.intermediate_size = m.intermediate_size > 0 ? m.intermediate_size : (8 * m.n_embd / 3 + 63) / 64 * 64;
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.n_kv_head = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  c.max_position = m.block_size;
  c.rms_norm_eps = m.layer_norm_eps;
  c.rope_theta = m.rope_theta;
  c.init_std = m.init_std;
  return c;
}

std::unique_ptr<models::CausalLM> make_model(const ModelConfig& m) {
  if (m.type == "llama") return std::make_unique<models::LLaMA>(llama_config(m));
  return std::make_unique<models::GPT>(gpt_config(m));
}

std::unique_ptr<models::CausalLM> build_model(const Recipe& r) {
  std::unique_ptr<models::CausalLM> model = make_model(r.model);
  {
    Generator init_gen(r.run.seed);
    if (auto* gpt = dynamic_cast<models::GPT*>(model.get())) gpt->init_weights(init_gen);
    if (auto* llama = dynamic_cast<models::LLaMA*>(model.get())) llama->init_weights(init_gen);
  }
  model->dropout_generator().manual_seed(r.run.seed + 1);
  // Activation recompute ([memory], docs/memory.md): a per-block plan for one micro-batch of B x T.
  const models::RecomputePolicy recompute{r.memory.recompute, r.memory.every_k,
                                          int64_t(r.memory.budget_mb * double(1 << 20))};
  models::GPTConfig shape = gpt_config(r.model);  // the plan's policies; "budget" reads GPT's estimate
  model->set_recompute(models::plan_recompute(shape, r.train.batch_size, r.train.seq_len, recompute));
  return model;
}

namespace {

// O3 keeps no fp32 master copy: every stored value is rounded to the low dtype.
void round_to(const Tensor& t, DType low) {
  if (!t.defined() || t.numel() == 0) return;
  BRIGADE_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), InternalError, "round_to: {} must be contiguous f32",
                t.str());
  Tensor r = ops::cast(ops::cast(t, low), DType::F32);
  std::memcpy(t.data<float>(), r.data<float>(), t.nbytes());
}

}  // namespace

void round_state_to_low(parallel::DataParallel& dp, optim::Optimizer& opt, DType low) {
  for (auto& [name, p] : dp.optimizer_params()) round_to(p, low);
  for (auto& [name, t] : opt.state_tensors()) round_to(t, low);
  dp.after_optimizer_step();
}

GradientStep apply_gradients(parallel::DataParallel& dp, optim::Optimizer& opt, amp::LossScaler& scaler,
                             const amp::Policy& policy, const TrainConfig& t, double lr, dist::ProcessGroup& ctrl,
                             const std::function<double(double)>& clip) {
  GradientStep out;
  // Loss scaling: unscale this rank's gradients (whole or ZeRO shards) with the Inf/NaN check
  // fused in; every rank agrees on the verdict, so all skip an overflowing step together.
  if (scaler.enabled()) {
    std::vector<Tensor> grads;
    for (auto& [name, p] : dp.optimizer_params()) grads.push_back(p.grad());
    const amp::UnscaleResult ur = scaler.unscale_(grads);
    double verdict[2] = {ur.found_inf, ur.amax};
    ctrl.allreduce_max(verdict, 2);
    out.skipped = scaler.update({verdict[0], verdict[1]});
  }
  if (out.skipped) return out;  // weights and optimizer state untouched
  const bool pure_low = policy.level == amp::Level::O3;
  if (pure_low)
    for (auto& [name, p] : dp.optimizer_params()) round_to(p.grad(), policy.low);
  if (clip) {
    out.grad_norm = clip(t.grad_clip);  // model parallel: its own reduction, gradients scaled in place
  } else if (opt.fuses_grad_scale() && !(t.clip_value > 0)) {
    // the optimizer reads the gradients scaled (AdamW): one pass over them fewer
    out.grad_norm = dp.grad_norm();
    opt.set_grad_scale(optim::clip_coefficient(out.grad_norm, t.grad_clip));
  } else {
    out.grad_norm = dp.clip_grad_norm(t.grad_clip);
  }
  // then by value: elementwise, so on this rank's optimizer views (whole parameters or ZeRO shards)
  optim::clip_grad_value(dp.optimizer_params(), t.clip_value);
  opt.step(lr);
  if (pure_low)
    round_state_to_low(dp, opt, policy.low);  // includes dp.after_optimizer_step()
  else
    dp.after_optimizer_step();
  return out;
}

namespace {

std::string fmt_bytes(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", double(b) / double(int64_t(1) << 30));
  if (b >= (int64_t(1) << 20)) return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
  return fmt::format("{:.1f} KiB", double(b) / 1024.0);
}

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

// memory.json["predicted"]: what predict_memory (memory_plan.h) expected, beside the measurements.
nlohmann::json predicted_json(const MemoryPrediction& p, bool formulas) {
  nlohmann::json j;
  for (int i = 0; i < kNumMemTags; ++i) {
    const std::string name(mem_tag_name(MemTag(i)));
    const PredictedCategory& c = p.tags[size_t(i)];
    j["live"][name] = c.live;
    j["peak"][name] = c.peak;
    j["peak_low"][name] = c.peak_low;  // below peak only where communication timing decides
    if (formulas) j["formulas"][name] = c.formula;
  }
  j["peak_total"] = p.total_peak;
  if (formulas) {
    j["formulas"]["total"] = p.total_formula;
    j["recompute"] = p.recompute;
  }
  return j;
}



// "section.key" -> "value" lines of a recipe, for comparing two recipes.
std::map<std::string, std::string> recipe_values(const Recipe& r) {
  std::map<std::string, std::string> out;
  std::string section;
  std::istringstream in(recipe_to_toml(r));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

// Settings that change the numbers of a resumed run (everything except logging,
// evaluation, sampling, naming and the run length).
// layout = false: every other setting; layout = true: only the batch split (is_layout_key).
bool is_layout_key(const std::string& key);
std::string resume_differences(const Recipe& saved, const Recipe& now, bool layout) {
  static const std::set<std::string> harmless{"run.name",         "run.out_dir",        "train.steps",
                                              "train.eval_every", "train.eval_batches", "train.log_every",
                                              "train.checkpoint_every", "train.early_stop", "train.patience",
                                              "train.min_delta"};
  const auto a = recipe_values(saved), b = recipe_values(now);
  std::string diff;
  for (const auto& [key, value] : b) {
    // memory.*: activation recompute leaves every number bitwise the same
    if (harmless.count(key) || key.rfind("sample.", 0) == 0 || key.rfind("memory.", 0) == 0) continue;
    if (is_layout_key(key) != layout) continue;
    auto it = a.find(key);
    if (it != a.end() && it->second != value) diff += fmt::format("{}{} ({} -> {})", diff.empty() ? "" : ", ", key, it->second, value);
  }
  return diff;
}

}  // namespace

// ---- shared by the training loops (trainer.h)

namespace {
std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested.store(true); }
}  // namespace

struct StopSignalGuard::Saved {
  struct sigaction old_int {}, old_term {};
};

StopSignalGuard::StopSignalGuard() : saved_(std::make_unique<Saved>()) {
  g_stop_requested.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &saved_->old_int);
  sigaction(SIGTERM, &sa, &saved_->old_term);
}

StopSignalGuard::~StopSignalGuard() {
  sigaction(SIGINT, &saved_->old_int, nullptr);
  sigaction(SIGTERM, &saved_->old_term, nullptr);
}

bool stop_requested() { return g_stop_requested.load(); }

std::string fmt_duration(double s) {
  if (s < 0 || !std::isfinite(s)) return "?";
  int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

void write_run_plot(const std::string& metrics_path, const std::string& svg_path, const std::string& title,
                    const std::function<void(const std::string&)>& say) {
  try {
    write_loss_plot(read_run_metrics(metrics_path), svg_path, title);
  } catch (const Error& e) {
    say(fmt::format("warning: could not draw {}: {}", svg_path, e.what()));
  }
}

Recipe eval_checkpoint_recipe(const std::string& ckpt_dir, const std::string& example, int threads) {
  BRIGADE_CHECK(fs::is_directory(ckpt_dir), CheckpointError,
                "--ckpt {}: no such checkpoint directory; pass the folder written by `brigade train` (e.g. {})",
                ckpt_dir, example);
  Recipe r = checkpoint_recipe(ckpt_dir);
  if (threads > 0)
    omp_set_num_threads(threads);
  else if (r.run.threads > 0)
    omp_set_num_threads(r.run.threads);
  return r;
}

optim::Schedule make_schedule(const Recipe& r) {
  return optim::Schedule{optim::schedule_from_name(r.schedule.name), r.optim.lr, r.schedule.min_lr,
                         r.schedule.warmup_steps, r.train.steps, r.schedule.step_every, r.schedule.step_gamma,
                         r.schedule.decay_steps, optim::decay_shape_from_name(r.schedule.decay_shape)};
}

// Keeps metrics.jsonl consistent on resume: drops records past the resumed step.
void truncate_metrics(const std::string& path, int64_t step) {
  const fs::path p(path);
  std::ifstream in(p);
  if (!in) return;
  std::vector<std::string> keep;
  for (std::string line; std::getline(in, line);) {
    try {
      auto j = nlohmann::json::parse(line);
      // (an early-stop record is dropped too: a run resumed past it continues, and writes its own)
      if (j.value("step", int64_t(0)) <= step && !j.contains("early_stop")) keep.push_back(line);
    } catch (...) {
      // a torn last line from a crash: drop it
    }
  }
  in.close();
  std::ofstream out(p, std::ios::trunc);
  for (auto& l : keep) out << l << '\n';
}


std::vector<parallel::ParamUnit> model_units(models::CausalLM& m) {
  std::vector<parallel::ParamUnit> units(1);
  units[0].name = "embeddings+head";
  const auto blocks = m.blocks();
  std::vector<parallel::ParamUnit> block_units(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    block_units[i].name = blocks[i].first;
    block_units[i].module = blocks[i].second;
  }
  for (auto& [name, p] : m.named_parameters()) {
    bool placed = false;
    for (size_t i = 0; i < blocks.size() && !placed; ++i)
      if (name.rfind(block_units[i].name + ".", 0) == 0) {
        block_units[i].params.emplace_back(name, p);
        placed = true;
      }
    if (!placed) units[0].params.emplace_back(name, p);
  }
  for (auto& u : block_units) units.push_back(std::move(u));
  return units;
}

namespace {

// Test hook (docs/distributed.md, docs/mixed-precision.md): BRIGADE_FAULT="<rank>:<step>:<kind>".
// kill|raise: that rank dies (SIGKILL) or throws in the middle of that step, after its forward
// pass; inf_grad|nan_grad: that rank's first gradient element becomes +Inf / NaN once the
// step's gradients are complete (before loss-scaler unscaling and the optimizer).
struct Fault {
  int rank = -1;
  int64_t step = -1;
  std::string kind;
};
Fault fault_from_env() {
  Fault f;
  const char* e = std::getenv("BRIGADE_FAULT");
  if (!e) return f;
  char kind[16] = {0};
  long long step = -1;
  if (std::sscanf(e, "%d:%lld:%15s", &f.rank, &step, kind) == 3) {
    f.step = step;
    f.kind = kind;
  }
  return f;
}

// Settings that may differ on resume without changing the numbers beyond float
// rounding, as long as the global batch stays the same: how the batch is split.
bool is_layout_key(const std::string& key) {
  return key.rfind("parallel.", 0) == 0 || key == "train.batch_size" || key == "train.accumulation";
}

}  // namespace

TrainResult run_training(const Recipe& r, const TrainOptions& opts) {
  if (r.run.threads > 0) omp_set_num_threads(r.run.threads);
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
  // Data-parallel replicas: every rank of one replica (its tp and pp ranks) reads the same batch.
  const int D = int(r.parallel.dp);
  const int replica = model_parallel ? int((rank / r.parallel.tp) % r.parallel.dp) : rank;  // DeviceMesh's layout

  // Gradients travel on `world`; the trainer's own small messages (loss, stop flag, eval, memory)
  // on a duplicate, so the gradient group's byte counter measures the algorithm alone.
  std::shared_ptr<dist::ProcessGroup> ctrl = world->split(0, rank);
  const bool tty = lead && isatty(fileno(stderr)) && !opts.quiet;
  auto say = [&](const std::string& s) {
    if (lead && !opts.quiet) fmt::print(stderr, "{}\n", s);
  };

  // ---- data: prepared on first use (by rank 0); once prepared, `brigade prepare` owns it (so a
  // damaged or stale token file is reported, not silently rebuilt)
  const fs::path data_dir(r.data.dir);
  if (lead && !fs::exists(data_dir / data::kMetaFile)) {
    data::prepare(prepare_options(r), [&](const data::PrepareProgress& p) { say("prepare: " + p.message); });
  }
  ctrl->barrier();
  data::Tokenizer tok = data::Tokenizer::load((data_dir / data::kTokenizerFile).string());
  BRIGADE_CHECK(tok.vocab_size() == r.model.vocab_size, ConfigError,
                "{}: the tokenizer in {} has vocab {} but model.vocab_size is {}; run `brigade prepare` again or set "
                "data.dir to a fresh folder",
                r.path, r.data.dir, tok.vocab_size(), r.model.vocab_size);
  data::TokenDataset train_ds((data_dir / data::kTrainFile).string());
  data::TokenDataset val_ds((data_dir / data::kValFile).string());
  for (const data::TokenDataset* ds : {&train_ds, &val_ds})
    BRIGADE_CHECK(ds->vocab_size() == r.model.vocab_size, ConfigError,
                  "{}: token file {} has vocab {} but model.vocab_size is {}; run `brigade prepare` again", r.path,
                  ds->path(), ds->vocab_size(), r.model.vocab_size);
  const int64_t B = r.train.batch_size, T = r.train.seq_len, A = r.train.accumulation;
  AccumulationPolicy accumulation(r.train, B * D);  // micro-steps per step (static, ramp or noise_scale)
  // Micro-step m of rank p takes rows [(m P + p) B, +B) of the step's global batch, so the rows
  // seen per step do not depend on how the batch is split (dp x accumulation x batch_size).
  // Evaluation uses the same split of its (fixed) windows with the recipe's accumulation, so val
  // loss depends neither on the split nor on adaptive accumulation.
  auto make_samplers = [&](const data::TokenDataset& ds, int64_t micro_steps) {
    std::vector<data::BatchSampler> v;
    for (int64_t m = 0; m < micro_steps; ++m)
      v.emplace_back(ds, B, T, r.run.seed, int(m * D + replica), int(micro_steps * D));
    return v;
  };
  std::vector<data::BatchSampler> samplers = make_samplers(train_ds, A);
  const std::vector<data::BatchSampler> val_samplers = make_samplers(val_ds, A);

  // ---- model
  const std::unique_ptr<models::CausalLM> model_owner = build_model(r);
  models::CausalLM& model = *model_owner;
  models::GPT* const gpt = dynamic_cast<models::GPT*>(&model);  // for the GPT-only plans (tp/pp, memory estimate)

  const fs::path out_dir(r.run.out_dir);
  std::error_code ec;
  if (lead) fs::create_directories(out_dir, ec);
  BRIGADE_CHECK(!ec, IoError, "cannot create run.out_dir {}: {}; choose a writable folder", out_dir.string(),
                ec.message());
  ctrl->barrier();
  const std::string ckpt_dir = (out_dir / "checkpoint").string();
  const fs::path metrics_path = out_dir / "metrics.jsonl";
  BRIGADE_CHECK(opts.stop_at == -1 || opts.stop_at >= 1, ConfigError, "--stop-at {}: must be a step >= 1",
                opts.stop_at);
  const int64_t last_step = opts.stop_at >= 1 ? std::min(opts.stop_at, r.train.steps) : r.train.steps;
  TrainState state;
  if (opts.resume) {
    BRIGADE_CHECK(checkpoint_exists(ckpt_dir), CheckpointError,
                  "--resume: no checkpoint in {}; run without --resume to start training", ckpt_dir);
    state = checkpoint_state(ckpt_dir);
    const Recipe saved = checkpoint_recipe(ckpt_dir);
    const std::string diff = resume_differences(saved, r, /*layout=*/false);
    if (!diff.empty())
      say("warning: resuming with settings that differ from the checkpoint's recipe: " + diff +
          "; the continuation will not match an uninterrupted run");
    const std::string layout_diff = resume_differences(saved, r, /*layout=*/true);
    const int64_t saved_global =
        saved.train.batch_size * saved.train.accumulation * saved.parallel.dp;
    if (!layout_diff.empty())
      say(saved_global == B * A * D
              ? "resuming with a different batch split (" + layout_diff +
                    "): same global batch, so the continuation matches an uninterrupted run up to float rounding"
              : fmt::format("warning: the global batch changes from {} to {} rows ({}); the continuation will not "
                            "match an uninterrupted run",
                            saved_global, B * A * D, layout_diff));
    load_model_weights((fs::path(ckpt_dir) / "model.safetensors").string(), model);
    model.dropout_generator().set_state(state.rng_state);
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

  // ---- data parallelism (one rank: the same code, collectives are no-ops) + optimizer
  parallel::DataParallelOptions dpo;
  dpo.zero = int(r.parallel.zero);
  dpo.algo = dist::allreduce_algo_from_name(r.parallel.allreduce);
  dpo.bucket_bytes = int64_t(r.parallel.bucket_mb * double(1 << 20));
  dpo.overlap = r.parallel.overlap;
  dpo.accumulation = A;
  // Model parallelism (tp, pp) shards and trims the model first; data parallelism then runs over
  // the dp group on this rank's parameters, communicating after the pipeline's backward work.
  const double flops_per_token = model.flops_per_token(T);  // of the whole model, before any split
  const int64_t num_params = model.num_parameters();
  std::unique_ptr<ModelParallel> mp;
  if (model_parallel) {
    BRIGADE_CHECK(gpt != nullptr, ConfigError, "{}: parallel.tp and parallel.pp are built for model.arch = \"gpt\"; "
                  "this model is \"{}\": use parallel.dp", r.path, model.arch());
    mp = std::make_unique<ModelParallel>(r, *gpt, world, say);
    dpo.communicate_in_backward = false;
  }
  parallel::DataParallel dp(mp ? mp->units() : model_units(model), mp ? mp->dp_group() : world, dpo);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, dp.optimizer_params(), dp);
  std::vector<FlatLayoutEntry> layout;
  for (const auto& e : dp.layout()) layout.push_back({e.name, e.offset, e.numel});
  if (opts.resume) {
    // the optimizer's own step count (bias corrections): loss scaling may have skipped updates
    const int64_t opt_steps = state.optimizer_steps >= 0 ? state.optimizer_steps : state.step;
    const bool saved_mp = checkpoint_recipe(ckpt_dir).parallel.tp > 1 || checkpoint_recipe(ckpt_dir).parallel.pp > 1;
    BRIGADE_CHECK(saved_mp == model_parallel, CheckpointError,
                  "--resume: the checkpoint in {} was saved by a run {} model parallelism, this one runs {} it; the "
                  "optimizer state is kept per rank of the mesh, so resume with the checkpoint's parallel.tp and "
                  "parallel.pp (its model.safetensors loads anywhere, e.g. for `brigade generate`)",
                  ckpt_dir, saved_mp ? "with" : "without", model_parallel ? "with" : "without");
    if (mp) {
      read_mp_optimizer(ckpt_dir, *mp, *opt, opt_steps);
    } else if (dpo.zero == 0 && !checkpoint_is_sharded(ckpt_dir)) {
      load_optimizer_state(ckpt_dir, *opt, opt_steps);
    } else if (dpo.zero == 0) {  // a ZeRO checkpoint resumed without ZeRO: re-assemble per parameter
      std::map<std::string, Shape> shapes;
      for (auto& [name, p] : model.named_parameters()) shapes[name] = p.shape();
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
    if (lead) truncate_metrics(metrics_path.string(), state.step);
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

  const optim::Schedule sched = make_schedule(r);
  std::ofstream metrics;
  if (lead) {
    metrics.open(metrics_path, std::ios::app);
    BRIGADE_CHECK(metrics.good(), IoError, "cannot write {}: check the run.out_dir permissions",
                  metrics_path.string());
  }

  // MFU is measured against the GEMM ceiling of the dtype the GEMMs run in
  const DType gemm_dtype = policy.level == amp::Level::O0 ? DType::F32 : policy.low;
  double peak = measure_gemm_peak_gflops(gemm_dtype);  // per rank, measured by all ranks at once
  ctrl->allreduce(&peak, 1);                          // the job's ceiling: the sum over ranks
  say(fmt::format("model: {} {} layers, {} dims, {} heads, vocab {}, {:.2f}M parameters | data: {} train / {} val "
                  "tokens | {} threads, {} GEMM peak {:.0f} GFLOP/s",
                  gpt ? "GPT" : "LLaMA", r.model.n_layer, r.model.n_embd, r.model.n_head, r.model.vocab_size,
                  double(num_params) / 1e6, train_ds.size(), val_ds.size(), omp_get_max_threads(),
                  dtype_name(gemm_dtype), peak));
  if (policy.level != amp::Level::O0 || scaler.enabled())
    say(fmt::format("precision: {} {} | loss scaling {}{}", r.precision.level,
                    policy.level == amp::Level::O0 ? "fp32" : r.precision.dtype, amp::scale_mode_name(scaler.mode()),
                    scaler.enabled() ? fmt::format(" (scale {:g})", scaler.scale()) : std::string()));
  if (D > 1 || A > 1)
    say(fmt::format("parallel: dp {} x accumulation {} x batch {} = {} rows per step | ZeRO-{} | allreduce {} | "
                    "buckets {} MiB | overlap {}",
                    D, A, B, B * A * D, dpo.zero, r.parallel.allreduce, r.parallel.bucket_mb,
                    r.parallel.overlap && !mp ? "on" : "off"));
  if (mp) say(mp->describe());
  if (r.memory.recompute != "none") {
    std::string blocks;
    for (nn::Recompute m : model.recompute_modes()) blocks += models::recompute_name(m)[0];
    say(fmt::format("memory: recompute {} (blocks {}: f = full, s = selective, n = none) | estimated activation peak "
                    "{}",
                    r.memory.recompute, blocks,
                    gpt ? fmt_bytes(models::estimate_activation_peak(gpt->config(), B, T, model.recompute_modes()))
                        : std::string("(not estimated for this architecture)")));
  }

  auto evaluate = [&]() {
    autograd::NoGradGuard ng;
    model.train(false);
    dp.gather_persistent();
    Tensor x = Tensor::empty({B, T}, DType::I64), y = Tensor::empty({B, T}, DType::I64);  // (B, T)
    double total = 0.0;
    const int64_t n = std::max<int64_t>(1, r.train.eval_batches);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t m = 0; m < A; ++m) {
        val_samplers[size_t(m)].get_eval_batch(i, n, x, y);
        if (mp) {
          total += mp->eval_batch(x, y, policy);  // non-zero on one rank per replica
          continue;
        }
        amp::AutocastScope autocast(policy);
        total += model.loss(x, y).item();
      }
    dp.release_persistent();
    model.train(true);
    double mean = total / double(n * A);
    ctrl->allreduce(&mean, 1);
    return mean / double(D);
  };

  const std::string tokenizer_path = (data_dir / data::kTokenizerFile).string();
  auto save = [&](const std::string& dir) {  // collective: every rank calls it; dir = ckpt_dir or best_dir
    state.rng_state = model.dropout_generator().state();
    state.accumulation_state = accumulation.state();
    state.scaler_state = scaler.state();
    state.optimizer_steps = opt->steps();
    if (mp) {  // the whole model gathered on rank 0 (HF names); the optimizer state per rank of the mesh
      const nn::NamedTensors whole = mp->gather_full();
      const std::string tmp = dir + ".tmp";
      if (lead) begin_checkpoint(dir);
      ctrl->barrier();
      write_mp_optimizer(tmp, *mp, *opt);
      ctrl->barrier();
      if (lead) {
        write_checkpoint_files(tmp, whole, nullptr, state, r, tokenizer_path);
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
    for (auto& [name, p] : model.named_parameters())
      if (lead) full.emplace_back(name, copies.at(name));
    const std::string tmp = dir + ".tmp";
    if (lead) begin_checkpoint(dir);
    ctrl->barrier();
    const std::map<std::string, Tensor> shard = dpo.zero >= 1 ? dp.shard_state(opt->state_tensors())
                                                               : std::map<std::string, Tensor>();
    if (dpo.zero >= 1) write_optimizer_shard(tmp, rank, P, dp.shard_begin(), dp.shard_end(), shard);
    ctrl->barrier();
    if (lead) {
      write_checkpoint_files(tmp, full, dpo.zero == 0 ? opt.get() : nullptr, state, r, tokenizer_path);
      if (dpo.zero >= 1) {
        std::vector<std::pair<int64_t, int64_t>> ranges;
        for (int p = 0; p < P; ++p) ranges.push_back(dp.shard_range(p));
        std::vector<std::string> kinds;
        for (auto& [kind, t] : shard) kinds.push_back(kind);
        write_optimizer_index(tmp, P, dp.flat_numel(), layout, ranges, kinds);
      }
      commit_checkpoint(dir);
    }
    ctrl->barrier();
  };

  const Fault fault = fault_from_env();
  Tensor x = Tensor::empty({B, T}, DType::I64), y = Tensor::empty({B, T}, DType::I64);  // (B, T)
  std::vector<double> step_times, step_rates, comm_waits;
  double last_loss = 0.0, tok_s = 0.0;
  const auto t_start = Clock::now();
  const int64_t start_step = state.step;
  Allocator::instance().reset_peak();
  model.train(true);
  StopSignalGuard stop_guard;
  bool interrupted = false, stopped_early = false;
  int64_t logged_skipped = scaler.skipped(), logged_overflows = scaler.overflows();
  for (int64_t step = state.step; step < last_step; ++step) {
    const auto t0 = Clock::now();
    // Dropout masks: one stream per rank, re-seeded from (seed, step, rank) every step, so a run
    // resumes exactly at any dp size without saving per-rank generator states.
    model.dropout_generator().manual_seed(
        data::splitmix64(r.run.seed ^ data::splitmix64((uint64_t(step) << 16) + uint64_t(replica))));
    const int64_t acc = accumulation.at(step);
    if (int64_t(samplers.size()) != acc) samplers = make_samplers(train_ds, acc);
    const int64_t tokens_per_step = B * T * acc * D;  // this step's global batch
    dp.set_accumulation(acc);
    dp.reset_stats();
    dp.begin_step();
    double loss_sum = 0.0, small_sq = 0.0;
    for (int64_t m = 0; m < acc; ++m) {
      if (m == 1 && accumulation.measures_noise()) {
        // |G_small|^2: the gradient of one micro-batch (B rows), averaged over the ranks
        small_sq = dp.local_grad_sq();
        ctrl->allreduce(&small_sq, 1);
        small_sq /= double(D) * scaler.scale() * scaler.scale();  // the loss scale is still in these gradients
      }
      dp.begin_micro_step(m);
      samplers[size_t(m)].get_batch(step, x, y);
      if (mp) {  // the pipeline: forward and backward of every micro-batch of this batch
        loss_sum += mp->train_batch(x, y, scaler.enabled() ? scaler.scale() : 1.0, policy);
        if (fault.rank == rank && fault.step == step + 1 && fault.kind != "inf_grad" && fault.kind != "nan_grad") {
          if (fault.kind == "kill") ::raise(SIGKILL);
          throw ValueError(fmt::format("injected fault at step {} (BRIGADE_FAULT={}:{}:{})", step + 1, fault.rank,
                                       fault.step, fault.kind));
        }
        continue;
      }
      Tensor loss;
      {
        amp::AutocastScope autocast(policy);
        loss = model.loss(x, y);  // (): f32 at every level
      }
      if (fault.rank == rank && fault.step == step + 1 && fault.kind != "inf_grad" && fault.kind != "nan_grad") {
        if (fault.kind == "kill") ::raise(SIGKILL);
        throw ValueError(fmt::format("injected fault at step {} (BRIGADE_FAULT={}:{}:{})", step + 1, fault.rank,
                                     fault.step, fault.kind));
      }
      // the scaled loss is an f32 scalar (outside the autocast scope, so never rounded to fp16)
      autograd::backward(scaler.enabled() ? fn::mul_scalar(loss, scaler.scale()) : loss);
      loss_sum += loss.item();
    }
    if (mp) mp->sync_tied_gradients();  // the tied embedding's two halves, before the dp reduction
    dp.finish_gradients();
    double agreed[2] = {loss_sum / double(acc), stop_requested() ? 1.0 : 0.0};
    ctrl->allreduce(agreed, 1);  // the global batch's mean loss (x P)
    ctrl->allreduce_max(agreed + 1, 1);  // stop when any rank was asked to
    last_loss = agreed[0] / double(D);  // one reporting rank per replica
    BRIGADE_CHECK(std::isfinite(last_loss), ValueError,
                  "loss became {} at step {}; the run diverged: lower optim.lr, keep train.grad_clip on, or resume "
                  "from the last checkpoint in {}{}",
                  last_loss, step + 1, ckpt_dir,
                  policy.level != amp::Level::O0 && policy.low == DType::F16
                      ? " (under fp16 the forward itself may have overflowed 65504, which loss scaling cannot "
                        "fix: try precision.dtype = \"bf16\")"
                      : "");
    if (fault.rank == rank && fault.step == step + 1 && (fault.kind == "inf_grad" || fault.kind == "nan_grad")) {
      for (auto& [name, p] : dp.optimizer_params())
        if (p.grad().defined() && p.grad().numel() > 0) {
          p.grad().data<float>()[0] = fault.kind == "inf_grad" ? std::numeric_limits<float>::infinity()
                                                               : std::numeric_limits<float>::quiet_NaN();
          break;
        }
    }
    const double lr = sched.lr_at(step);
    const GradientStep gs =
        mp ? apply_gradients(dp, *opt, scaler, policy, r.train, lr, *ctrl,
                             [&](double max_norm) { return mp->clip_grad_norm(dp, max_norm, *ctrl); })
           : apply_gradients(dp, *opt, scaler, policy, r.train, lr, *ctrl);
    const double norm = gs.grad_norm;
    if (!gs.skipped && accumulation.measures_noise()) accumulation.observe(small_sq, B, norm * norm, B * acc * D);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    step_times.push_back(dt);
    comm_waits.push_back(dp.comm_wait_seconds());
    state.step = step + 1;
    state.tokens_seen += tokens_per_step;
    tok_s = double(tokens_per_step) / dt;
    step_rates.push_back(tok_s);
    const double mfu = tok_s * flops_per_token / (peak * 1e9);

    const bool log_now = r.train.log_every > 0 && (state.step % r.train.log_every == 0 || state.step == last_step);
    if (log_now && lead) {
      nlohmann::json j{{"step", state.step},
                       {"loss", last_loss},
                       {"lr", lr},
                       {"grad_norm", norm},
                       {"tokens_per_s", tok_s},
                       {"mfu", mfu},
                       {"tokens_seen", state.tokens_seen},
                       {"global_batch", B * acc * D},
                       {"accumulation", acc},
                       {"mem_peak", memory_json(Allocator::instance().stats())["peak"]},
                       {"mem_live", memory_json(Allocator::instance().stats())["live"]}};
      if (accumulation.measures_noise()) j["noise_scale"] = accumulation.noise_scale();
      if (scaler.enabled()) {  // per log interval, plus the run's totals
        j["loss_scale"] = scaler.scale();
        j["skipped"] = scaler.skipped() - logged_skipped;
        j["overflows"] = scaler.overflows() - logged_overflows;
        j["skipped_total"] = scaler.skipped();
      }
      if (P > 1) {
        j["comm_wait_s"] = dp.comm_wait_seconds();
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
      std::string line = fmt::format("step {:>5}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | MFU {:.1f}% | ETA {}",
                                     state.step, last_step, last_loss, lr, tok_s, 100.0 * mfu, fmt_duration(eta));
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
      state.last_val_loss = evaluate();
      if (lead) {
        metrics << nlohmann::json{{"step", state.step}, {"val_loss", state.last_val_loss}}.dump() << '\n';
        metrics.flush();
      }
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("step {:>5}/{} | val loss {:.4f}", state.step, last_step, state.last_val_loss));
      // Early stopping counts the periodic evaluations and the one at train.steps, not one at a
      // --stop-at step, so a run split by --stop-at/--resume stops where an uninterrupted one does.
      if (stopper && (eval_now || state.step == r.train.steps)) {
        const EarlyStopper::Verdict verdict = stopper->observe(state.step, state.last_val_loss);
        state.early_stop = stopper->state();
        if (verdict == EarlyStopper::Verdict::Improved) save(best_dir);
        stopped_early = verdict == EarlyStopper::Verdict::Stop && state.step < r.train.steps;
      }
    }
    interrupted = agreed[1] > 0.0 && state.step < last_step && !stopped_early;
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
      say(fmt::format("early stop at step {}: val loss did not improve by more than {} in {} evaluations; best val "
                      "loss {:.4f} at step {}, kept in {}",
                      state.step, r.train.min_delta, es.evals_since_best, es.best_val_loss, es.best_step, best_dir));
      break;
    }
    if (interrupted) {
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("interrupted at step {}: checkpoint saved in {}; continue with --resume", state.step,
                      ckpt_dir));
      break;
    }
  }

  TrainResult res;
  res.interrupted = interrupted;
  res.steps = state.step;
  res.last_loss = last_loss;
  res.val_loss = state.last_val_loss;
  if (!step_times.empty()) {
    std::vector<double> s = step_times;
    std::nth_element(s.begin(), s.begin() + long(s.size() / 2), s.end());
    std::vector<double> rates = step_rates;
    std::nth_element(rates.begin(), rates.begin() + long(rates.size() / 2), rates.end());
    res.tokens_per_s = rates[rates.size() / 2];
    std::vector<double> c = comm_waits;
    std::nth_element(c.begin(), c.begin() + long(c.size() / 2), c.end());
    res.comm_wait_share = c[c.size() / 2] / s[s.size() / 2];
  }
  res.gemm_peak_gflops = peak;
  res.skipped_steps = scaler.skipped();
  res.loss_scale = scaler.scale();
  res.mfu = res.tokens_per_s * flops_per_token / (peak * 1e9);
  res.memory = Allocator::instance().stats();
  res.checkpoint_dir = ckpt_dir;
  res.early_stopped = stopped_early;
  if (stopper && state.early_stop.best_step > 0) {
    res.best_step = state.early_stop.best_step;
    res.best_val_loss = state.early_stop.best_val_loss;
    res.best_dir = best_dir;
  }
  {
    // Every rank's memory by tag, gathered to rank 0 (a sum of vectors that are zero but for one slot).
    std::vector<double> all(size_t(P) * 2 * kNumMemTags, 0.0);
    for (int i = 0; i < kNumMemTags; ++i) {
      all[(size_t(rank) * 2) * kNumMemTags + size_t(i)] = double(res.memory.live[size_t(i)]);
      all[(size_t(rank) * 2 + 1) * kNumMemTags + size_t(i)] = double(res.memory.peak[size_t(i)]);
    }
    ctrl->allreduce(all.data(), int64_t(all.size()));
    if (lead) {
      nlohmann::json mj = memory_json(res.memory);
      mj["dp"] = D;
      mj["tp"] = r.parallel.tp;
      mj["pp"] = r.parallel.pp;
      mj["zero"] = dpo.zero;
      mj["precision"] = {{"level", r.precision.level}, {"dtype", policy.level == amp::Level::O0 ? "f32" : r.precision.dtype}};
      if (!mp && gpt) mj["predicted"] = predicted_json(predict_memory(r, 0), /*formulas=*/true);  // GPT, dp
      for (int p = 0; p < P; ++p) {
        nlohmann::json rj;
        for (int i = 0; i < kNumMemTags; ++i) {
          const std::string name(mem_tag_name(MemTag(i)));
          rj["live"][name] = int64_t(all[(size_t(p) * 2) * kNumMemTags + size_t(i)]);
          rj["peak"][name] = int64_t(all[(size_t(p) * 2 + 1) * kNumMemTags + size_t(i)]);
        }
        if (!mp && gpt) rj["predicted"] = predicted_json(predict_memory(r, p), /*formulas=*/false);
        mj["ranks"].push_back(rj);
      }
      std::ofstream(out_dir / "memory.json") << mj.dump(2) << '\n';
    }
  }
  if (lead) {  // loss.svg beside metrics.jsonl: the whole run's curves (a resumed run's included)
    metrics.flush();
    write_run_plot(metrics_path.string(), (out_dir / "loss.svg").string(), fmt::format("{}: loss", r.run.name), say);
  }
  if (mp && r.parallel.pp > 1) {  // the last step's measured pipeline timeline (collective)
    const ModelParallel::PipeReport rep = mp->report();
    if (lead) {
      nlohmann::json pj{{"schedule", std::string(parallel::pipe_schedule_name(mp->plan().kind))},
                        {"pp", mp->plan().p},
                        {"virtual_stages", mp->plan().v},
                        {"microbatches", mp->plan().m},
                        {"stage_bounds", mp->stage_bounds()},
                        {"measured_bubble", rep.measured_bubble},
                        {"predicted_bubble", rep.predicted_bubble},
                        {"peak_in_flight", rep.peak_in_flight}};
      std::ofstream(out_dir / "pipeline.json") << pj.dump(2) << '\n';
      parallel::write_pipe_timeline_svg((out_dir / "pipeline.svg").string(), rep.events, mp->plan().p,
                                        fmt::format("{}: {} schedule, measured (last step, pp rank rows)", r.run.name,
                                                    parallel::pipe_schedule_name(mp->plan().kind)));
      std::string peaks;
      for (int v : rep.peak_in_flight) peaks += fmt::format("{}{}", peaks.empty() ? "" : " ", v);
      say(fmt::format("pipeline: bubble measured {:.1f}% | predicted from the measured stage times {:.1f}% | "
                      "micro-batches in flight per pp rank {} | timeline {}",
                      100.0 * rep.measured_bubble, 100.0 * rep.predicted_bubble, peaks,
                      (out_dir / "pipeline.svg").string()));
    }
  }
  if (opts.sample && !interrupted && mp) {
    const nn::NamedTensors whole = mp->gather_full();  // collective
    if (lead) {
      models::GPT full(gpt_config(r.model));
      std::map<std::string, Tensor> by_name(whole.begin(), whole.end());
      for (auto& [name, p] : full.named_parameters()) p.copy_(by_name.at(name));
      SampleOptions so{r.sample.tokens, r.sample.temperature, r.sample.top_k, r.run.seed};
      full.train(false);
      res.sample = generate_text(full, tok, r.sample.prompt, so);
    }
  } else if (opts.sample && !interrupted) {
    dp.gather_all();  // collective
    if (lead) {
      SampleOptions so{r.sample.tokens, r.sample.temperature, r.sample.top_k, r.run.seed};
      model.train(false);
      res.sample = generate_text(model, tok, r.sample.prompt, so);
    }
  }
  if (!opts.quiet && lead) {
    // measured / predicted peak per category (the prediction of `brigade train --dry-run`)
    if (mp || !gpt) {  // the dry-run prediction models GPT under data parallelism; here: measured, rank 0
      auto m = [&](MemTag t) { return fmt::format("{} {}", mem_tag_name(t), format_bytes(res.memory.peak[size_t(t)])); };
      say(fmt::format("done: {} steps | final loss {:.4f} | val loss {:.4f} | {:.0f} tok/s (median) | MFU {:.1f}% of "
                      "{:.0f} GFLOP/s | peak memory of rank 0 {} ({}, {}, {}, {}, {}; every rank in memory.json)",
                      res.steps, res.last_loss, res.val_loss, res.tokens_per_s, 100.0 * res.mfu, peak,
                      format_bytes(res.memory.peak_total), m(MemTag::Params), m(MemTag::Grads), m(MemTag::Optimizer),
                      m(MemTag::Activations), m(MemTag::Workspace)));
    } else {
      const MemoryPrediction pred = predict_memory(r, 0);
      auto vs = [&](MemTag t) {
        const PredictedCategory& c = pred[t];
        const std::string p = c.peak_low == c.peak ? format_bytes(c.peak)
                                                   : format_bytes(c.peak_low) + " to " + format_bytes(c.peak);
        return fmt::format("{} {} / {}", mem_tag_name(t), format_bytes(res.memory.peak[size_t(t)]), p);
      };
      say(fmt::format("done: {} steps | final loss {:.4f} | val loss {:.4f} | {:.0f} tok/s (median) | MFU {:.1f}% of "
                      "{:.0f} GFLOP/s | peak memory measured / predicted {} / {} ({}, {}, {}, {}, {})",
                      res.steps, res.last_loss, res.val_loss, res.tokens_per_s, 100.0 * res.mfu, peak,
                      format_bytes(res.memory.peak_total), format_bytes(pred.total_peak), vs(MemTag::Params),
                      vs(MemTag::Grads), vs(MemTag::Optimizer), vs(MemTag::Activations), vs(MemTag::Workspace)));
    }
    if (policy.level != amp::Level::O0 && !mp && gpt)
      say(fmt::format("(the prediction is for fp32; at {} params include the {} weight copies and activations are "
                      "smaller: see docs/mixed-precision.md)",
                      r.precision.level, r.precision.dtype));
    if (scaler.enabled())
      say(fmt::format("loss scaling: {} | final scale {:g} | {} of {} steps skipped on overflow",
                      amp::scale_mode_name(scaler.mode()), scaler.scale(), scaler.skipped(), res.steps));
    if (P > 1)
      say(fmt::format("communication: {:.1f}% of the median step spent waiting (rank 0)", 100.0 * res.comm_wait_share));
    say("checkpoint: " + ckpt_dir);
    if (!res.best_dir.empty())
      say(fmt::format("best: val loss {:.4f} at step {} in {}", res.best_val_loss, res.best_step, res.best_dir));
    say("loss plot: " + (out_dir / "loss.svg").string());
  }
  return res;
}

}  // namespace brigade::train
