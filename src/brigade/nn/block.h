// nn::Block, the repeated unit of a model that plans reach from outside (ZeRO-3 hooks,
// activation recompute), find_blocks, and GPT-2's pre-LayerNorm transformer block with its MLP
// (Hugging Face GPT-2 names: ln_1, attn, ln_2, mlp.c_fc, mlp.c_proj).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "brigade/nn/attention.h"
#include "brigade/nn/dropout.h"
#include "brigade/nn/linear.h"
#include "brigade/nn/norm.h"

namespace brigade::nn {

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
