// LoRA adapters in PEFT's on-disk format, so an adapter trained here loads with
// peft.PeftModel.from_pretrained and one trained there loads here:
//   <dir>/adapter_model.safetensors  "base_model.model.<layer>.lora_A.weight" (r, in) and
//                                    "base_model.model.<layer>.lora_B.weight" (out, r)
//   <dir>/adapter_config.json        peft_type "LORA", r, lora_alpha, lora_dropout,
//                                    target_modules, bias, fan_in_fan_out, use_rslora,
//                                    task_type, base_model_name_or_path, ...
// Only the files: nn/lora.h builds the adapters on a model (apply_lora) and the caller copies
// the tensors in (their names are the model's parameter names once the prefix is dropped).
#pragma once
#include <string>
#include <vector>

#include "brigade/ckpt/safetensors.h"

namespace brigade::ckpt {

struct PeftLoraConfig {
  int64_t r = 8;
  double lora_alpha = 8.0;
  double lora_dropout = 0.0;
  std::vector<std::string> target_modules;
  bool fan_in_fan_out = false;  // true for HF Conv1D layers (GPT-2): weight (in, out)
  bool use_rslora = false;
  std::string task_type = "CAUSAL_LM";
  std::string base_model_name_or_path;
};

// The key prefix PEFT gives every adapter tensor.
inline constexpr const char* kPeftPrefix = "base_model.model.";

// Writes the two files into `dir` (created if missing; each file written atomically).
// `adapters` are the model's LoRA parameters under their model names ("...lora_A.weight").
// ValueError for a name that is not a LoRA parameter.
void save_peft_adapter(const std::string& dir, const NamedTensors& adapters, const PeftLoraConfig& c);

struct PeftAdapter {
  PeftLoraConfig config;
  NamedTensors tensors;  // under the model's names: the "base_model.model." prefix dropped
};

// Reads and validates `dir`: a CheckpointError naming the file and the field or key for a
// missing file, a peft_type other than "LORA", a bias other than "none", a missing or
// mistyped field, or a tensor name that is not "base_model.model.<layer>.lora_{A,B}.weight".
PeftAdapter read_peft_adapter(const std::string& dir);

}  // namespace brigade::ckpt
