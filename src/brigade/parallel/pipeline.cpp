// Pipeline executor and stage partitioning; see pipeline.h.
#include "brigade/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::parallel {

namespace {
using Clock = std::chrono::steady_clock;
constexpr int kMaxTag = 32000;  // ProcessGroup's point-to-point tags are [0, 32000)
}  // namespace

PipelineExecutor::PipelineExecutor(PipePlan plan, dist::ProcessGroup& pp, Shape activation)
    : plan_(std::move(plan)), pp_(pp), act_(std::move(activation)) {
  BRIGADE_CHECK(plan_.p == pp_.size(), ConfigError, "pipeline plan for {} ranks on a pipeline group of {}", plan_.p,
                pp_.size());
  BRIGADE_CHECK(int64_t{2} * plan_.stages() * plan_.m < kMaxTag, ConfigError,
                "{} stages x {} micro-batches is too many messages to tag apart; use fewer parallel.microbatches",
                plan_.stages(), plan_.m);
}

PipeStepResult PipelineExecutor::run(const std::vector<PipeChunk>& chunks, double root_scale, bool train,
                                     const std::function<Shape(int mb)>& activation) {
  const int p = plan_.p, m = plan_.m, S = plan_.stages(), me = pp_.rank();
  BRIGADE_CHECK(int(chunks.size()) == plan_.v, InternalError, "pipeline: {} chunks for {} virtual stages per rank",
                chunks.size(), plan_.v);
  const size_t slots = static_cast<size_t>(S) * static_cast<size_t>(m);
  auto key = [m](int stage, int mb) { return static_cast<size_t>(stage) * static_cast<size_t>(m) + size_t(mb); };
  // tag of a message by its kind (0 activation, 1 gradient), receiving stage and micro-batch
  auto tag = [S, m](int kind, int stage, int mb) { return (kind * S + stage) * m + mb; };
  std::vector<Tensor> input(slots), output(slots), out_grad(slots), in_grad(slots);
  std::vector<autograd::DeferredGrads> deferred(slots);
  std::vector<Tensor> keep;  // buffers of sends in flight
  PipeStepResult res;
  std::optional<autograd::NoGradGuard> no_grad;
  if (!train) no_grad.emplace();

  pp_.barrier();  // one time origin for every rank's timeline
  const auto t0 = Clock::now();
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  int in_flight = 0;
  std::vector<Shape> act(static_cast<size_t>(m), act_);  // per micro-batch
  if (activation)
    for (int mb = 0; mb < m; ++mb) {
      act[size_t(mb)] = activation(mb);
      BRIGADE_CHECK(!train || shape_numel(act[size_t(mb)]) > 0, InternalError,
                    "pipeline: training micro-batch {} has an empty activation {}", mb, shape_str(act[size_t(mb)]));
    }
  for (const PipeAction& a : plan_.ranks[size_t(me)]) {
    const size_t k = key(a.stage, a.mb);
    const Shape& act_mb = act[size_t(a.mb)];
    if (shape_numel(act_mb) == 0) continue;  // an empty evaluation micro-batch: no rank runs it
    const bool compute = a.op == PipeOp::Forward || a.op == PipeOp::Backward || a.op == PipeOp::BackwardInput ||
                         a.op == PipeOp::BackwardWeight;
    if (!train && (compute && a.op != PipeOp::Forward)) continue;
    if (!train && (a.op == PipeOp::RecvGrad || a.op == PipeOp::SendGrad)) continue;
    const double start = now();
    switch (a.op) {
      case PipeOp::RecvActivation: {
        Tensor x = Tensor::empty(act_mb, DType::F32);  // (B_mb, T, C)
        pp_.recv(x.raw_data(), x.nbytes(), plan_.rank_of(a.stage - 1), tag(0, a.stage, a.mb));
        if (train) x.set_requires_grad(true);
        input[k] = x;
        break;
      }
      case PipeOp::Forward: {
        Tensor out = chunks[size_t(a.stage / p)].forward(a.mb, input[k]);
        if (a.stage == S - 1) res.loss_sum += out.item();
        input[k] = train ? input[k] : Tensor();
        output[k] = train || a.stage < S - 1 ? out : Tensor();  // evaluation: kept only until sent
        if (train) res.peak_in_flight = std::max(res.peak_in_flight, ++in_flight);
        break;
      }
      case PipeOp::SendActivation: {
        Tensor y = output[k];
        BRIGADE_CHECK(y.shape() == act_mb, ShapeError, "pipeline stage {} produced {}, expected activations {}",
                      a.stage, y.str(), shape_str(act_mb));
        Tensor wire;
        {
          autograd::NoGradGuard ng;
          wire = y.dtype() == DType::F32 && y.is_contiguous() ? y : ops::cast(y.contiguous(), DType::F32);
        }
        pp_.isend(wire.raw_data(), wire.nbytes(), plan_.rank_of(a.stage + 1), tag(0, a.stage + 1, a.mb));
        keep.push_back(wire);
        if (!train) output[k] = Tensor();
        break;
      }
      case PipeOp::RecvGrad: {
        Tensor g = Tensor::empty(act_mb, DType::F32);  // (B_mb, T, C)
        pp_.recv(g.raw_data(), g.nbytes(), plan_.rank_of(a.stage + 1), tag(1, a.stage, a.mb));
        out_grad[k] = g;
        break;
      }
      case PipeOp::Backward:
      case PipeOp::BackwardInput: {
        std::optional<autograd::DeferWeightGradScope> defer;
        if (a.op == PipeOp::BackwardInput) defer.emplace(&deferred[k]);
        Tensor y = output[k];
        if (a.stage == S - 1) {
          autograd::backward(fn::mul_scalar(y, root_scale));  // the loss, scaled (mean over micro-batches, loss scale)
        } else {
          Tensor g = out_grad[k];
          if (g.dtype() != y.dtype()) g = ops::cast(g, y.dtype());
          autograd::backward(y, g);
        }
        output[k] = out_grad[k] = Tensor();
        if (a.stage > 0) in_grad[k] = input[k].grad();
        input[k] = Tensor();
        if (a.op == PipeOp::Backward) --in_flight;
        break;
      }
      case PipeOp::BackwardWeight: {
        for (auto& task : deferred[k]) task();
        deferred[k].clear();
        --in_flight;
        break;
      }
      case PipeOp::SendGrad: {
        Tensor g = in_grad[k];
        BRIGADE_CHECK(g.defined(), InternalError, "pipeline stage {} has no input gradient for micro-batch {}", a.stage,
                      a.mb);
        if (g.dtype() != DType::F32) g = ops::cast(g, DType::F32);
        pp_.isend(g.raw_data(), g.nbytes(), plan_.rank_of(a.stage - 1), tag(1, a.stage - 1, a.mb));
        keep.push_back(g);
        in_grad[k] = Tensor();
        break;
      }
    }
    if (compute) {
      const double end = now();
      res.events.push_back({me, a, start, end});
      res.busy += end - start;
      res.makespan = end;
    }
  }
  pp_.wait_sends();
  return res;
}

