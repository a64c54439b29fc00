// Memory prediction from the recipe alone; see memory_plan.h.
#include "brigade/train/memory_plan.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/ops/ops.h"
#include "brigade/train/executor.h"
#include "brigade/train/model_configs.h"
#include "brigade/train/registry.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

namespace {

constexpr int64_t kAlign = 16;       // floats: parallel::DataParallel starts every parameter on 64 bytes
constexpr int64_t kMaxInFlight = 2;  // parallel::DataParallel::kMaxInFlight (reduce-scatters in flight)

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
// Bytes the allocator accounts for `n` fp32 values (or n elements of `size` bytes).
int64_t held(int64_t n, int64_t size = 4) { return int64_t(Allocator::round_size(size_t(n * size))); }

// parallel::DataParallel's flat layout and buckets, rebuilt from the planned units.
struct FlatPlan {
  struct Param {
    std::string name;
    int64_t offset = 0, numel = 0;
  };
  struct Range {
    int64_t begin = 0, end = 0;
  };
  std::vector<Param> params;
  std::vector<Range> units;    // flat range of each unit, in unit order
  std::vector<Range> buckets;  // in firing order (reverse parameter order)
  int64_t S = 0, lo = 0, hi = 0;
};

FlatPlan flat_plan(const std::vector<PlannedUnit>& units, int P, int rank, int zero, int64_t bucket_bytes) {
  FlatPlan f;
  int64_t off = 0;
  for (const PlannedUnit& u : units) {
    FlatPlan::Range ur{off, off};
    for (const auto& [name, n] : u.params) {
      f.params.push_back({name, off, n});
      off = round_up(off + n, kAlign);
    }
    ur.end = off;
    f.units.push_back(ur);
  }
  f.S = round_up((off + P - 1) / P, kAlign);
  f.lo = int64_t(rank) * f.S;
  f.hi = f.lo + f.S;
  if (zero == 3) {
    for (size_t u = f.units.size(); u-- > 0;)
      if (!units[u].params.empty()) f.buckets.push_back(f.units[u]);
  } else {
    bool open = false;
    FlatPlan::Range cur;
    for (size_t k = f.params.size(); k-- > 0;) {
      if (!open) cur.end = round_up(f.params[k].offset + f.params[k].numel, kAlign);
      open = true;
      cur.begin = f.params[k].offset;
      if ((cur.end - cur.begin) * 4 >= bucket_bytes) {
        f.buckets.push_back(cur);
        open = false;
      }
    }
    if (open) f.buckets.push_back(cur);
  }
  return f;
}

int64_t states_per_param(const OptimConfig& o) {
  if (o.name == "adamw" || o.name == "lamb") return 2;
  if (o.name == "sgd") return o.momentum != 0.0 ? 1 : 0;
  throw ConfigError(fmt::format("unknown optimizer '{}': use 'adamw', 'lamb' or 'sgd'", o.name));
}

std::string mib(int64_t b) { return format_bytes(b); }

}  // namespace

std::string format_bytes(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", double(b) / double(int64_t(1) << 30));
  if (b >= (int64_t(1) << 20)) return fmt::format("{:.2f} MiB", double(b) / double(1 << 20));
  return fmt::format("{:.1f} KiB", double(b) / 1024.0);
}

std::vector<PlannedUnit> planned_gpt_units(const ModelConfig& m) {
  const int64_t C = m.n_embd;
  std::vector<PlannedUnit> units;
  units.push_back({"embeddings+head",
                   {{"transformer.wte.weight", m.vocab_size * C},
                    {"transformer.wpe.weight", m.block_size * C},
                    {"transformer.ln_f.weight", C},
                    {"transformer.ln_f.bias", C}}});
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    units.push_back({fmt::format("transformer.h.{}", i),
                     {{p + "ln_1.weight", C},
                      {p + "ln_1.bias", C},
                      {p + "attn.c_attn.weight", C * 3 * C},
                      {p + "attn.c_attn.bias", 3 * C},
                      {p + "attn.c_proj.weight", C * C},
                      {p + "attn.c_proj.bias", C},
                      {p + "ln_2.weight", C},
                      {p + "ln_2.bias", C},
                      {p + "mlp.c_fc.weight", C * 4 * C},
                      {p + "mlp.c_fc.bias", 4 * C},
                      {p + "mlp.c_proj.weight", 4 * C * C},
                      {p + "mlp.c_proj.bias", C}}});
  }
  return units;
}

