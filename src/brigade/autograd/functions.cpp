// Every derivative rule of the engine, one Node per differentiable function.
// Convention: backward returns fresh gradients for each input in the order the
// inputs were recorded (undefined where not needed); the engine sums gradients
// of shared inputs and AccumulateGrad adds into leaves. A node that saves its own
// output saves output.detach(), never the recorded tensor (that would be a cycle).
#include "brigade/autograd/functions.h"

#include <cmath>
#include <memory>
#include <unordered_set>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/rules.h"
#include "brigade/core/error.h"

namespace brigade::fn {

using autograd::Node;
using autograd::record;
using autograd::needs_grad;
using rules::policy_dtype;
using rules::wants;

namespace {

// ------------------------------------------------------------------ checkpoint regions

// A checkpointed region while fn runs in it: in its forward (record) or its recompute
// (replay). Under CheckpointKeep::GemmOutputs the forward appends every GEMM output to
// `kept` and the recompute takes them back in the same order.
struct Region {
  CheckpointKeep keep = CheckpointKeep::Inputs;
  bool replay = false;
  std::vector<Tensor>* kept = nullptr;
  size_t next = 0;
};
thread_local std::vector<Region*> g_regions;  // innermost last

struct RegionScope {
  explicit RegionScope(Region* r) { g_regions.push_back(r); }
  ~RegionScope() { g_regions.pop_back(); }
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;
};

// The output of a GEMM, `compute()` unless a region keeps GEMM outputs (fn::gemm_output).
template <typename F>
Tensor kept_gemm_output(F&& compute) {
  Region* r = g_regions.empty() ? nullptr : g_regions.back();
  if (!r || r->keep != CheckpointKeep::GemmOutputs) return compute();
  if (r->replay) {
    BRIGADE_CHECK(r->next < r->kept->size(), ValueError,
                  "checkpoint(): the recompute runs more GEMMs than the forward did ({}); the checkpointed "
                  "function must do the same work every time it runs",
                  r->kept->size());
    return std::move((*r->kept)[r->next++]);  // the region no longer holds it: freed with the recomputed graph
  }
  Tensor y = compute();
  r->kept->push_back(y.detach());
  return y;
}

// ------------------------------------------------------------------ dtype casts (autocast)

struct CastBackward : Node {
  DType from = DType::F32;
  const char* name() const override { return "CastBackward"; }
  // forward: out = x.to(to)   -> the gradient goes back in x's dtype
  std::vector<Tensor> backward(const Tensor& g) override { return {g.dtype() == from ? g : ops::cast(g, from)}; }
};

// x in dtype dt: x itself when it already is (or is not floating), else a recorded cast.
// A cast of a parameter is the low-precision working copy of a weight: it is allocated
// as MemTag::Params (it lives as long as the op that saved it, i.e. until the backward).
Tensor as_dtype(const Tensor& x, DType dt) {
  if (!x.defined() || x.dtype() == dt || !is_floating(x.dtype())) return x;
  const bool weight = x.tag() == MemTag::Params;
  MemTagScope tag(weight ? MemTag::Params : MemTagScope::current());
  auto n = std::make_shared<CastBackward>();
  n->from = x.dtype();
  return record(ops::cast(x, dt), n, {x});
}

// A parameter that does not train, stored in another floating dtype than the op computes in
// (LoRA's frozen base: stored in bf16 and computed in f32 at O0, or stored in f32 and computed in
// 16 bits at O1/O2). It outlives the graph anyway, so a GEMM's node saves it as stored and casts it
// again in its backward instead of holding the working copy from the forward to the backward.
bool frozen_cast(const Tensor& p, DType dt) {
  return p.defined() && is_floating(p.dtype()) && p.dtype() != dt && !p.requires_grad() && p.tag() == MemTag::Params;
}

// The working copy of a frozen parameter that frozen_cast saved as stored (tagged params, as the
// forward's cast of a weight is).
Tensor recast(const Tensor& stored, DType dt) {
  MemTagScope tag(MemTag::Params);
  return ops::cast(stored, dt);
}

// ------------------------------------------------------------------ elementwise

struct AddBackward : Node {
  Shape a_shape, b_shape;
  double b_sign = 1.0;
  const char* name() const override { return "AddBackward"; }
  // forward: out = a + b_sign * b   (broadcast)
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor ga, gb;
    if (wants(*this, 0)) ga = ops::sum_to(g, a_shape);
    if (wants(*this, 1)) {
      gb = ops::sum_to(g, b_shape);
      if (b_sign != 1.0) gb = ops::mul_scalar(gb, b_sign);
    }
    return {ga, gb};
  }
};

struct MulBackward : Node {
  Tensor a, b;
  const char* name() const override { return "MulBackward"; }
  // forward: out = a * b   (broadcast)
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor ga, gb;
    if (wants(*this, 0)) ga = ops::sum_to(ops::mul(g, b), a.shape());
    if (wants(*this, 1)) gb = ops::sum_to(ops::mul(g, a), b.shape());
    return {ga, gb};
  }
  void release() override { a = b = Tensor(); }
};

