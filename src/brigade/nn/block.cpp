// nn::Block, find_blocks and the GPT-2 transformer block (nn/block.h).
#include "brigade/nn/block.h"

namespace brigade::nn {

namespace F = brigade::fn;

MLP::MLP(int64_t C, double dropout, Generator* gen) {
  c_fc = register_module("c_fc", std::make_shared<Linear>(C, 4 * C, true, WeightLayout::InOut));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * C, C, true, WeightLayout::InOut));
  drop = register_module("dropout", std::make_shared<Dropout>(dropout, gen));
}

Tensor MLP::forward(const Tensor& x) const {
  Tensor h = F::gelu(c_fc->forward(x));      // (B, T, 4C)
  return drop->forward(c_proj->forward(h));  // (B, T, C)
}

TransformerBlock::TransformerBlock(int64_t C, int64_t n_head, double dropout, double eps, Generator* gen) : gen_(gen) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(C, eps));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(C, n_head, dropout, gen));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(C, eps));
  mlp = register_module("mlp", std::make_shared<MLP>(C, dropout, gen));
}

Tensor TransformerBlock::body(const Tensor& x) const {
  Tensor h = F::add(x, attn->forward(ln_1->forward(x)));  // (B, T, C)
  return F::add(h, mlp->forward(ln_2->forward(h)));       // (B, T, C)
}

Tensor Block::run(const std::vector<Tensor>& inputs, const std::function<Tensor(const std::vector<Tensor>&)>& body,
                  Generator* rng) const {
  if (pre_forward_hook) pre_forward_hook();
  Tensor out;
  if (recompute == Recompute::None) {
    out = body(inputs);
  } else {
    F::CheckpointOptions o;
    o.keep = recompute == Recompute::Selective ? F::CheckpointKeep::GemmOutputs : F::CheckpointKeep::Inputs;
    o.rng = rng;
    out = F::checkpoint(body, inputs, o);
  }
  return post_forward_hook ? post_forward_hook(out) : out;
}

std::vector<std::pair<std::string, Block*>> find_blocks(const Module& root) {
  std::vector<std::pair<std::string, Block*>> out;
  for (auto& [name, m] : root.named_modules()) {
    auto* b = dynamic_cast<Block*>(m);
    if (!b) continue;
    bool inside = false;  // below a block already listed
    for (auto& [outer, ob] : out)
      if (name.rfind(outer + ".", 0) == 0) inside = true;
    if (!inside) out.emplace_back(name, b);
  }
  return out;
}

Tensor TransformerBlock::forward(const Tensor& x) const {
  return run(
      {x}, [this](const std::vector<Tensor>& in) { return body(in[0]); }, gen_);  // (B, T, C)
}

}  // namespace brigade::nn
