// GGUF (version 3) files out, for llama.cpp and the tools built on ggml: a GPT-2 or LLaMA model
// written with the tensor names, layouts and metadata keys llama.cpp's convert_hf_to_gguf.py
// gives the same Hugging Face model (docs/finetuning.md, "GGUF export").
//
// File layout (ggml's docs/gguf.md, little-endian): "GGUF", u32 version 3, u64 tensor count,
// u64 metadata count; the metadata as (string key, u32 value type, value); one info per tensor
// (string name, u32 n_dims, u64 dims in GGML order = the row-major shape reversed, u32 ggml type,
// u64 offset into the data section); zero padding to general.alignment (32, written); the data,
// each tensor starting at a multiple of the alignment. Strings are u64 length + UTF-8 bytes.
//
// - gpt2: token_embd, position_embd, blk.N.{attn_norm, attn_qkv, attn_output, ffn_norm, ffn_up,
//   ffn_down}.{weight,bias}, output_norm.{weight,bias}, and output.weight as a copy of token_embd
//   (GPT-2 ties them). HF Conv1D weights (in, out) are transposed to (out, in), as the converter
//   does, so every 2-D weight is (out, in) row-major = GGML {in, out}.
// - llama: token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
//   ffn_up, ffn_down}.weight, output_norm, output (absent for a tied head: llama.cpp then uses
//   token_embd, as for the converter's tied Llama 3.2). q_proj and k_proj rows are permuted from HF's
//   rotary layout (the two halves of each head) back to the interleaved pairs GGML's RoPE rotates:
//   per head, row (i, h) of the (2, HS/2) split goes to row (h, i) — with n_head heads for q and
//   n_kv_head for k.
// - 2-D weights in `dtype` (F32, F16 or BF16, rounded to nearest even); 1-D tensors (norms,
//   biases) stay F32. general.file_type: 0 (F32), 1 (F16), 32 (BF16).
// - With `tokenizer_model`: that SentencePiece model as tokenizer.ggml.* (model "llama": pieces,
//   scores, token types, bos/eos/unk ids, add_bos_token false), padded with "[PADi]" unused tokens
//   to the model's vocab_size as the converter pads; a tokenizer larger than the model is refused.
// - With `bpe_tokenizer_dir` (GPT-2's vocab.json + merges.txt, or a byte-level tokenizer.json):
//   model "gpt2", the tokens by id as the vocabulary spells them, token types (special: control,
//   other added: user-defined, ids no token has: "[PADi]" unused), the merges, and pre "gpt-2"
//   or "llama-bpe" by the pre-tokenizer regex (any other regex is a ValueError: llama.cpp would
//   split text differently).
// Written atomically (temp file, fsync, rename); IoError when it cannot be. A model with LoRA
// adapters is a ValueError (merge them first), as is any model other than GPT and LLaMA, and a
// LLaMA with scaled RoPE frequencies (rope_scaling; not recorded here yet).
#pragma once
#include <string>

#include "brigade/core/dtype.h"
#include "brigade/models/causal_lm.h"

namespace brigade::models {

struct GgufOptions {
  DType dtype = DType::F32;       // F32, F16 or BF16 for the 2-D weight matrices; 1-D tensors stay F32
  std::string tokenizer_model;    // a SentencePiece tokenizer.model to embed as tokenizer.ggml.* ("" = none)
  std::string bpe_tokenizer_dir;  // or a byte-level BPE's folder ("" = none)
  int bos_token_id = -1;          // a BPE's BOS and EOS ids (-1 = not written); SentencePiece: the model's own
  int eos_token_id = -1;
  bool add_bos_token = false;  // runners prepend BOS (LlamaTokenizer and LLaMA-3 models; not this engine's)
  std::string name;            // general.name ("" = not written)
};

void save_gguf(const CausalLM& model, const std::string& path, const GgufOptions& o = {});

}  // namespace brigade::models
