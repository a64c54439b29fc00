// Megatron-style tensor parallelism for GPT; see tensor_parallel.h for the design.
#include "brigade/parallel/tensor_parallel.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"

namespace brigade::parallel {

namespace F = brigade::fn;
using autograd::Node;
using autograd::record;

namespace {

// x summed over tp into a fresh contiguous tensor of x's dtype (16-bit: widened to f32,
// reduced, rounded back once).
Tensor allreduce_sum(const Tensor& x, dist::ProcessGroup& tp) {
  BRIGADE_CHECK(is_floating(x.dtype()), ValueError, "tensor parallel allreduce: {} is not floating point", x.str());
  Tensor buf = x.dtype() == DType::F32 ? x.clone() : x.to(DType::F32);  // same shape, f32, fresh
  tp.allreduce(buf.data<float>(), buf.numel());
  return x.dtype() == DType::F32 ? buf : buf.to(x.dtype());
}

struct TpCopyBackward : Node {
  dist::ProcessGroup* tp = nullptr;
  const char* name() const override { return "TpCopyBackward"; }
  // forward: y = x on every rank; the loss depends on each rank's y -> dx = sum over tp of dy
  std::vector<Tensor> backward(const Tensor& g) override { return {allreduce_sum(g, *tp)}; }
};

struct TpReduceBackward : Node {
  const char* name() const override { return "TpReduceBackward"; }
  // forward: y = sum over tp of x (y replicated) -> dx = dy
  std::vector<Tensor> backward(const Tensor& g) override { return {g}; }
};

// Rows of the output whose id is not on this rank are zero; see vocab_parallel_embedding.
struct VocabLookupBackward : Node {
  Tensor local_ids;            // ids - vocab_start, 0 where not local; same shape as ids
  std::vector<uint8_t> local;  // per id: found on this rank
  int64_t Vl = 0;
  const char* name() const override { return "VocabParallelEmbeddingBackward"; }
  // forward: out[i, :] = local[i] ? w[local_ids[i], :] : 0
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor gl = g.clone();  // (..., C), contiguous; rows of other ranks' ids zeroed
    const size_t row = size_t(g.size(-1)) * gl.element_size();
    auto* bytes = static_cast<unsigned char*>(gl.raw_data());
    for (size_t i = 0; i < local.size(); ++i)
      if (!local[i]) std::memset(bytes + i * row, 0, row);
    return {ops::embedding_backward(gl, local_ids, Vl)};  // (Vl, C)
  }
  void release() override {
    local_ids = Tensor();
    local.clear();
  }
};

struct VocabCrossEntropyBackward : Node {
  Tensor logits;                 // (N, Vl) f32 contiguous
  Tensor lse;                    // (N, 1) f32: log-sum-exp over the full (unpadded) vocabulary
  std::vector<int64_t> targets;  // (N)
  int64_t vocab_start = 0, valid = 0, count = 0, ignore_index = -100;
  DType in_dtype = DType::F32;
  const char* name() const override { return "VocabParallelCrossEntropyBackward"; }
  // forward: loss = mean_{i: t_i != ignore} (lse_i - logits_full[i, t_i])
  // -> dlogits[i, v] = g / count * (softmax_i(v) - [v == t_i]) on this rank's columns.
  std::vector<Tensor> backward(const Tensor& g) override {
    const int64_t N = logits.size(0), Vl = logits.size(1);
    Tensor gl;
    if (count == 0) {
      gl = Tensor::zeros({N, Vl}, DType::F32);  // (N, Vl)
    } else {
      gl = ops::exp(ops::sub(logits, lse));  // (N, Vl): softmax over the full vocabulary, local columns
      if (valid < Vl) gl.narrow(1, valid, Vl - valid).zero_();  // padding columns
      float* p = gl.data<float>();
      for (int64_t i = 0; i < N; ++i) {
        const int64_t t = targets[size_t(i)];
        if (t == ignore_index) {
          std::memset(p + i * Vl, 0, size_t(Vl) * sizeof(float));
        } else if (t >= vocab_start && t < vocab_start + valid) {
          p[i * Vl + (t - vocab_start)] -= 1.0f;
        }
      }
      ops::mul_scalar_(gl, g.item() / double(count));
    }
    return {in_dtype == DType::F32 ? gl : gl.to(in_dtype)};
  }
  void release() override {
    logits = lse = Tensor();
    targets.clear();
  }
};

}  // namespace

Tensor tp_copy(const Tensor& x, dist::ProcessGroup& tp) {
  if (tp.size() == 1) return x;
  auto n = std::make_shared<TpCopyBackward>();
  n->tp = &tp;
  return record(x.detach(), n, {x});
}

