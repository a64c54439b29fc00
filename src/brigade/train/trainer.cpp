// The training loop; see trainer.h.
#include "brigade/train/trainer.h"

#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"
#include "brigade/data/prepare.h"
#include "brigade/data/sampler.h"
#include "brigade/data/token_file.h"
#include "brigade/data/tokenizer.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/ops/ops.h"
#include "brigade/optim/optimizer.h"
#include "brigade/optim/schedule.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/generate.h"

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

double measure_gemm_peak_gflops() {
  const int64_t n = 1024;
  autograd::NoGradGuard ng;
  Tensor a = Tensor::full({n, n}, 0.5), b = Tensor::full({n, n}, 0.25);  // (n, n)
  double best = 1e30;
  for (int i = 0; i < 12; ++i) {  // best of 12 (the first includes primitive creation)
    auto t0 = Clock::now();
    Tensor c = ops::matmul(a, b);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * double(n) * double(n) * double(n) / best / 1e9;
}

namespace {

// Ctrl-C / SIGTERM: finish the current step, checkpoint, stop. A second signal
// kills as usual (SA_RESETHAND).
std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested.store(true); }

class StopSignalGuard {
 public:
  StopSignalGuard() {
    g_stop_requested.store(false);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignalGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

std::string fmt_duration(double s) {
  if (s < 0 || !std::isfinite(s)) return "?";
  int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

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


std::unique_ptr<optim::Optimizer> make_optimizer(const OptimConfig& o, const nn::NamedTensors& params) {
  if (o.name == "adamw") return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{o.beta1, o.beta2, o.eps, o.weight_decay});
  if (o.name == "sgd") return std::make_unique<optim::SGD>(params, optim::SGDOptions{o.momentum, o.weight_decay, false});
  throw ConfigError(fmt::format("unknown optimizer '{}': use 'adamw' or 'sgd'", o.name));
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
std::string resume_differences(const Recipe& saved, const Recipe& now) {
  static const std::set<std::string> harmless{"run.name",         "run.out_dir",        "train.steps",
                                              "train.eval_every", "train.eval_batches", "train.log_every",
                                              "train.checkpoint_every"};
  const auto a = recipe_values(saved), b = recipe_values(now);
  std::string diff;
  for (const auto& [key, value] : b) {
    if (harmless.count(key) || key.rfind("sample.", 0) == 0) continue;
    auto it = a.find(key);
    if (it != a.end() && it->second != value) diff += fmt::format("{}{} ({} -> {})", diff.empty() ? "" : ", ", key, it->second, value);
  }
  return diff;
}

// Keeps metrics.jsonl consistent on resume: drops records past the resumed step.
void truncate_metrics(const fs::path& p, int64_t step) {
  std::ifstream in(p);
  if (!in) return;
  std::vector<std::string> keep;
  for (std::string line; std::getline(in, line);) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.value("step", int64_t(0)) <= step) keep.push_back(line);
    } catch (...) {
      // a torn last line from a crash: drop it
    }
  }
  in.close();
  std::ofstream out(p, std::ios::trunc);
  for (auto& l : keep) out << l << '\n';
}

}  // namespace