struct ScaleBackward : Node {
  double s = 1.0;
  const char* name() const override { return "ScaleBackward"; }
  // forward: out = a * s (+ const)
  std::vector<Tensor> backward(const Tensor& g) override { return {s == 1.0 ? g : ops::mul_scalar(g, s)}; }
};

}  // namespace

DType rules::policy_dtype(amp::Op op, std::initializer_list<const Tensor*> inputs) {
  DType ds[4] = {DType::F32, DType::F32, DType::F32, DType::F32};
  size_t k = 0;
  for (const Tensor* t : inputs)
    if (t->defined() && is_floating(t->dtype()) && k < 4) ds[k++] = t->dtype();
  switch (k) {
    case 0: return amp::compute_dtype(op, {});
    case 1: return amp::compute_dtype(op, {ds[0]});
    case 2: return amp::compute_dtype(op, {ds[0], ds[1]});
    case 3: return amp::compute_dtype(op, {ds[0], ds[1], ds[2]});
    default: return amp::compute_dtype(op, {ds[0], ds[1], ds[2], ds[3]});
  }
}

bool rules::policy_mixed(amp::Op op) {
  return amp::rule(op, amp::current_policy().level) == amp::Rule::Mixed;
}

Tensor cast(const Tensor& x, DType dt) { return as_dtype(x, dt); }

Tensor gemm_output(const std::function<Tensor()>& compute) { return kept_gemm_output(compute); }

namespace {
// a + b (b_sign 1, ops::add) or a - b (b_sign -1, ops::sub), recorded with an AddBackward.
Tensor add_signed(const Tensor& a0, const Tensor& b0, double b_sign) {
  const DType dt = policy_dtype(amp::Op::Elementwise, {&a0, &b0});
  const Tensor a = as_dtype(a0, dt), b = as_dtype(b0, dt);
  auto n = std::make_shared<AddBackward>();
  n->a_shape = a.shape();
  n->b_shape = b.shape();
  n->b_sign = b_sign;
  return record(b_sign == 1.0 ? ops::add(a, b) : ops::sub(a, b), n, {a, b});
}
}  // namespace

Tensor add(const Tensor& a0, const Tensor& b0) { return add_signed(a0, b0, 1.0); }

Tensor sub(const Tensor& a0, const Tensor& b0) { return add_signed(a0, b0, -1.0); }

Tensor mul(const Tensor& a0, const Tensor& b0) {
  const DType dt = policy_dtype(amp::Op::Elementwise, {&a0, &b0});
  const Tensor a = as_dtype(a0, dt), b = as_dtype(b0, dt);
  auto n = std::make_shared<MulBackward>();
  if (needs_grad({a, b})) {
    n->a = a;
    n->b = b;
  }
  return record(ops::mul(a, b), n, {a, b});
}