std::vector<int64_t> partition_layers(const std::vector<double>& cost, int S, double first_extra, double last_extra) {
  const int64_t n = int64_t(cost.size());
  BRIGADE_CHECK(S >= 1 && S <= n, ConfigError,
                "cannot cut {} transformer blocks into {} pipeline stages of at least one block; lower parallel.pp "
                "(or parallel.virtual_stages)",
                n, S);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + cost[size_t(i)];
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the least largest cost of cutting blocks [0, i) into stages 0..s-1; from[s][i]: the last cut
  const size_t N = static_cast<size_t>(n) + 1;
  std::vector<std::vector<double>> best(static_cast<size_t>(S) + 1, std::vector<double>(N, inf));
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(S) + 1, std::vector<int64_t>(N, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= S; ++s)
    for (int64_t i = s; i <= n - (S - s); ++i)
      for (int64_t j = s - 1; j < i; ++j) {
        if (best[size_t(s) - 1][size_t(j)] == inf) continue;
        double c = prefix[size_t(i)] - prefix[size_t(j)];
        if (s == 1) c += first_extra;
        if (s == S) c += last_extra;
        const double v = std::max(best[size_t(s) - 1][size_t(j)], c);
        if (v < best[size_t(s)][size_t(i)]) {
          best[size_t(s)][size_t(i)] = v;
          from[size_t(s)][size_t(i)] = j;
        }
      }
  std::vector<int64_t> b(static_cast<size_t>(S) + 1, 0);
  b[size_t(S)] = n;
  for (int s = S; s >= 1; --s) b[size_t(s) - 1] = from[size_t(s)][size_t(b[size_t(s)])];
  return b;
}

std::vector<int64_t> stage_bounds_from_list(const std::vector<int64_t>& counts, int S, int64_t n) {
  int64_t total = 0;
  bool positive = true;
  for (int64_t c : counts) {
    total += c;
    positive = positive && c >= 1;
  }
  BRIGADE_CHECK(int(counts.size()) == S && positive && total == n, ConfigError,
                "parallel.stage_layers lists {} stage{} with {} blocks in all; it needs {} positive counts (one per "
                "pipeline stage: parallel.pp x parallel.virtual_stages) summing to model.n_layer = {}",
                counts.size(), counts.size() == 1 ? "" : "s", total, S, n);
  std::vector<int64_t> b{0};
  for (int64_t c : counts) b.push_back(b.back() + c);
  return b;
}

double measured_bubble(const std::vector<double>& busy, const std::vector<double>& makespan) {
  const double ideal = busy.empty() ? 0.0 : *std::max_element(busy.begin(), busy.end());
  const double span = makespan.empty() ? 0.0 : *std::max_element(makespan.begin(), makespan.end());
  return ideal > 0 ? (span - ideal) / ideal : 0.0;
}

}  // namespace brigade::parallel
