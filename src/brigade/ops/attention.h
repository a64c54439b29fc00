// Scaled dot-product attention: causal or full, with a key padding mask, the head expansion
// of grouped-query attention, and Swin's shifted-window mask.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// ---------------- scaled dot-product attention (Vaswani et al. 2017): causal, full, or with a
// key padding mask. q, k, v: (B, NH, T, HS). out: (B, NH, T, HS) = softmax(scale q k^T + mask) v;
// lse: (B, NH, T) f32, the log-sum-exp of the scaled scores of each query row over the keys that
// take part, saved for the backward (which recomputes probabilities). key_mask (defined, never
// with causal): (B, T) of 0 / 1 in any dtype (i32, i64, f32, bf16, f16), key j of batch row b
// taking part when key_mask[b, j] == 1; a value other than 0 or 1, or a row with no key at 1
// (its softmax would be 0/0), is a ValueError. The masked kernels widen 16-bit inputs to f32.
struct AttentionOut {
  Tensor out, lse;
};
AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                       const Tensor& key_mask = Tensor());
struct AttentionGrads {
  Tensor gq, gk, gv;
  // Fresh uninitialised gradients of q's shape s (all three alike) in dtype dt, for a kernel to fill.
  static AttentionGrads empty(const Shape& s, DType dt = DType::F32);
};
AttentionGrads attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, bool causal, double scale,
                                  const Tensor& key_mask = Tensor());
// Caching-allocator workspace (MemTag::Workspace) each OpenMP thread takes inside the f32
// attention / attention_backward kernels (T keys, head size HS), for memory planning.
int64_t attention_workspace_per_thread(int64_t T, int64_t HS);
// key_mask (B, T) as bytes (1 = attend), checked as above; for tests and the kernels.
std::vector<uint8_t> key_mask_bytes(const Tensor& key_mask, int64_t B, int64_t T, const char* op);

// ---------------- grouped-query attention's head expansion (HF repeat_kv):
// x (B, NKV, T, HS) -> (B, NKV * n_rep, T, HS), query head j reads kv head j / n_rep.
Tensor repeat_kv(const Tensor& x, int64_t n_rep);
// Its backward: gy (B, NKV * n_rep, T, HS) -> (B, NKV, T, HS), the sum over each group of
// n_rep heads (in head order).
Tensor repeat_kv_backward(const Tensor& gy, int64_t n_rep);

// (nW, ws*ws, ws*ws) f32 of 0 / -100.0 for an H x W grid (multiples of ws), nW = (H/ws)(W/ws)
// windows in row-major order; 0 < shift < ws (ValueError otherwise).
Tensor swin_shift_mask(int64_t H, int64_t W, int64_t ws, int64_t shift);

}  // namespace brigade::ops