Tensor tp_reduce(const Tensor& x, dist::ProcessGroup& tp) {
  if (tp.size() == 1) return x;
  return record(allreduce_sum(x, tp), std::make_shared<TpReduceBackward>(), {x});
}

Tensor vocab_parallel_embedding(const Tensor& weight_shard, const Tensor& ids, int64_t vocab_start,
                                dist::ProcessGroup& tp) {
  BRIGADE_CHECK(weight_shard.dim() == 2, ShapeError, "vocab_parallel_embedding: weight shard must be (Vl, C), got {}",
                weight_shard.str());
  BRIGADE_CHECK(ids.dtype() == DType::I64 || ids.dtype() == DType::I32, ShapeError,
                "vocab_parallel_embedding: ids must be i32 or i64, got {}", ids.str());
  // Autocast as fn::embedding: the weight in the policy's dtype (a recorded cast).
  const Tensor w = F::cast(weight_shard, amp::compute_dtype(amp::Op::Embedding, {weight_shard.dtype()}));
  const int64_t Vl = w.size(0), V_pad = Vl * tp.size();
  std::vector<int64_t> id = ids.to_vector_i64();
  std::vector<uint8_t> local(id.size());
  for (size_t i = 0; i < id.size(); ++i) {
    BRIGADE_CHECK(id[i] >= 0 && id[i] < V_pad, ValueError,
                  "vocab_parallel_embedding: token id {} outside the padded vocabulary [0, {})", id[i], V_pad);
    local[i] = id[i] >= vocab_start && id[i] < vocab_start + Vl;
    id[i] = local[i] ? id[i] - vocab_start : 0;
  }
  Tensor local_ids = Tensor::from_vector_i64(id, ids.shape());  // same shape as ids
  Tensor out = ops::embedding(w, local_ids);                     // (..., C)
  const size_t row = size_t(w.size(1)) * out.element_size();
  auto* bytes = static_cast<unsigned char*>(out.raw_data());
  for (size_t i = 0; i < local.size(); ++i)
    if (!local[i]) std::memset(bytes + i * row, 0, row);
  auto n = std::make_shared<VocabLookupBackward>();
  if (autograd::needs_grad({w})) {
    n->local_ids = local_ids;
    n->local = std::move(local);
    n->Vl = Vl;
  }
  return tp_reduce(record(out, n, {w}), tp);  // (..., C), replicated
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits_shard, const Tensor& targets, int64_t vocab_start,
                                    int64_t vocab_size, dist::ProcessGroup& tp, int64_t ignore_index) {
  BRIGADE_CHECK(logits_shard.dim() == 2 && is_floating(logits_shard.dtype()), ShapeError,
                "vocab_parallel_cross_entropy: logits shard must be floating (N, Vl), got {}", logits_shard.str());
  const int64_t N = logits_shard.size(0), Vl = logits_shard.size(1);
  BRIGADE_CHECK((targets.dtype() == DType::I64 || targets.dtype() == DType::I32) && targets.numel() == N, ShapeError,
                "vocab_parallel_cross_entropy: targets must be {} i32/i64 values (one per logits row), got {}", N,
                targets.str());
  BRIGADE_CHECK(vocab_start >= 0 && vocab_size > 0, ValueError,
                "vocab_parallel_cross_entropy: vocab_start = {} and vocab_size = {} must be >= 0 and > 0", vocab_start,
                vocab_size);
  const Tensor lg = logits_shard.dtype() == DType::F32 ? logits_shard.contiguous()
                                                        : logits_shard.to(DType::F32);  // (N, Vl) f32
  const int64_t valid = std::clamp<int64_t>(vocab_size - vocab_start, 0, Vl);  // non-padding columns here
  std::vector<int64_t> t = targets.to_vector_i64();
  int64_t count = 0;
  for (int64_t tv : t) {
    BRIGADE_CHECK(tv == ignore_index || (tv >= 0 && tv < vocab_size), ValueError,
                  "vocab_parallel_cross_entropy: target {} outside [0, {}) (and not ignore_index {})", tv, vocab_size,
                  ignore_index);
    count += tv != ignore_index;
  }

  // Local log-sum-exp of each row over this rank's real columns (the kernel's own max).
  std::vector<double> m(static_cast<size_t>(N), -std::numeric_limits<double>::infinity());
  std::vector<float> lse_local;
  if (valid > 0) {
    Tensor zero_t = Tensor::zeros({N}, DType::I64);                      // (N): any valid target
    lse_local = ops::cross_entropy(lg.narrow(1, 0, valid), zero_t).lse.to_vector();  // (N)
    for (int64_t i = 0; i < N; ++i) m[size_t(i)] = lse_local[size_t(i)];
  }
  tp.allreduce_max(m.data(), N);  // a stabiliser >= every row's max logit
  // [sum_v exp(logit - m) | target logit], both summed over tp.
  std::vector<double> acc(static_cast<size_t>(2 * N), 0.0);
  const float* p = lg.data<float>();
  for (int64_t i = 0; i < N; ++i) {
    if (valid > 0) acc[size_t(i)] = std::exp(double(lse_local[size_t(i)]) - m[size_t(i)]);
    const int64_t ti = t[size_t(i)];
    if (ti != ignore_index && ti >= vocab_start && ti < vocab_start + valid)
      acc[size_t(N + i)] = p[i * Vl + (ti - vocab_start)];
  }
  tp.allreduce(acc.data(), 2 * N);
  std::vector<float> lse(static_cast<size_t>(N));
  double total = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    const double l = m[size_t(i)] + std::log(acc[size_t(i)]);
    lse[size_t(i)] = float(l);
    if (t[size_t(i)] != ignore_index) total += l - acc[size_t(N + i)];
  }
  const float loss = count ? float(total / double(count)) : std::numeric_limits<float>::quiet_NaN();
  Tensor out = Tensor::full({}, loss, DType::F32);  // 0-d
  auto n = std::make_shared<VocabCrossEntropyBackward>();
  if (autograd::needs_grad({logits_shard})) {
    n->logits = lg;
    n->lse = Tensor::from_vector(lse, {N, 1});  // (N, 1)
    n->targets = std::move(t);
    n->vocab_start = vocab_start;
    n->valid = valid;
    n->count = count;
    n->ignore_index = ignore_index;
    n->in_dtype = logits_shard.dtype();
  }
  return record(out, n, {logits_shard});
}

