// nn::Embedding: out = weight[ids] (torch.nn.Embedding), with the tied language-model head on
// the same weight and the EmbeddingShard hook of a vocabulary-parallel plan (see nn/linear.h).
#pragma once
#include <memory>

#include "brigade/autograd/functions.h"
#include "brigade/nn/module.h"

namespace brigade::nn {

class Embedding;

// A plan's lookup and tied-head functions for an Embedding whose weight it replaced by a
// shard of the rows (vocabulary-parallel embedding): this rank holds rows
// [vocab_start, vocab_start + weight.size(0)) of a table whose real row count is vocab_size
// (rows at or past it are padding).
class EmbeddingShard {
 public:
  virtual ~EmbeddingShard() = default;
  virtual Tensor lookup(const Embedding& layer, const Tensor& ids) const = 0;
  // Full logits x @ W^T; a plan that never gathers them throws a ValueError saying so.
  virtual Tensor attend(const Embedding& layer, const Tensor& x) const = 0;
  virtual Tensor lm_loss(const Embedding& layer, const Tensor& x, const Tensor& targets) const = 0;
  int64_t vocab_start = 0, vocab_size = 0;
};

// out = weight[ids] (torch.nn.Embedding), weight (V, C). attend / lm_loss are the tied LM
// head on the same weight (GPT-2): the model calls them instead of reading the weight, so a
// vocabulary-sharding plan can replace them.
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim);
  Tensor forward(const Tensor& ids) const;  // ids (...) -> (..., C)
  // x (N, C) -> logits (N, V) = x @ weight^T.
  Tensor attend(const Tensor& x) const;
  // Mean cross-entropy (0-d) of attend(x) against targets (N), ignore_index -100.
  Tensor lm_loss(const Tensor& x, const Tensor& targets) const;
  Tensor weight;
  std::shared_ptr<const EmbeddingShard> shard;  // set by a plan; null: the plain layer

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace brigade::nn