MemoryInputs measured_inputs(const Recipe& r) {
  const std::unique_ptr<Task> task = make_task(r);
  return measured_inputs(r, *task);
}

MemoryInputs measured_inputs(const Recipe& r, Task& t) {
  MemoryInputs in;
  in.measured = true;
  Task* task = &t;
  const std::vector<nn::Recompute> modes = apply_recompute(r, *task);
  for (nn::Recompute m : modes) in.recompute += models::recompute_name(m)[0];
  for (const parallel::ParamUnit& u : task->units(int(r.parallel.zero))) {
    PlannedUnit pu{u.name, {}};
    for (auto& [name, p] : u.params) pu.params.emplace_back(name, p.numel());
    in.units.push_back(std::move(pu));
  }
  for (auto& [name, p] : task->model().named_parameters())
    if (!p.requires_grad()) in.frozen.push_back({p.numel(), int64_t(p.element_size())});
  // One training micro-step and one evaluation batch of synthetic data, on the allocator's
  // activation and workspace accounting (the rest is the parameter layout, above).
  const amp::Policy policy = precision_policy(r.precision);
  Allocator& a = Allocator::instance();
  const int64_t act0 = a.stats().live[size_t(MemTag::Activations)];
  const int64_t work0 = a.stats().live[size_t(MemTag::Workspace)];
  const int64_t params0 = a.stats().live[size_t(MemTag::Params)];
  Batch b = task->synthetic_batch(r.run.seed + 2, r.train.batch_size);
  const int64_t batch_bytes = a.stats().live[size_t(MemTag::Activations)] - act0;
  a.reset_peak();
  task->model().train(true);
  // ZeRO-2/3's view of the backward (MemoryInputs::params_work_backward, early_grads): when the
  // backward first enters a gathered unit (the last block, once the head's backward is done), the
  // gradients made so far are read and the peaks restarted, so that the Params peak after it is
  // the backward's alone. The units' hooks are put back after the step, however it ends.
  std::array<int64_t, kNumMemTags> before{};  // the peaks up to that moment
  bool entered = false;
  {
    struct Hooked {
      nn::Module* module;
      std::function<Tensor(const Tensor&)> saved;
    };
    struct Restore {
      std::vector<Hooked> hooked;
      ~Restore() {
        for (Hooked& h : hooked) h.module->post_forward_hook = std::move(h.saved);
      }
    } restore;
    for (const parallel::ParamUnit& u : task->units(3)) {
      if (!u.module) continue;
      restore.hooked.push_back({u.module, u.module->post_forward_hook});
      u.module->post_forward_hook = [&, prev = u.module->post_forward_hook](const Tensor& out0) -> Tensor {
        const Tensor out = prev ? prev(out0) : out0;
        if (!out.requires_grad() || autograd::recomputing()) return out;
        return fn::backward_hook(out, [&] {
          if (entered) return;
          entered = true;
          before = a.stats().peak;
          for (auto& [name, p] : task->model().named_parameters())
            if (p.grad().defined()) in.early_grads.push_back(name);
          a.reset_peak();
        });
      };
    }
    Metrics extras;
    std::vector<Batch> micro{b};
    const std::shared_ptr<dist::ProcessGroup> one = dist::ProcessGroup::world();
    if (task->needs_whole_step()) task->begin_step(micro, Shard{0, 1, one.get()});
    Loss l;
    {
      amp::AutocastScope autocast(policy);
      l = task->loss(b, 0, extras);
    }
    autograd::backward(l.loss);
  }  // the hooks are back
  auto step_peak = [&](MemTag t) { return std::max(before[size_t(t)], a.stats().peak[size_t(t)]); };
  const int64_t train_act = step_peak(MemTag::Activations) - act0;
  const int64_t train_work = step_peak(MemTag::Workspace) - work0;
  in.params_work = step_peak(MemTag::Params) - params0;
  if (entered) in.params_work_backward = a.stats().peak[size_t(MemTag::Params)] - params0;
  for (auto& [name, p] : task->model().named_parameters()) p.set_grad(Tensor());
  int64_t eval_act = 0, eval_work = 0;
  {
    autograd::NoGradGuard ng;
    task->model().train(false);
    Batch e = task->synthetic_batch(r.run.seed + 3, task->eval_rows());
    a.reset_peak();
    const int64_t e0 = a.stats().live[size_t(MemTag::Activations)];
    Metrics m;
    amp::AutocastScope autocast(policy);
    task->prepare_eval();
    task->score(e, m);
    eval_act = a.stats().peak[size_t(MemTag::Activations)] - e0 + (e0 - act0);
    eval_work = a.stats().peak[size_t(MemTag::Workspace)] - work0;
  }
  in.act_peak = std::max(train_act, eval_act);
  in.act_live = batch_bytes;
  in.act_formula = fmt::format(
      "measured: one micro-batch of {} rows through forward and backward peaks at {} (its batch {} included; "
      "recompute {}: blocks {}); an evaluation batch of {} rows at {}",
      r.train.batch_size, mib(train_act), mib(batch_bytes), r.memory.recompute, in.recompute, task->eval_rows(),
      mib(eval_act));
  in.work_compute = std::max(train_work, eval_work);
  in.work_formula = fmt::format("kernel scratch measured on the dry step: {}", mib(in.work_compute));
  return in;
}

