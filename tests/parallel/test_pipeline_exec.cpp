// The pipeline executor (parallel/pipeline.h) on a chain of small layers, under mpirun
// with the world as the pipeline group, against the same chain run in one process on
// every rank (the independent reference: no pipeline, one backward). Checked for GPipe,
// 1F1B, interleaved 1F1B (v = 2) and ZB-H1: the loss, and every stage's weight and bias
// gradients (each rank checks the stages it holds), the in-flight counts (GPipe m, 1F1B
// p - r, ZB-H1 at most p, 1F1B's peak), forward-only evaluation, and the measured timeline (one
// event per compute action, in order). Also, without MPI: autograd's deferred weight
// gradients (the Bi / W split) give bitwise the gradients of one backward, under fp32
// and under O2 bf16 autocast, and stage partitioning.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/parallel/pipeline.h"
#include "support/numeric.h"

using namespace brigade;
using namespace brigade::parallel;
namespace F = brigade::fn;
using brigade::test_support::rel_err;

namespace {

Tensor rand_tensor(const Shape& s, unsigned seed, bool grad) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-1, 1);
  std::vector<float> v(size_t(shape_numel(s)));
  for (auto& e : v) e = U(rng);
  Tensor t = Tensor::from_vector(v, s);
  if (grad) t.set_requires_grad(true);
  return t;
}

constexpr int64_t kB = 2, kT = 3, kC = 8;  // one micro-batch's activation (kB, kT, kC)

// S stages, stage s: x -> gelu(linear(x, W_s, b_s)) (+ x: a residual, so the input gradient
// has two paths); the last stage returns mean(y^2) as the loss.
struct Chain {
  std::vector<Tensor> w, b;
  int S;
  explicit Chain(int stages) : S(stages) {
    for (int s = 0; s < S; ++s) {
      w.push_back(rand_tensor({kC, kC}, 100 + unsigned(s), true));
      b.push_back(rand_tensor({kC}, 200 + unsigned(s), true));
    }
  }
  Tensor stage(int s, const Tensor& x) const {
    Tensor y = F::add(F::gelu(F::linear(x, w[size_t(s)], b[size_t(s)], ops::WeightLayout::OutIn)), x);
    return s == S - 1 ? F::mean_all(F::mul(y, y)) : y;
  }
  void zero() {
    for (auto* v : {&w, &b})
      for (Tensor& t : *v) t.set_grad(Tensor());
  }
};

Tensor micro_input(int mb) { return rand_tensor({kB, kT, kC}, 1000 + unsigned(mb), false); }

struct Case {
  PipeSchedule kind;
  int v;
};

}  // namespace

TEST(PipelineExecutor, EveryScheduleGivesTheOneProcessLossAndGradients) {
  auto world = dist::ProcessGroup::world();
  const int p = world->size(), me = world->rank();
  const int m = 2 * p;  // a multiple of p (interleaving)
  for (const Case c : {Case{PipeSchedule::GPipe, 1}, Case{PipeSchedule::OneFOneB, 1},
                       Case{PipeSchedule::Interleaved, 2}, Case{PipeSchedule::ZeroBubbleH1, 1}}) {
    SCOPED_TRACE(std::string(pipe_schedule_name(c.kind)));
    const int S = p * c.v;
    // reference: every micro-batch through the whole chain in one process, loss mean over micro-batches
    Chain ref(S);
    double ref_loss = 0;
    for (int mb = 0; mb < m; ++mb) {
      Tensor x = micro_input(mb);
      for (int s = 0; s < S; ++s) x = ref.stage(s, x);
      ref_loss += x.item() / m;
      autograd::backward(F::mul_scalar(x, 1.0 / m));
    }
    // the pipeline: this rank's chunks
    Chain net(S);
    PipelineExecutor exec(build_pipe_plan(c.kind, p, m, c.v, PipeCosts::uniform(S, 1, 1, 1)), *world,
                          Shape{kB, kT, kC});
    std::vector<PipeChunk> chunks;
    for (int k = 0; k < c.v; ++k) {
      const int s = k * p + me;
      chunks.push_back({[&net, s](int mb, const Tensor& in) { return net.stage(s, s == 0 ? micro_input(mb) : in); }});
    }
    const PipeStepResult res = exec.run(chunks, 1.0 / m);
    if (me == exec.plan().rank_of(S - 1)) {
      EXPECT_NEAR(res.loss_sum / m, ref_loss, 1e-6 * std::abs(ref_loss));
    }
    for (int k = 0; k < c.v; ++k) {
      const size_t s = size_t(k * p + me);
      ASSERT_TRUE(net.w[s].grad().defined()) << "stage " << s;
      EXPECT_LT(rel_err(net.w[s].grad(), ref.w[s].grad(), 1e-30), 1e-5) << "weight of stage " << s;
      EXPECT_LT(rel_err(net.b[s].grad(), ref.b[s].grad(), 1e-30), 1e-5) << "bias of stage " << s;
    }
    // in flight: GPipe all m; 1F1B p - r; ZB-H1 no more than 1F1B
    if (c.kind == PipeSchedule::GPipe) {
      EXPECT_EQ(res.peak_in_flight, m);
    }
    if (c.kind == PipeSchedule::OneFOneB) {
      EXPECT_EQ(res.peak_in_flight, std::min(m, p - me));
    }
    if (c.kind == PipeSchedule::ZeroBubbleH1) {
      EXPECT_LE(res.peak_in_flight, p);  // 1F1B's peak (rank 0)
    }
    // the measured timeline: one event per compute action, ordered, within the makespan
    size_t compute = 0;
    for (const PipeAction& a : exec.plan().ranks[size_t(me)])
      compute += a.op == PipeOp::Forward || a.op == PipeOp::Backward || a.op == PipeOp::BackwardInput ||
                 a.op == PipeOp::BackwardWeight;
    ASSERT_EQ(res.events.size(), compute);
    for (size_t i = 0; i < res.events.size(); ++i) {
      EXPECT_LE(res.events[i].start, res.events[i].end);
      if (i) {
        EXPECT_LE(res.events[i - 1].end, res.events[i].start);
      }
    }
    EXPECT_LE(res.busy, res.makespan + 1e-9);

    // evaluation: forwards only, no gradients touched
    net.zero();
    const PipeStepResult ev = exec.run(chunks, 1.0, /*train=*/false);
    if (me == exec.plan().rank_of(S - 1)) {
      EXPECT_NEAR(ev.loss_sum / m, ref_loss, 1e-6 * std::abs(ref_loss));
    }
    for (int k = 0; k < c.v; ++k) EXPECT_FALSE(net.w[size_t(k * p + me)].grad().defined());
  }
}