Tensor mul_scalar(const Tensor& a0, double s) {
  const Tensor a = as_dtype(a0, policy_dtype(amp::Op::Elementwise, {&a0}));
  auto n = std::make_shared<ScaleBackward>();
  n->s = s;
  return record(ops::mul_scalar(a, s), n, {a});
}

Tensor add_scalar(const Tensor& a0, double s) {
  const Tensor a = as_dtype(a0, policy_dtype(amp::Op::Elementwise, {&a0}));
  auto n = std::make_shared<ScaleBackward>();
  return record(ops::add_scalar(a, s), n, {a});
}

// ------------------------------------------------------------------ shape

namespace {

struct ReshapeBackward : Node {
  Shape in_shape;
  const char* name() const override { return "ReshapeBackward"; }
  // forward: out = a.reshape(shape)
  std::vector<Tensor> backward(const Tensor& g) override { return {g.reshape(in_shape)}; }
};

struct TransposeBackward : Node {
  int64_t d0 = 0, d1 = 0;
  const char* name() const override { return "TransposeBackward"; }
  // forward: out = a.transpose(d0, d1)
  std::vector<Tensor> backward(const Tensor& g) override { return {g.transpose(d0, d1).contiguous()}; }
};

struct NarrowBackward : Node {
  Shape in_shape;
  int64_t dim = 0, start = 0, length = 0;
  const char* name() const override { return "NarrowBackward"; }
  // forward: out = a.narrow(dim, start, length)
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor ga = Tensor::zeros(in_shape, g.dtype());  // same shape as a
    ga.narrow(dim, start, length).copy_(g);
    return {ga};
  }
};

}  // namespace

struct HookBackward : Node {
  const char* name() const override { return "HookBackward"; }
  std::function<void()> fn;
  std::vector<Tensor> backward(const Tensor& g) override {
    if (fn) fn();
    return {g};
  }
  void release() override { fn = nullptr; }
};

Tensor backward_hook(const Tensor& x, std::function<void()> on_backward) {
  auto n = std::make_shared<HookBackward>();
  n->fn = std::move(on_backward);
  return record(x.detach(), n, {x});
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  auto n = std::make_shared<ReshapeBackward>();
  n->in_shape = a.shape();
  return record(a.reshape(shape).detach(), n, {a});
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  auto n = std::make_shared<TransposeBackward>();
  n->d0 = d0;
  n->d1 = d1;
  return record(a.transpose(d0, d1).detach(), n, {a});
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  auto n = std::make_shared<NarrowBackward>();
  n->in_shape = a.shape();
  n->dim = dim;
  n->start = start;
  n->length = length;
  return record(a.narrow(dim, start, length).detach(), n, {a});
}

// ------------------------------------------------------------------ reductions

namespace {

struct SumAllBackward : Node {
  Shape in_shape;
  double scale = 1.0;
  const char* name() const override { return "SumAllBackward"; }
  // forward: out = sum(a) * scale
  std::vector<Tensor> backward(const Tensor& g) override {
    return {Tensor::full(in_shape, g.item() * scale, g.dtype())};
  }
};

}  // namespace

Tensor sum_all(const Tensor& a0) {
  const Tensor a = as_dtype(a0, policy_dtype(amp::Op::Reduction, {&a0}));
  auto n = std::make_shared<SumAllBackward>();
  n->in_shape = a.shape();
  return record(ops::sum_all(a), n, {a});
}

Tensor mean_all(const Tensor& a0) {
  const Tensor a = as_dtype(a0, policy_dtype(amp::Op::Reduction, {&a0}));
  auto n = std::make_shared<SumAllBackward>();
  n->in_shape = a.shape();
  n->scale = 1.0 / double(std::max<int64_t>(a.numel(), 1));
  return record(ops::mul_scalar(ops::sum_all(a), n->scale), n, {a});
}

// ------------------------------------------------------------------ layers