bool memory_from_formulas(const Recipe& r) {
  // the formulas know the whole model's layout in fp32; a LoRA run's trainable set comes from its
  // model, and at O1-O3 the working copies and the 16-bit activations from a measured dry step
  return model_entry(r.model.type).caps.memory_formula && r.finetune.method != "lora" &&
         precision_policy(r.precision).level == amp::Level::O0;
}

MemoryInputs memory_inputs(const Recipe& r) {
  MemoryInputs in;
  if (!memory_from_formulas(r)) return measured_inputs(r);
  in.units = planned_gpt_units(r.model);
  const int64_t B = r.train.batch_size, T = r.train.seq_len;
  const models::GPTConfig cfg = gpt_config(r.model);
  const models::RecomputePolicy policy{r.memory.recompute, r.memory.every_k,
                                       int64_t(r.memory.budget_mb * double(1 << 20))};
  const std::vector<nn::Recompute> modes = models::plan_recompute(cfg, B, T, policy);
  for (nn::Recompute m : modes) in.recompute += models::recompute_name(m)[0];
  in.act_peak = models::estimate_activation_peak(cfg, B, T, modes);
  in.act_live = 2 * held(B * T, 8);  // the batch's ids and targets, kept by the loop
  {
    models::GPTConfig no_blocks = cfg;
    no_blocks.n_layer = 0;
    const int64_t head = models::estimate_activation_peak(no_blocks, B, T, {});
    const int64_t logits = held(B * T * r.model.vocab_size);
    const int64_t per_block = r.model.n_layer > 0 ? (in.act_peak - head) / r.model.n_layer : 0;
    in.act_formula = fmt::format(
        "peak of one micro-batch of B x T = {} x {} tokens (train.batch_size rows; accumulation does not "
        "add): embeddings and head = {} (logits B x T x V = {}, their gradient written over them by the "
        "cross-entropy backward, with ln_f and the tied head's gradient) + {} block{} x {} each (what a block "
        "keeps for its backward, "
        "and with recompute the re-run block's transients; recompute {}: blocks {})",
        B, T, mib(head), mib(logits), r.model.n_layer, r.model.n_layer == 1 ? "" : "s", mib(per_block),
        r.memory.recompute, in.recompute);
  }
  // the attention kernels' per-thread tiles, during the forward and backward
  const int threads = resolve_threads(r.run.threads);
  in.work_compute = r.model.n_layer > 0 ? threads * ops::attention_workspace_per_thread(r.train.seq_len,
                                                                                        r.model.n_embd / r.model.n_head)
                                        : 0;
  in.work_formula =
      fmt::format("attention tiles {} threads x {}", threads, mib(in.work_compute / std::max(threads, 1)));
  in.measured = false;
  return in;
}

