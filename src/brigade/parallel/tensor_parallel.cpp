// Megatron-style tensor parallelism from a model's plan; see tensor_parallel.h for the design.
#include "brigade/parallel/tensor_parallel.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/nn/layers.h"

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
  Tensor out = ops::embedding(w, local_ids);                    // (..., C)
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
  const Tensor lg =
      logits_shard.dtype() == DType::F32 ? logits_shard.contiguous() : logits_shard.to(DType::F32);  // (N, Vl) f32
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
    Tensor zero_t = Tensor::zeros({N}, DType::I64);                                  // (N): any valid target
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
SplitViews views_of(const TpSplit& s, int P) {
  const int64_t k = s.padded / (s.groups * P);
  Shape padded = s.full;
  padded[size_t(s.dim)] = s.padded;
  SplitViews v;
  v.full_view = replace_dim(padded, s.dim, {s.groups, P, k});
  v.shard = replace_dim(padded, s.dim, {s.groups * k});
  v.shard_view = replace_dim(padded, s.dim, {s.groups, k});
  return v;
}

// A module the plan names, with the rule that names it.
struct Match {
  std::string path;
  nn::Module* module = nullptr;
  const nn::TpRule* rule = nullptr;
};

// What a rule that shards an L (nn::Linear or nn::Embedding) finds at `path`: nullptr when m is an
// L that is not sharded yet, else the kind it wanted (`want`), for the caller's error; an L with a
// shard already is a ValueError.
template <class L>
const char* check_unsharded(nn::Module* m, const std::string& path, const char* want) {
  auto* l = dynamic_cast<L*>(m);
  if (!l) return want;
  BRIGADE_CHECK(l->shard == nullptr, ValueError,
                "apply_tensor_parallel: {} is already sharded (a plan was applied before); build a fresh model to "
                "shard it again",
                path);
  if constexpr (std::is_same_v<L, nn::Linear>)
    BRIGADE_CHECK(!l->lora, ConfigError,
                  "apply_tensor_parallel: {} carries a LoRA adapter; LoRA under tensor parallelism is not supported "
                  "(merge the adapters first, or train without parallel.tp)",
                  path);
  return nullptr;
}

// Every (module, rule) pair of the plan, checked: each rule matches something of the right kind,
// a module is split by at most one rule, nothing is sharded yet.
std::vector<Match> match_plan(const nn::Module& model, const nn::TpPlan& plan) {
  std::vector<Match> out;
  std::vector<int> used(plan.rules.size(), 0);
  for (auto& [path, m] : model.named_modules()) {
    int splits = 0;
    for (size_t i = 0; i < plan.rules.size(); ++i) {
      const nn::TpRule& rule = plan.rules[i];
      if (!nn::tp_path_matches(rule.pattern, path)) continue;
      ++used[i];
      const char* want = nullptr;
      switch (rule.style) {
        case nn::TpStyle::Column:
        case nn::TpStyle::Row:
        case nn::TpStyle::VocabHead: want = check_unsharded<nn::Linear>(m, path, "an nn::Linear"); break;
        case nn::TpStyle::VocabEmbedding: want = check_unsharded<nn::Embedding>(m, path, "an nn::Embedding"); break;
        case nn::TpStyle::Heads:
          if (!dynamic_cast<nn::HeadParallel*>(m)) want = "an attention implementing nn::HeadParallel";
          break;
      }
      BRIGADE_CHECK(want == nullptr, ValueError, "tensor-parallel plan: rule \"{}\" ({}) matches {}, which is not {}",
                    rule.pattern, nn::tp_style_name(rule.style), path, want);
      BRIGADE_CHECK(rule.groups >= 1 && (rule.groups == 1 || rule.style == nn::TpStyle::Column), ValueError,
                    "tensor-parallel plan: rule \"{}\" has groups = {}; only a column rule may split its output in "
                    "groups (>= 1)",
                    rule.pattern, rule.groups);
      if (rule.style != nn::TpStyle::Heads) ++splits;
      BRIGADE_CHECK(splits <= 1, ValueError, "tensor-parallel plan: {} is split by two rules (the second: \"{}\")",
                    path, rule.pattern);
      out.push_back({path, m, &rule});
    }
  }
  for (size_t i = 0; i < plan.rules.size(); ++i)
    BRIGADE_CHECK(used[i] > 0, ValueError,
                  "tensor-parallel plan: rule \"{}\" ({}) matches no module of the model; check the pattern against "
                  "the model's module names",
                  plan.rules[i].pattern, nn::tp_style_name(plan.rules[i].style));
  return out;
}

// The local parameter `local` of a module.
Tensor param_of(const nn::Module& m, const std::string& local) {
  for (auto& [n, t] : m.named_parameters())
    if (n == local) return t;
  return Tensor();
}

}  // namespace

const TpSplit& TpLayout::split(const std::string& name) const {
  auto it = splits_.find(name);
  BRIGADE_CHECK(it != splits_.end(), ValueError,
                "tensor parallel: the model has no parameter '{}' (the layout holds {} parameters)", name,
                splits_.size());
  return it->second;
}