namespace {

// Feeds a deferred weight gradient to its edge (a parameter's AccumulateGrad, or the recorded
// cast in front of it): a small backward of its own.
void feed(const std::shared_ptr<Node>& edge, const Tensor& g) {
  if (edge && g.defined()) autograd::backward(edge, g);
}

struct MatmulBackward : Node {
  Tensor a, b;
  bool ta = false, tb = false;
  bool param_a = false, param_b = false;  // the operand is a parameter (deferrable, engine.h)
  // an operand that is a frozen parameter cast for the op (frozen_cast): saved as stored, in place
  // of a / b, and cast to dt again in the backward
  Tensor a_stored, b_stored;
  DType dt = DType::F32;
  const char* name() const override { return "MatmulBackward"; }
  // forward: out = op(a) @ op(b), op = transpose of the last two dims when ta / tb
  static Tensor grad_a(const Tensor& g, const Tensor& a, const Tensor& b, bool ta, bool tb) {
    // d op(a) = g @ op(b)^T ; if ta, da = (g @ op(b)^T)^T = op(b) @ g^T
    Tensor ga = ta ? ops::matmul(b, g, tb, true) : ops::matmul(g, b, false, !tb);
    return ops::sum_to(ga, a.shape());
  }
  static Tensor grad_b(const Tensor& g, const Tensor& a, const Tensor& b, bool ta, bool tb) {
    // d op(b) = op(a)^T @ g ; if tb, db = g^T @ op(a)
    Tensor gb = tb ? ops::matmul(g, a, true, ta) : ops::matmul(a, g, !ta, false);
    return ops::sum_to(gb, b.shape());
  }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor ga, gb;
    if (a_stored.defined()) a = recast(a_stored, dt);
    if (b_stored.defined()) b = recast(b_stored, dt);
    autograd::DeferredGrads* sink = autograd::deferred_weight_grads();
    const bool defer_a = sink && param_a && wants(*this, 0), defer_b = sink && param_b && wants(*this, 1);
    if (wants(*this, 0) && !defer_a) ga = grad_a(g, a, b, ta, tb);
    if (wants(*this, 1) && !defer_b) gb = grad_b(g, a, b, ta, tb);
    if (defer_a || defer_b)
      sink->push_back([g, a = a, b = b, ta = ta, tb = tb, defer_a, defer_b, ea = next[0], eb = next[1]] {
        if (defer_a) feed(ea, grad_a(g, a, b, ta, tb));
        if (defer_b) feed(eb, grad_b(g, a, b, ta, tb));
      });
    return {ga, gb};
  }
  void release() override { a = b = a_stored = b_stored = Tensor(); }
};

struct LinearBackward : Node {
  Tensor x, w;
  WeightLayout layout = WeightLayout::OutIn;
  bool has_bias = false;
  bool param_w = false;  // the weight is a parameter (deferrable, engine.h)
  Tensor w_stored;       // a frozen weight cast for the op (frozen_cast), saved as stored in place of w
  DType dt = DType::F32;
  const char* name() const override { return "LinearBackward"; }
  // forward: y = x @ W^T + bias (OutIn) or y = x @ W + bias (InOut)
  std::vector<Tensor> backward(const Tensor& g) override {
    if (w_stored.defined()) w = recast(w_stored, dt);
    autograd::DeferredGrads* sink = autograd::deferred_weight_grads();
    const bool want_w = wants(*this, 1), want_b = has_bias && wants(*this, 2);
    if (sink && param_w && want_w) {  // the input gradient now, the weight and bias gradients later
      ops::LinearGrads r = ops::linear_backward(g, x, w, layout, wants(*this, 0), false, false);
      sink->push_back([g, x = x, w = w, layout = layout, want_b, ew = next[1],
                       eb = has_bias ? next[2] : std::shared_ptr<Node>()] {
        ops::LinearGrads d = ops::linear_backward(g, x, w, layout, false, true, want_b);
        feed(ew, d.gw);
        if (want_b) feed(eb, d.gb);
      });
      std::vector<Tensor> out{r.gx, Tensor()};
      if (has_bias) out.push_back(Tensor());
      return out;
    }
    ops::LinearGrads r = ops::linear_backward(g, x, w, layout, wants(*this, 0), want_w, want_b);
    std::vector<Tensor> out{r.gx, r.gw};
    if (has_bias) out.push_back(r.gb);
    return out;
  }
  void release() override { x = w = w_stored = Tensor(); }
};

