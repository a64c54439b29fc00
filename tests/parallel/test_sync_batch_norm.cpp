// Synchronised batch norm over the world (parallel/sync_batch_norm.h, fn::sync_batch_norm2d):
// one MPI gtest binary, run under mpirun with 2 ranks (also passes as one rank). Every rank
// builds the same global batch; rank r holds rows [r B, (r + 1) B) of it (and, in the uneven
// case, B + r rows). Against one process running plain BatchNorm2d on the whole batch, with
// an upstream gradient that is not uniform:
//  - the synchronised output rows and input-gradient rows equal the one-process rows (1e-5);
//  - the sum over ranks of the weight / bias gradients equals the one-process gradient (the
//    local-part convention of fn::sync_batch_norm2d);
//  - the running statistics (global mean, unbiased global variance) and num_batches_tracked
//    equal the one-process ones on every rank; also with the allreduces on a CommQueue thread;
//  - a tiny ResNet-18 with every BatchNorm synchronised, each rank's loss the mean over its
//    rows: logits rows equal the one-process logits, the mean over ranks of every parameter
//    gradient equals the one-process gradient of the mean loss (what data parallelism's
//    averaging produces), buffers equal, and Full recompute on every block is bitwise no
//    recompute (the recomputed forward allreduces again, on every rank alike).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/resnet/resnet.h"
#include "brigade/parallel/sync_batch_norm.h"
#include "support/parity.h"

