// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") on any model's
// nn::Linear layers, as PEFT builds it:
//
//   y = W x + b + s · B A dropout(x),   s = alpha / r   (rsLoRA: alpha / sqrt(r))
//
// A (r, in) starts kaiming-uniform with a = sqrt(5) (torch.nn.init.kaiming_uniform_, drawn from
// the generator in module order, so a torch run seeded alike draws the same numbers) and B
// (out, r) at zero, so the adapted model starts equal to the base. A and B are registered under
// the adapted layer as "lora_A.weight" and "lora_B.weight", so a parameter's name is PEFT's key
// without its "base_model.model." prefix ("transformer.h.0.attn.c_attn.lora_A.weight"). Every
// other parameter of the model is frozen (requires_grad false: no gradient, no optimizer state).
// HF Conv1D layers (GPT-2's c_attn, weight (in, out)) are handled: A and B keep torch's Linear
// layout and a merge adds (B A)^T, as PEFT's fan_in_fan_out does.
#pragma once
#include <string>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/nn/linear.h"

namespace brigade::nn {

struct LoraOptions {
  int64_t r = 8;
  double alpha = 8.0;
  double dropout = 0.0;  // on the adapter's input; p > 0 needs `generator`
  bool rslora = false;   // scale alpha / sqrt(r) instead of alpha / r
  // Layers to adapt: a Linear whose full name ends with ".<target>" (or is <target>), as
  // PEFT's target_modules list matches. E.g. {"c_attn"} (GPT-2), {"q_proj", "v_proj"} (LLaMA).
  std::vector<std::string> target_modules;
  Generator* dropout_generator = nullptr;
};

// The adapter a Linear carries once apply_lora has adapted it.
struct LoraAdapter {
  std::shared_ptr<Linear> A, B;  // A: Linear(in, r), B: Linear(r, out), no biases, torch layout
  double scale = 1.0;
  double dropout = 0.0;
  Generator* generator = nullptr;
  bool merged = false;  // true: s B A is added into the base weight and the forward skips it
};

// Adapts every Linear of `root` that a target names, freezes all other parameters, and draws
// the A matrices from `init` in module order. Returns the adapted layers' full names. A
// ConfigError when no layer matches a target (naming it and the model's Linear layers), when a
// layer is already adapted or sharded by tensor parallelism, or when r < 1.
std::vector<std::string> apply_lora(Module& root, const LoraOptions& o, Generator& init);

// The trainable parameters after apply_lora: the A and B of each adapter, in parameter order.
NamedTensors lora_parameters(const Module& root);

// Whether the adapted layers are HF Conv1D layers (weight (in, out)): PEFT's fan_in_fan_out.
// A ValueError when there are no adapters or when they mix layouts (PEFT has one flag).
bool lora_fan_in_fan_out(const Module& root);

// Stores every frozen parameter of `root` (requires_grad false: LoRA's base after apply_lora) in
// `dt`, its values rounded to nearest even: each is replaced through Module::set_parameter (so the
// layers' member aliases follow) by a `dt` tensor under MemTag::Params, and stays frozen. Trainable
// parameters (the adapters) are left as they are. The ops read such a weight through the precision
// policy's casts (docs/finetuning.md, "The frozen base in bf16"). Returns the bytes the frozen
// parameters take before and after.
struct FrozenStorage {
  int64_t tensors = 0, numel = 0, bytes_before = 0, bytes_after = 0;
};
FrozenStorage store_frozen_parameters(Module& root, DType dt);

// Adds s B A into each adapted layer's base weight (merge) or takes it out again (unmerge);
// the forward follows. Merging twice, or unmerging an unmerged layer, is a ValueError. Into a base
// stored in 16 bits (store_frozen_parameters) each sum is rounded to it, so unmerging does not
// give the base back bitwise; `brigade export` merges into f32 instead.
void merge_lora(Module& root);
void unmerge_lora(Module& root);

}  // namespace brigade::nn
