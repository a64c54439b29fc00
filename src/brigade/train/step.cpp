// The pieces of a training step the loop, `brigade bench` and the memory plan share; see trainer.h.
#include <omp.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/nn/layers.h"
#include "brigade/ops/ops.h"
#include "brigade/train/model_configs.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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
    auto lamb =
        std::make_unique<optim::LAMB>(params, optim::LAMBOptions{o.beta1, o.beta2, o.eps, o.weight_decay},
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
    o.mode =
        policy.level != amp::Level::O0 && policy.low == DType::F16 ? amp::ScaleMode::Dynamic : amp::ScaleMode::None;
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
                             const std::function<double(double)>& clip,
                             const std::function<void(const nn::NamedTensors&)>& after_update,
                             const std::function<bool(double)>& accept) {
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
  if (accept && !accept(out.grad_norm)) {
    out.rejected = true;
    opt.set_grad_scale(1.0);  // a fused clip coefficient is for this step's gradients only
    return out;
  }
  // then by value: elementwise, so on this rank's optimizer views (whole parameters or ZeRO shards)
  optim::clip_grad_value(dp.optimizer_params(), t.clip_value);
  opt.step(lr);
  if (after_update) after_update(dp.optimizer_params());
  if (pure_low)
    round_state_to_low(dp, opt, policy.low);  // includes dp.after_optimizer_step()
  else
    dp.after_optimizer_step();
  return out;
}

namespace {
std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested.store(true); }
}  // namespace

struct StopSignalGuard::Saved {
  struct sigaction old_int {
  }, old_term{};
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

optim::Schedule make_schedule(const Recipe& r) {
  return optim::Schedule{optim::schedule_from_name(r.schedule.name),
                         r.optim.lr,
                         r.schedule.min_lr,
                         r.schedule.warmup_steps,
                         r.train.steps,
                         r.schedule.step_every,
                         r.schedule.step_gamma,
                         r.schedule.decay_steps,
                         optim::decay_shape_from_name(r.schedule.decay_shape)};
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

std::vector<nn::Recompute> recompute_plan(const Recipe& r, size_t blocks) {
  const models::RecomputePolicy policy{r.memory.recompute, r.memory.every_k,
                                       int64_t(r.memory.budget_mb * double(1 << 20))};
  // "budget" reads the GPT activation estimate (the registry allows it for gpt only); the other
  // policies depend on the block count alone.
  models::GPTConfig shape = gpt_config(r.model);
  shape.n_layer = int64_t(blocks);
  return models::plan_recompute(shape, r.train.batch_size, r.train.seq_len, policy);
}

std::vector<nn::Recompute> apply_recompute(const Recipe& r, Task& task) {
  const auto blocks = nn::find_blocks(task.model());
  const std::vector<nn::Recompute> modes = recompute_plan(r, blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i].second->recompute = modes[i];
  return modes;
}

void load_state(const std::string& path, const nn::NamedTensors& state) {
  ckpt::SafetensorsReader in(path);
  std::set<std::string> expected;
  for (auto [name, t] : state) {
    expected.insert(name);
    BRIGADE_CHECK(in.contains(name), CheckpointError,
                  "{}: tensor '{}' is missing; the checkpoint was written for a different model config", path, name);
    const Tensor v = in.get(name);
    BRIGADE_CHECK(v.shape() == t.shape(), CheckpointError,
                  "{}: tensor '{}' has shape {} but the model expects {}; check model.* in the recipe", path, name,
                  shape_str(v.shape()), shape_str(t.shape()));
    t.copy_(v);
  }
  for (const std::string& name : in.names())
    BRIGADE_CHECK(expected.count(name), CheckpointError, "{}: unexpected tensor '{}' (not in this model's state)", path,
                  name);
}

}  // namespace brigade::train
