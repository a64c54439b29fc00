// Module tree; see module.h.
#include "brigade/nn/module.h"

#include "brigade/core/error.h"

namespace brigade::nn {

Tensor Module::register_parameter(const std::string& name, const Shape& shape) {
  for (auto& [n, t] : params_) BRIGADE_CHECK(n != name, ValueError, "parameter '{}' registered twice", name);
  Tensor p = Tensor::empty(shape, DType::F32, MemTag::Params);  // shape as given by the layer
  p.zero_();
  p.set_requires_grad(true);
  params_.emplace_back(name, p);
  return p;
}

void Module::set_parameter(const std::string& name, const Tensor& t) {
  BRIGADE_CHECK(t.defined(), ValueError, "set_parameter('{}'): the new tensor is undefined", name);
  BRIGADE_CHECK(t.is_leaf(), ValueError,
                "set_parameter('{}'): the new tensor {} has autograd history; pass a leaf (detach() it)", name,
                t.str());
  for (auto& [n, p] : params_) {
    if (n != name) continue;
    Tensor q = t;
    q.set_requires_grad(true);
    if (p.defined() && p.impl()->meta) q.meta().name = p.name();  // keep the full name
    p = q;
    parameter_replaced(name, q);
    return;
  }
  std::string have;
  for (auto& [n, p] : params_) have += (have.empty() ? "" : ", ") + n;
  throw ValueError(
      fmt::format("set_parameter('{}'): this module has no such parameter (it has: {}); pass a "
                  "local name, not a dotted path",
                  name, have.empty() ? "none" : have));
}

void Module::collect(const std::string& prefix, NamedTensors& out) const {
  for (auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  for (auto& [n, m] : children_) m->collect(prefix + n + ".", out);
}

void Module::collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) const {
  for (auto& [n, m] : children_) {
    out.emplace_back(prefix + n, m.get());
    m->collect_modules(prefix + n + ".", out);
  }
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules("", out);
  return out;
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
