// Tests of Megatron-style tensor parallelism (parallel/tensor_parallel.h), run under
// mpirun with 2 and 3 ranks (CTest: tensor_parallel_np2, tensor_parallel_np3); the tp
// group is the whole world. The expected values are the unsharded computation on the
// same rank: every rank builds the full tensors and the full model from the same seed,
// so each rank checks its shard against an independent single-device result.
//   - tp_copy / tp_reduce (f32 and bf16), vocabulary-parallel embedding and
//     cross-entropy against fn::embedding / fn::cross_entropy: values and gradients to
//     1e-5 relative, with V = 37 (padded to 38 or 39) and an ignored target;
//   - a tiny GPT, full vs sharded with apply_tensor_parallel: loss to 1e-5 relative and
//     every parameter gradient (gathered with tp_gather_param) to 1e-4 of its max,
//     without and with activation recompute (the recompute re-runs the allreduces), and
//     under autocast O1-O3 with bf16 (loss to 2e-2, f32 finite gradients);
//   - tp_gather_param(tp_shard_param(full)) == full bitwise, the q/k/v head layout of a
//     shard, tp_replicated exactly for LayerNorms, wpe and the row-parallel biases;
//   - ConfigError when model.n_head is not divisible by the tp size;
//   - the generic applier on every plan (GPT, LLaMA, BERT, ViT: their tp_plan() tables):
//     shard then gather gives back every parameter bitwise, tp_replicated is exactly what the
//     plan leaves whole, and the sharded model's loss (1e-5) and gathered gradients (1e-4)
//     match the unsharded one (LLaMA: grouped-query heads and a vocabulary-parallel untied
//     head; BERT and ViT: the encoder attention's divided heads); n_kv_head not divisible by
//     tp is a ConfigError; a plan rule that matches nothing is a ValueError.
// Every rank runs every collective before checking (EXPECT_*, no ASSERT_* between
// collectives), so a failed check does not leave the others waiting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/bert/bert.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"
#include "brigade/models/vit/vit.h"
#include "brigade/ops/ops.h"
#include "brigade/parallel/tensor_parallel.h"
#include "support/parity.h"

