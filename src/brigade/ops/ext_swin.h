// Raw ops for the Swin Transformer (Liu et al. 2021; issue 8), beside ops/ops.h:
//   roll2d                  torch.roll(x, shifts=(sh, sw), dims=(1, 2)) on x (B, H, W, C):
//                           out[b, (h + sh) mod H, (w + sw) mod W, c] = x[b, h, w, c]; Swin's
//                           cyclic shift is roll2d(x, -s, -s), its inverse roll2d(x, s, s). The
//                           backward of roll2d(sh, sw) is roll2d(-sh, -sw) (a permutation);
//   swin_shift_mask         the shifted-window attention mask, built exactly as Hugging Face's
//                           SwinLayer.get_attn_mask: regions [0, H-ws), [H-ws, H-s), [H-s, H) by
//                           rows and the same by columns, numbered row-major; token pairs of a
//                           window in different regions get -100.0, the others 0;
//   relative_position_index the standard Swin index into the ((2ws-1)^2, heads) bias table:
//                           index[i, j] = (hi - hj + ws - 1) (2 ws - 1) + (wi - wj + ws - 1), for
//                           tokens i = hi ws + wi, j = hj ws + wj of a ws x ws window.
// Window partition / reverse, patch merging's gather and the window attention are compositions
// of exact differentiable functions (autograd/ext_swin.h), so they need no kernels here.
// The dtype contract is ops.h's: roll2d takes f32 / bf16 / f16 (a pure permutation, so it
// runs in the input's dtype: 16-bit values are moved, never rounded). The scalar oracle is the
// template in ops::ref below (also instantiated in double by tests/ops/test_ext_swin_ops.cpp);
// the OpenMP cpu kernel (row copies, static schedule) and the front-ends are in ext_swin.cpp.
#pragma once
#include <cstdint>
#include <cstring>

#include "brigade/ops/ops.h"

namespace brigade::ops {

// x (B, H, W, C) any floating dtype -> same shape and dtype; shifts taken modulo H and W.
Tensor roll2d(const Tensor& x, int64_t shift_h, int64_t shift_w);

// (nW, ws*ws, ws*ws) f32 of 0 / -100.0 for an H x W grid (multiples of ws), nW = (H/ws)(W/ws)
// windows in row-major order; 0 < shift < ws (ValueError otherwise).
Tensor swin_shift_mask(int64_t H, int64_t W, int64_t ws, int64_t shift);

// (ws*ws * ws*ws) i64, flattened row-major over (i, j).
Tensor relative_position_index(int64_t ws);

namespace ref {

inline int64_t wrap(int64_t i, int64_t n) { return ((i % n) + n) % n; }

// out[b, (h + sh) mod H, (w + sw) mod W, c] = x[b, h, w, c]; contiguous (B, H, W, C).
template <class S>
void roll2d(int64_t B, int64_t H, int64_t W, int64_t C, int64_t sh, int64_t sw, const S* x, S* out) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w)
        for (int64_t c = 0; c < C; ++c)
          out[((b * H + wrap(h + sh, H)) * W + wrap(w + sw, W)) * C + c] = x[((b * H + h) * W + w) * C + c];
}

}  // namespace ref
}  // namespace brigade::ops
