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
#include "brigade/train/memory_plan.h"
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
  // the gradient synchronisation of the trainer's step (weak scaling: the job's items are dp x a rank's);
  // tensor / pipeline parallel: each dp replica's batch runs through the model-parallel executor
  // of `brigade train` over its tp x pp ranks
  const int64_t mp = r.parallel.tp * r.parallel.pp;
  const bool model_parallel = mp > 1;
  BRIGADE_CHECK(r.parallel.dp * mp == world->size(), ConfigError,
                "bench: parallel.dp x tp x pp = {} x {} x {} but {} process{} run{}: {}", r.parallel.dp, r.parallel.tp,
                r.parallel.pp, world->size(), world->size() == 1 ? "" : "es", world->size() == 1 ? "s" : "",
                world->size() == 1
                    ? fmt::format("launch `mpirun -np {} brigade bench ...` to time them", r.parallel.dp * mp)
                : model_parallel ? fmt::format("launch dp x tp x pp = {} processes", r.parallel.dp * mp)
                                 : fmt::format("set parallel.dp = {} (the ranks launched)", world->size()));
  BRIGADE_CHECK(!model_parallel || !o.group, ConfigError,
                "bench: a model-parallel bench runs over the world group, not a group of its own");
  train::set_threads(r.run.threads);
  const int64_t A = r.train.accumulation;
  const std::unique_ptr<Task> task = make_task(r);  // the recipe's model, as `brigade train` builds it
  apply_recompute(r, *task);
  // how the step runs, as in the trainer: this process's whole model, or cut by tp / pp
  const std::unique_ptr<StepExecutor> exec =
      model_parallel ? make_model_parallel_executor(r, *task, world, [](const std::string&) {})
                     : make_local_executor(*task, world);
  parallel::DataParallelOptions dpo;  // as the trainer sets them
  dpo.zero = int(r.parallel.zero);
  dpo.algo = dist::allreduce_algo_from_name(r.parallel.allreduce);
  dpo.bucket_bytes = int64_t(r.parallel.bucket_mb * double(1 << 20));
  dpo.overlap = r.parallel.overlap;
  dpo.accumulation = A;
  dpo.communicate_in_backward = exec->communicate_in_backward();
  dpo.deterministic = r.parallel.deterministic;
  parallel::DataParallel dp(exec->units(dpo.deterministic ? 3 : dpo.zero), exec->dp_group(), dpo);  // as the trainer
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, dp.optimizer_params(), dp);
  const amp::Policy policy = precision_policy(r.precision);
  amp::LossScaler scaler(loss_scaler_options(r.precision));
  if (policy.level == amp::Level::O3) round_state_to_low(dp, *opt, policy.low);
  const Batch batch = task->synthetic_batch(r.run.seed + 2);  // the micro-batch's shape, random content
  const Shard shard = exec->shard();

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
      if (!o.quiet) {
        fmt::print(stderr, "bench: warm-up done, timing {} steps\n", o.steps);
        std::fflush(stderr);
      }
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
      loss_sum += exec->train_micro(*task, micro[size_t(m)], m, scaler.enabled() ? scaler.scale() : 1.0, 1.0, policy,
                                    extras, {});
    }
    const auto t_fb = std::chrono::steady_clock::now();
    exec->finish_backward();  // the tied embedding's two halves (pipelines)
    dp.finish_gradients();
    apply_gradients(dp, *opt, scaler, policy, r.train, r.optim.lr, *world, exec->clip(dp, *world),
                    [&](const nn::NamedTensors& master) { task->after_update(master); });  // the trainer's step
    if (model_parallel) {  // one rank per replica reports its loss
      world->allreduce(&loss_sum, 1);
      loss_sum /= double(r.parallel.dp);
    }
    res.last_loss = loss_sum / double(A);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step >= o.warmup) {
      res.step_seconds.push_back(dt);
      res.fwd_bwd_seconds.push_back(std::chrono::duration<double>(t_fb - t0).count());
      res.update_seconds.push_back(dt - res.fwd_bwd_seconds.back());
    }
    if (world->rank() == 0 && !o.quiet) {
      const double fb = std::chrono::duration<double>(t_fb - t0).count();
      fmt::print(stderr,
                 "bench: step {}/{} ({}) {:.3f} s (forward + backward {:.3f} s, update {:.3f} s), loss {:.4f}\n",
                 step + 1, o.warmup + o.steps, step < o.warmup ? "warm-up" : "timed", dt, fb, dt - fb, res.last_loss);
    }
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
  res.dp = r.parallel.dp, res.tp = r.parallel.tp, res.pp = r.parallel.pp;
  res.items_per_s = double(batch.rows * task->items_per_row() * A * r.parallel.dp) / res.median_step_s;
  res.flops_per_item = task->flops_per_item();
  res.achieved_gflops = res.items_per_s * res.flops_per_item / 1e9;
  const bool low_gemm = policy.level != amp::Level::O0 && policy.low == DType::BF16;
  const double peak = low_gemm ? res.gemm_peak_bf16 : res.gemm_peak_f32;
  res.mfu = peak > 0 ? res.achieved_gflops / peak : 0.0;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  res.peak_rss_bytes = int64_t(ru.ru_maxrss) * 1024;
  if (o.eval_and_checkpoint) {
    {  // one evaluation batch, as the trainer scores it (a pipeline on its last stage)
      autograd::NoGradGuard ng;
      task->model().train(false);
      dp.gather_persistent();
      task->prepare_eval();
      Metrics m;
      exec->scorer(*task, policy)(task->synthetic_batch(r.run.seed + 3, task->eval_rows()), m);
      dp.release_persistent();
      task->model().train(true);
    }
    if (exec->holds_shards()) exec->gather_full();  // the checkpoint's whole model on world rank 0
  }
  res.memory = Allocator::instance().stats();
  if (world->size() > 1) {
    // every rank's allocator peaks (by category, then the total), world rank order: an
    // allreduce over zeros elsewhere is an exact gather (byte counts are exact in a double)
    const size_t T = size_t(kNumMemTags), K = 2 * T + 1;
    std::vector<double> all(K * size_t(world->size()), 0.0);
    double* mine = all.data() + K * size_t(world->rank());
    for (size_t i = 0; i < T; ++i) mine[i] = double(res.memory.peak[i]), mine[T + i] = double(res.memory.live[i]);
    mine[2 * T] = double(res.memory.peak_total);
    world->allreduce(all.data(), int64_t(all.size()));
    for (int k = 0; k < world->size(); ++k) {
      const double* theirs = all.data() + K * size_t(k);
      BenchResult::RankPeaks rp;
      for (size_t i = 0; i < T; ++i) rp.peak[i] = int64_t(theirs[i]), rp.live[i] = int64_t(theirs[T + i]);
      rp.total = int64_t(theirs[2 * T]);
      res.rank_peaks.push_back(rp);
    }
  }
  return res;
}