namespace {

using namespace brigade;
namespace F = brigade::fn;
using dist::ProcessGroup;
using parallel::tp_copy;
using parallel::tp_reduce;

std::shared_ptr<ProcessGroup> group() {
  static std::shared_ptr<ProcessGroup> g = ProcessGroup::world();
  return g;
}

using brigade::test_support::rel_err;

Tensor randn(const Shape& s, uint64_t seed, double std = 1.0) {
  Tensor t = Tensor::empty(s, DType::F32);  // shape s
  Generator g(seed);
  g.normal_(t, 0.0, std);
  return t;
}

Tensor random_ids(const Shape& s, int64_t V, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = int64_t(g.random() % uint32_t(V));
  return Tensor::from_vector_i64(v, s);
}

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

models::GPTConfig tiny_config(int64_t n_head) {
  models::GPTConfig c;
  c.vocab_size = 37;  // not divisible by 2 or 3: padded
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = n_head;
  c.n_embd = 8 * n_head;
  c.dropout = 0.0;
  return c;
}

TEST(TensorParallel, CopyAndReduce) {
  ProcessGroup& tp = *group();
  const int P = tp.size(), r = tp.rank();
  // tp_copy: identity forward; the gradient of a replicated x is the sum of every rank's.
  Tensor x = leaf(randn({4, 6}, 11));
  Tensor y = tp_copy(x, tp);
  EXPECT_EQ(rel_err(y, x), 0.0);
  Tensor w = randn({4, 6}, 100 + uint64_t(r));  // rank-specific upstream gradient
  autograd::backward(F::sum_all(F::mul(y, w)));
  Tensor want = Tensor::zeros({4, 6});
  for (int q = 0; q < P; ++q) ops::add_(want, randn({4, 6}, 100 + uint64_t(q)));
  EXPECT_LT(rel_err(x.grad(), want), 1e-6);

  // tp_reduce: sum of rank-specific tensors; the gradient passes through unchanged.
  Tensor xr = leaf(randn({3, 5}, 200 + uint64_t(r)));
  Tensor s = tp_reduce(xr, tp);
  Tensor sum = Tensor::zeros({3, 5});
  for (int q = 0; q < P; ++q) ops::add_(sum, randn({3, 5}, 200 + uint64_t(q)));
  EXPECT_LT(rel_err(s, sum), 1e-6);
  Tensor c = randn({3, 5}, 300);
  autograd::backward(F::sum_all(F::mul(s, c)));
  EXPECT_EQ(rel_err(xr.grad(), c), 0.0);

  // 16-bit: widened, reduced in f32, rounded back once.
  Tensor xb = randn({3, 5}, 200 + uint64_t(r)).to(DType::BF16);
  Tensor sb = tp_reduce(xb, tp);
  EXPECT_EQ(sb.dtype(), DType::BF16);
  Tensor sum_b = Tensor::zeros({3, 5});
  for (int q = 0; q < P; ++q) ops::add_(sum_b, randn({3, 5}, 200 + uint64_t(q)).to(DType::BF16));
  EXPECT_LT(rel_err(sb, sum_b.to(DType::BF16)), 1e-2);
}

TEST(TensorParallel, VocabParallelEmbedding) {
  ProcessGroup& tp = *group();
  const int P = tp.size(), r = tp.rank();
  models::GPTConfig cfg = tiny_config(6);
  const int64_t V = cfg.vocab_size, C = cfg.n_embd, Vl = parallel::tp_padded_vocab(V, P) / P;
  Tensor W = leaf(randn({V, C}, 1));
  Tensor ids = random_ids({3, 7}, V, 2);
  Tensor G = randn({3, 7, C}, 3);      // upstream gradient
  Tensor want = F::embedding(W, ids);  // (3, 7, C)
  autograd::backward(F::sum_all(F::mul(want, G)));

  models::GPT gpt(cfg);
  const parallel::TpLayout layout = parallel::tp_layout(gpt, models::GPT::tp_plan(), P);
  Tensor shard = leaf(parallel::tp_shard_param(layout, "transformer.wte.weight", W.detach(), r));  // (Vl, C)
  EXPECT_EQ(shard.shape(), (Shape{Vl, C}));
  Tensor got = parallel::vocab_parallel_embedding(shard, ids, int64_t(r) * Vl, tp);  // (3, 7, C)
  EXPECT_LT(rel_err(got, want), 1e-5);
  autograd::backward(F::sum_all(F::mul(got, G)));
  Tensor gw = parallel::tp_gather_param(layout, "transformer.wte.weight", shard.grad(), tp);  // (V, C)
  EXPECT_LT(rel_err(gw, W.grad()), 1e-5);
  // Padding rows (global index >= V) receive no gradient.
  std::vector<float> g = shard.grad().to_vector();
  for (int64_t row = std::max<int64_t>(V - int64_t(r) * Vl, 0); row < Vl; ++row)
    for (int64_t k = 0; k < C; ++k) EXPECT_EQ(g[size_t(row * C + k)], 0.0f) << "padding row " << row;
}

// logits (N, V) -> this rank's (N, Vl) columns, padding columns filled with `pad`.
Tensor logits_shard(const Tensor& L, int64_t start, int64_t Vl, float pad) {
  const int64_t N = L.size(0), V = L.size(1);
  Tensor s = Tensor::full({N, Vl}, pad);  // (N, Vl)
  const int64_t valid = std::clamp<int64_t>(V - start, 0, Vl);
  if (valid > 0) s.narrow(1, 0, valid).copy_(L.narrow(1, start, valid));
  return s;
}

TEST(TensorParallel, VocabParallelCrossEntropy) {
  ProcessGroup& tp = *group();
  const int P = tp.size(), r = tp.rank();
  const int64_t N = 6, V = 37, Vl = parallel::tp_padded_vocab(V, P) / P, start = int64_t(r) * Vl;
  Tensor L = leaf(randn({N, V}, 5, 3.0));
  std::vector<int64_t> tv = {0, 36, 18, -100, 19, 25};  // both ends, rank boundaries, one ignored
  Tensor t = Tensor::from_vector_i64(tv, {N});
  Tensor want = F::cross_entropy(L, t);
  autograd::backward(F::mul_scalar(want, 0.7));

  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor Ls =
        leaf(logits_shard(dt == DType::F32 ? L.detach() : L.detach().to(DType::BF16).to(DType::F32), start, Vl, 50.0f)
                 .to(dt));  // (N, Vl); padding columns large: they must not count
    Tensor got = parallel::vocab_parallel_cross_entropy(Ls, t, start, V, tp);
    EXPECT_EQ(got.dtype(), DType::F32);
    autograd::backward(F::mul_scalar(got, 0.7));
    EXPECT_EQ(Ls.grad().dtype(), dt);
    if (dt == DType::F32) {
      EXPECT_LT(std::abs(got.item() - want.item()) / std::abs(want.item()), 1e-5);
      EXPECT_LT(rel_err(Ls.grad(), logits_shard(L.grad(), start, Vl, 0.0f)), 1e-5);
    } else {  // the loss of the bf16-rounded logits, in f32
      Tensor Lb = L.detach().to(DType::BF16).to(DType::F32);
      Tensor wb = F::cross_entropy(Lb, t);
      EXPECT_LT(std::abs(got.item() - wb.item()) / std::abs(wb.item()), 1e-5);
      EXPECT_LT(rel_err(Ls.grad(), logits_shard(L.grad(), start, Vl, 0.0f)), 2e-2);
    }
    std::vector<float> g = Ls.grad().to_vector();
    for (int64_t i = 0; i < N; ++i)
      for (int64_t v = std::clamp<int64_t>(V - start, 0, Vl); v < Vl; ++v)
        EXPECT_EQ(g[size_t(i * Vl + v)], 0.0f) << "padding column " << v;
  }
}

