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

}  // namespace brigade::nn
