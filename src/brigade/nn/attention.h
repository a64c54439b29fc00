// The bidirectional encoders' attention (models/vit, models/bert, the CLIP and ALIGN towers):
// EncoderSelfAttention is Hugging Face's ViTSelfAttention / BertSelfAttention: separate query,
// key, value torch.nn.Linear layers (weights (D, D)), heads split, non-causal attention with an
// optional key padding mask, heads merged. The output projection is the model's (its name
// differs: ViT attention.output.dense, BERT attention.output.dense + LayerNorm), so this layer
// stops at the context. GPT's CausalSelfAttention is in nn/layers.h. Parameters are zero at
// construction (the model owns initialisation).
#pragma once
#include <memory>
#include <string>

#include "brigade/autograd/functions.h"
#include "brigade/nn/layers.h"

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

}  // namespace brigade::nn