Shape TpLayout::shard_shape(const std::string& name) const {
  const TpSplit& s = split(name);
  return s.sharded ? views_of(s, size_).shard : s.full;
}

TpLayout tp_layout(const nn::Module& model, const nn::TpPlan& plan, int P) {
  BRIGADE_CHECK(P >= 1, ValueError, "tp_layout: a tensor-parallel group of {} ranks", P);
  const std::vector<Match> matches = match_plan(model, plan);
  // Heads first: their divisibility is what a recipe chooses (parallel.tp against model.n_head).
  for (const Match& m : matches)
    if (m.rule->style == nn::TpStyle::Heads) dynamic_cast<nn::HeadParallel*>(m.module)->check_heads(P);
  TpLayout out;
  out.size_ = P;
  for (auto& [name, p] : model.named_parameters()) {
    TpSplit s;
    s.full = p.shape();
    out.names_.push_back(name);
    out.splits_[name] = s;
  }
  for (const Match& m : matches) {
    const nn::TpStyle style = m.rule->style;
    if (style == nn::TpStyle::Heads) continue;
    auto set = [&](const std::string& local, int64_t dim, bool pad) {
      const std::string name = m.path + "." + local;
      TpSplit& s = out.splits_.at(name);
      s.sharded = true;
      s.dim = dim;
      s.groups = m.rule->groups;
      s.style = style;
      s.real = s.full[size_t(dim)];
      s.padded = pad ? tp_padded_vocab(s.real, P) : s.real;
      BRIGADE_CHECK(s.padded % (s.groups * P) == 0, ConfigError,
                    "tensor parallel: {} has extent {} along dim {}, not divisible into {} x parallel.tp = {} parts "
                    "({} split); choose a parallel.tp that divides it",
                    name, s.padded, s.dim, s.groups, P, nn::tp_style_name(style));
    };
    if (style == nn::TpStyle::VocabEmbedding) {
      set("weight", 0, /*pad=*/true);
      continue;
    }
    const auto* l = dynamic_cast<const nn::Linear*>(m.module);
    const int64_t out_dim = l->layout == nn::WeightLayout::OutIn ? 0 : 1, in_dim = 1 - out_dim;
    const bool has_bias = param_of(*l, "bias").defined();
    if (style == nn::TpStyle::Column || style == nn::TpStyle::VocabHead) {
      const bool pad = style == nn::TpStyle::VocabHead;
      set("weight", out_dim, pad);
      if (has_bias) set("bias", 0, pad);
    } else {  // Row: the bias is added once, after the reduce (replicated)
      set("weight", in_dim, false);
    }
  }
  return out;
}

bool tp_replicated(const TpLayout& layout, const std::string& full_param_name) {
  return !layout.split(full_param_name).sharded;
}

Tensor tp_shard_param(const TpLayout& layout, const std::string& name, const Tensor& full, int tp_rank) {
  const int P = layout.size();
  BRIGADE_CHECK(tp_rank >= 0 && tp_rank < P, ValueError,
                "tp_shard_param({}): rank {} outside a tensor-parallel group of {}", name, tp_rank, P);
  const TpSplit& s = layout.split(name);
  BRIGADE_CHECK(full.shape() == s.full, ShapeError,
                "tp_shard_param: {} is {}, but the model gives it shape ({}); check model.* against the checkpoint",
                name, full.str(), fmt::join(s.full, ", "));
  if (!s.sharded) return full;
  const SplitViews v = views_of(s, P);
  Tensor src = full.contiguous();
  if (s.padded != s.real) {  // zero padding rows (a vocabulary)
    Shape padded = s.full;
    padded[size_t(s.dim)] = s.padded;
    src = Tensor::zeros(padded, full.dtype());  // (V_pad, C)
    src.narrow(s.dim, 0, s.real).copy_(full);
  }
  Tensor shard = Tensor::empty(v.shard, full.dtype(), MemTag::Params);  // e.g. (C, 3C/tp)
  shard.view(v.shard_view).copy_(src.view(v.full_view).select(s.dim + 1, tp_rank));
  return shard;
}

