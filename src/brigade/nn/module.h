// Module tree with hierarchical parameter names ("transformer.h.0.ln_1.weight"),
// in registration order. Parameters are allocated under MemTag::Params and
// require grad. Modules hold no autograd state; forward passes are plain
// member functions of each layer (signatures differ per layer).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  NamedTensors named_parameters() const;  // depth-first, registration order
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  void zero_grad();  // grads set to zero (buffers kept)
  void train(bool on = true);
  bool is_training() const { return training_; }
  // Stores each parameter's full name in its tensor (for error messages).
  void name_parameters(const std::string& prefix = "");
  // Every submodule below this one with its full name ("transformer.h.3"), depth-first in
  // registration order, this module excluded.
  std::vector<std::pair<std::string, Module*>> named_modules() const;

  // Forward hooks, for plans applied from outside (ZeRO-3 gathers a block's
  // parameters before its forward and releases them after). Run by layers that
  // opt in: TransformerBlock today. The post hook may replace the output.
  std::function<void()> pre_forward_hook;
  std::function<Tensor(const Tensor&)> post_forward_hook;

  // Replaces the registered parameter `name` of this module (a local name such as
  // "weight", not a dotted path) by `t`, keeping its place in the registration order
  // and its full name; `t` is marked requires_grad. For plans that swap in shards
  // (tensor parallelism): the layer's own member (Linear::weight, ...) follows, through
  // parameter_replaced. ValueError when this module has no such parameter.
  void set_parameter(const std::string& name, const Tensor& t);

 protected:
  Tensor register_parameter(const std::string& name, const Shape& shape);  // zero-initialised
  // Called by set_parameter after the registry holds the new tensor: a layer that keeps
  // a member alias of the parameter updates it here.
  virtual void parameter_replaced(const std::string& /*name*/, const Tensor& /*t*/) {}
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, NamedTensors& out) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) const;
  NamedTensors params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// An ordered list of submodules named "0", "1", ...
template <typename M>
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<M> m) {
    items_.push_back(register_module(std::to_string(items_.size()), std::move(m)));
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) const { return *items_[i]; }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

// A parameterless node of the name tree that only holds named children (HF's "encoder" holding
// "layer", "attention" holding "attention" and "output"), so models can reproduce HF's nesting.
class Submodules : public Module {
 public:
  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

}  // namespace brigade::nn
