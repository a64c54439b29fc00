// Module tree; see module.h.
#include "brigade/nn/module.h"

#include "brigade/core/error.h"

namespace brigade::nn {

Tensor Module::register_parameter(const std::string& name, const Shape& shape) {
  for (auto& [n, t] : params_)
    BRIGADE_CHECK(n != name, ValueError, "parameter '{}' registered twice", name);
  Tensor p = Tensor::empty(shape, DType::F32, MemTag::Params);  // shape as given by the layer
  p.zero_();
  p.set_requires_grad(true);
  params_.emplace_back(name, p);
  return p;
}

void Module::collect(const std::string& prefix, NamedTensors& out) const {
  for (auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  for (auto& [n, m] : children_) m->collect(prefix + n + ".", out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) {
    Tensor g = t.grad();
    if (g.defined()) g.zero_();
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::name_parameters(const std::string& prefix) {
  for (auto& [n, t] : named_parameters()) t.meta().name = prefix + n;
}

}  // namespace brigade::nn
