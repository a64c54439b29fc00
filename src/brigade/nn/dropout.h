// nn::Dropout (torch.nn.Dropout): inverted dropout in training mode, the identity in eval.
#pragma once
#include "brigade/autograd/functions.h"
#include "brigade/core/rng.h"
#include "brigade/nn/module.h"

namespace brigade::nn {

// Inverted dropout drawing from `gen` (owned by the model) in training mode only.
class Dropout : public Module {
 public:
  Dropout(double p, Generator* gen) : p(p), gen_(gen) {}
  Tensor forward(const Tensor& x) const { return fn::dropout(x, p, is_training(), *gen_); }
  double p;

 private:
  Generator* gen_;
};

}  // namespace brigade::nn
