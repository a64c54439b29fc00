// Differentiable functions for LLaMA-style models: RMSNorm, rotary position embedding,
// SiLU, and grouped-query attention (GQA). Like functions.h: each runs a raw op (here from
// ops/ext_llama.h) and, when an input needs a gradient, records a Node whose backward is
// the derivative rule written with ops:: calls (so it runs on every backend). Model code
// calls these, never the raw ops.
//
// Precision (autocast) as in functions.cpp: each function asks the active policy
// (amp::compute_dtype) for its dtype and casts its floating inputs with recorded casts
// (fn::cast), so gradients come back in each input's own dtype. Op kinds in the policy table:
//   rms_norm -> LayerNorm (a norm: f32 under O1 and O2), silu -> Gelu (the activation kind),
//   rope -> Elementwise, grouped_query_attention -> Attention (through fn::attention).
//   repeat_kv casts nothing (a copy, the input's dtype).
#pragma once
#include "brigade/autograd/functions.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

// x (..., C), w (C) -> x / sqrt(mean(x^2) + eps) * w (HF LlamaRMSNorm).
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
// x (B, NH, T, HS) with the rotary embedding of positions pos0 .. pos0 + T - 1 (HF LLaMA
// convention and the frequency scalings, see ops/ext_llama.h); the backward is the inverse
// rotation. The theta overload is the unscaled RoPE, rope(x, ops::RopeSpec{theta}).
Tensor rope(const Tensor& x, const ops::RopeSpec& spec, int64_t pos0 = 0);
Tensor rope(const Tensor& x, double theta, int64_t pos0 = 0);
// x * sigmoid(x).
Tensor silu(const Tensor& x);
// x (B, NKV, T, HS) -> (B, NKV * n_rep, T, HS) (HF repeat_kv); the backward sums the
// gradients of each group of n_rep heads.
Tensor repeat_kv(const Tensor& x, int64_t n_rep);
// Grouped-query attention (Ainslie et al. 2023): q (B, NH, T, HS), k and v (B, NKV, T, HS)
// with NKV dividing NH; query head j attends with kv head j / (NH / NKV). Scale 1/sqrt(HS).
// = fn::attention(q, repeat_kv(k), repeat_kv(v), causal): (B, NH, T, HS). NKV == NH is
// plain multi-head attention (no copy).
Tensor grouped_query_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);

}  // namespace brigade::fn
