// nn::Embedding (nn/embedding.h).
#include "brigade/nn/embedding.h"

namespace brigade::nn {

namespace F = brigade::fn;

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

}  // namespace brigade::nn