namespace {

using namespace brigade;
using dist::ProcessGroup;

std::shared_ptr<ProcessGroup> group() {
  static std::shared_ptr<ProcessGroup> g = ProcessGroup::world();
  return g;
}

using brigade::test_support::rel_err;

Tensor randn(const Shape& s, uint64_t seed, double mean = 0.0) {
  Tensor t = Tensor::empty(s);  // shape s
  Generator g(seed);
  g.normal_(t, mean, 1.0);
  return t;
}

// The sum over ranks of a f32 tensor (a copy).
Tensor sum_over_ranks(const Tensor& t) {
  Tensor c = t.contiguous().clone();
  group()->allreduce(c.data<float>(), c.numel());
  return c;
}

// Rows [start, start + n) of x, contiguous.
Tensor rows(const Tensor& x, int64_t start, int64_t n) { return x.narrow(0, start, n).contiguous(); }

void check_layer(int64_t B, bool uneven, parallel::CommQueue* queue = nullptr) {
  const int R = group()->size(), r = group()->rank();
  const int64_t C = 4, H = 5, W = 6;
  // rank q holds B (+ q when uneven) rows
  std::vector<int64_t> count(static_cast<size_t>(R)), start(static_cast<size_t>(R));
  int64_t total = 0;
  for (int q = 0; q < R; ++q) {
    start[size_t(q)] = total;
    count[size_t(q)] = B + (uneven ? q : 0);
    total += count[size_t(q)];
  }
  const Tensor x = randn({total, C, H, W}, 11, 0.5);  // the global batch
  const Tensor G = randn({total, C, H, W}, 12);       // a non-uniform upstream gradient
  const Tensor w0 = randn({C}, 13, 1.0), b0 = randn({C}, 14);

  nn::BatchNorm2d one(C), synced(C);
  parallel::sync_batch_norms(synced, group(), queue);
  ASSERT_NE(synced.sync, nullptr);
  for (nn::BatchNorm2d* bn : {&one, &synced}) {
    bn->weight.copy_(w0);
    bn->bias.copy_(b0);
  }
  Tensor xg = x.clone();
  xg.set_requires_grad(true);
  const Tensor y1 = one.forward(xg);  // (total, C, H, W)
  autograd::backward(y1, G);

  const int64_t s = start[size_t(r)], n = count[size_t(r)];
  Tensor xl = rows(x, s, n);
  xl.set_requires_grad(true);
  const Tensor y = synced.forward(xl);  // (n, C, H, W)
  autograd::backward(y, rows(G, s, n));

  EXPECT_LT(rel_err(y, rows(y1, s, n)), 1e-5) << "output rows";
  EXPECT_LT(rel_err(xl.grad(), rows(xg.grad(), s, n)), 1e-5) << "input gradient rows";
  EXPECT_LT(rel_err(sum_over_ranks(synced.weight.grad()), one.weight.grad()), 1e-5) << "sum of weight gradients";
  EXPECT_LT(rel_err(sum_over_ranks(synced.bias.grad()), one.bias.grad()), 1e-5) << "sum of bias gradients";
  EXPECT_LT(rel_err(synced.running_mean, one.running_mean), 1e-6) << "running_mean";
  EXPECT_LT(rel_err(synced.running_var, one.running_var), 1e-6) << "running_var";
  EXPECT_EQ(synced.num_batches_tracked.to_vector_i64(), one.num_batches_tracked.to_vector_i64());
  if (R > 1) {  // not vacuous: this rank's own statistics would differ
    nn::BatchNorm2d local(C);
    local.weight.copy_(w0);
    local.bias.copy_(b0);
    autograd::NoGradGuard ng;
    EXPECT_GT(rel_err(local.forward(rows(x, s, n)), rows(y1, s, n)), 1e-3);
  }
}

TEST(SyncBatchNormMpi, RowsOfOneGlobalBatchNorm) { check_layer(3, false); }

TEST(SyncBatchNormMpi, UnevenRowsPerRank) { check_layer(2, true); }

// The allreduces submitted to a communication thread (as under DataParallel's overlap).
TEST(SyncBatchNormMpi, ThroughACommQueue) {
  parallel::CommQueue queue(/*threaded=*/true);
  check_layer(3, false, &queue);
  queue.wait_all();
}

struct ResNetRun {
  Tensor logits;
  std::vector<Tensor> grads, buffers;
};

ResNetRun resnet_run(const Tensor& images, const Tensor& labels, bool sync, nn::Recompute mode) {
  models::ResNetConfig c = models::resnet18_config(5, 2, true);
  c.width = 4;
  models::ResNet m(c);
  Generator g(3);
  m.init_weights(g);
  m.train();
  if (sync) {
    EXPECT_EQ(parallel::sync_batch_norms(m, group()), 20);
  }
  for (auto& [name, b] : nn::find_blocks(m)) b->recompute = mode;
  ResNetRun out;
  out.logits = m.forward(images);
  autograd::backward(fn::cross_entropy(out.logits, labels));
  for (auto& [n, p] : m.named_parameters()) out.grads.push_back(p.grad().clone());
  for (auto& [n, b] : m.named_buffers()) out.buffers.push_back(b.clone());
  return out;
}

TEST(SyncBatchNormMpi, ResNetDataParallelRowsMatchOneProcess) {
  const int R = group()->size(), r = group()->rank();
  const int64_t B = 3, total = B * R;
  const Tensor images = randn({total, 2, 12, 12}, 21);  // the global batch
  std::vector<int64_t> lv(static_cast<size_t>(total));
  for (size_t i = 0; i < lv.size(); ++i) lv[i] = int64_t((i * 3 + 1) % 5);
  const Tensor labels = Tensor::from_vector_i64(lv, {total});

  const ResNetRun one = resnet_run(images, labels, false, nn::Recompute::None);
  const Tensor li = rows(images, r * B, B), ll = labels.narrow(0, r * B, B).contiguous();
  const ResNetRun dp = resnet_run(li, ll, true, nn::Recompute::None);
  EXPECT_LT(rel_err(dp.logits, rows(one.logits, r * B, B)), 1e-5) << "logits rows";
  for (size_t i = 0; i < one.grads.size(); ++i) {
    // each rank's loss is the mean over its B rows: the mean over ranks of the gradients is
    // the gradient of the global mean loss
    Tensor mean = sum_over_ranks(dp.grads[i]);
    mean = ops::mul_scalar(mean, 1.0 / R);
    EXPECT_LT(rel_err(mean, one.grads[i]), 1e-4) << "gradient " << i;
  }
  for (size_t i = 0; i < one.buffers.size(); ++i) {
    if (one.buffers[i].dtype() == DType::I64)
      EXPECT_EQ(dp.buffers[i].to_vector_i64(), one.buffers[i].to_vector_i64());
    else
      EXPECT_LT(rel_err(dp.buffers[i], one.buffers[i]), 1e-5) << "buffer " << i;
  }
  const ResNetRun rc = resnet_run(li, ll, true, nn::Recompute::Full);
  for (size_t i = 0; i < dp.grads.size(); ++i)
    EXPECT_EQ(dp.grads[i].to_vector(), rc.grads[i].to_vector()) << "recompute, gradient " << i;
  for (size_t i = 0; i < dp.buffers.size(); ++i)
    if (dp.buffers[i].dtype() == DType::F32) {
      EXPECT_EQ(dp.buffers[i].to_vector(), rc.buffers[i].to_vector()) << "recompute, buffer " << i;
    }
}

}  // namespace
