// `brigade bench`; see bench.h.
#include "brigade/train/bench.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
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
#include "brigade/train/trainer.h"

namespace brigade::train {

BenchResult run_bench(const Recipe& r, const BenchOptions& o) {
  BRIGADE_CHECK(o.steps >= 1 && o.warmup >= 0, ConfigError, "bench: --steps must be >= 1 and --warmup >= 0, got {} and {}",
                o.steps, o.warmup);
  BRIGADE_CHECK(r.parallel.dp == 1, ConfigError,
                "bench: runs one process; parallel.dp = {} is for `brigade train` under mpirun", r.parallel.dp);
  BRIGADE_CHECK(r.parallel.tp == 1 && r.parallel.pp == 1, ConfigError,
                "bench: runs one process; parallel.tp = {} and parallel.pp = {} are for `brigade train` under mpirun "
                "(bench/mp_bench.py times them)",
                r.parallel.tp, r.parallel.pp);
  if (r.run.threads > 0) omp_set_num_threads(r.run.threads);
  const int64_t B = r.train.batch_size, T = r.train.seq_len, A = r.train.accumulation;
  const std::unique_ptr<models::CausalLM> model_owner = build_model(r);
  models::CausalLM& model = *model_owner;
  parallel::DataParallelOptions dpo;
  dpo.accumulation = A;
  const std::shared_ptr<dist::ProcessGroup> world = dist::ProcessGroup::world();
  parallel::DataParallel dp(model_units(model), world, dpo);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, dp.optimizer_params(), dp);
  const amp::Policy policy = precision_policy(r.precision);
  amp::LossScaler scaler(loss_scaler_options(r.precision));
  if (policy.level == amp::Level::O3) round_state_to_low(dp, *opt, policy.low);

  // random ids (and targets: the next id), fixed by the seed
  Tensor ids = Tensor::empty({B, T + 1}, DType::I64);  // (B, T + 1)
  {
    Generator g(r.run.seed + 2);
    int64_t* p = ids.data<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i)
      p[i] = std::min<int64_t>(int64_t(g.uniform_double() * double(r.model.vocab_size)), r.model.vocab_size - 1);
  }
  const Tensor x = ids.narrow(1, 0, T).contiguous(), y = ids.narrow(1, 1, T).contiguous();  // (B, T)

  BenchResult res;
  res.parameters = model.num_parameters();
  res.gemm_peak_f32 = measure_gemm_peak_gflops(DType::F32);
  res.gemm_peak_bf16 = measure_gemm_peak_gflops(DType::BF16);
  model.train(true);
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
    double loss_sum = 0;
    for (int64_t m = 0; m < A; ++m) {
      dp.begin_micro_step(m);
      Tensor loss;
      {
        amp::AutocastScope autocast(policy);
        loss = model.loss(x, y);
      }
      autograd::backward(scaler.enabled() ? fn::mul_scalar(loss, scaler.scale()) : loss);
      loss_sum += loss.item();
    }
    dp.finish_gradients();
    apply_gradients(dp, *opt, scaler, policy, r.train, r.optim.lr, *world);  // the trainer's step
    res.last_loss = loss_sum / double(A);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step >= o.warmup) res.step_seconds.push_back(dt);
    fmt::print(stderr, "bench: step {}/{} ({}) {:.3f} s, loss {:.4f}\n", step + 1, o.warmup + o.steps,
               step < o.warmup ? "warm-up" : "timed", dt, res.last_loss);
  }
  {
    struct rusage ru1 {};
    getrusage(RUSAGE_SELF, &ru1);
    res.timed_page_faults_per_step = double(ru1.ru_minflt - ru0.ru_minflt + ru1.ru_majflt - ru0.ru_majflt) / double(o.steps);
    res.timed_os_allocs_per_step = double(Allocator::instance().stats().os_allocs - os_allocs0) / double(o.steps);
  }
  std::vector<double> s = res.step_seconds;
  std::nth_element(s.begin(), s.begin() + long(s.size() / 2), s.end());
  res.median_step_s = s[s.size() / 2];
  res.tokens_per_s = double(B * T * A) / res.median_step_s;
  res.flops_per_token = model.flops_per_token(T);
  res.achieved_gflops = res.tokens_per_s * res.flops_per_token / 1e9;
  const bool low_gemm = policy.level != amp::Level::O0 && policy.low == DType::BF16;
  res.mfu = res.achieved_gflops / (low_gemm ? res.gemm_peak_bf16 : res.gemm_peak_f32);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  res.peak_rss_bytes = int64_t(ru.ru_maxrss) * 1024;
  res.memory = Allocator::instance().stats();
  return res;
}

std::string bench_json(const Recipe& r, const BenchResult& b) {
  nlohmann::json peaks;
  for (int i = 0; i < kNumMemTags; ++i) peaks[std::string(mem_tag_name(MemTag(i)))] = b.memory.peak[size_t(i)];
  return nlohmann::json{{"engine", "brigade"},
                        {"n_layer", r.model.n_layer},
                        {"n_embd", r.model.n_embd},
                        {"n_head", r.model.n_head},
                        {"vocab_size", r.model.vocab_size},
                        {"batch_size", r.train.batch_size},
                        {"seq_len", r.train.seq_len},
                        {"precision", r.precision.level + (r.precision.level == "O0" ? "" : " " + r.precision.dtype)},
                        {"threads", omp_get_max_threads()},
                        {"parameters", b.parameters},
                        {"steps", b.step_seconds.size()},
                        {"step_seconds", b.step_seconds},
                        {"median_step_s", b.median_step_s},
                        {"tokens_per_s", b.tokens_per_s},
                        {"flops_per_token", b.flops_per_token},
                        {"achieved_gflops", b.achieved_gflops},
                        {"gemm_peak_f32_gflops", b.gemm_peak_f32},
                        {"gemm_peak_bf16_gflops", b.gemm_peak_bf16},
                        {"mfu", b.mfu},
                        {"peak_rss_bytes", b.peak_rss_bytes},
                        {"timed_page_faults_per_step", b.timed_page_faults_per_step},
                        {"timed_os_allocs_per_step", b.timed_os_allocs_per_step},
                        {"allocator_peak_bytes", peaks},
                        {"allocator_peak_total", b.memory.peak_total},
                        {"last_loss", b.last_loss}}
      .dump();
}

}  // namespace brigade::train