struct EmbeddingBackward : Node {
  Tensor ids;
  int64_t V = 0;
  const char* name() const override { return "EmbeddingBackward"; }
  // forward: out[..., :] = weight[ids[...], :]
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::embedding_backward(g, ids, V)}; }
  void release() override { ids = Tensor(); }
};

struct LayerNormBackward : rules::NormNode {
  const char* name() const override { return "LayerNormBackward"; }
  // forward: y = (x - mean) * rstd * w + b
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::LayerNormGrads r = ops::layer_norm_backward(g, x, w, mean, rstd);
    return {r.gx, r.gw, r.gb};
  }
};

struct AttentionBackward : rules::AttentionNode {
  bool causal = true;
  const char* name() const override { return "AttentionBackward"; }
  // forward: out = softmax(scale * q @ k^T [+ causal mask]) @ v
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::AttentionGrads r = ops::attention_backward(g, q, k, v, out, lse, causal, scale);
    return {r.gq, r.gk, r.gv};
  }
};

// qkv (B, T, 3C) -> views q, k, v (B, NH, T, HS), made contiguous for the kernel.
struct HeadSplit {
  Tensor q, k, v;
};
HeadSplit split_heads(const Tensor& qkv, int64_t NH) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, HS = C / NH;
  Tensor x = qkv.view({B, T, 3, NH, HS}).permute({2, 0, 3, 1, 4});  // (3, B, NH, T, HS)
  return {x.select(0, 0).contiguous(), x.select(0, 1).contiguous(), x.select(0, 2).contiguous()};
}

struct SelfAttentionBackward : rules::AttentionNode {  // q, k, v, out (B, NH, T, HS) and lse (B, NH, T)
  const char* name() const override { return "CausalSelfAttentionBackward"; }
  // forward: y = merge_heads(softmax(scale * q @ k^T + causal mask) @ v), (q, k, v) = split_heads(qkv)
  std::vector<Tensor> backward(const Tensor& g) override {
    const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
    Tensor gout = g.view({B, T, NH, HS}).permute({0, 2, 1, 3}).contiguous();  // (B, NH, T, HS)
    ops::AttentionGrads r = ops::attention_backward(gout, q, k, v, out, lse, true, scale);
    Tensor gqkv = Tensor::empty({B, T, 3 * NH * HS}, g.dtype());  // (B, T, 3C)
    Tensor dst = gqkv.view({B, T, 3, NH, HS}).permute({2, 0, 3, 1, 4});  // (3, B, NH, T, HS)
    dst.select(0, 0).copy_(r.gq);
    dst.select(0, 1).copy_(r.gk);
    dst.select(0, 2).copy_(r.gv);
    return {gqkv};
  }
};

struct CrossEntropyBackward : Node {
  Tensor logits, targets, lse;
  int64_t ignore_index = -100;
  const char* name() const override { return "CrossEntropyBackward"; }
  // forward: loss = mean_i (lse_i - logits[i, target_i]) over targets != ignore_index
  std::vector<Tensor> backward(const Tensor& g) override {
    // the saved logits are released here anyway: hand them over, so the gradient is written
    // over them when nothing else holds them (no second (N, V) buffer)
    return {ops::cross_entropy_backward_(g.item(), std::move(logits), targets, lse, ignore_index)};
  }
  void release() override { logits = targets = lse = Tensor(); }
};

}  // namespace

