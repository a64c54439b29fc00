// LoRA adapters on nn::Linear layers; see lora.h.
#include "brigade/nn/lora.h"

#include <cmath>
#include <map>

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::nn {

namespace {

bool targeted(const std::string& name, const std::vector<std::string>& targets) {
  for (const std::string& t : targets)
    if (name == t || (name.size() > t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0 &&
                      name[name.size() - t.size() - 1] == '.'))
      return true;
  return false;
}

// Every Linear below root (LoRA's own A and B excluded), with its full name.
std::vector<std::pair<std::string, Linear*>> linears(const Module& root) {
  std::vector<std::pair<std::string, Linear*>> out;
  for (auto& [name, m] : root.named_modules()) {
    auto* l = dynamic_cast<Linear*>(m);
    const bool own = name.ends_with(".lora_A") || name.ends_with(".lora_B");
    if (l && !own) out.emplace_back(name, l);
  }
  return out;
}

// s B A in the base weight's layout: (out, in) for torch's Linear, (in, out) for HF Conv1D.
Tensor delta_weight(const Linear& l) {
  const Tensor& A = l.lora->A->weight;  // (r, in)
  const Tensor& B = l.lora->B->weight;  // (out, r)
  const Tensor ba = l.layout == WeightLayout::OutIn ? ops::matmul(B, A) : ops::matmul(A, B, true, true);
  return ops::mul_scalar(ba, l.lora->scale);
}

}  // namespace

std::vector<std::string> apply_lora(Module& root, const LoraOptions& o, Generator& init) {
  BRIGADE_CHECK(o.r >= 1, ConfigError, "LoRA: r = {} must be at least 1", o.r);
  BRIGADE_CHECK(o.dropout >= 0 && o.dropout < 1, ConfigError, "LoRA: dropout = {} must be in [0, 1)", o.dropout);
  BRIGADE_CHECK(o.dropout == 0 || o.dropout_generator, ConfigError,
                "LoRA: dropout = {} needs a dropout generator (LoraOptions::dropout_generator)", o.dropout);
  BRIGADE_CHECK(!o.target_modules.empty(), ConfigError, "LoRA: no target_modules given");
  const auto all = linears(root);
  for (const std::string& t : o.target_modules) {
    bool found = false;
    for (auto& [name, l] : all) found = found || targeted(name, {t});
    if (!found) {
      std::string names;
      for (auto& [name, l] : all) names += (names.empty() ? "" : ", ") + name;
      throw ConfigError(
          fmt::format("LoRA: target module \"{}\" matches no Linear layer of the model; its Linear "
                      "layers are: {}",
                      t, names));
    }
  }
  for (auto& [name, l] : all) {  // every check before anything changes
    if (!targeted(name, o.target_modules)) continue;
    BRIGADE_CHECK(!l->lora, ConfigError, "LoRA: {} is already adapted", name);
    BRIGADE_CHECK(!l->shard, ConfigError,
                  "LoRA: {} is sharded by tensor parallelism; LoRA under tensor parallelism is not supported", name);
  }
  for (auto& [name, p] : root.named_parameters()) p.set_requires_grad(false);
  std::vector<std::string> adapted;
  const double a = std::sqrt(5.0);
  for (auto& [name, l] : all) {
    if (!targeted(name, o.target_modules)) continue;
    const int64_t in = l->layout == WeightLayout::OutIn ? l->weight.size(1) : l->weight.size(0);
    const int64_t out = l->layout == WeightLayout::OutIn ? l->weight.size(0) : l->weight.size(1);
    auto ad = std::make_shared<LoraAdapter>();
    ad->A = std::make_shared<Linear>(in, o.r, /*bias=*/false);
    ad->B = std::make_shared<Linear>(o.r, out, /*bias=*/false);  // zero-initialised
    // torch.nn.init.kaiming_uniform_(A, a=sqrt(5)): gain sqrt(2 / (1 + a^2)), fan_in = in,
    // bound sqrt(3) * gain / sqrt(fan_in), computed as torch computes it.
    const double gain = std::sqrt(2.0 / (1 + a * a));
    const double bound = std::sqrt(3.0) * (gain / std::sqrt(double(in)));
    init.uniform_(ad->A->weight, -bound, bound);
    ad->scale = o.rslora ? o.alpha / std::sqrt(double(o.r)) : o.alpha / double(o.r);
    ad->dropout = o.dropout;
    ad->generator = o.dropout_generator;
    l->attach_lora(ad);
    adapted.push_back(name);
  }
  root.name_parameters();
  return adapted;
}

FrozenStorage store_frozen_parameters(Module& root, DType dt) {
  BRIGADE_CHECK(is_floating(dt), ValueError, "store_frozen_parameters: {} is not a floating dtype", dtype_name(dt));
  std::map<std::string, Module*> modules;
  for (auto& [name, m] : root.named_modules()) modules.emplace(name, m);
  FrozenStorage s;
  for (auto& [name, p] : root.named_parameters()) {
    if (p.requires_grad() || !is_floating(p.dtype())) continue;
    ++s.tensors;
    s.numel += p.numel();
    s.bytes_before += int64_t(p.nbytes());
    s.bytes_after += p.numel() * int64_t(dtype_size(dt));
    if (p.dtype() == dt) continue;
    const size_t dot = name.rfind('.');
    Module* owner = &root;  // a parameter of the model itself has no dot
    if (dot != std::string::npos) {
      auto it = modules.find(name.substr(0, dot));
      BRIGADE_CHECK(it != modules.end(), InternalError, "store_frozen_parameters: no module holds {}", name);
      owner = it->second;
    }
    Tensor q = Tensor::empty(p.shape(), dt, MemTag::Params);
    q.copy_(p);  // round to nearest even (core/dtype.h)
    owner->set_parameter(dot == std::string::npos ? name : name.substr(dot + 1), q);
    q.set_requires_grad(false);  // set_parameter marks it trainable; it stays frozen
  }
  return s;
}

NamedTensors lora_parameters(const Module& root) {
  NamedTensors out;
  for (auto& [name, p] : root.named_parameters())
    if (name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight")) out.emplace_back(name, p);
  return out;
}

bool lora_fan_in_fan_out(const Module& root) {
  int conv1d = 0, linear = 0;
  for (auto& [name, l] : linears(root))
    if (l->lora) ++(l->layout == WeightLayout::InOut ? conv1d : linear);
  BRIGADE_CHECK(conv1d + linear > 0, ValueError, "lora_fan_in_fan_out: the model has no LoRA adapters");
  BRIGADE_CHECK(conv1d == 0 || linear == 0, ValueError,
                "lora_fan_in_fan_out: the adapters sit on {} Conv1D and {} Linear layers; PEFT's one "
                "fan_in_fan_out flag cannot describe both",
                conv1d, linear);
  return conv1d > 0;
}

void merge_lora(Module& root) {
  autograd::NoGradGuard no_grad;
  for (auto& [name, l] : linears(root)) {
    if (!l->lora) continue;
    BRIGADE_CHECK(!l->lora->merged, ValueError, "merge_lora: {} is already merged", name);
    ops::add_(l->weight, delta_weight(*l));
    l->lora->merged = true;
  }
}

void unmerge_lora(Module& root) {
  autograd::NoGradGuard no_grad;
  for (auto& [name, l] : linears(root)) {
    if (!l->lora) continue;
    BRIGADE_CHECK(l->lora->merged, ValueError, "unmerge_lora: {} is not merged", name);
    ops::add_(l->weight, delta_weight(*l), -1.0);
    l->lora->merged = false;
  }
}

}  // namespace brigade::nn