TrainResult run_training(const Recipe& r, const TrainOptions& opts) {
  if (r.run.threads > 0) omp_set_num_threads(r.run.threads);
  const bool tty = isatty(fileno(stderr)) && !opts.quiet;
  auto say = [&](const std::string& s) {
    if (!opts.quiet) fmt::print(stderr, "{}\n", s);
  };

  // ---- data: prepared on first use; once prepared, `brigade prepare` owns it (so a damaged
  // or stale token file is reported, not silently rebuilt)
  const fs::path data_dir(r.data.dir);
  if (!fs::exists(data_dir / data::kMetaFile)) {
    data::prepare(prepare_options(r), [&](const data::PrepareProgress& p) { say("prepare: " + p.message); });
  }
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
  const int64_t B = r.train.batch_size, T = r.train.seq_len;
  data::BatchSampler sampler(train_ds, B, T, r.run.seed);
  data::BatchSampler val_sampler(val_ds, B, T, r.run.seed);

  // ---- model + optimizer
  models::GPT model(gpt_config(r.model));
  {
    Generator init_gen(r.run.seed);
    model.init_weights(init_gen);
  }
  model.dropout_generator().manual_seed(r.run.seed + 1);
  const nn::NamedTensors params = model.named_parameters();
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, params);
  optim::Schedule sched{optim::schedule_from_name(r.schedule.name), r.optim.lr, r.schedule.min_lr,
                        r.schedule.warmup_steps, r.train.steps};

  const fs::path out_dir(r.run.out_dir);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  BRIGADE_CHECK(!ec, IoError, "cannot create run.out_dir {}: {}; choose a writable folder", out_dir.string(),
                ec.message());
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
    const std::string diff = resume_differences(checkpoint_recipe(ckpt_dir), r);
    if (!diff.empty())
      say("warning: resuming with settings that differ from the checkpoint's recipe: " + diff +
          "; the continuation will not match an uninterrupted run");
    load_model_weights((fs::path(ckpt_dir) / "model.safetensors").string(), model);
    load_optimizer_state(ckpt_dir, *opt, state.step);
    model.dropout_generator().set_state(state.rng_state);
    BRIGADE_CHECK(state.step < last_step, ConfigError,
                  "nothing to train: the checkpoint in {} is at step {} and this run ends at step {}; raise "
                  "train.steps (e.g. --set train.steps={}) or --stop-at to continue",
                  ckpt_dir, state.step, last_step, r.train.steps + state.step);
    truncate_metrics(metrics_path, state.step);
    say(fmt::format("resumed from {} at step {}", ckpt_dir, state.step));
  } else {
    std::ofstream(metrics_path, std::ios::trunc);
  }
  std::ofstream metrics(metrics_path, std::ios::app);
  BRIGADE_CHECK(metrics.good(), IoError, "cannot write {}: check the run.out_dir permissions", metrics_path.string());

  const double flops_per_token = model.flops_per_token(T);
  const double peak = measure_gemm_peak_gflops();
  say(fmt::format("model: GPT {} layers, {} dims, {} heads, vocab {}, {:.2f}M parameters | data: {} train / {} val "
                  "tokens | {} threads, GEMM peak {:.0f} GFLOP/s",
                  r.model.n_layer, r.model.n_embd, r.model.n_head, r.model.vocab_size,
                  double(model.num_parameters()) / 1e6, train_ds.size(), val_ds.size(), omp_get_max_threads(), peak));

  auto evaluate = [&]() {
    autograd::NoGradGuard ng;
    model.train(false);
    Tensor x = Tensor::empty({B, T}, DType::I64), y = Tensor::empty({B, T}, DType::I64);  // (B, T)
    double total = 0.0;
    const int64_t n = std::max<int64_t>(1, r.train.eval_batches);
    for (int64_t i = 0; i < n; ++i) {
      val_sampler.get_eval_batch(i, n, x, y);
      total += model.loss(x, y).item();
    }
    model.train(true);
    return total / double(n);
  };

  Tensor x = Tensor::empty({B, T}, DType::I64), y = Tensor::empty({B, T}, DType::I64);  // (B, T)
  std::vector<double> step_times;
  double last_loss = 0.0, tok_s = 0.0;
  const auto t_start = Clock::now();
  const int64_t start_step = state.step;
  Allocator::instance().reset_peak();
  model.train(true);
  StopSignalGuard stop_guard;
  bool interrupted = false;
  for (int64_t step = state.step; step < last_step; ++step) {
    const auto t0 = Clock::now();
    sampler.get_batch(step, x, y);
    opt->zero_grad();
    Tensor loss = model.loss(x, y);
    autograd::backward(loss);
    last_loss = loss.item();
    BRIGADE_CHECK(std::isfinite(last_loss), ValueError,
                  "loss became {} at step {}; the run diverged: lower optim.lr, keep train.grad_clip on, or resume "
                  "from the last checkpoint in {}",
                  last_loss, step + 1, ckpt_dir);
    const double norm = optim::clip_grad_norm(params, r.train.grad_clip);
    const double lr = sched.lr_at(step);
    opt->step(lr);
    loss = Tensor();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    step_times.push_back(dt);
    state.step = step + 1;
    state.tokens_seen += B * T;
    tok_s = double(B * T) / dt;
    const double mfu = tok_s * flops_per_token / (peak * 1e9);

    const bool log_now = r.train.log_every > 0 && (state.step % r.train.log_every == 0 || state.step == last_step);
    if (log_now) {
      nlohmann::json j{{"step", state.step}, {"loss", last_loss},     {"lr", lr},
                       {"grad_norm", norm},  {"tokens_per_s", tok_s}, {"mfu", mfu},
                       {"tokens_seen", state.tokens_seen},
                       {"mem_peak", memory_json(Allocator::instance().stats())["peak"]}};
      metrics << j.dump() << '\n';
      metrics.flush();
    }
    if (!opts.quiet) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double eta = elapsed / double(state.step - start_step) * double(last_step - state.step);
      std::string line = fmt::format("step {:>5}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | MFU {:.1f}% | ETA {}",
                                     state.step, last_step, last_loss, lr, tok_s, 100.0 * mfu, fmt_duration(eta));
      if (tty)
        fmt::print(stderr, "\r{}\033[K", line);
      else if (log_now)
        fmt::print(stderr, "{}\n", line);
    }
    const bool eval_now = r.train.eval_every > 0 && state.step % r.train.eval_every == 0;
    if (eval_now || state.step == last_step) {
      state.last_val_loss = evaluate();
      metrics << nlohmann::json{{"step", state.step}, {"val_loss", state.last_val_loss}}.dump() << '\n';
      metrics.flush();
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("step {:>5}/{} | val loss {:.4f}", state.step, last_step, state.last_val_loss));
    }
    interrupted = g_stop_requested.load() && state.step < last_step;
    const bool ckpt_now = r.train.checkpoint_every > 0 && state.step % r.train.checkpoint_every == 0;
    if (ckpt_now || state.step == last_step || interrupted) {
      state.rng_state = model.dropout_generator().state();
      save_checkpoint(ckpt_dir, model, opt.get(), state, r, (data_dir / data::kTokenizerFile).string());
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
    res.tokens_per_s = double(B * T) / s[s.size() / 2];
  }
  res.gemm_peak_gflops = peak;
  res.mfu = res.tokens_per_s * flops_per_token / (peak * 1e9);
  res.memory = Allocator::instance().stats();
  res.checkpoint_dir = ckpt_dir;
  {
    std::ofstream mj(out_dir / "memory.json");
    mj << memory_json(res.memory).dump(2) << '\n';
  }
  if (opts.sample && !interrupted) {
    SampleOptions so{r.sample.tokens, r.sample.temperature, r.sample.top_k, r.run.seed};
    model.train(false);
    res.sample = generate_text(model, tok, r.sample.prompt, so);
  }
  if (!opts.quiet) {
    say(fmt::format("done: {} steps | final loss {:.4f} | val loss {:.4f} | {:.0f} tok/s (median) | MFU {:.1f}% of "
                    "{:.0f} GFLOP/s | peak memory {} (params {}, grads {}, optimizer {}, activations {})",
                    res.steps, res.last_loss, res.val_loss, res.tokens_per_s, 100.0 * res.mfu, peak,
                    fmt_bytes(res.memory.peak_total), fmt_bytes(res.memory.peak[0]), fmt_bytes(res.memory.peak[1]),
                    fmt_bytes(res.memory.peak[2]), fmt_bytes(res.memory.peak[3])));
    say("checkpoint: " + ckpt_dir);
  }
  return res;
}

}  // namespace brigade::train