Tensor matmul(const Tensor& a0, const Tensor& b0, bool trans_a, bool trans_b) {
  const DType dt = policy_dtype(amp::Op::Matmul, {&a0, &b0});
  const Tensor a = as_dtype(a0, dt), b = as_dtype(b0, dt);
  auto n = std::make_shared<MatmulBackward>();
  if (needs_grad({a, b})) {
    n->dt = dt;
    if (frozen_cast(a0, dt)) n->a_stored = a0; else n->a = a;
    if (frozen_cast(b0, dt)) n->b_stored = b0; else n->b = b;
    n->ta = trans_a;
    n->tb = trans_b;
    n->param_a = a0.is_leaf() && a0.requires_grad();
    n->param_b = b0.is_leaf() && b0.requires_grad();
  }
  return record(kept_gemm_output([&] { return ops::matmul(a, b, trans_a, trans_b); }), n, {a, b});
}

Tensor linear(const Tensor& x0, const Tensor& w0, const Tensor& b0, WeightLayout layout) {
  const DType dt = policy_dtype(amp::Op::Linear, {&x0, &w0});
  const Tensor x = as_dtype(x0, dt), w = as_dtype(w0, dt), bias = as_dtype(b0, dt);
  auto n = std::make_shared<LinearBackward>();
  std::vector<Tensor> inputs{x, w};
  if (bias.defined()) inputs.push_back(bias);
  if (needs_grad(inputs)) {
    n->x = x;
    n->dt = dt;
    if (frozen_cast(w0, dt)) n->w_stored = w0; else n->w = w;
    n->layout = layout;
    n->has_bias = bias.defined();
    n->param_w = w0.is_leaf() && w0.requires_grad();
  }
  return record(kept_gemm_output([&] { return ops::linear(x, w, bias, layout); }), n, inputs);
}

Tensor embedding(const Tensor& w0, const Tensor& ids) {
  const Tensor weight = as_dtype(w0, policy_dtype(amp::Op::Embedding, {&w0}));
  auto n = std::make_shared<EmbeddingBackward>();
  if (needs_grad({weight})) {
    n->ids = ids;
    n->V = weight.size(0);
  }
  Tensor y = record(ops::embedding(weight, ids), n, {weight});
  // Under rule Keep (O0) a 16-bit table that is a frozen parameter (LoRA's base stored in bf16,
  // lora.base_dtype) is storage, not a compute dtype: its rows are gathered as stored and widened
  // to f32, O0's activation dtype, which is exactly what an f32 copy of the table would give,
  // without copying the V x C table. (Every other op of the model promotes the mix of f32
  // activations and 16-bit weights to f32 already; a lookup has no activation input to mix with.)
  if (amp::rule(amp::Op::Embedding, amp::current_policy().level) == amp::Rule::Keep && frozen_cast(w0, DType::F32))
    y = as_dtype(y, DType::F32);
  return y;
}

Tensor layer_norm(const Tensor& x0, const Tensor& w0, const Tensor& b0, double eps) {
  const DType dt = policy_dtype(amp::Op::LayerNorm, {&x0, &w0, &b0});
  const Tensor x = as_dtype(x0, dt), w = as_dtype(w0, dt), b = as_dtype(b0, dt);
  ops::LayerNormOut r = ops::layer_norm(x, w, b, eps);
  auto n = std::make_shared<LayerNormBackward>();
  if (needs_grad({x, w, b})) n->save(x, w, r.mean, r.rstd);
  return record(r.y, n, {x, w, b});
}

// forward: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); the node keeps x
Tensor gelu(const Tensor& x0) {
  const Tensor x = as_dtype(x0, policy_dtype(amp::Op::Gelu, {&x0}));
  return rules::record_saving<ops::gelu_backward>("GeluBackward", ops::gelu(x), x, x);
}

// forward: y = exp(x - max) / sum(exp(x - max)); the node keeps y
Tensor softmax(const Tensor& x0) {
  const Tensor x = as_dtype(x0, policy_dtype(amp::Op::Softmax, {&x0}));
  Tensor y = ops::softmax(x);
  return rules::record_saving<ops::softmax_backward>("SoftmaxBackward", y, x, y.detach());
}

