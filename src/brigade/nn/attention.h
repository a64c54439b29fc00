// Attention layers. GPT-2's CausalSelfAttention (a fused qkv projection, "attn"), and the
// bidirectional encoders' (models/vit, models/bert, the CLIP and ALIGN towers): EncoderSelfAttention is Hugging Face's
// ViTSelfAttention / BertSelfAttention: separate query, key, value torch.nn.Linear layers (weights (D, D)), heads
// split, non-causal attention with an optional key padding mask, heads merged. The output projection is the model's
// (its name differs: ViT attention.output.dense, BERT attention.output.dense + LayerNorm), so this layer stops at the
// context. Parameters are zero at construction (the model owns initialisation).
#pragma once
#include <memory>
#include <string>

#include "brigade/autograd/functions.h"
#include "brigade/nn/dropout.h"
#include "brigade/nn/linear.h"
#include "brigade/nn/tp_plan.h"

namespace brigade::nn {

// Under tensor parallelism (nn::HeadParallel) the layer computes n_head / tp heads: its query,
// key and value projections are column-split, so the context is (B, T, D / tp).
class EncoderSelfAttention : public Module, public HeadParallel {
 public:
  EncoderSelfAttention(int64_t D, int64_t n_head);
  // x (B, T, D), key_mask (B, T) of 0 / 1 or undefined (every key attends) -> (B, T, n_head * HS).
  Tensor forward(const Tensor& x, const Tensor& key_mask = Tensor()) const;
  void check_heads(int64_t parts) const override;  // parts must divide n_head
  void divide_heads(int64_t parts) override;
  std::shared_ptr<Linear> query, key, value;
  int64_t n_head;  // the heads this layer computes
};

// Causal multi-head self-attention with a fused qkv projection (GPT-2 "attn").
class CausalSelfAttention : public Module, public HeadParallel {
 public:
  CausalSelfAttention(int64_t C, int64_t n_head, double dropout, Generator* gen);
  Tensor forward(const Tensor& x) const;           // (B, T, C) -> (B, T, C)
  void check_heads(int64_t parts) const override;  // parts must divide n_head
  void divide_heads(int64_t parts) override;
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_drop;
  // Heads this layer computes: all of them, or this rank's n_head / tp under tensor
  // parallelism (c_attn then yields [q | k | v] of those heads only).
  int64_t n_head;
};

}  // namespace brigade::nn
