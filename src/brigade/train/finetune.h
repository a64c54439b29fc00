// Fine-tuning as a recipe asks for it (docs/finetuning.md):
//   model.init_from  start from pretrained weights: a Hugging Face model directory (config.json +
//                    safetensors, GPT-2 / LLaMA) or a Brigade checkpoint directory (recipe.toml +
//                    model.safetensors, any model). The model's shape keys come from it.
//   finetune.method  "full" trains every parameter; "lora" adds LoRA adapters (lora.*) to the
//                    target layers and freezes everything else; lora.base_dtype = "bf16" stores
//                    the frozen part in bf16 (gpt, llama).
// The trainer stays the one loop: a frozen parameter is simply not in the data-parallel units
// (no gradient, no optimizer state, replicated on every rank and never sharded by ZeRO), and the
// checkpoint's model.safetensors holds the whole model, base and adapters, so resume, eval and
// generate read it as any other.
#pragma once
#include <string>
#include <vector>

#include "brigade/core/dtype.h"
#include "brigade/nn/module.h"
#include "brigade/train/config.h"
#include "brigade/train/registry.h"

namespace brigade::train {

class Task;

// Fills r.model's shape keys (and model.type) from model.init_from; nothing when it is "". A
// shape key the recipe set away from its default to another value than the directory's is a
// ConfigError naming both. Called by parse_recipe before validation.
void resolve_init_from(Recipe& r, const std::string& origin);

// The finetune.* / lora.* part of validate_recipe.
void validate_finetune(const Recipe& r, const Fail& fail);

// The folder whose tokenizer a text task encodes its data with when model.init_from is set: the
// directory itself (data/text/text_tokenizer.h: tokenizer.model, vocab.json + merges.txt or
// tokenizer.json). ConfigError when it holds none.
std::string init_from_tokenizer(const Recipe& r);

// The layers LoRA adapts: lora.target_modules, or the model's default (gpt: c_attn; llama:
// q_proj, v_proj). Other model types need lora.target_modules.
std::vector<std::string> lora_targets(const Recipe& r);

// On a task just built from the recipe (random weights from run.seed): loads model.init_from's
// weights when `load_weights` (not when a checkpoint is about to replace them all), then applies
// finetune.method (LoRA: A drawn from run.seed + 2, dropout from the task's dropout stream; then
// the frozen parameters stored in lora.base_dtype).
// Returns one line for the log ("" when the recipe fine-tunes nothing).
std::string apply_finetune(const Recipe& r, Task& task, bool load_weights);

// A LoRA run's adapters as PEFT saves them (adapter_model.safetensors + adapter_config.json) in
// `dir`, from `params`: the model's parameters by name (every rank's view, or gathered copies).
void save_lora_adapter(const Recipe& r, const nn::NamedTensors& params, bool fan_in_fan_out, const std::string& dir);

// `brigade export`: a gpt or llama checkpoint as a Hugging Face directory (config.json,
// model.safetensors in `dtype`, the checkpoint's tokenizer.model), a LoRA run's adapters merged
// into the base weights (in f32, also for a base stored in bf16); or, with `adapter_only`, a LoRA run's adapters as
// PEFT files. Returns one line saying what was written. With format "gguf": one GGUF v3 file at `out`
// (models/hf/gguf.h) instead of the directory.
std::string export_checkpoint(const std::string& ckpt, const std::string& out, DType dtype, bool adapter_only,
                              const std::string& format = "hf");

// `brigade generate --adapter DIR`: a PEFT LoRA folder (ckpt/peft.h) applied to `model` (built
// without adapters): its r, lora_alpha, use_rslora and target_modules, then its tensors, every
// one a parameter of the adapted model with its shape. ConfigError when the model already has
// adapters, when the folder's fan_in_fan_out does not match the model's layers, or for a tensor
// the model does not have. Returns one line saying what was applied.
std::string attach_peft_adapter(nn::Module& model, const std::string& dir);

// `brigade eval --ckpt DIR --data FILE`: a gpt or llama checkpoint's mean next-token loss on a
// file: a prepared token file (`.bin`, e.g. data/kjv/val.bin; its vocabulary must be the
// model's) or text, encoded with the checkpoint's tokenizer. Consecutive windows of
// train.seq_len + 1 tokens (the last one shorter), batch_size windows per forward; every token
// after the first of a window is scored once. Fields: loss, perplexity, tokens, windows.
struct TextEval {
  double loss = 0, perplexity = 0;
  int64_t tokens = 0, windows = 0;
};
TextEval evaluate_on_file(const std::string& ckpt, const std::string& file);

}  // namespace brigade::train
