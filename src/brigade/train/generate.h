// Text generation from a trained causal language model (GPT, LLaMA): temperature and top-k sampling (Fan et al.
// 2018), recomputing the full context each token (no KV cache yet; contexts are
// cropped to the model's block_size).
#pragma once
#include <cstdint>
#include <string>

#include "brigade/data/text/text_tokenizer.h"
#include "brigade/models/causal_lm.h"

namespace brigade::train {

struct SampleOptions {
  int64_t tokens = 64;
  double temperature = 0.8;  // > 0
  int64_t top_k = 40;        // 0 = whole vocabulary
  uint64_t seed = 1337;
};

// Continues `prompt` (must use only characters the tokenizer knows: DataError
// otherwise), after the tokenizer's document prefix (LLaMA's BOS); an empty prompt starts from
// the tokenizer's begin token (this engine's: a line break). Returns prompt + continuation,
// decoded.
std::string generate_text(const models::CausalLM& model, const data::TextTokenizer& tok, const std::string& prompt,
                          const SampleOptions& o);

}  // namespace brigade::train
