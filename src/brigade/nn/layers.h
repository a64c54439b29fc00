// Building blocks: Linear, Embedding, LayerNorm, Dropout, causal self-attention,
// MLP and the pre-LayerNorm transformer block (GPT-2 style). Parameter names
// follow Hugging Face GPT-2 (c_attn, c_proj, c_fc, ln_1, ln_2). Layers allocate
// zeroed parameters; the model owns initialisation (so it can match torch's RNG order).
//
// Sharding hooks. A plan applied from outside (parallel/tensor_parallel.h, from a model's
// nn::TpPlan) can make Linear and Embedding compute on a shard of their weight by installing a
// LinearShard / EmbeddingShard object, and divide an attention's heads (nn::HeadParallel);
// nn knows nothing of process groups (the plan's objects hold them). Without one, every layer
// runs exactly its single-device code path.
#pragma once
#include "brigade/autograd/functions.h"
#include "brigade/nn/module.h"
#include "brigade/nn/tp_plan.h"

namespace brigade::nn {

using ops::WeightLayout;

class Linear;
struct LoraAdapter;
class Embedding;

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

// torch.nn.LayerNorm over the last dim; weight = 1, bias = 0 at construction.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

// Inverted dropout drawing from `gen` (owned by the model) in training mode only.
class Dropout : public Module {
 public:
  Dropout(double p, Generator* gen) : p(p), gen_(gen) {}
  Tensor forward(const Tensor& x) const;
  double p;

 private:
  Generator* gen_;
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

// GPT-2 MLP: c_fc (C -> 4C), GELU (tanh), c_proj (4C -> C), dropout.
class MLP : public Module {
 public:
  MLP(int64_t C, double dropout, Generator* gen);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> drop;
};

// Activation recompute of one block (chosen by a plan from outside, see
// models::plan_recompute and docs/memory.md):
//   None       the backward reads what the forward saved;
//   Full       the block keeps only its input; the backward re-runs the whole block;
//   Selective  the block keeps its input and the outputs of its GEMMs (linear, matmul, conv2d);
//              the backward re-runs the cheap parts: norms, the attention core,
//              activations, dropout, adds.
enum class Recompute : uint8_t { None, Full, Selective };

// The repeated unit of a model (a transformer layer, a residual block) that plans reach
// from outside without the model knowing: ZeRO-3 gathers a block's parameters around its
// forward (pre_forward_hook / post_forward_hook) and activation recompute re-runs it in the
// backward. A block's forward calls run(): the hooks, then the body directly or through
// fn::checkpoint, the hooks outside the recomputed region. Blocks are found in a model by
// find_blocks, so a model needs no code of its own for either plan.
class Block : public Module {
 public:
  Recompute recompute = Recompute::None;

 protected:
  // body(inputs) under the block's hooks and recompute mode. `rng`: the generator the body's
  // dropout draws from (replayed by a recompute); nullptr when it draws nothing. Tensors the
  // body reads that need a gradient and are not parameters must be passed in `inputs`.
  Tensor run(const std::vector<Tensor>& inputs, const std::function<Tensor(const std::vector<Tensor>&)>& body,
             Generator* rng = nullptr) const;
};

// The outermost blocks below `root` (a block inside a block is not listed), by full name in
// forward (registration) order.
std::vector<std::pair<std::string, Block*>> find_blocks(const Module& root);

// Pre-LN transformer block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
class TransformerBlock : public Block {
 public:
  TransformerBlock(int64_t C, int64_t n_head, double dropout, double eps, Generator* gen);
  Tensor forward(const Tensor& x) const;  // through Block::run
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;

 private:
  Tensor body(const Tensor& x) const;
  Generator* gen_;  // the dropout generator (its state is replayed by a recompute)
};

}  // namespace brigade::nn
