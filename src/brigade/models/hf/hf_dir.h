// Hugging Face model directories in: config.json + model.safetensors (or shards listed in
// model.safetensors.index.json), as transformers saves GPT2LMHeadModel and LlamaForCausalLM.
//
// - config.json is read with HF's field names (GPT2Config: n_embd, n_layer, n_head,
//   n_positions, n_inner, activation_function, layer_norm_epsilon, tie_word_embeddings, the
//   *_pdrop; LlamaConfig: hidden_size, intermediate_size, num_hidden_layers,
//   num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta,
//   rope_scaling, tie_word_embeddings, attention_bias, mlp_bias, hidden_act). rope_scaling's
//   "rope_type" (or legacy "type") may be "default", "linear" or "llama3" (Llama 3.1-3.3) and
//   tie_word_embeddings true or false. A value this engine's model cannot represent (another
//   rope_type such as dynamic or yarn, biases, another activation, ...) is refused by name:
//   nothing is silently dropped.
// - Weights may be F32, BF16 or F16 (converted to the fp32 parameters), with or without the
//   base-model prefix ("transformer." / "model."). Known buffers (GPT-2's attn.bias /
//   attn.masked_bias, LLaMA's rotary inv_freq) and the lm_head.weight of a tied head (GPT-2, a
//   tied LLaMA), which must equal the embedding, are skipped;
//   any other unexpected key, a missing one, a wrong shape or a missing shard is a
//   CheckpointError naming the key or file. Tensors are read one at a time into the model's
//   parameters, so a sharded model is never held twice.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "brigade/models/causal_lm.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"

namespace brigade::models {

struct HfModel {
  std::unique_ptr<CausalLM> model;
  std::string model_type;            // "gpt2" or "llama"
  std::vector<std::string> skipped;  // file keys skipped as known buffers or the tied head
  // Settings read but not applied, each with why (GPT-2's attn_pdrop: this GPT-2 has no dropout
  // on the attention probabilities). Training settings only: the forward is the checkpoint's.
  std::vector<std::string> notes;
};

HfModel load_hf_directory(const std::string& dir);

// The two halves of load_hf_directory, for a caller that builds the model itself (the trainer
// adds adapters and its own dropout): config.json read and checked, and the weights read into
// a model of that config (its LoRA adapters, if any, left as they are). load_hf_weights returns
// what it skipped.
struct HfConfig {
  std::string model_type;  // "gpt2" (gpt set) or "llama" (llama set)
  GPTConfig gpt;
  LLaMAConfig llama;
  std::vector<std::string> notes;  // as HfModel::notes
};
HfConfig read_hf_config(const std::string& dir);
std::unique_ptr<CausalLM> make_hf_model(const HfConfig& c);
std::vector<std::string> load_hf_weights(const std::string& dir, const std::string& model_type, CausalLM& model);

// Writes `model` (a GPT or a LLaMA) as a Hugging Face directory that load_hf_directory and
// transformers read: config.json with HF's field names and model.safetensors with HF's keys
// (a tied head, GPT-2's or a tied LLaMA's, writes tie_word_embeddings = true and no
// lm_head.weight; a LLaMA's rope_scaling is written with "rope_type"), in F32 or, with dtype = BF16 / F16, rounded to
// it. The directory is replaced atomically (as a checkpoint is). A model with LoRA adapters
// is refused: merge them first (nn::merge_lora) or save them with ckpt::save_peft_adapter.
// `extra_files` (the tokenizer: file name, bytes) are written inside the same atomic swap.
void save_hf_directory(const CausalLM& model, const std::string& dir, DType dtype = DType::F32,
                       const std::vector<std::pair<std::string, std::string>>& extra_files = {});

}  // namespace brigade::models
