// Differentiable functions for the Swin Transformer (issue 8), beside autograd/functions.h and
// with its conventions. roll2d records one node (its backward is the opposite roll, a raw op in
// ops/ext_swin.h); the others are exact compositions of fn::reshape / transpose / embedding /
// matmul / add / softmax, so their backward is those functions' rules (no new derivative code).
// Shapes: B batch, H W grid, C channels, ws window, N = ws*ws tokens per window, nW windows per
// image, NH heads, HS head size.
#pragma once
#include "brigade/autograd/functions.h"

namespace brigade::fn {

// torch.roll(x, (sh, sw), dims=(1, 2)) on x (B, H, W, C); moves values, runs in x's dtype.
Tensor roll2d(const Tensor& x, int64_t shift_h, int64_t shift_w);

// x (B, H, W, C), H and W multiples of ws -> (B*nW, N, C), windows row-major per image
// (Hugging Face's window_partition followed by view(-1, ws*ws, C)).
Tensor window_partition(const Tensor& x, int64_t ws);
// The inverse: windows (B*nW, N, C) (or (B*nW, ws, ws, C)) -> (B, H, W, C).
Tensor window_reverse(const Tensor& windows, int64_t ws, int64_t H, int64_t W);

// Patch merging's gather: x (B, H, W, C), H and W even -> (B, (H/2)(W/2), 4C), the channels
// [x0 | x1 | x2 | x3] with x0 = x[:, 0::2, 0::2], x1 = x[:, 1::2, 0::2], x2 = x[:, 0::2, 1::2],
// x3 = x[:, 1::2, 1::2] (HF's SwinPatchMerging order).
Tensor patch_merge(const Tensor& x);

// The relative position bias (NH, N, N): table ((2ws-1)^2, NH) gathered by index (N*N) i64
// (ops::relative_position_index(ws)), i.e. table[index].view(N, N, NH).permute(2, 0, 1).
// The table's gradient is the scatter-add of the embedding backward.
Tensor relative_position_bias(const Tensor& table, const Tensor& index);

// Window attention: softmax(q k^T * scale + bias [+ mask]) v on q, k, v (B*nW, NH, N, HS),
// bias (NH, N, N) broadcast over windows, mask (nW, N, N) (never differentiated; undefined for
// no shift) added per window, broadcast over the batch and the heads (windows are batch-major:
// row r is window r % nW of image r / nW). Returns (B*nW, NH, N, HS).
Tensor window_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor& mask,
                        double scale);

}  // namespace brigade::fn