struct Named {
  std::string name;
  Tensor t;
};

TEST(TensorParallel, GPTMatchesUnsharded) {
  const int P = group()->size();
  const models::GPTConfig cfg = tiny_config(6);  // 6 heads: divisible by 2 and 3
  models::GPT full(cfg);
  Generator g0(1234);
  full.init_weights(g0);
  Tensor ids = random_ids({2, 16}, cfg.vocab_size, 7), targets = random_ids({2, 16}, cfg.vocab_size, 8);
  Tensor want = full.loss(ids, targets);
  autograd::backward(want);

  const std::vector<std::vector<nn::Recompute>> modes = {{nn::Recompute::None, nn::Recompute::None},
                                                         {nn::Recompute::Full, nn::Recompute::Selective}};
  for (const auto& m : modes) {
    SCOPED_TRACE(std::string("recompute ") + models::recompute_name(m[0]) + ", " + models::recompute_name(m[1]));
    models::GPT model(cfg);
    Generator g1(1234);
    model.init_weights(g1);
    const parallel::TpLayout layout = parallel::apply_tensor_parallel(model, models::GPT::tp_plan(), group());
    model.set_recompute(m);
    EXPECT_EQ(model.transformer->h->operator[](0).attn->n_head, cfg.n_head / P);
    Tensor got = model.loss(ids, targets);
    autograd::backward(got);
    EXPECT_LT(std::abs(got.item() - want.item()) / std::abs(want.item()), 1e-5);

    nn::NamedTensors ref = full.named_parameters(), mine = model.named_parameters();
    EXPECT_EQ(ref.size(), mine.size());
    for (size_t i = 0; i < ref.size() && i < mine.size(); ++i) {
      EXPECT_EQ(mine[i].first, ref[i].first);
      EXPECT_EQ(mine[i].second.name(), ref[i].first);  // full names kept by set_parameter
      Tensor grad = mine[i].second.grad();
      EXPECT_TRUE(grad.defined()) << mine[i].first;
      if (!grad.defined()) grad = Tensor::zeros(mine[i].second.shape());  // keep the collectives in step
      Tensor gathered = parallel::tp_gather_param(layout, mine[i].first, grad, *group());
      EXPECT_LT(rel_err(gathered, ref[i].second.grad()), 1e-4) << mine[i].first;
    }
    // The full logits are never gathered on a vocabulary-sharded model; a second plan is refused.
    if (P > 1) {
      EXPECT_THROW(model.forward(ids), ValueError);
      EXPECT_THROW(parallel::apply_tensor_parallel(model, models::GPT::tp_plan(), group()), ValueError);
    }
  }
}

