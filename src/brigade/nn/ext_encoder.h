// Layers shared by the bidirectional encoders (models/vit, models/bert):
//   EncoderSelfAttention  Hugging Face's ViTSelfAttention / BertSelfAttention: separate
//                         query, key, value torch.nn.Linear layers (weights (D, D)), heads
//                         split, non-causal attention with an optional key padding mask,
//                         heads merged. The output projection is the model's (its name
//                         differs: ViT attention.output.dense, BERT attention.output.dense +
//                         LayerNorm), so this layer stops at the context.
//   PatchEmbedding        torch.nn.Conv2d(C, D, kernel p, stride p) on (N, C, H, W), as HF's
//                         ViTPatchEmbeddings.projection: weight (D, C, p, p), bias (D); computed
//                         as patchify + a linear layer on the weight viewed (D, C*p*p), then
//                         flattened to (N, P, D) with patches in row-major order (HF's
//                         flatten(2).transpose(1, 2)).
//   Submodules            a parameterless node of the name tree that only holds named children
//                         (HF's "encoder" holding "layer", "attention" holding "attention"
//                         and "output"), so models can reproduce HF's nesting.
// Parameters are zero at construction (the model owns initialisation), as in nn/layers.h.
#pragma once
#include "brigade/autograd/functions.h"
#include "brigade/nn/layers.h"

namespace brigade::nn {

class Submodules : public Module {
 public:
  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

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

class PatchEmbedding : public Module {
 public:
  PatchEmbedding(int64_t in_channels, int64_t D, int64_t patch);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> (N, (H/p) * (W/p), D)
  Tensor weight, bias;                          // (D, C, p, p), (D)
  int64_t in_channels, dim, patch;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace brigade::nn
