// The derivative rule of the embedding lookup.
#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct EmbeddingBackward : Node {
  Tensor ids;
  int64_t V = 0;
  const char* name() const override { return "EmbeddingBackward"; }
  // forward: out[..., :] = weight[ids[...], :]
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::embedding_backward(g, ids, V)}; }
  void release() override { ids = Tensor(); }
};

}  // namespace

Tensor embedding(const Tensor& w0, const Tensor& ids) {
  const Tensor weight = cast(w0, policy_dtype(amp::Op::Embedding, {&w0}));
  auto n = std::make_shared<EmbeddingBackward>();
  if (needs_grad({weight})) {
    n->ids = ids;
    n->V = weight.size(0);
  }
  Tensor y = record(ops::embedding(weight, ids), n, {weight});
  // Under rule Keep (O0) a 16-bit table that is a frozen parameter (LoRA's base stored in bf16,
  // lora.base_dtype) is storage, not a compute dtype: its rows are gathered as stored and widened
  // to f32, O0's activation dtype, which is exactly what an f32 copy of the table would give,
  // without copying the V x C table. (Every other op of the model promotes the mix of f32
  // activations and 16-bit weights to f32 already; a lookup has no activation input to mix with.)
  if (amp::rule(amp::Op::Embedding, amp::current_policy().level) == amp::Rule::Keep && frozen_cast(w0, DType::F32))
    y = cast(y, DType::F32);
  return y;
}

}  // namespace brigade::fn
