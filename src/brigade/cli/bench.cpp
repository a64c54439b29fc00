// `brigade bench`; see bench.h.
#include "brigade/cli/bench.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "brigade/amp/loss_scaler.h"
#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/optim/optimizer.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/executor.h"
#include "brigade/train/registry.h"
#include "brigade/train/trainer.h"

namespace brigade::cli {

using namespace brigade::train;  // the recipes, tasks and trainer these commands drive

BenchResult run_bench(const Recipe& recipe, const BenchOptions& o) {
  const Recipe r = deterministic_split(recipe);  // parallel.deterministic: micro-steps of one atom each
  BRIGADE_CHECK(o.steps >= 1 && o.warmup >= 0, ConfigError,
                "bench: --steps must be >= 1 and --warmup >= 0, got {} and {}", o.steps, o.warmup);
  const std::shared_ptr<dist::ProcessGroup> world = o.group ? o.group : dist::ProcessGroup::world();
  // data parallel under mpirun: every rank times its own micro-batch of train.batch_size rows, with
  // the gradient synchronisation of the trainer's step (weak scaling: the job's items are dp x a rank's)
  BRIGADE_CHECK(r.parallel.dp == world->size(), ConfigError, "bench: parallel.dp = {} but {} process{} run{}: {}",
                r.parallel.dp, world->size(), world->size() == 1 ? "" : "es", world->size() == 1 ? "s" : "",
                world->size() == 1
                    ? fmt::format("launch `mpirun -np {} brigade bench ...` to time data parallelism", r.parallel.dp)
                    : fmt::format("set parallel.dp = {} (the ranks launched)", world->size()));
  BRIGADE_CHECK(r.parallel.tp == 1 && r.parallel.pp == 1, ConfigError,
                "bench: runs one process; parallel.tp = {} and parallel.pp = {} are for `brigade train` under mpirun "
                "(bench/mp_bench.py times them)",
                r.parallel.tp, r.parallel.pp);
  train::set_threads(r.run.threads);
  const int64_t A = r.train.accumulation;
  const std::unique_ptr<Task> task = make_task(r);  // the recipe's model, as `brigade train` builds it
  apply_recompute(r, *task);
  parallel::DataParallelOptions dpo;  // as the trainer sets them for one process's whole model
  dpo.zero = int(r.parallel.zero);
  dpo.algo = dist::allreduce_algo_from_name(r.parallel.allreduce);
  dpo.bucket_bytes = int64_t(r.parallel.bucket_mb * double(1 << 20));
  dpo.overlap = r.parallel.overlap;
  dpo.accumulation = A;
  dpo.deterministic = r.parallel.deterministic;
  parallel::DataParallel dp(task->units(dpo.deterministic ? 3 : dpo.zero), world, dpo);  // as the trainer
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, dp.optimizer_params(), dp);
  const amp::Policy policy = precision_policy(r.precision);
  amp::LossScaler scaler(loss_scaler_options(r.precision));
  if (policy.level == amp::Level::O3) round_state_to_low(dp, *opt, policy.low);
  const Batch batch = task->synthetic_batch(r.run.seed + 2);  // the micro-batch's shape, random content
  const Shard shard{0, 1, world.get()};