// ------------------------------------------------------------------ parameter sharding

int64_t tp_padded_vocab(int64_t vocab_size, int tp_size) {
  BRIGADE_CHECK(tp_size >= 1 && vocab_size >= 1, ValueError, "tp_padded_vocab: vocab_size {} and tp {} must be >= 1",
                vocab_size, tp_size);
  return (vocab_size + tp_size - 1) / tp_size * tp_size;
}

namespace {

// How one parameter is split. Along `dim` the (padded) full extent is G groups of P
// blocks of k: rank r holds block r of every group, concatenated (G k). G = 3 for the
// fused qkv projection (q, k and v each split by heads), 1 otherwise.
struct Split {
  bool sharded = false;
  int64_t dim = 0;
  int64_t groups = 1;
  Shape full;           // Hugging Face shape
  int64_t real = 0;     // extent along dim without padding (wte: V)
  int64_t padded = 0;   // extent along dim with padding (wte: V_pad)
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Split split_of(const std::string& name, const models::GPTConfig& c, int P) {
  const int64_t C = c.n_embd;
  Split s;
  auto set = [&](int64_t dim, int64_t groups, Shape full) {
    s.sharded = true;
    s.dim = dim;
    s.groups = groups;
    s.full = std::move(full);
    s.real = s.padded = s.full[size_t(dim)];
  };
  if (name == "transformer.wte.weight" || ends_with(name, ".wte.weight")) {
    set(0, 1, {c.vocab_size, C});
    s.padded = tp_padded_vocab(c.vocab_size, P);
  } else if (ends_with(name, ".attn.c_attn.weight")) {
    set(1, 3, {C, 3 * C});
  } else if (ends_with(name, ".attn.c_attn.bias")) {
    set(0, 3, {3 * C});
  } else if (ends_with(name, ".attn.c_proj.weight")) {
    set(0, 1, {C, C});
  } else if (ends_with(name, ".mlp.c_fc.weight")) {
    set(1, 1, {C, 4 * C});
  } else if (ends_with(name, ".mlp.c_fc.bias")) {
    set(0, 1, {4 * C});
  } else if (ends_with(name, ".mlp.c_proj.weight")) {
    set(0, 1, {4 * C, C});
  }
  if (s.sharded)
    BRIGADE_CHECK(s.padded % (s.groups * P) == 0, ConfigError,
                  "tensor parallel: {} has extent {} along dim {}, not divisible into {} x parallel.tp = {} parts; "
                  "choose a parallel.tp that divides model.n_head",
                  name, s.padded, s.dim, s.groups, P);
  return s;
}

Shape replace_dim(const Shape& s, int64_t dim, const std::vector<int64_t>& with) {
  Shape out(s.begin(), s.begin() + dim);
  out.insert(out.end(), with.begin(), with.end());
  out.insert(out.end(), s.begin() + dim + 1, s.end());
  return out;
}

// The padded full tensor viewed as (..., G, P, k, ...) and a shard viewed as (..., G, k, ...).
struct SplitViews {
  Shape full_view, shard, shard_view;
};
SplitViews views_of(const Split& s, int P) {
  const int64_t k = s.padded / (s.groups * P);
  Shape padded = s.full;
  padded[size_t(s.dim)] = s.padded;
  SplitViews v;
  v.full_view = replace_dim(padded, s.dim, {s.groups, P, k});
  v.shard = replace_dim(padded, s.dim, {s.groups * k});
  v.shard_view = replace_dim(padded, s.dim, {s.groups, k});
  return v;
}

}  // namespace

bool tp_replicated(const std::string& full_param_name) {
  return !split_of(full_param_name, models::GPTConfig{}, 1).sharded;
}

Tensor tp_shard_param(const std::string& name, const Tensor& full, const models::GPTConfig& cfg, int tp_rank,
                      int tp_size) {
  BRIGADE_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, ValueError,
                "tp_shard_param({}): rank {} outside a tensor-parallel group of {}", name, tp_rank, tp_size);
  const Split s = split_of(name, cfg, tp_size);
  if (!s.sharded) return full;
  BRIGADE_CHECK(full.shape() == s.full, ShapeError,
                "tp_shard_param: {} is {}, but the model config gives it shape ({}); check model.* against the "
                "checkpoint",
                name, full.str(), fmt::join(s.full, ", "));
  const SplitViews v = views_of(s, tp_size);
  Tensor src = full.contiguous();
  if (s.padded != s.real) {  // zero padding rows (wte)
    Shape padded = s.full;
    padded[size_t(s.dim)] = s.padded;
    src = Tensor::zeros(padded, full.dtype());  // (V_pad, C)
    src.narrow(s.dim, 0, s.real).copy_(full);
  }
  Tensor shard = Tensor::empty(v.shard, full.dtype(), MemTag::Params);  // e.g. (C, 3C/tp)
  shard.view(v.shard_view).copy_(src.view(v.full_view).select(s.dim + 1, tp_rank));
  return shard;
}

