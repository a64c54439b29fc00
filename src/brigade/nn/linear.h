// nn::Linear: y = x W^T + b (torch.nn.Linear) or y = x W + b (Hugging Face's Conv1D). Layers
// allocate zeroed parameters; the model owns initialisation (so it can match torch's RNG order).
// Sharding hooks: a plan applied from outside (parallel/tensor_parallel.h, from a model's
// nn::TpPlan) can make a Linear or an Embedding compute on a shard of its weight by installing a
// LinearShard / EmbeddingShard; nn knows nothing of process groups (the plan's objects hold them).
// Without one, every layer runs exactly its single-device code path.
#pragma once
#include <memory>

#include "brigade/autograd/functions.h"
#include "brigade/nn/module.h"

namespace brigade::nn {

using ops::WeightLayout;

class Linear;
struct LoraAdapter;  // nn/lora.h

// A plan's forward for a Linear whose weight (and bias) it replaced by a shard, e.g.
// Megatron's column-parallel y_local = x W[:, cols] + b[cols] (the input's gradient summed
// over the group) or row-parallel y = allreduce(x_local W[rows, :]) + b.
class LinearShard {
 public:
  virtual ~LinearShard() = default;
  virtual Tensor forward(const Linear& layer, const Tensor& x) const = 0;
  // Linear::lm_loss on the shard: by default the cross-entropy of forward(); a plan that splits
  // the vocabulary (an LM head) computes it without gathering the logits.
  virtual Tensor lm_loss(const Linear& layer, const Tensor& x, const Tensor& targets) const;
};

// y = x W^T + b (torch.nn.Linear, weight (out, in)) or y = x W + b (HF Conv1D, weight (in, out)).
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, WeightLayout layout = WeightLayout::OutIn);
  // shard ? shard->forward(*this, x) : fn::linear(x, weight, bias, layout)
  Tensor forward(const Tensor& x) const;
  // A language-model head's loss: the mean cross-entropy (0-d, ignore_index -100) of forward(x)
  // (x (N, in), targets (N)). Models call it instead of forward + cross_entropy, so a plan that
  // shards the vocabulary (parallel/tensor_parallel.h, TpStyle::VocabHead) computes it without
  // the full (N, V) logits.
  Tensor lm_loss(const Tensor& x, const Tensor& targets) const;
  Tensor weight, bias;
  WeightLayout layout;
  std::shared_ptr<const LinearShard> shard;  // set by a plan; null: the plain layer
  // A low-rank adapter (nn/lora.h, set by apply_lora): the forward adds s B A dropout(x)
  // unless it is merged into the weight.
  std::shared_ptr<LoraAdapter> lora;
  // Installs `a`, registering its A and B as this layer's "lora_A" and "lora_B".
  void attach_lora(std::shared_ptr<LoraAdapter> a);

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace brigade::nn