// Under autocast the sharded model runs the same dtypes (16-bit partial sums are reduced in
// f32 and rounded once more, so the losses agree to bf16 precision, not bitwise).
TEST(TensorParallel, GPTUnderAutocast) {
  const models::GPTConfig cfg = tiny_config(6);
  models::GPT full(cfg), model(cfg);
  Generator g0(1234), g1(1234);
  full.init_weights(g0);
  model.init_weights(g1);
  parallel::apply_tensor_parallel(model, models::GPT::tp_plan(), group());
  Tensor ids = random_ids({2, 16}, cfg.vocab_size, 7), targets = random_ids({2, 16}, cfg.vocab_size, 8);
  for (amp::Level level : {amp::Level::O1, amp::Level::O2, amp::Level::O3}) {
    SCOPED_TRACE(std::string(amp::level_name(level)));
    amp::AutocastScope scope(amp::Policy{level, DType::BF16});
    Tensor want = full.loss(ids, targets), got = model.loss(ids, targets);
    autograd::backward(got);
    EXPECT_LT(std::abs(got.item() - want.item()) / std::abs(want.item()), 2e-2);
    for (auto& [name, p] : model.named_parameters()) {
      EXPECT_EQ(p.grad().dtype(), DType::F32) << name;
      for (float v : p.grad().to_vector()) EXPECT_TRUE(std::isfinite(v)) << name;
    }
  }
}

TEST(TensorParallel, ShardGatherRoundTrip) {
  ProcessGroup& tp = *group();
  const int P = tp.size(), r = tp.rank();
  const models::GPTConfig cfg = tiny_config(6);
  const int64_t C = cfg.n_embd;
  models::GPT full(cfg);
  Generator g0(99);
  full.init_weights(g0);
  const parallel::TpLayout layout = parallel::tp_layout(full, models::GPT::tp_plan(), P);
  for (auto& [name, p] : full.named_parameters()) {
    Generator gr(std::hash<std::string>{}(name));
    gr.normal_(p.detach());  // non-trivial values everywhere (biases and LayerNorms too)
    Tensor s = parallel::tp_shard_param(layout, name, p.detach(), r);
    Tensor back = parallel::tp_gather_param(layout, name, s, tp);
    EXPECT_EQ(back.shape(), p.shape()) << name;
    EXPECT_EQ(back.to_vector(), p.to_vector()) << name;
    const bool want_rep = name.find(".ln_") != std::string::npos || name.rfind("transformer.ln_f.", 0) == 0 ||
                          name == "transformer.wpe.weight" || name.find(".c_proj.bias") != std::string::npos;
    EXPECT_EQ(parallel::tp_replicated(layout, name), want_rep) << name;
    if (name == "transformer.h.0.attn.c_attn.weight") {  // (C, 3C/P): this rank's heads of q, k and v
      const int64_t k = C / P;
      EXPECT_EQ(s.shape(), (Shape{C, 3 * k}));
      for (int64_t part = 0; part < 3; ++part)
        EXPECT_EQ(s.narrow(1, part * k, k).to_vector(), p.detach().narrow(1, part * C + r * k, k).to_vector());
    }
    if (name == "transformer.h.0.mlp.c_proj.weight") {
      EXPECT_EQ(s.shape(), (Shape{4 * C / P, C}));
    }
  }
}

TEST(TensorParallel, HeadsNotDivisible) {
  const int P = group()->size();
  if (P == 1) GTEST_SKIP() << "needs a tp group of 2 or more";
  models::GPT model(tiny_config(P + 1));  // n_head = P + 1
  try {
    parallel::apply_tensor_parallel(model, models::GPT::tp_plan(), group());
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parallel.tp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.n_head"), std::string::npos) << msg;
  }
}

}  // namespace

// ---------------------------------------------------------------- the generic applier on every plan

