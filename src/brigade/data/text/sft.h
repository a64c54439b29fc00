// Supervised fine-tuning data: a JSONL file, one sample per line, in one of three shapes
//   {"text": "..."}                                   every token is trained on
//   {"prompt": "...", "completion": "..."}            the loss is on the completion only
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//                                                     rendered by a chat template; the loss is on
//                                                     the assistant turns only (their end marker
//                                                     included, so the model learns to stop)
// Each sample becomes token ids with a per-token flag "trained on": the tokenizer's document
// prefix (LLaMA's BOS; never trained on; not repeated when the text starts with it, as the llama-2
// template's "<s>" does), the pieces, and its end token (this engine's EOS,
// GPT-2's <|endoftext|>, LLaMA's </s>; trained on when the part before it is). Pieces are encoded one by one (prompt,
// then completion; each template piece alone), so a trained span starts at a token boundary. Templates (what each
// renders; {x} is a message's content):
//   chatml   <|im_start|>{role}\n{x}<|im_end|>\n per message; the prompt ends with
//            <|im_start|>assistant\n
//   llama-2  <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s> per
//            exchange (the system block only in the first one)
//   llama-3  <|start_header_id|>{role}<|end_header_id|>\n\n{x}<|eot_id|> per message
// The markers are plain text to this engine's SentencePiece tokenizer (it has no added
// special tokens), so they cost several tokens each; a Hugging Face tokenizer that has them as
// special tokens (LLaMA-3's <|eot_id|>, LLaMA-2's <s>) gives their ids.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/data/text/text_tokenizer.h"

namespace brigade::data {

struct SftSample {
  std::vector<int> ids;
  std::vector<uint8_t> trained;  // per id: 1 = its prediction (from the id before) is in the loss
  int64_t line = 0;              // 1-based line of the file
};

struct SftOptions {
  std::string chat_template = "chatml";  // "chatml" | "llama-2" | "llama-3" (messages only)
  bool loss_on_all = false;              // true: every token of every shape is trained on
};

struct SftData {
  std::vector<SftSample> samples;
  std::string shape;    // "text", "prompt-completion", "messages" (one file holds one shape)
  int64_t skipped = 0;  // samples with no trained token (e.g. an empty completion)
};

// Reads and encodes `path`. DataError "FILE:LINE: what; what to do" for a line that is not a
// JSON object, has none or several of the shapes, a non-string field, an unknown role, a
// messages list without an assistant turn, or a shape other than the file's first line's.
// Empty lines are skipped.
SftData read_sft_jsonl(const std::string& path, const TextTokenizer& tok, const SftOptions& o);

// The template's text pieces for a messages list, each with whether it is trained on (for tests
// and docs: read_sft_jsonl encodes these).
struct Piece {
  std::string text;
  bool trained = false;
};
std::vector<Piece> render_chat(const std::vector<std::pair<std::string, std::string>>& messages,
                               const std::string& chat_template, const std::string& where);

}  // namespace brigade::data
