// Per-block and head timings through a task's stages; see stage_timing.h.
#include "brigade/train/stage_timing.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/ops/ops.h"

namespace brigade::train {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds of fn(), the median of `reps` runs (after one warm-up).
double time_median(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

StageTimes measure_stage_times(nn::Module& model, const Stages& stages, const Batch& syn, const Shape& act,
                               const amp::Policy& policy, int reps) {
  autograd::NoGradGuard outer;
  Tensor x = ops::mul_scalar(Tensor::ones(act, DType::F32), 0.1);  // (rows, T, C)
  auto measure = [&](const std::function<Tensor(const Tensor&)>& fwd, double& f, double& bi, double& w) {
    autograd::EnableGradGuard eg;
    f = time_median(reps, [&] { (void)fwd(x.clone().set_requires_grad(true)); });
    double bsum = 0.0, wsum = 0.0;
    for (int i = 0; i < reps; ++i) {
      Tensor in = x.clone();
      in.set_requires_grad(true);
      Tensor y = fwd(in);
      autograd::DeferredGrads tasks;
      const auto t0 = Clock::now();
      {
        autograd::DeferWeightGradScope scope(&tasks);
        if (y.numel() == 1)
          autograd::backward(y);
        else
          autograd::backward(y, Tensor::ones(y.shape(), y.dtype()));
      }
      const auto t1 = Clock::now();
      for (auto& task : tasks) task();
      bsum += std::chrono::duration<double>(t1 - t0).count();
      wsum += std::chrono::duration<double>(Clock::now() - t1).count();
    }
    bi = bsum / reps;
    w = wsum / reps;
    for (auto& [name, prm] : model.named_parameters()) prm.set_grad(Tensor());  // leave no gradient behind
  };
  StageTimes st;
  measure(
      [&](const Tensor& in) {
        amp::AutocastScope ac(policy);
        return stages.blocks(in, 0, 1, syn);
      },
      st.block_f, st.block_bi, st.block_w);
  measure(
      [&](const Tensor& in) {
        amp::AutocastScope ac(policy);
        Metrics unused;
        return stages.head(in, syn, unused);
      },
      st.head_f, st.head_bi, st.head_w);
  return st;
}

}  // namespace brigade::train
