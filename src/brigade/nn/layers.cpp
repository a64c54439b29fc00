// Layer forwards; derivative rules are in autograd/rules/.
#include "brigade/nn/layers.h"

#include "brigade/core/error.h"
#include "brigade/nn/lora.h"

namespace brigade::nn {

namespace F = brigade::fn;

Linear::Linear(int64_t in, int64_t out, bool has_bias, WeightLayout layout) : layout(layout) {
  weight = register_parameter("weight", layout == WeightLayout::OutIn ? Shape{out, in} : Shape{in, out});
  if (has_bias) bias = register_parameter("bias", {out});
}
Tensor Linear::forward(const Tensor& x) const {
  Tensor y = shard ? shard->forward(*this, x) : F::linear(x, weight, bias, layout);
  if (lora && !lora->merged) {
    // PEFT's order: result + lora_B(lora_A(dropout(x))) * scaling
    const Tensor xd = lora->dropout > 0 ? F::dropout(x, lora->dropout, is_training(), *lora->generator) : x;
    y = F::add(y, F::mul_scalar(lora->B->forward(lora->A->forward(xd)), lora->scale));
  }
  return y;
}
void Linear::attach_lora(std::shared_ptr<LoraAdapter> a) {
  BRIGADE_CHECK(!lora, ValueError, "Linear::attach_lora: the layer already has an adapter");
  register_module("lora_A", a->A);
  register_module("lora_B", a->B);
  lora = std::move(a);
}
Tensor Linear::lm_loss(const Tensor& x, const Tensor& targets) const {
  if (lora && !lora->merged) return F::cross_entropy(forward(x), targets);  // an adapted head
  return shard ? shard->lm_loss(*this, x, targets) : F::cross_entropy(F::linear(x, weight, bias, layout), targets);
}
Tensor LinearShard::lm_loss(const Linear& layer, const Tensor& x, const Tensor& targets) const {
  return F::cross_entropy(forward(layer, x), targets);
}
void Linear::parameter_replaced(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }

Embedding::Embedding(int64_t num, int64_t dim) { weight = register_parameter("weight", {num, dim}); }
Tensor Embedding::forward(const Tensor& ids) const {
  return shard ? shard->lookup(*this, ids) : F::embedding(weight, ids);
}
Tensor Embedding::attend(const Tensor& x) const {
  return shard ? shard->attend(*this, x) : F::matmul(x, weight, false, true);  // (N, V)
}
Tensor Embedding::lm_loss(const Tensor& x, const Tensor& targets) const {
  return shard ? shard->lm_loss(*this, x, targets) : F::cross_entropy(attend(x), targets);
}
void Embedding::parameter_replaced(const std::string&, const Tensor& t) { weight = t; }

LayerNorm::LayerNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", {dim});
  weight.fill_(1.0);
  bias = register_parameter("bias", {dim});
}
Tensor LayerNorm::forward(const Tensor& x) const { return F::layer_norm(x, weight, bias, eps); }
void LayerNorm::parameter_replaced(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }

Tensor Dropout::forward(const Tensor& x) const { return F::dropout(x, p, is_training(), *gen_); }

CausalSelfAttention::CausalSelfAttention(int64_t C, int64_t n_head, double dropout, Generator* gen) : n_head(n_head) {
  BRIGADE_CHECK(C % n_head == 0, ConfigError, "n_embd={} is not divisible by n_head={}", C, n_head);
  c_attn = register_module("c_attn", std::make_shared<Linear>(C, 3 * C, true, WeightLayout::InOut));
  c_proj = register_module("c_proj", std::make_shared<Linear>(C, C, true, WeightLayout::InOut));
  resid_drop = register_module("resid_dropout", std::make_shared<Dropout>(dropout, gen));  // no parameters
}

void CausalSelfAttention::check_heads(int64_t parts) const { check_head_count(n_head, parts); }
void CausalSelfAttention::divide_heads(int64_t parts) { divide_head_count(n_head, parts); }

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  Tensor qkv = c_attn->forward(x);                   // (B, T, 3C)
  Tensor y = F::causal_self_attention(qkv, n_head);  // (B, T, C)
  return resid_drop->forward(c_proj->forward(y));    // (B, T, C)
}

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