Tensor tp_gather_param(const std::string& name, const Tensor& local, const models::GPTConfig& cfg,
                       dist::ProcessGroup& tp) {
  const int P = tp.size();
  const Split s = split_of(name, cfg, P);
  if (!s.sharded) return local.clone();
  const SplitViews v = views_of(s, P);
  BRIGADE_CHECK(local.shape() == v.shard, ShapeError,
                "tp_gather_param: {} is {} on tp rank {}, but its shard over parallel.tp = {} has shape ({})", name,
                local.str(), tp.rank(), P, fmt::join(v.shard, ", "));
  Tensor mine = local.dtype() == DType::F32 ? local.contiguous() : local.to(DType::F32);  // f32 shard
  Shape all = v.shard;
  all.insert(all.begin(), P);
  Tensor gathered = Tensor::empty(all, DType::F32);  // (P, shard...)
  tp.allgather(mine.data<float>(), gathered.data<float>(),
               std::vector<int64_t>(static_cast<size_t>(P), local.numel()));
  Shape padded = s.full;
  padded[size_t(s.dim)] = s.padded;
  Tensor full = Tensor::empty(padded, local.dtype());  // padded full shape
  for (int r = 0; r < P; ++r) full.view(v.full_view).select(s.dim + 1, r).copy_(gathered.select(0, r).view(v.shard_view));
  return s.padded == s.real ? full : full.narrow(s.dim, 0, s.real).clone();
}

// ------------------------------------------------------------------ layer hooks

namespace {

class ColumnParallel final : public nn::LinearShard {
 public:
  explicit ColumnParallel(std::shared_ptr<dist::ProcessGroup> tp) : tp_(std::move(tp)) {}
  // y_local (..., out/tp) = x W[:, cols] + b[cols]; the input's gradient is summed over tp.
  Tensor forward(const nn::Linear& l, const Tensor& x) const override {
    return F::linear(tp_copy(x, *tp_), l.weight, l.bias, l.layout);
  }

 private:
  std::shared_ptr<dist::ProcessGroup> tp_;
};

class RowParallel final : public nn::LinearShard {
 public:
  explicit RowParallel(std::shared_ptr<dist::ProcessGroup> tp) : tp_(std::move(tp)) {}
  // y (..., out) = sum over tp of x_local W[rows, :], then + b once (b replicated).
  Tensor forward(const nn::Linear& l, const Tensor& x) const override {
    Tensor y = tp_reduce(F::linear(x, l.weight, Tensor(), l.layout), *tp_);  // (..., out)
    if (!l.bias.defined()) return y;
    return F::add(y, F::cast(l.bias, y.dtype()));  // the bias in the GEMM's dtype, as fn::linear adds it
  }

