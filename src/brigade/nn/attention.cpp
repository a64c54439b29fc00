// EncoderSelfAttention (nn/attention.h): differentiable fn:: calls only.
#include "brigade/nn/attention.h"

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"

namespace brigade::nn {

EncoderSelfAttention::EncoderSelfAttention(int64_t D, int64_t n_head) : n_head(n_head) {
  BRIGADE_CHECK(n_head > 0 && D % n_head == 0, ConfigError,
                "EncoderSelfAttention: the width {} must be divisible by the number of heads {}", D, n_head);
  query = register_module("query", std::make_shared<Linear>(D, D));
  key = register_module("key", std::make_shared<Linear>(D, D));
  value = register_module("value", std::make_shared<Linear>(D, D));
}

Tensor EncoderSelfAttention::forward(const Tensor& x, const Tensor& key_mask) const {
  BRIGADE_CHECK(x.dim() == 3, ShapeError, "EncoderSelfAttention: x must be (B, T, D), got {}", shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1);
  const Tensor qp = query->forward(x);  // (B, T, NH * HS): D, or D / tp under tensor parallelism
  const int64_t W = qp.size(2), HS = W / n_head;
  auto heads = [&](const Tensor& y) {  // (B, T, NH * HS) -> (B, NH, T, HS) view
    return fn::transpose(fn::reshape(y, {B, T, n_head, HS}), 1, 2);
  };
  const Tensor q = heads(qp);                                                         // (B, NH, T, HS)
  const Tensor k = heads(key->forward(x));                                            // (B, NH, T, HS)
  const Tensor v = heads(value->forward(x));                                          // (B, NH, T, HS)
  const Tensor o = fn::attention(q, k, v, fn::AttentionMask::key_padding(key_mask));  // (B, NH, T, HS)
  return fn::reshape(fn::transpose(o, 1, 2), {B, T, W});                              // (B, T, NH * HS)
}

void EncoderSelfAttention::check_heads(int64_t parts) const { check_head_count(n_head, parts); }
void EncoderSelfAttention::divide_heads(int64_t parts) { divide_head_count(n_head, parts); }

namespace F = brigade::fn;

CausalSelfAttention::CausalSelfAttention(int64_t C, int64_t n_head, double dropout, Generator* gen) : n_head(n_head) {
  BRIGADE_CHECK(C % n_head == 0, ConfigError, "n_embd={} is not divisible by n_head={}", C, n_head);
  c_attn = register_module("c_attn", std::make_shared<Linear>(C, 3 * C, true, WeightLayout::InOut));
  c_proj = register_module("c_proj", std::make_shared<Linear>(C, C, true, WeightLayout::InOut));
  resid_drop = register_module("resid_dropout", std::make_shared<Dropout>(dropout, gen));  // no parameters
}

void CausalSelfAttention::check_heads(int64_t parts) const { check_head_count(n_head, parts); }
void CausalSelfAttention::divide_heads(int64_t parts) { divide_head_count(n_head, parts); }

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  Tensor qkv = c_attn->forward(x);                   // (B, T, 3C)
  Tensor y = F::causal_self_attention(qkv, n_head);  // (B, T, C)
  return resid_drop->forward(c_proj->forward(y));    // (B, T, C)
}

}  // namespace brigade::nn
