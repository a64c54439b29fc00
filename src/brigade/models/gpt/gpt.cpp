// GPT-2 model code; see gpt.h.
#include "brigade/models/gpt/gpt.h"

#include <cmath>

#include "brigade/core/error.h"

namespace brigade::models {

namespace F = brigade::fn;

GPTTransformer::GPTTransformer(const GPTConfig& c, Generator* gen) {
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
  drop = register_module("drop", std::make_shared<nn::Dropout>(c.dropout, gen));
  h = register_module("h", std::make_shared<nn::ModuleList<nn::TransformerBlock>>());
  for (int64_t i = 0; i < c.n_layer; ++i)
    h->push_back(std::make_shared<nn::TransformerBlock>(c.n_embd, c.n_head, c.dropout, c.layer_norm_eps, gen));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.n_embd, c.layer_norm_eps));
}

GPT::GPT(const GPTConfig& c) : cfg_(c) {
  BRIGADE_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0, ConfigError,
                "GPT config: all sizes must be positive");
  BRIGADE_CHECK(c.n_embd % c.n_head == 0, ConfigError, "GPT config: n_embd={} must be divisible by n_head={}",
                c.n_embd, c.n_head);
  transformer = register_module("transformer", std::make_shared<GPTTransformer>(c, &gen_));
  name_parameters();
}

void GPT::init_weights(Generator& g) {
  // Same order and distributions as the PyTorch reference (HF GPT-2 _init_weights,
  // with the GPT-2 paper's 1/sqrt(2L) scaling of the residual projections).
  const double std = cfg_.init_std;
  const double proj_std = std / std::sqrt(2.0 * double(cfg_.n_layer));
  auto& t = *transformer;
  g.normal_(t.wte->weight, 0.0, std);
  g.normal_(t.wpe->weight, 0.0, std);
  for (const auto& block : *t.h) {
    block->ln_1->weight.fill_(1.0);
    block->ln_1->bias.zero_();
    g.normal_(block->attn->c_attn->weight, 0.0, std);
    block->attn->c_attn->bias.zero_();
    g.normal_(block->attn->c_proj->weight, 0.0, proj_std);
    block->attn->c_proj->bias.zero_();
    block->ln_2->weight.fill_(1.0);
    block->ln_2->bias.zero_();
    g.normal_(block->mlp->c_fc->weight, 0.0, std);
    block->mlp->c_fc->bias.zero_();
    g.normal_(block->mlp->c_proj->weight, 0.0, proj_std);
    block->mlp->c_proj->bias.zero_();
  }
  t.ln_f->weight.fill_(1.0);
  t.ln_f->bias.zero_();
}

Tensor GPT::forward(const Tensor& ids) const {
  return F::reshape(forward_flat(ids), {ids.size(0), ids.size(1), cfg_.vocab_size});  // (B, T, V)
}

Tensor GPT::forward_flat(const Tensor& ids) const {
  BRIGADE_CHECK(ids.dim() == 2, ShapeError, "GPT.forward: ids must be (B, T), got {}", ids.str());
  const int64_t T = ids.size(1);
  BRIGADE_CHECK(T <= cfg_.block_size, ShapeError,
                "GPT.forward: sequence length {} exceeds block_size {}; shorten the input or raise model.block_size",
                T, cfg_.block_size);
  auto& t = *transformer;
  Tensor pos = Tensor::arange(T, DType::I64);              // (T)
  Tensor x = F::add(t.wte->forward(ids), t.wpe->forward(pos));  // (B, T, C)
  x = t.drop->forward(x);
  for (const auto& block : *t.h) x = block->forward(x);  // (B, T, C)
  x = t.ln_f->forward(x);                                // (B, T, C)
  x = F::reshape(x, {ids.size(0) * T, cfg_.n_embd});     // (B*T, C)
  return F::matmul(x, t.wte->weight, false, true);       // (B*T, V): tied head, x @ wte^T
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets) const {
  BRIGADE_CHECK(targets.shape() == ids.shape(), ShapeError, "GPT.loss: targets {} must match ids {}", targets.str(),
                ids.str());
  Tensor logits = forward_flat(ids);  // (B*T, V)
  return F::cross_entropy(logits, targets.reshape({targets.numel()}));
}

double GPT::flops_per_token(int64_t T) const {
  const double N = double(num_parameters());
  return 6.0 * N + 12.0 * double(cfg_.n_layer) * double(T) * double(cfg_.n_embd);
}

}  // namespace brigade::models