 private:
  std::shared_ptr<dist::ProcessGroup> tp_;
};

class VocabParallel final : public nn::EmbeddingShard {
 public:
  VocabParallel(std::shared_ptr<dist::ProcessGroup> tp, int64_t start, int64_t V) : tp_(std::move(tp)) {
    vocab_start = start;
    vocab_size = V;
  }
  Tensor lookup(const nn::Embedding& e, const Tensor& ids) const override {
    for (int64_t id : ids.to_vector_i64())
      BRIGADE_CHECK(id >= 0 && id < vocab_size, ValueError, "embedding: token id {} outside the vocabulary [0, {})",
                    id, vocab_size);
    return vocab_parallel_embedding(e.weight, ids, vocab_start, *tp_);  // (..., C)
  }
  Tensor attend(const nn::Embedding&, const Tensor&) const override {
    throw ValueError(fmt::format(
        "GPT.head_logits: the vocabulary is sharded over parallel.tp = {} ranks and the full (N, {}) logits are "
        "never gathered; train with GPT::head_loss / GPT::loss, or run generation on a model without tensor "
        "parallelism",
        tp_->size(), vocab_size));
  }
  Tensor lm_loss(const nn::Embedding& e, const Tensor& x, const Tensor& targets) const override {
    Tensor logits = F::matmul(tp_copy(x, *tp_), e.weight, false, true);  // (N, Vl): this rank's vocabulary
    return vocab_parallel_cross_entropy(logits, targets, vocab_start, vocab_size, *tp_);
  }

 private:
  std::shared_ptr<dist::ProcessGroup> tp_;
};

}  // namespace

void apply_tensor_parallel(models::GPT& model, std::shared_ptr<dist::ProcessGroup> tp) {
  BRIGADE_CHECK(tp != nullptr, ValueError, "apply_tensor_parallel: no process group given");
  const models::GPTConfig& cfg = model.config();
  const int P = tp->size(), r = tp->rank();
  BRIGADE_CHECK(cfg.n_head % P == 0, ConfigError,
                "tensor parallelism: parallel.tp = {} does not divide model.n_head = {} (each rank computes whole "
                "attention heads); choose a parallel.tp that divides model.n_head",
                P, cfg.n_head);
  if (P == 1) return;
  BRIGADE_CHECK(model.transformer->wte->shard == nullptr, ValueError,
                "apply_tensor_parallel: the model is already sharded (a plan was applied before); build a fresh "
                "model to shard it again");
  autograd::NoGradGuard no_grad;
  auto shard = [&](nn::Module& m, const std::string& local, const std::string& full_name) {
    Tensor current;
    for (auto& [n, t] : m.named_parameters())
      if (n == local) current = t;
    BRIGADE_ASSERT(current.defined(), "{} not found", full_name);
    Tensor s = tp_shard_param(full_name, current.detach(), cfg, r, P);
    m.set_parameter(local, s);
  };
  auto& t = *model.transformer;
  const int64_t V_pad = tp_padded_vocab(cfg.vocab_size, P);
  shard(*t.wte, "weight", "transformer.wte.weight");
  t.wte->shard = std::make_shared<VocabParallel>(tp, int64_t(r) * (V_pad / P), cfg.vocab_size);
  auto column = std::make_shared<ColumnParallel>(tp);
  auto row = std::make_shared<RowParallel>(tp);
  for (size_t i = 0; i < t.h->size(); ++i) {
    nn::TransformerBlock& b = (*t.h)[i];
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    shard(*b.attn->c_attn, "weight", p + "attn.c_attn.weight");
    shard(*b.attn->c_attn, "bias", p + "attn.c_attn.bias");
    shard(*b.attn->c_proj, "weight", p + "attn.c_proj.weight");
    shard(*b.mlp->c_fc, "weight", p + "mlp.c_fc.weight");
    shard(*b.mlp->c_fc, "bias", p + "mlp.c_fc.bias");
    shard(*b.mlp->c_proj, "weight", p + "mlp.c_proj.weight");
    b.attn->c_attn->shard = column;
    b.mlp->c_fc->shard = column;
    b.attn->c_proj->shard = row;
    b.mlp->c_proj->shard = row;
    b.attn->n_head = cfg.n_head / P;
  }
}

}  // namespace brigade::parallel