MemoryPrediction predict_memory(const Recipe& r, int rank) { return predict_memory(r, rank, memory_inputs(r)); }

MemoryPrediction predict_memory(const Recipe& r, int rank, const MemoryInputs& in) {
  const int P = int(r.parallel.dp), zero = int(r.parallel.zero);
  BRIGADE_CHECK(rank >= 0 && rank < P, ValueError, "predict_memory: rank {} is outside parallel.dp = {}", rank, P);
  MemoryPrediction out;
  out.rank = rank;
  out.dp = P;
  out.zero = zero;
  out.measured = in.measured;
  const std::vector<PlannedUnit>& units = in.units;
  const int64_t bucket_bytes = int64_t(r.parallel.bucket_mb * double(1 << 20));
  const FlatPlan f = flat_plan(units, P, rank, zero, bucket_bytes);
  const int64_t padded = f.S * P;
  const bool async = P > 1 && r.parallel.overlap;  // a communication thread (else collectives run inline)
  auto unit_bytes = [&](size_t u) { return held(f.units[u].end - f.units[u].begin); };
  auto bucket_bytes_of = [&](size_t b) { return held(f.buckets[b].end - f.buckets[b].begin); };
  PredictedCategory& params = out.tags[size_t(MemTag::Params)];
  PredictedCategory& grads = out.tags[size_t(MemTag::Grads)];
  PredictedCategory& optim = out.tags[size_t(MemTag::Optimizer)];
  PredictedCategory& acts = out.tags[size_t(MemTag::Activations)];
  PredictedCategory& work = out.tags[size_t(MemTag::Workspace)];
  PredictedCategory& other = out.tags[size_t(MemTag::Other)];
  const int64_t flat_numel = f.params.empty() ? 0 : f.params.back().offset + f.params.back().numel;
  int64_t n_params = 0;
  for (const auto& p : f.params) n_params += p.numel;
  const std::string layout_words =
      fmt::format("{} parameters, each 16-float aligned = {} floats, padded to dp x S = {} x {}", n_params,
                  round_up(flat_numel, kAlign), P, f.S);

  // ---- parameters
  int64_t pair = 0;  // ZeRO-3: the two largest consecutive block units
  if (zero < 3) {
    params.live = params.peak = held(padded);
    params.formula = fmt::format("flat fp32 buffer: 4 B x ({})", layout_words);
  } else {
    // the two largest consecutive block units (computing + prefetched; equal blocks for the transformers)
    const size_t blocks = units.size() - 1;
    int64_t block = 0;
    for (size_t u = 1; u < units.size(); ++u) {
      block = std::max(block, unit_bytes(u));
      pair = std::max(pair, unit_bytes(u) + (u + 1 < units.size() ? unit_bytes(u + 1) : 0));
    }
    params.live = held(f.S);
    params.peak = params.live + unit_bytes(0) + pair;
    params.formula = fmt::format(
        "shard 4 B x S ({}; {}) + gathered during the step: embeddings+head unit {} + {} block units "
        "(computing + prefetched) x {}",
        mib(params.live), layout_words, mib(unit_bytes(0)), std::min<size_t>(blocks, 2), mib(block));
  }

  if (!in.frozen.empty()) {
    int64_t frozen = 0, n = 0, sixteen = 0;
    for (const MemoryInputs::Frozen& t : in.frozen) {
      frozen += held(t.numel, t.element_bytes), n += t.numel;
      if (t.element_bytes == 2) sixteen += t.numel;
    }
    params.live += frozen;
    params.peak += frozen;
    params.formula +=
        fmt::format(" + the frozen base, whole on every rank: {} tensors, {} parameters{}, {}", in.frozen.size(), n,
                    sixteen == n  ? " at 2 B (lora.base_dtype)"
                    : sixteen > 0 ? fmt::format(" ({} of them at 2 B)", sixteen)
                                  : "",
                    mib(frozen));
  }
  if (in.params_work > 0 && zero == 3 && in.params_work_backward >= 0) {
    // ZeRO-3 holds two gathered block units only from the backward's entry into the last block
    // on (the forward releases each block after it); the head's working copy is gone by then
    const int64_t base = params.peak - pair;
    params.peak = std::max(params.peak + in.params_work_backward, base + in.params_work);
    params.formula += fmt::format(
        " + the weights' working copies, measured on the dry step: the larger of those alive in the backward ({}, "
        "beside the gathered pair) and the step's peak of them ({}, with no block unit gathered)",
        mib(in.params_work_backward), mib(in.params_work));
  } else if (in.params_work > 0) {
    params.peak += in.params_work;
    params.formula += fmt::format(" + the weights' working copies at the step's peak, measured on the dry step: {}",
                                  mib(in.params_work));
  }

  // ---- gradients
  int64_t first_bucket = 0;  // zero >= 2: armed at the start of every micro-step
  if (zero < 2) {
    grads.live = grads.peak = held(padded);
    grads.formula = "flat fp32 buffer, the same layout as the parameters (every gradient a view)";
  } else {
    // A bucket fires when its gradients are complete: its buffer becomes the staging of a
    // reduce-scatter and the next bucket is armed, so inline (one rank or overlap off) two
    // consecutive buffers are alive at once. With the communication thread the stagings of
    // earlier buckets live until their reduce-scatter ends: at most kMaxInFlight pending, plus
    // (ZeRO-2) one just completed whose task is still being destroyed; under ZeRO-3 the wait
    // for each unit's gather (queued after the earlier reduce-scatters) retires them sooner.
    const size_t low_window = 2;
    const size_t high_window = !async ? 2 : zero == 3 ? size_t(kMaxInFlight) + 1 : size_t(kMaxInFlight) + 2;
    // The gradients the head makes before the backward reaches the blocks (in.early_grads): a
    // parameter whose bucket is not armed yet (any but the first) gets a gradient of its own,
    // copied into the bucket when that fires, so it lives until then.
    std::vector<std::pair<size_t, int64_t>> early;  // (bucket, bytes)
    int64_t early_bytes = 0;
    const std::set<std::string> early_names(in.early_grads.begin(), in.early_grads.end());
    for (const auto& p : f.params) {
      if (!early_names.count(p.name)) continue;
      for (size_t b = 1; b < f.buckets.size(); ++b)
        if (p.offset >= f.buckets[b].begin && p.offset < f.buckets[b].end) {
          early.emplace_back(b, held(p.numel));
          early_bytes += held(p.numel);
          break;
        }
    }
    // a window of buckets [b, e) peaks when e - 1 is armed and the ones before it are in flight
    auto most = [&](size_t window) {
      int64_t worst = 0;
      for (size_t b = 0; b < f.buckets.size(); ++b) {
        const size_t e = std::min(f.buckets.size(), b + window);
        int64_t s = 0;
        for (size_t k = b; k < e; ++k) s += bucket_bytes_of(k);
        for (const auto& [k, bytes] : early)
          if (k + 1 >= e) s += bytes;
        worst = std::max(worst, s);
      }
      return worst;
    };
    if (!f.buckets.empty()) first_bucket = bucket_bytes_of(0);
    grads.live = held(f.S);
    grads.peak = grads.live + most(high_window);
    grads.peak_low = grads.live + most(low_window);
    grads.formula = fmt::format(
        "shard 4 B x S ({}) + the most bucket buffers alive at once{}: {} consecutive of {} buckets ({}) = {}",
        mib(grads.live),
        early_bytes > 0 ? fmt::format(" (and until theirs fires, the gradients the head makes before their bucket is "
                                      "armed, {} tensor{} measured on the dry step, {})",
                                      early.size(), early.size() == 1 ? "" : "s", mib(early_bytes))
                        : std::string(),
        high_window == low_window ? fmt::format("{}", low_window) : fmt::format("{} to {}", low_window, high_window),
        f.buckets.size(),
        zero == 3 ? "ZeRO-3: one per unit"
                  : fmt::format("reverse parameter order, >= {} MiB each", r.parallel.bucket_mb),
        high_window == low_window ? mib(most(low_window))
                                  : fmt::format("{} to {} (overlap on: how many depends on how fast the "
                                                "reduce-scatters finish)",
                                                mib(most(low_window)), mib(most(high_window))));
  }

  // ---- optimizer state
  const int64_t states = states_per_param(r.optim);
  int64_t per_state = 0, tensors = 0;
  for (const auto& p : f.params) {
    const int64_t a = zero >= 1 ? std::max(p.offset, f.lo) : p.offset;
    const int64_t b = zero >= 1 ? std::min(p.offset + p.numel, f.hi) : p.offset + p.numel;
    if (a >= b) continue;
    per_state += held(b - a);
    ++tensors;
  }
  optim.live = optim.peak = states * per_state;
  optim.formula = fmt::format(
      "{} state{} ({}) x {} tensor{} {}, each rounded by the allocator: {} x {}", states, states == 1 ? "" : "s",
      r.optim.name, tensors, tensors == 1 ? "" : "s",
      zero >= 1 ? fmt::format("(this rank's pieces of its ZeRO shard [{}, {}))", f.lo, f.hi) : "(one per parameter)",
      states, mib(per_state));

  // ---- activations: one micro-batch (train.batch_size rows) through the recompute plan
  out.recompute = in.recompute;
  acts.peak = in.act_peak;
  acts.live = in.act_live;
  acts.formula = in.act_formula;

  // ---- workspace: the attention kernels' per-thread tiles (during the forward and backward), the
  // reduce-scatter output of one bucket (the communication runs one at a time; with the
  // communication thread it overlaps the backward), and the global norm's partial sums (after it)
  {
    const int64_t attn = in.work_compute;
    int64_t norm = 0;
    if (zero == 0)
      for (const auto& p : f.params) norm = std::max(norm, ops::sum_squares_workspace(p.numel));
    else
      norm = ops::sum_squares_workspace(f.S);
    int64_t worst = 0;
    if (zero >= 1)
      for (const auto& bk : f.buckets) {
        const int64_t mine = std::max<int64_t>(0, std::min(bk.end, f.hi) - std::max(bk.begin, f.lo));
        worst = std::max(worst, held(std::max<int64_t>(mine, 1)));
      }
    // with the communication thread a reduce-scatter may or may not coincide with the tiles: a range
    work.peak_low = std::max({worst, attn, norm});
    work.peak = std::max({async ? worst + attn : std::max(worst, attn), norm});
    work.formula = fmt::format(
        "{}{}; the gradient norm's partial sums {}", in.work_formula,
        zero >= 1 ? fmt::format("; largest reduce-scatter output {} (this rank's part of one bucket{})", mib(worst),
                                async ? ", with the communication thread at times alongside the attention tiles" : "")
                  : std::string(" (ZeRO-0 allreduces the gradient buffer in place)"),
        mib(norm));
  }

  // ---- other: checkpoint staging (every run writes one at its end). ZeRO >= 1: each rank copies
  // its shard of every optimizer state into one flat tensor to write it; ZeRO-3: rank 0 also
  // copies every parameter, one gathered unit at a time.
  std::vector<std::string> staged;
  if (zero >= 1) {
    const int64_t numel = f.params.empty() ? 0 : f.params.back().offset + f.params.back().numel;
    const int64_t len = std::max<int64_t>(0, std::min(f.hi, numel) - f.lo);
    other.peak += states * held(len);
    staged.push_back(fmt::format("this rank's shard of the {} optimizer state{} as flat copies {}", states,
                                 states == 1 ? "" : "s", mib(states * held(len))));
  }
  if (zero == 3 && rank == 0) {
    int64_t copies = 0;
    for (const auto& p : f.params) copies += held(p.numel);
    other.peak += copies;
    staged.push_back(fmt::format("rank 0 under ZeRO-3: a copy of every parameter {}", mib(copies)));
  }
  other.formula = "none";
  for (size_t i = 0; i < staged.size(); ++i)
    other.formula = (i == 0 ? "while a checkpoint is written: " : other.formula + "; ") + staged[i];

  // ---- total: at the activation peak (the head's backward) the steady state is held, plus the
  // embeddings+head unit (ZeRO-3) and the first gradient bucket, armed for the backward (ZeRO >= 2)
  const int64_t unit0 = zero == 3 ? unit_bytes(0) : 0;
  const int64_t in_step = params.live + grads.live + optim.live + acts.peak + unit0 + first_bucket + in.params_work;
  // while a checkpoint is written: the state held between steps and the staging copies (the
  // optimizer shards are copied after the last gathered unit is released)
  const int64_t at_checkpoint = params.live + grads.live + optim.live + other.peak;
  out.total_peak = std::max(in_step, at_checkpoint);
  for (PredictedCategory& c : out.tags)
    if (c.peak_low == 0) c.peak_low = c.peak;
  out.total_formula = "params + grads + optimizer held between steps + the activation peak" +
                      std::string(zero == 3 ? " + the gathered embeddings+head unit" : "") +
                      (zero >= 2 ? " + the first gradient bucket (armed)" : "") +
                      (in.params_work > 0 ? " + the weights' working copies" : "") +
                      (other.peak > 0 ? fmt::format("; or, if larger ({}), the held state + the checkpoint's staging "
                                                    "copies (other)",
                                                    at_checkpoint > in_step ? "it is" : "it is not")
                                      : std::string());
  return out;
}

