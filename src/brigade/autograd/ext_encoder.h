// Differentiable functions for bidirectional encoders (ViT, BERT; issue 8), beside
// autograd/functions.h and with its conventions: each runs a raw op (ops/ext_encoder.h or
// ops.h) and records one Node whose backward is the derivative rule, written with ops:: calls
// so it runs on every backend. Precision follows the active policy like the core functions:
// gelu_erf is an amp::Op::Gelu, attention_key_mask an amp::Op::Attention; patchify and
// prepend_token only move values, so they run in their inputs' dtype (no cast).
#pragma once
#include "brigade/autograd/functions.h"

namespace brigade::fn {

// Exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (torch's default gelu; fn::gelu is the tanh form).
Tensor gelu_erf(const Tensor& x);

// Bidirectional multi-head attention on q, k, v (B, NH, T, HS) where key j of batch row b takes
// part only when key_mask[b, j] == 1 (BERT's attention_mask, (B, T) of 0 / 1 in any dtype;
// never differentiated). Scale 1/sqrt(HS). An undefined key_mask is plain non-causal attention.
Tensor attention_key_mask(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask);

// Image patches: x (N, C, H, W) -> (N, (H/p) * (W/p), C*p*p), see ops::patchify.
Tensor patchify(const Tensor& x, int64_t p);

// [token; x]: token (C) (or any shape of C elements, e.g. ViT's cls_token (1, 1, C)) placed in
// front of every row of x (N, T, C) -> (N, 1 + T, C). Backward: token gets the sum over N of the
// gradient at position 0, x the rest. The token is cast (recorded) to x's dtype.
Tensor prepend_token(const Tensor& token, const Tensor& x);

}  // namespace brigade::fn