// forward: y = x * mask   (mask in {0, 1/(1-p)}); the node keeps the mask
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  if (!training || p == 0.0) return x;
  ops::DropoutOut r = ops::dropout(x, p, gen);
  return rules::record_saving<ops::dropout_backward>("DropoutBackward", r.y, x, r.mask);
}

rules::AttentionArgs rules::attention_args(const Tensor& q0, const Tensor& k0, const Tensor& v0) {
  const DType dt = policy_dtype(amp::Op::Attention, {&q0, &k0, &v0});
  const Tensor q = as_dtype(q0, dt);
  return {q, as_dtype(k0, dt), as_dtype(v0, dt), 1.0 / std::sqrt(double(q.size(-1)))};
}

Tensor attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, bool causal) {
  const rules::AttentionArgs a = rules::attention_args(q0, k0, v0);
  auto n = std::make_shared<AttentionBackward>();
  n->causal = causal;
  return rules::record_attention(n, a, ops::attention(a.q, a.k, a.v, causal, a.scale));
}

Tensor causal_self_attention(const Tensor& qkv0, int64_t n_head) {
  const Tensor qkv = as_dtype(qkv0, policy_dtype(amp::Op::Attention, {&qkv0}));
  BRIGADE_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * n_head) == 0, ShapeError,
                "causal_self_attention: qkv must be (B, T, 3C) with C divisible by n_head={}, got {}", n_head,
                qkv.str());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, HS = C / n_head;
  HeadSplit h = split_heads(qkv, n_head);
  const double scale = 1.0 / std::sqrt(double(HS));
  ops::AttentionOut r = ops::attention(h.q, h.k, h.v, true, scale);  // (B, NH, T, HS)
  Tensor y = r.out.permute({0, 2, 1, 3}).contiguous().view({B, T, C});  // (B, T, C)
  auto n = std::make_shared<SelfAttentionBackward>();
  if (needs_grad({qkv})) {
    n->q = h.q;
    n->k = h.k;
    n->v = h.v;
    n->out = r.out;
    n->lse = r.lse;
    n->scale = scale;
  }
  return record(y, n, {qkv});
}

Tensor cross_entropy(const Tensor& logits0, const Tensor& targets, int64_t ignore_index) {
  const Tensor logits = as_dtype(logits0, policy_dtype(amp::Op::CrossEntropy, {&logits0}));
  ops::CrossEntropyOut r = ops::cross_entropy(logits, targets, ignore_index);
  auto n = std::make_shared<CrossEntropyBackward>();
  if (needs_grad({logits})) {
    n->logits = logits;
    n->targets = targets;
    n->lse = r.lse;
    n->ignore_index = ignore_index;
  }
  return record(r.loss, n, {logits});
}

// ------------------------------------------------------------------ checkpoint

namespace {

// Where the gradient of a recomputed region's (detached) input ends up.
struct CheckpointInput : Node {
  Tensor grad;
  const char* name() const override { return "CheckpointInput"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    grad = g;
    return {};
  }
};

// Restores a generator when the recompute ends, also by an exception.
struct RngRestore {
  Generator* gen = nullptr;
  Generator saved;
  ~RngRestore() {
    if (gen) *gen = saved;
  }
};

struct CheckpointBackward : Node {
  CheckpointFn fn;
  std::vector<Tensor> inputs;  // detached
  CheckpointKeep keep = CheckpointKeep::Inputs;
  std::vector<Tensor> kept;  // GEMM outputs (CheckpointKeep::GemmOutputs)
  Generator* rng = nullptr;
  std::unique_ptr<Generator> rng_state;  // *rng before the forward
  amp::Policy policy;                    // the precision policy of the forward, re-applied in the recompute
  const char* name() const override { return "CheckpointBackward"; }

