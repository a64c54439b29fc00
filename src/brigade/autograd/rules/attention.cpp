// Derivative rules of attention: causal / full, GPT's fused qkv, key-padding masked, grouped-query
// (through repeat_kv) and Swin's window attention (a composition).
#include <cmath>

#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

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
    Tensor gqkv = Tensor::empty({B, T, 3 * NH * HS}, g.dtype());         // (B, T, 3C)
    Tensor dst = gqkv.view({B, T, 3, NH, HS}).permute({2, 0, 3, 1, 4});  // (3, B, NH, T, HS)
    dst.select(0, 0).copy_(r.gq);
    dst.select(0, 1).copy_(r.gk);
    dst.select(0, 2).copy_(r.gv);
    return {gqkv};
  }
};

struct KeyMaskAttentionBackward : rules::AttentionNode {
  Tensor key_mask;
  const char* name() const override { return "KeyMaskAttentionBackward"; }
  // forward: out = softmax(scale q k^T + (-inf where key_mask == 0)) v
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::AttentionGrads r = ops::attention_key_mask_backward(g, q, k, v, out, lse, key_mask, scale);
    return {r.gq, r.gk, r.gv};
  }
  void release() override {
    AttentionNode::release();
    key_mask = Tensor();
  }
};

struct RepeatKvBackward : Node {
  int64_t n_rep = 1;
  const char* name() const override { return "RepeatKvBackward"; }
  // forward: y[:, j] = x[:, j / n_rep]  ->  gx[:, kv] = sum_r g[:, kv * n_rep + r]
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::repeat_kv_backward(g, n_rep)}; }
};

}  // namespace

rules::AttentionArgs rules::attention_args(const Tensor& q0, const Tensor& k0, const Tensor& v0) {
  const DType dt = policy_dtype(amp::Op::Attention, {&q0, &k0, &v0});
  const Tensor q = cast(q0, dt);
  return {q, cast(k0, dt), cast(v0, dt), 1.0 / std::sqrt(double(q.size(-1)))};
}

Tensor attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, bool causal) {
  const rules::AttentionArgs a = rules::attention_args(q0, k0, v0);
  auto n = std::make_shared<AttentionBackward>();
  n->causal = causal;
  return rules::record_attention(n, a, ops::attention(a.q, a.k, a.v, causal, a.scale));
}

Tensor causal_self_attention(const Tensor& qkv0, int64_t n_head) {
  const Tensor qkv = cast(qkv0, policy_dtype(amp::Op::Attention, {&qkv0}));
  BRIGADE_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * n_head) == 0, ShapeError,
                "causal_self_attention: qkv must be (B, T, 3C) with C divisible by n_head={}, got {}", n_head,
                qkv.str());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, HS = C / n_head;
  HeadSplit h = split_heads(qkv, n_head);
  const double scale = 1.0 / std::sqrt(double(HS));
  ops::AttentionOut r = ops::attention(h.q, h.k, h.v, true, scale);     // (B, NH, T, HS)
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

Tensor attention_key_mask(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& key_mask) {
  if (!key_mask.defined()) return attention(q0, k0, v0, false);
  const rules::AttentionArgs a = rules::attention_args(q0, k0, v0);
  auto n = std::make_shared<KeyMaskAttentionBackward>();
  n->key_mask = key_mask;
  return rules::record_attention(n, a, ops::attention_key_mask(a.q, a.k, a.v, key_mask, a.scale));
}

Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  auto n = std::make_shared<RepeatKvBackward>();
  n->n_rep = n_rep;
  return record(ops::repeat_kv(x, n_rep), n, {x});
}

Tensor grouped_query_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  BRIGADE_CHECK(q.defined() && k.defined() && v.defined() && q.dim() == 4 && k.dim() == 4, ShapeError,
                "grouped_query_attention: q must be (B, NH, T, HS) and k, v (B, NKV, T, HS), got q {}, k {}",
                q.defined() ? shape_str(q.shape()) : "undefined", k.defined() ? shape_str(k.shape()) : "undefined");
  BRIGADE_CHECK(v.shape() == k.shape(), ShapeError, "grouped_query_attention: v {} must have k's shape {}",
                shape_str(v.shape()), shape_str(k.shape()));
  const int64_t NH = q.size(1), NKV = k.size(1);
  BRIGADE_CHECK(NKV > 0 && NH % NKV == 0, ShapeError,
                "grouped_query_attention: the {} kv heads of k {} must divide the {} query heads of q {}", NKV,
                shape_str(k.shape()), NH, shape_str(q.shape()));
  BRIGADE_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3), ShapeError,
                "grouped_query_attention: k {} must match q {} in B, T and HS", shape_str(k.shape()),
                shape_str(q.shape()));
  const int64_t n_rep = NH / NKV;
  return attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal);  // (B, NH, T, HS)
}

Tensor window_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor& mask,
                        double scale) {
  BRIGADE_CHECK(
      q.defined() && q.dim() == 4 && k.defined() && k.shape() == q.shape() && v.defined() && v.shape() == q.shape(),
      ShapeError, "window_attention: q, k, v must be (B*nW, NH, N, HS) alike, got {}, {}, {}", shape_of(q), shape_of(k),
      shape_of(v));
  const int64_t BW = q.size(0), NH = q.size(1), N = q.size(2);
  BRIGADE_CHECK(bias.defined() && bias.shape() == Shape({NH, N, N}), ShapeError,
                "window_attention: bias must be (NH, N, N) = ({}, {}, {}), got {}", NH, N, N, shape_of(bias));
  Tensor s = add(mul_scalar(matmul(q, k, false, true), scale), bias);  // (B*nW, NH, N, N)
  if (mask.defined()) {
    BRIGADE_CHECK(mask.dim() == 3 && mask.size(1) == N && mask.size(2) == N && BW % mask.size(0) == 0, ShapeError,
                  "window_attention: mask must be (nW, N, N) with nW dividing {} windows, got {}", BW, shape_of(mask));
    const int64_t nW = mask.size(0);
    s = add(reshape(s, {BW / nW, nW, NH, N, N}), reshape(mask, {1, nW, 1, N, N}));  // (B, nW, NH, N, N)
    s = reshape(s, {BW, NH, N, N});                                                 // (B*nW, NH, N, N)
  }
  return matmul(softmax(s), v);  // (B*nW, NH, N, HS)
}

}  // namespace brigade::fn
