// Differentiable functions for CLIP (models/clip; issue 8), beside autograd/functions.h and with
// its conventions. quick_gelu and l2_normalize are compositions of existing fn:: functions
// (exact up to rounding); exp is one small Node on ops::exp.
#pragma once
#include "brigade/autograd/functions.h"

namespace brigade::fn {

// Elementwise exp(x) in x's dtype (no autocast cast: CLIP applies it to the f32 logit_scale).
// Backward: g * exp(x) (the output, saved detached).
Tensor exp(const Tensor& x);

// OpenAI CLIP's / HF's quick_gelu: x * sigmoid(1.702 x), composed as silu(1.702 x) / 1.702
// (fn::silu of autograd/ext_llama.h; mathematically identical, a few ulp apart).
Tensor quick_gelu(const Tensor& x);

// x / ||x||_2 along the last dim (torch: x / x.norm(p=2, dim=-1, keepdim=True)), composed as
// rms_norm(x, ones, eps 0) / sqrt(C) (rms_norm's rstd is 1 / sqrt(sum x^2 / C)). A zero row
// gives inf/nan, as torch does.
Tensor l2_normalize(const Tensor& x);

}  // namespace brigade::fn