nlohmann::json prediction_json(const MemoryPrediction& p, bool formulas) {
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

nlohmann::json dry_run_json(const Recipe& r) {
  const MemoryInputs in = memory_inputs(r);
  nlohmann::json j{
      {"model", r.model.type}, {"measured", in.measured}, {"dp", r.parallel.dp}, {"zero", r.parallel.zero}};
  for (int p = 0; p < int(r.parallel.dp); ++p) j["ranks"].push_back(prediction_json(predict_memory(r, p, in), p == 0));
  if (r.parallel.tp > 1 || r.parallel.pp > 1)
    j["note"] = fmt::format(
        "this prediction models data parallelism only: parallel.tp = {} and parallel.pp = {} are not in it; "
        "`mpirun -np {} brigade train ... --dry-run` measures every rank of the mesh",
        r.parallel.tp, r.parallel.pp, r.parallel.dp * r.parallel.tp * r.parallel.pp);
  return j;
}

std::string dry_run_report(const Recipe& r) {
  const MemoryInputs in = memory_inputs(r);
  std::vector<MemoryPrediction> ranks;
  for (int p = 0; p < int(r.parallel.dp); ++p) ranks.push_back(predict_memory(r, p, in));
  bool differ = false;
  for (const MemoryPrediction& m : ranks) {
    for (int i = 0; i < kNumMemTags; ++i) {
      const PredictedCategory &a = m.tags[size_t(i)], &b = ranks[0].tags[size_t(i)];
      differ = differ || a.peak != b.peak || a.peak_low != b.peak_low || a.live != b.live;
    }
    differ = differ || m.total_peak != ranks[0].total_peak;
  }
  const size_t cols = differ ? ranks.size() : 1;
  const MemoryPrediction& p0 = ranks[0];
  const int64_t B = r.train.batch_size, T = r.train.seq_len, A = r.train.accumulation, P = r.parallel.dp;
  std::string s = fmt::format(
      "dry run: {} (nothing trained, no data read)\n"
      "model: {} ({}) {} layers, {} dims, {} heads | micro-batch {} rows{}, accumulation {}, dp {} (global batch {} "
      "rows) | optimizer {} | ZeRO-{} | recompute {} (blocks {})\n"
      "prediction: {}\n\n",
      r.path.empty() ? "default recipe" : r.path, r.model.type, model_entry(r.model.type).summary, r.model.n_layer,
      r.model.n_embd, r.model.n_head, B,
      model_entry(r.model.type).data == DataKind::Text ? fmt::format(" x {} tokens", T) : std::string(), A, P,
      B * A * P, r.optim.name, r.parallel.zero, r.memory.recompute, p0.recompute,
      in.measured ? "params, grads, optimizer and other from the flat layout of the model's parameters; activations "
                    "and workspace measured on one dry step of a synthetic micro-batch (and one evaluation batch) on "
                    "the caching allocator, with this process's kernels"
                  : "every category from formulas (docs/memory.md)");
  if (r.parallel.tp > 1 || r.parallel.pp > 1)
    s += fmt::format(
        "note: this prediction models data parallelism only; parallel.tp = {} and parallel.pp = {} are "
        "not in it: `mpirun -np {} brigade train ... --dry-run` measures every rank of the mesh (a tp/pp run "
        "also writes every rank's peaks into memory.json; docs/model-parallel.md)\n\n",
        r.parallel.tp, r.parallel.pp, r.parallel.dp * r.parallel.tp * r.parallel.pp);
  s += fmt::format("{:<12}", "category");
  for (size_t c = 0; c < cols; ++c)
    s += fmt::format(" {:>34}", cols > 1 ? fmt::format("rank {} peak (live)", c) : std::string("peak (live)"));
  s += "\n";
  for (MemTag t :
       {MemTag::Params, MemTag::Grads, MemTag::Optimizer, MemTag::Activations, MemTag::Workspace, MemTag::Other}) {
    s += fmt::format("{:<12}", mem_tag_name(t));
    for (size_t c = 0; c < cols; ++c) {
      const PredictedCategory& pc = ranks[c][t];
      const std::string peak = pc.peak_low == pc.peak
                                   ? format_bytes(pc.peak)
                                   : fmt::format("{} to {}", format_bytes(pc.peak_low), format_bytes(pc.peak));
      s += fmt::format(" {:>34}", fmt::format("{} ({})", peak, format_bytes(pc.live)));
    }
    s += "\n";
  }
  s += fmt::format("{:<12}", "total");
  for (size_t c = 0; c < cols; ++c) s += fmt::format(" {:>34}", format_bytes(ranks[c].total_peak));
  s += "\n\nformulas (rank 0; bytes as the allocator rounds them: 64 B up to 4 KiB, 4 KiB up to 1 MiB, then 64 KiB):\n";
  for (MemTag t :
       {MemTag::Params, MemTag::Grads, MemTag::Optimizer, MemTag::Activations, MemTag::Workspace, MemTag::Other})
    s += fmt::format("  {:<12} {}\n", mem_tag_name(t), p0[t].formula);
  s += fmt::format("  {:<12} {}\n", "total", p0.total_formula);
  return s;
}

}  // namespace brigade::train