  // forward: out = fn(inputs), recorded as one node; backward: recompute fn with
  // recording on, then backward through the recomputed graph with gradient g
  std::vector<Tensor> backward(const Tensor& g) override {
    std::vector<Tensor> ins(inputs.size());
    std::vector<std::shared_ptr<CheckpointInput>> sinks(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      ins[i] = inputs[i];
      if (!wants(*this, i) || !inputs[i].defined()) continue;
      ins[i] = inputs[i].detach();
      sinks[i] = std::make_shared<CheckpointInput>();
      ins[i].meta().grad_fn = sinks[i];
      ins[i].meta().requires_grad = true;
    }
    const uint64_t first = autograd::next_node_seq();
    Tensor out;
    {
      autograd::EnableGradGuard grad_on;
      autograd::RecomputeScope recompute;
      amp::AutocastScope autocast(policy);
      RngRestore restore;
      if (rng) {
        restore.saved = *rng;
        restore.gen = rng;
        *rng = *rng_state;
      }
      Region region{keep, /*replay=*/true, &kept, 0};
      RegionScope scope(&region);
      out = fn(ins);
      BRIGADE_CHECK(region.next == kept.size(), ValueError,
                    "checkpoint(): the forward ran {} GEMMs but the recompute only {}; the checkpointed function "
                    "must do the same work every time it runs",
                    kept.size(), region.next);
    }
    kept.clear();
    std::vector<Tensor> grads(inputs.size());
    if (!out.defined() || !out.requires_grad()) return grads;  // nothing in the region needs a gradient
    std::shared_ptr<Node> root = autograd::gradient_edge(out);
    out = Tensor();  // its values are not needed for the backward: free them now
    check_self_contained(root.get(), first);
    autograd::backward(std::move(root), g);
    for (size_t i = 0; i < sinks.size(); ++i)
      if (sinks[i]) grads[i] = std::move(sinks[i]->grad);
    return grads;
  }

  // The recomputed graph must end in its own inputs and in leaves: a node recorded
  // before the recompute means fn read a non-leaf of the surrounding graph that was
  // not passed in `inputs`, and the inner backward would run (and free) that graph.
  static void check_self_contained(Node* root, uint64_t first) {
    std::vector<Node*> stack{root};
    std::unordered_set<Node*> seen;
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (!n || !seen.insert(n).second) continue;
      if (dynamic_cast<autograd::AccumulateGrad*>(n) || dynamic_cast<CheckpointInput*>(n)) continue;
      BRIGADE_CHECK(n->seq >= first, ValueError,
                    "checkpoint(): the checkpointed function reads a tensor computed outside it ({} output) "
                    "that needs a gradient; pass that tensor in the checkpoint's inputs",
                    n->name());
      for (auto& c : n->next) stack.push_back(c.get());
    }
  }

  void release() override {
    fn = nullptr;
    inputs.clear();
    kept.clear();
    rng_state.reset();
  }
};

}  // namespace

Tensor checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs, const CheckpointOptions& options) {
  if (!autograd::grad_enabled() || !g_regions.empty()) return fn(inputs);
  auto n = std::make_shared<CheckpointBackward>();
  n->keep = options.keep;
  n->policy = amp::current_policy();
  if (options.rng) {
    n->rng = options.rng;
    n->rng_state = std::make_unique<Generator>(*options.rng);
  }
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    Region region{options.keep, /*replay=*/false, &n->kept, 0};
    RegionScope scope(&region);
    out = fn(inputs);
  }
  BRIGADE_CHECK(out.defined(), ValueError, "checkpoint(): the checkpointed function returned an undefined tensor");
  n->inputs.reserve(inputs.size());
  n->next.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    n->inputs.push_back(t.defined() ? t.detach() : Tensor());
    n->next.push_back(autograd::gradient_edge(t));
  }
  n->fn = std::move(fn);
  // Recorded even when no input needs a gradient: fn may read parameters that do.
  out = out.detach();
  AutogradMeta& m = out.meta();
  m.grad_fn = std::move(n);
  m.requires_grad = true;
  return out;
}

}  // namespace brigade::fn
