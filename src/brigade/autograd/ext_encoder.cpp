// Derivative rules of the encoder functions (autograd/ext_encoder.h). Same conventions as
// functions.cpp: one Node per function, backward returns fresh gradients in input order
// (undefined where not wanted), saved tensors released after use, outputs saved detached.
#include "brigade/autograd/ext_encoder.h"

#include <memory>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/rules.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

using autograd::Node;
using autograd::record;
using rules::wants;

namespace {

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

struct PatchifyBackward : Node {
  Shape x_shape;
  int64_t p = 1;
  const char* name() const override { return "PatchifyBackward"; }
  // forward: out = patchify(x, p), a permutation of x
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::patchify_backward(g, x_shape, p)}; }
};

struct PrependTokenBackward : Node {
  Shape token_shape;
  int64_t T = 0;
  const char* name() const override { return "PrependTokenBackward"; }
  // forward: out[n, 0] = token, out[n, 1:] = x[n]
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor gt, gx;
    if (wants(*this, 0)) gt = ops::sum(g.narrow(1, 0, 1), {0, 1}).reshape(token_shape);  // token's shape
    if (wants(*this, 1)) gx = g.narrow(1, 1, T).contiguous();                           // (N, T, C)
    return {gt, gx};
  }
};

}  // namespace

// forward: y = 0.5 x (1 + erf(x / sqrt 2)); the node keeps x
Tensor gelu_erf(const Tensor& x0) {
  const Tensor x = cast(x0, rules::policy_dtype(amp::Op::Gelu, {&x0}));
  return rules::record_saving<ops::gelu_erf_backward>("GeluErfBackward", ops::gelu_erf(x), x, x);
}

Tensor attention_key_mask(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& key_mask) {
  if (!key_mask.defined()) return attention(q0, k0, v0, false);
  const rules::AttentionArgs a = rules::attention_args(q0, k0, v0);
  auto n = std::make_shared<KeyMaskAttentionBackward>();
  n->key_mask = key_mask;
  return rules::record_attention(n, a, ops::attention_key_mask(a.q, a.k, a.v, key_mask, a.scale));
}

Tensor patchify(const Tensor& x, int64_t p) {
  auto n = std::make_shared<PatchifyBackward>();
  n->x_shape = x.shape();
  n->p = p;
  return record(ops::patchify(x, p), n, {x});
}

Tensor prepend_token(const Tensor& token, const Tensor& x) {
  BRIGADE_CHECK(x.defined() && x.dim() == 3, ShapeError, "prepend_token: x must be (N, T, C), got {}",
                x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const int64_t N = x.size(0), T = x.size(1), C = x.size(2);
  BRIGADE_CHECK(token.defined() && token.numel() == C, ShapeError,
                "prepend_token: token must hold C = {} values (x is {}), got {}", C, shape_str(x.shape()),
                token.defined() ? shape_str(token.shape()) : std::string("an undefined tensor"));
  const Tensor tok = cast(token, x.dtype());  // recorded: an f32 parameter gets an f32 gradient
  Tensor y = Tensor::empty({N, 1 + T, C}, x.dtype());  // (N, 1 + T, C)
  y.narrow(1, 0, 1).copy_(tok.reshape({1, 1, C}).expand({N, 1, C}));
  y.narrow(1, 1, T).copy_(x);
  auto n = std::make_shared<PrependTokenBackward>();
  n->token_shape = tok.shape();
  n->T = T;
  return record(y, n, {tok, x});
}

}  // namespace brigade::fn