namespace {

models::LLaMAConfig llama_config(int P) {
  models::LLaMAConfig c;
  c.vocab_size = 37;  // padded
  c.n_kv_head = P;    // grouped-query: two query heads per kv head, both divisible by P
  c.n_head = 2 * P;
  c.hidden_size = 8 * c.n_head;
  c.intermediate_size = 12 * P;
  c.n_layer = 2;
  c.max_position = 16;
  return c;
}

models::BERTConfig bert_config() {
  models::BERTConfig c;
  c.vocab_size = 37;
  c.max_position_embeddings = 16;
  c.hidden_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;  // divisible by 2 and 3
  c.intermediate_size = 36;
  return c;
}

models::ViTConfig vit_config() {
  models::ViTConfig c;
  c.image_size = 8;
  c.patch_size = 4;
  c.num_channels = 1;
  c.hidden_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;
  c.intermediate_size = 36;
  c.num_labels = 5;
  return c;
}

// Non-trivial values in every parameter (biases and norms too), the same on every rank.
void randomise(nn::Module& m) {
  for (auto& [name, p] : m.named_parameters()) {
    Generator g(std::hash<std::string>{}(name) + 17);
    Tensor t = p.detach();
    g.normal_(t, 0.0, 0.1);
    if (name.find("norm") != std::string::npos || name.find("LayerNorm") != std::string::npos)
      t.copy_(ops::add_scalar(t, 1.0));  // norms around 1
  }
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Shard then gather gives back every parameter bitwise; replicated(name) is what the plan leaves whole.
void expect_round_trip(nn::Module& full, const nn::TpPlan& plan,
                       const std::function<bool(const std::string&)>& replicated) {
  ProcessGroup& tp = *group();
  const int P = tp.size(), r = tp.rank();
  const parallel::TpLayout layout = parallel::tp_layout(full, plan, P);
  EXPECT_EQ(layout.names().size(), full.named_parameters().size());
  for (auto& [name, p] : full.named_parameters()) {
    Tensor s = parallel::tp_shard_param(layout, name, p.detach(), r);
    EXPECT_EQ(s.shape(), layout.shard_shape(name)) << name;
    Tensor back = parallel::tp_gather_param(layout, name, s, tp);
    EXPECT_EQ(back.shape(), p.shape()) << name;
    EXPECT_EQ(back.to_vector(), p.to_vector()) << name;
    EXPECT_EQ(parallel::tp_replicated(layout, name), replicated(name)) << name;
    if (!replicated(name) && P > 1) {
      EXPECT_LT(s.numel(), p.numel()) << name;
    }
  }
}

// The sharded model's loss and gathered gradients match the unsharded model's.
template <typename M>
void expect_sharded_matches(M& full, M& model, const nn::TpPlan& plan, const std::function<Tensor(M&)>& loss) {
  Tensor want = loss(full);
  autograd::backward(want);
  const parallel::TpLayout layout = parallel::apply_tensor_parallel(model, plan, group());
  Tensor got = loss(model);
  autograd::backward(got);
  EXPECT_LT(std::abs(got.item() - want.item()) / std::abs(want.item()), 1e-5) << got.item() << " vs " << want.item();
  nn::NamedTensors ref = full.named_parameters(), mine = model.named_parameters();
  EXPECT_EQ(ref.size(), mine.size());
  for (size_t i = 0; i < ref.size() && i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, ref[i].first);
    Tensor grad = mine[i].second.grad();
    EXPECT_TRUE(grad.defined()) << mine[i].first;
    if (!grad.defined()) grad = Tensor::zeros(mine[i].second.shape());  // keep the collectives in step
    Tensor gathered = parallel::tp_gather_param(layout, mine[i].first, grad, *group());
    // 1e-4 of the gradient's largest element, and at least 1e-7 absolute: an attention's key bias
    // has a zero gradient in exact arithmetic (softmax ignores a per-query shift), so both sides
    // are rounding noise there.
    std::vector<float> a = gathered.to_vector(), b = ref[i].second.grad().to_vector();
    double err = 0, scale = 0;
    for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
      err = std::max(err, std::abs(double(a[k]) - double(b[k])));
      scale = std::max(scale, std::abs(double(b[k])));
    }
    EXPECT_EQ(a.size(), b.size()) << mine[i].first;
    EXPECT_LE(err, 1e-4 * scale + 1e-7) << mine[i].first << ": max |diff| " << err << ", max |grad| " << scale;
  }
}

// BERT and ViT: the encoder layers' q/k/v, intermediate.dense and the row-parallel weights are split.
bool encoder_replicated(const std::string& n) {
  const bool split = has(n, ".query.") || has(n, ".key.") || has(n, ".value.") || has(n, "intermediate.dense.") ||
                     (has(n, "output.dense.weight") && has(n, "encoder"));
  return !split;
}

}  // namespace