Tensor tp_gather_param(const TpLayout& layout, const std::string& name, const Tensor& local, dist::ProcessGroup& tp) {
  const int P = tp.size();
  BRIGADE_CHECK(P == layout.size(), ValueError, "tp_gather_param({}): the layout is for {} ranks, the group has {}",
                name, layout.size(), P);
  const TpSplit& s = layout.split(name);
  if (!s.sharded) return local.clone();
  const SplitViews v = views_of(s, P);
  BRIGADE_CHECK(local.shape() == v.shard, ShapeError,
                "tp_gather_param: {} is {} on tp rank {}, but its shard over parallel.tp = {} has shape ({})", name,
                local.str(), tp.rank(), P, fmt::join(v.shard, ", "));
  Tensor mine = local.dtype() == DType::F32 ? local.contiguous() : local.to(DType::F32);  // f32 shard
  Shape all = v.shard;
  all.insert(all.begin(), P);
  Tensor gathered = Tensor::empty(all, DType::F32);  // (P, shard...)
  tp.allgather(mine.data<float>(), gathered.data<float>(), std::vector<int64_t>(static_cast<size_t>(P), local.numel()));
  Shape padded = s.full;
  padded[size_t(s.dim)] = s.padded;
  Tensor full = Tensor::empty(padded, local.dtype());  // padded full shape
  for (int r = 0; r < P; ++r)
    full.view(v.full_view).select(s.dim + 1, r).copy_(gathered.select(0, r).view(v.shard_view));
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

std::string logits_refused(int tp, int64_t V) {
  return fmt::format(
      "the vocabulary is sharded over parallel.tp = {} ranks and the full (N, {}) logits are never gathered; train "
      "through the model's loss (its head's lm_loss), or run generation on a model without tensor parallelism",
      tp, V);
}

class VocabParallel final : public nn::EmbeddingShard {
 public:
  VocabParallel(std::shared_ptr<dist::ProcessGroup> tp, int64_t start, int64_t V) : tp_(std::move(tp)) {
    vocab_start = start;
    vocab_size = V;
  }
  Tensor lookup(const nn::Embedding& e, const Tensor& ids) const override {
    for (int64_t id : ids.to_vector_i64())
      BRIGADE_CHECK(id >= 0 && id < vocab_size, ValueError, "embedding: token id {} outside the vocabulary [0, {})", id,
                    vocab_size);
    return vocab_parallel_embedding(e.weight, ids, vocab_start, *tp_);  // (..., C)
  }
  Tensor attend(const nn::Embedding&, const Tensor&) const override {
    throw ValueError("Embedding.attend: " + logits_refused(tp_->size(), vocab_size));
  }
  Tensor lm_loss(const nn::Embedding& e, const Tensor& x, const Tensor& targets) const override {
    Tensor logits = F::matmul(tp_copy(x, *tp_), e.weight, false, true);  // (N, Vl): this rank's vocabulary
    return vocab_parallel_cross_entropy(logits, targets, vocab_start, vocab_size, *tp_);
  }

 private:
  std::shared_ptr<dist::ProcessGroup> tp_;
};

// An untied LM head (a Linear over the vocabulary) on this rank's rows of the padded vocabulary.
class VocabParallelHead final : public nn::LinearShard {
 public:
  VocabParallelHead(std::shared_ptr<dist::ProcessGroup> tp, int64_t start, int64_t V)
      : tp_(std::move(tp)), vocab_start_(start), vocab_size_(V) {}
  Tensor forward(const nn::Linear&, const Tensor&) const override {
    throw ValueError("Linear.forward (an LM head): " + logits_refused(tp_->size(), vocab_size_));
  }
  Tensor lm_loss(const nn::Linear& l, const Tensor& x, const Tensor& targets) const override {
    Tensor logits = F::linear(tp_copy(x, *tp_), l.weight, l.bias, l.layout);  // (N, Vl): this rank's vocabulary
    return vocab_parallel_cross_entropy(logits, targets, vocab_start_, vocab_size_, *tp_);
  }

 private:
  std::shared_ptr<dist::ProcessGroup> tp_;
  int64_t vocab_start_, vocab_size_;
};

}  // namespace

TpLayout apply_tensor_parallel(nn::Module& model, const nn::TpPlan& plan, std::shared_ptr<dist::ProcessGroup> tp) {
  BRIGADE_CHECK(tp != nullptr, ValueError, "apply_tensor_parallel: no process group given");
  const int P = tp->size(), r = tp->rank();
  TpLayout layout = tp_layout(model, plan, P);  // every check before anything changes
  if (P == 1) return layout;
  autograd::NoGradGuard no_grad;
  auto column = std::make_shared<ColumnParallel>(tp);
  auto row = std::make_shared<RowParallel>(tp);
  for (const Match& m : match_plan(model, plan)) {
    const nn::TpStyle style = m.rule->style;
    if (style == nn::TpStyle::Heads) {
      dynamic_cast<nn::HeadParallel*>(m.module)->divide_heads(P);
      continue;
    }
    for (auto& [local, t] : m.module->named_parameters()) {
      const std::string name = m.path + "." + local;
      if (layout.split(name).sharded) m.module->set_parameter(local, tp_shard_param(layout, name, t.detach(), r));
    }
    switch (style) {
      case nn::TpStyle::Column: dynamic_cast<nn::Linear&>(*m.module).shard = column; break;
      case nn::TpStyle::Row: dynamic_cast<nn::Linear&>(*m.module).shard = row; break;
      case nn::TpStyle::VocabEmbedding: {
        const TpSplit& s = layout.split(m.path + ".weight");
        dynamic_cast<nn::Embedding&>(*m.module).shard =
            std::make_shared<VocabParallel>(tp, int64_t(r) * (s.padded / P), s.real);
        break;
      }
      case nn::TpStyle::VocabHead: {
        const TpSplit& s = layout.split(m.path + ".weight");
        dynamic_cast<nn::Linear&>(*m.module).shard =
            std::make_shared<VocabParallelHead>(tp, int64_t(r) * (s.padded / P), s.real);
        break;
      }
      case nn::TpStyle::Heads: break;
    }
  }
  return layout;
}

}  // namespace brigade::parallel
