// Derivative rules of attention: the one fn::attention (no mask, causal, key padding on the tiled
// kernel; additive bias as a composition), grouped-query heads through repeat_kv, and GPT's fused qkv.
#include <cmath>

#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

// out = softmax(scale q k^T + mask) v on the tiled kernel; the backward recomputes P from lse.
struct AttentionBackward : Node {
  Tensor q, k, v, out, lse, key_mask;  // key_mask: defined for a key padding mask
  bool causal = false;
  double scale = 1.0;
  const char* name() const override { return key_mask.defined() ? "KeyMaskAttentionBackward" : "AttentionBackward"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::AttentionGrads r = ops::attention_backward(g, q, k, v, out, lse, causal, scale, key_mask);
    return {r.gq, r.gk, r.gv};
  }
  void save(const Tensor& q_, const Tensor& k_, const Tensor& v_, const ops::AttentionOut& r, double s) {
    q = q_, k = k_, v = v_, lse = r.lse, scale = s;
    out = r.out.detach();  // detached: r.out may be the recorded output (no cycle)
  }
  void release() override { q = k = v = out = lse = key_mask = Tensor(); }
};

struct SelfAttentionBackward : AttentionBackward {  // q, k, v, out (B, NH, T, HS) and lse (B, NH, T)
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

struct RepeatKvBackward : Node {
  int64_t n_rep = 1;
  const char* name() const override { return "RepeatKvBackward"; }
  // forward: y[:, j] = x[:, j / n_rep]  ->  gx[:, kv] = sum_r g[:, kv * n_rep + r]
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::repeat_kv_backward(g, n_rep)}; }
};

// Records r.out as the output of n over q, k, v, saving what its backward reads when one needs a gradient.
Tensor record_attention(std::shared_ptr<AttentionBackward> n, const Tensor& q, const Tensor& k, const Tensor& v,
                        const ops::AttentionOut& r, double scale) {
  if (needs_grad({q, k, v})) n->save(q, k, v, r, scale);
  return record(r.out, std::move(n), {q, k, v});
}

// softmax(scale q k^T + bias [+ window_mask]) v as matmul, add and softmax nodes (each with its policy).
Tensor additive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                          const Tensor& window_mask, double scale) {
  const int64_t BW = q.size(0), NH = q.size(1), T = q.size(2);
  BRIGADE_CHECK(bias.defined() && bias.shape() == Shape({NH, T, T}), ShapeError,
                "attention: an additive mask's bias must be (NH, T, T) = ({}, {}, {}), got {}", NH, T, T,
                shape_of(bias));
  Tensor s = add(mul_scalar(matmul(q, k, false, true), scale), bias);  // (BW, NH, T, T)
  if (window_mask.defined()) {
    BRIGADE_CHECK(window_mask.dim() == 3 && window_mask.size(1) == T && window_mask.size(2) == T &&
                      window_mask.size(0) > 0 && BW % window_mask.size(0) == 0,
                  ShapeError, "attention: window_mask must be (nW, T, T) with nW dividing the {} rows of q, got {}", BW,
                  shape_of(window_mask));
    const int64_t nW = window_mask.size(0);
    s = add(reshape(s, {BW / nW, nW, NH, T, T}), reshape(window_mask, {1, nW, 1, T, T}));  // (B, nW, NH, T, T)
    s = reshape(s, {BW, NH, T, T});
  }
  return matmul(softmax(s), v);  // (BW, NH, T, HS)
}

}  // namespace

AttentionMask AttentionMask::key_padding(Tensor key_mask) {
  AttentionMask m;
  if (key_mask.defined()) m.kind = Kind::KeyPadding;
  m.key_mask = std::move(key_mask);
  return m;
}

AttentionMask AttentionMask::additive(Tensor bias, Tensor window_mask) {
  AttentionMask m;
  m.kind = Kind::Additive;
  m.bias = std::move(bias);
  m.window_mask = std::move(window_mask);
  return m;
}

Tensor attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, const AttentionMask& mask, double scale) {
  BRIGADE_CHECK(q0.defined() && k0.defined() && v0.defined() && q0.dim() == 4 && k0.dim() == 4, ShapeError,
                "attention: q must be (B, NH, T, HS) and k, v (B, NKV, T, HS), got q {}, k {}", shape_of(q0),
                shape_of(k0));
  BRIGADE_CHECK(v0.shape() == k0.shape(), ShapeError, "attention: v {} must have k's shape {}", shape_of(v0),
                shape_of(k0));
  const int64_t NH = q0.size(1), NKV = k0.size(1);
  BRIGADE_CHECK(NKV > 0 && NH % NKV == 0, ShapeError,
                "attention: the {} kv heads of k {} must divide the {} query heads of q {}", NKV, shape_of(k0), NH,
                shape_of(q0));
  BRIGADE_CHECK(k0.size(0) == q0.size(0) && k0.size(2) == q0.size(2) && k0.size(3) == q0.size(3), ShapeError,
                "attention: k {} must match q {} in B, T and HS", shape_of(k0), shape_of(q0));
  if (scale == 0) scale = 1.0 / std::sqrt(double(q0.size(3)));
  // Grouped-query attention (Ainslie et al. 2023): query head j attends with kv head j / (NH / NKV).
  const Tensor k1 = repeat_kv(k0, NH / NKV), v1 = repeat_kv(v0, NH / NKV);
  if (mask.kind == AttentionMask::Kind::Additive)
    return additive_attention(q0, k1, v1, mask.bias, mask.window_mask, scale);
  const DType dt = policy_dtype(amp::Op::Attention, {&q0, &k1, &v1});
  const Tensor q = cast(q0, dt), k = cast(k1, dt), v = cast(v1, dt);
  auto n = std::make_shared<AttentionBackward>();
  n->causal = mask.kind == AttentionMask::Kind::Causal;
  if (mask.kind == AttentionMask::Kind::KeyPadding) {
    BRIGADE_CHECK(mask.key_mask.defined(), ValueError, "attention: a key padding mask needs its key_mask (B, T)");
    n->key_mask = mask.key_mask;
  }
  return record_attention(n, q, k, v, ops::attention(q, k, v, n->causal, scale, n->key_mask), scale);
}

Tensor causal_self_attention(const Tensor& qkv0, int64_t n_head) {
  const Tensor qkv = cast(qkv0, policy_dtype(amp::Op::Attention, {&qkv0}));
  BRIGADE_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * n_head) == 0, ShapeError,
                "causal_self_attention: qkv must be (B, T, 3C) with C divisible by n_head={}, got {}", n_head,
                qkv.str());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, HS = C / n_head;
  Tensor x = qkv.view({B, T, 3, n_head, HS}).permute({2, 0, 3, 1, 4});  // (3, B, NH, T, HS) view
  const Tensor q = x.select(0, 0).contiguous(), k = x.select(0, 1).contiguous(), v = x.select(0, 2).contiguous();
  const double scale = 1.0 / std::sqrt(double(HS));
  ops::AttentionOut r = ops::attention(q, k, v, true, scale);           // (B, NH, T, HS)
  Tensor y = r.out.permute({0, 2, 1, 3}).contiguous().view({B, T, C});  // (B, T, C)
  auto n = std::make_shared<SelfAttentionBackward>();
  if (needs_grad({qkv})) n->save(q, k, v, r, scale);
  return record(y, n, {qkv});
}

Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  auto n = std::make_shared<RepeatKvBackward>();
  n->n_rep = n_rep;
  return record(ops::repeat_kv(x, n_rep), n, {x});
}

}  // namespace brigade::fn