TEST(TensorParallelPlans, LLaMA) {
  const int P = group()->size();
  const models::LLaMAConfig cfg = llama_config(P);
  models::LLaMA full(cfg), model(cfg);
  randomise(full);
  randomise(model);
  expect_round_trip(full, models::LLaMA::tp_plan(), [](const std::string& n) { return has(n, "norm."); });
  Tensor ids = random_ids({2, 16}, cfg.vocab_size, 7), targets = random_ids({2, 16}, cfg.vocab_size, 8);
  expect_sharded_matches<models::LLaMA>(full, model, models::LLaMA::tp_plan(),
                                        [&](models::LLaMA& m) { return m.loss(ids, targets); });
  EXPECT_EQ(model.model->layers->operator[](0).self_attn->n_head, cfg.n_head / P);
  EXPECT_EQ(model.model->layers->operator[](0).self_attn->n_kv_head, cfg.n_kv_head / P);
  if (P > 1) {
    EXPECT_THROW(model.forward(ids), ValueError);  // the full logits are never gathered
    // Query heads divisible but not the kv heads: a clear error naming the recipe key.
    models::LLaMAConfig odd = cfg;
    odd.n_kv_head = 1;
    models::LLaMA m(odd);
    try {
      parallel::apply_tensor_parallel(m, models::LLaMA::tp_plan(), group());
      ADD_FAILURE() << "expected ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("model.n_kv_head"), std::string::npos) << e.what();
    }
  }
}

TEST(TensorParallelPlans, BERT) {
  const models::BERTConfig cfg = bert_config();
  models::BERT full(cfg), model(cfg);
  randomise(full);
  randomise(model);
  // Replicated: the embeddings, every LayerNorm, the row-parallel biases, the prediction head.
  expect_round_trip(full, models::BERT::tp_plan(), encoder_replicated);
  Tensor ids = random_ids({2, 16}, cfg.vocab_size, 7);
  std::vector<int64_t> lab = random_ids({2, 16}, cfg.vocab_size, 8).to_vector_i64();
  for (size_t i = 0; i < lab.size(); ++i)
    if (i % 3 != 0) lab[i] = -100;  // a third of the positions labelled
  Tensor labels = Tensor::from_vector_i64(lab, {2, 16});
  expect_sharded_matches<models::BERT>(full, model, models::BERT::tp_plan(),
                                       [&](models::BERT& m) { return m.mlm_loss(ids, labels); });
  EXPECT_EQ(model.bert->layer->operator[](0).self_attention->n_head, cfg.num_attention_heads / group()->size());
}

TEST(TensorParallelPlans, ViT) {
  const models::ViTConfig cfg = vit_config();
  models::ViT full(cfg), model(cfg);
  randomise(full);
  randomise(model);
  expect_round_trip(full, models::ViT::tp_plan(), encoder_replicated);
  Tensor images = randn({3, 1, 8, 8}, 21);
  Tensor labels = Tensor::from_vector_i64({0, 4, 2}, {3});
  expect_sharded_matches<models::ViT>(full, model, models::ViT::tp_plan(),
                                      [&](models::ViT& m) { return m.loss(images, labels); });
}

TEST(TensorParallelPlans, RuleMatchingNothingIsAnError) {
  models::GPT model(tiny_config(6));
  nn::TpPlan plan = models::GPT::tp_plan();
  plan.rules.push_back({"transformer.h.*.attn.q_proj", nn::TpStyle::Column});  // GPT has no q_proj
  EXPECT_THROW(parallel::tp_layout(model, plan, group()->size()), ValueError);
  nn::TpPlan wrong{{{"transformer.ln_f", nn::TpStyle::Column}}};  // a LayerNorm is not a Linear
  EXPECT_THROW(parallel::tp_layout(model, wrong, group()->size()), ValueError);
  EXPECT_TRUE(nn::tp_path_matches("a.*.c", "a.12.c"));
  EXPECT_FALSE(nn::tp_path_matches("a.*.c", "a.1.b.c"));
  EXPECT_FALSE(nn::tp_path_matches("a.*", "a"));
  EXPECT_FALSE(nn::tp_path_matches("a.b", "a.b.c"));
}