  BenchResult res;
  res.parameters = task->model().num_parameters();
  if (o.gemm_peaks) {
    res.gemm_peak_f32 = measure_gemm_peak_gflops(DType::F32);
    res.gemm_peak_bf16 = measure_gemm_peak_gflops(DType::BF16);
  }
  task->model().train(true);
  struct rusage ru0 {};
  int64_t os_allocs0 = 0;
  for (int64_t step = 0; step < o.warmup + o.steps; ++step) {
    if (step == o.warmup) {
      Allocator::instance().reset_peak();
      os_allocs0 = Allocator::instance().stats().os_allocs;
      getrusage(RUSAGE_SELF, &ru0);
      // bench/profile_step.py starts sampling on this line, so the profile is of timed steps only
      fmt::print(stderr, "bench: warm-up done, timing {} steps\n", o.steps);
      std::fflush(stderr);
    }
    const auto t0 = std::chrono::steady_clock::now();
    dp.begin_step();
    std::vector<Batch> micro(size_t(A), batch);
    if (task->needs_whole_step()) {
      amp::AutocastScope autocast(policy);
      task->begin_step(micro, shard);
    }
    double loss_sum = 0;
    Metrics extras;
    for (int64_t m = 0; m < A; ++m) {
      dp.begin_micro_step(m);
      Loss l;
      {
        amp::AutocastScope autocast(policy);
        l = task->loss(micro[size_t(m)], m, extras);
      }
      autograd::backward(scaler.enabled() ? fn::mul_scalar(l.loss, scaler.scale()) : l.loss);
      loss_sum += l.value ? *l.value : l.loss.item();
    }
    const auto t_fb = std::chrono::steady_clock::now();
    dp.finish_gradients();
    apply_gradients(dp, *opt, scaler, policy, r.train, r.optim.lr, *world, {},
                    [&](const nn::NamedTensors& master) { task->after_update(master); });  // the trainer's step
    res.last_loss = loss_sum / double(A);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step >= o.warmup) {
      res.step_seconds.push_back(dt);
      res.fwd_bwd_seconds.push_back(std::chrono::duration<double>(t_fb - t0).count());
      res.update_seconds.push_back(dt - res.fwd_bwd_seconds.back());
    }
    if (world->rank() == 0)
      fmt::print(stderr, "bench: step {}/{} ({}) {:.3f} s, loss {:.4f}\n", step + 1, o.warmup + o.steps,
                 step < o.warmup ? "warm-up" : "timed", dt, res.last_loss);
  }
  {
    struct rusage ru1 {};
    getrusage(RUSAGE_SELF, &ru1);
    res.timed_page_faults_per_step =
        double(ru1.ru_minflt - ru0.ru_minflt + ru1.ru_majflt - ru0.ru_majflt) / double(o.steps);
    res.timed_os_allocs_per_step = double(Allocator::instance().stats().os_allocs - os_allocs0) / double(o.steps);
  }
  auto median = [](std::vector<double> s) {
    std::nth_element(s.begin(), s.begin() + long(s.size() / 2), s.end());
    return s[s.size() / 2];
  };
  res.median_step_s = median(res.step_seconds);
  res.median_fwd_bwd_s = median(res.fwd_bwd_seconds);
  res.median_update_s = median(res.update_seconds);
  res.item = task->item_kind();
  res.ranks = world->size();
  res.items_per_s = double(batch.rows * task->items_per_row() * A * world->size()) / res.median_step_s;
  res.flops_per_item = task->flops_per_item();
  res.achieved_gflops = res.items_per_s * res.flops_per_item / 1e9;
  const bool low_gemm = policy.level != amp::Level::O0 && policy.low == DType::BF16;
  const double peak = low_gemm ? res.gemm_peak_bf16 : res.gemm_peak_f32;
  res.mfu = peak > 0 ? res.achieved_gflops / peak : 0.0;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  res.peak_rss_bytes = int64_t(ru.ru_maxrss) * 1024;
  res.memory = Allocator::instance().stats();
  return res;
}

std::string bench_json(const Recipe& r, const BenchResult& b) {
  nlohmann::json peaks;
  for (int i = 0; i < kNumMemTags; ++i) peaks[std::string(mem_tag_name(MemTag(i)))] = b.memory.peak[size_t(i)];
  nlohmann::json j{{"engine", "brigade"},
                   {"model", r.model.type},
                   {"item", item_name(b.item)},
                   {"n_layer", r.model.n_layer},
                   {"n_embd", r.model.n_embd},
                   {"n_head", r.model.n_head},
                   {"vocab_size", r.model.vocab_size},
                   {"batch_size", r.train.batch_size},
                   {"seq_len", r.train.seq_len},
                   {"precision", r.precision.level + (r.precision.level == "O0" ? "" : " " + r.precision.dtype)},
                   {"threads", omp_get_max_threads()},
                   {"ranks", b.ranks},
                   {"parameters", b.parameters},
                   {"steps", b.step_seconds.size()},
                   {"step_seconds", b.step_seconds},
                   {"median_step_s", b.median_step_s},
                   {"median_fwd_bwd_s", b.median_fwd_bwd_s},
                   {"median_update_s", b.median_update_s},
                   {"items_per_s", b.items_per_s},
                   {item_rate_key(b.item), b.items_per_s},
                   {"flops_per_item", b.flops_per_item},
                   {"achieved_gflops", b.achieved_gflops},
                   {"gemm_peak_f32_gflops", b.gemm_peak_f32},
                   {"gemm_peak_bf16_gflops", b.gemm_peak_bf16},
                   {"mfu", b.mfu},
                   {"peak_rss_bytes", b.peak_rss_bytes},
                   {"timed_page_faults_per_step", b.timed_page_faults_per_step},
                   {"timed_os_allocs_per_step", b.timed_os_allocs_per_step},
                   {"allocator_peak_bytes", peaks},
                   {"allocator_peak_total", b.memory.peak_total},
                   {"last_loss", b.last_loss}};
  if (b.item == ItemKind::Token) j["flops_per_token"] = b.flops_per_item;
  return j.dump();
}

}  // namespace brigade::cli