std::string bench_json(const Recipe& r, const BenchResult& b) {
  nlohmann::json peaks;
  for (int i = 0; i < kNumMemTags; ++i) peaks[std::string(mem_tag_name(MemTag(i)))] = b.memory.peak[size_t(i)];
  nlohmann::json j{{"engine", "brigade"},
                   {"model", r.model.type},
                   {"item", item_name(b.item)},
                   {"batch_size", r.train.batch_size},
                   {"precision", r.precision.level + (r.precision.level == "O0" ? "" : " " + r.precision.dtype)},
                   {"threads", omp_get_max_threads()},
                   {"ranks", b.ranks},
                   {"dp", b.dp},
                   {"tp", b.tp},
                   {"pp", b.pp},
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
  if (model_entry(r.model.type).data ==
      DataKind::Text) {  // the sequence models' shape (others have none of these keys)
    j["n_layer"] = r.model.n_layer, j["n_embd"] = r.model.n_embd, j["n_head"] = r.model.n_head;
    j["vocab_size"] = r.model.vocab_size, j["seq_len"] = r.train.seq_len;
  }
  if (b.item == ItemKind::Token) j["flops_per_token"] = b.flops_per_item;
  for (const BenchResult::RankPeaks& rp : b.rank_peaks) {
    nlohmann::json k;
    for (int i = 0; i < kNumMemTags; ++i) k["peak"][std::string(mem_tag_name(MemTag(i)))] = rp.peak[size_t(i)];
    k["peak_total"] = rp.total;
    j["rank_allocator_peaks"].push_back(k);
  }
  return j.dump();
}

BenchResult mesh_dry_step(const Recipe& r) {
  const int64_t n = r.parallel.dp * r.parallel.tp * r.parallel.pp;
  const int world = dist::ProcessGroup::world()->size();
  BRIGADE_CHECK(world == n, ConfigError,
                "{}: --dry-run with parallel.tp = {} and parallel.pp = {} measures one training step on every rank of "
                "the dp x tp x pp = {} x {} x {} mesh; {}",
                r.path, r.parallel.tp, r.parallel.pp, r.parallel.dp, r.parallel.tp, r.parallel.pp,
                world == 1 ? fmt::format("launch it as `mpirun -np {} brigade train ... --dry-run`", n)
                           : fmt::format("{} processes run: launch {}", world, n));
  BenchOptions o;
  o.steps = 1;
  o.warmup = 0;
  o.gemm_peaks = false;
  o.quiet = true;
  o.eval_and_checkpoint = true;
  return run_bench(r, o);
}

nlohmann::json mesh_dry_run_json(const Recipe& r) {
  const BenchResult b = mesh_dry_step(r);
  nlohmann::json j{{"model", r.model.type}, {"measured", true},    {"dp", r.parallel.dp},
                   {"tp", r.parallel.tp},   {"pp", r.parallel.pp}, {"zero", r.parallel.zero}};
  j["ranks"] = nlohmann::json::array();
  for (const BenchResult::RankPeaks& rp : b.rank_peaks) {
    nlohmann::json k;
    for (int i = 0; i < kNumMemTags; ++i) {
      const std::string name(mem_tag_name(MemTag(i)));
      k["peak"][name] = k["peak_low"][name] = rp.peak[size_t(i)];
      k["live"][name] = rp.live[size_t(i)];
    }
    k["peak_total"] = rp.total;
    j["ranks"].push_back(k);
  }
  return j;
}

std::string mesh_dry_run_report(const Recipe& r) {
  const nlohmann::json j = mesh_dry_run_json(r);
  std::string s = fmt::format(
      "dry run: {} (nothing trained, no data read)\n"
      "model: {} | mesh dp x tp x pp = {} x {} x {} (world rank = dp, tp, pp coordinates with tp fastest), "
      "micro-batch {} rows, accumulation {}, {} micro-batches, schedule {} | ZeRO-{} | recompute {} | {}\n"
      "measured on every rank: one training step of a synthetic batch through the model-parallel step "
      "(forward, backward, gradient synchronisation, optimizer), one evaluation batch, and the checkpoint's "
      "gather of the whole model on rank 0 (other), on the caching allocator\n\n",
      r.path.empty() ? "default recipe" : r.path, r.model.type, r.parallel.dp, r.parallel.tp, r.parallel.pp,
      r.train.batch_size, r.train.accumulation, r.parallel.microbatches, r.parallel.schedule, r.parallel.zero,
      r.memory.recompute, r.precision.level);
  s += fmt::format("{:<12}", "category");
  const size_t ranks = j["ranks"].size();
  for (size_t c = 0; c < ranks; ++c) s += fmt::format(" {:>26}", fmt::format("rank {} peak (live)", c));
  s += "\n";
  for (MemTag t :
       {MemTag::Params, MemTag::Grads, MemTag::Optimizer, MemTag::Activations, MemTag::Workspace, MemTag::Other}) {
    const std::string name(mem_tag_name(t));
    s += fmt::format("{:<12}", name);
    for (size_t c = 0; c < ranks; ++c)
      s += fmt::format(" {:>26}", fmt::format("{} ({})", format_bytes(j["ranks"][c]["peak"][name].get<int64_t>()),
                                              format_bytes(j["ranks"][c]["live"][name].get<int64_t>())));
    s += "\n";
  }
  s += fmt::format("{:<12}", "total");
  for (size_t c = 0; c < ranks; ++c)
    s += fmt::format(" {:>26}", format_bytes(j["ranks"][c]["peak_total"].get<int64_t>()));
  return s + "\n";
}

}  // namespace brigade::cli
