// nn::Linear (nn/linear.h); derivative rules are in autograd/rules/.
#include "brigade/nn/linear.h"

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

}  // namespace brigade::nn