TEST(DeferredWeightGrads, BackwardInputThenWeightIsBitwiseOneBackward) {
  for (const bool o2 : {false, true}) {
    SCOPED_TRACE(o2 ? "O2 bf16" : "fp32");
    const amp::Policy policy{o2 ? amp::Level::O2 : amp::Level::O0, DType::BF16};
    auto run = [&](bool defer, std::vector<Tensor>& grads) {
      Tensor w1 = rand_tensor({kC, 2 * kC}, 1, true), b1 = rand_tensor({2 * kC}, 2, true);
      Tensor w2 = rand_tensor({kC, 2 * kC}, 3, true);  // used through matmul, as a tied head is
      Tensor x = rand_tensor({kB, kT, kC}, 4, true);
      Tensor loss;
      {
        amp::AutocastScope ac(policy);
        Tensor h = F::gelu(F::linear(x, w1, b1, ops::WeightLayout::InOut));       // (B, T, 2C)
        Tensor z = F::matmul(F::reshape(h, {kB * kT, 2 * kC}), w2, false, true);  // (B*T, C)
        loss = F::mean_all(F::mul(z, z));
      }
      autograd::DeferredGrads tasks;
      {
        std::optional<autograd::DeferWeightGradScope> scope;
        if (defer) scope.emplace(&tasks);
        autograd::backward(loss);
      }
      if (defer) {
        EXPECT_EQ(tasks.size(), 2u);      // the linear (weight and bias) and the matmul's parameter operand
        EXPECT_TRUE(x.grad().defined());  // the input gradient comes now
        EXPECT_FALSE(w1.grad().defined() || b1.grad().defined() || w2.grad().defined());
        for (auto& t : tasks) t();
      }
      grads = {x.grad(), w1.grad(), b1.grad(), w2.grad()};
    };
    std::vector<Tensor> plain, deferred;
    run(false, plain);
    run(true, deferred);
    const char* names[] = {"x", "w1", "b1", "w2"};
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_TRUE(deferred[i].defined()) << names[i];
      EXPECT_EQ(deferred[i].to_vector(), plain[i].to_vector()) << names[i];
    }
  }
}

TEST(PipelinePartition, MinimisesTheLargestStage) {
  // (each case has a unique optimum) 6 equal blocks in 3 stages: 2 each
  EXPECT_EQ(partition_layers(std::vector<double>(6, 1.0), 3, 0.0, 0.0), (std::vector<int64_t>{0, 2, 4, 6}));
  // a head worth 3 blocks: the last stage keeps one block (4 | 1 + 3)
  const auto b = partition_layers(std::vector<double>(5, 1.0), 2, 0.0, 3.0);
  EXPECT_EQ(b, (std::vector<int64_t>{0, 4, 5}));
  // uneven blocks
  EXPECT_EQ(partition_layers({5, 1, 1, 1, 1, 1}, 2, 0, 0), (std::vector<int64_t>{0, 1, 6}));
  EXPECT_THROW(partition_layers(std::vector<double>(2, 1.0), 3, 0, 0), ConfigError);
  EXPECT_EQ(stage_bounds_from_list({3, 4, 5}, 3, 12), (std::vector<int64_t>{0, 3, 7, 12}));
  EXPECT_THROW(stage_bounds_from_list({3, 4}, 3, 7), ConfigError);
  EXPECT_THROW(stage_bounds_from_list({3, 0, 4}, 3, 7), ConfigError);
  EXPECT_THROW(stage_bounds_from_list({3, 4, 4}, 3, 12), ConfigError);
  EXPECT_DOUBLE_EQ(measured_bubble({2.0, 1.0}, {3.0, 2.5}), 0.5);
}
