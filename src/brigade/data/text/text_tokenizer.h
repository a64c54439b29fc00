// TextTokenizer: the one interface the text pipeline (prepare, the causal-LM and SFT tasks,
// generate, eval --data, checkpoints and exports) uses, over the tokenizers a folder can hold:
//   "brigade"        this engine's own SentencePiece model (tokenizer.h Tokenizer): line by line,
//                    every '\n' is EOS (id 2); no BOS, no end-of-document token.
//   "sentencepiece"  a SentencePiece tokenizer.model used as Hugging Face's LlamaTokenizer does
//                    (tokenizer.h SentencePieceHf): the whole text at once, '\n' a byte token;
//                    each document starts with BOS (add_bos_token, default true) and ends with EOS
//                    only when tokenizer_config.json says add_eos_token.
//   "gpt2-bpe"       GPT-2's vocab.json + merges.txt (bpe.h ByteLevelBpe); documents end with
//                    <|endoftext|>, GPT-2's separator.
//   "tokenizer-json" a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, LLaMA-3);
//                    a document gets the post-processor's tokens (LLaMA-3's BOS) and, when the
//                    post-processor adds none, the end token after it (as GPT-2).
// Special-token text (<|endoftext|>, <|eot_id|>, <s>) in the input becomes the special token, as
// `tokenizers` and transformers' slow tokenizers do by default; the chat templates rely on it.
//
// Which one a folder holds: the file brigade_tokenizer.json ({"type": ...}) when present (the
// engine writes it beside every tokenizer it copies, except its own in a data folder or a
// checkpoint, which older versions wrote without it); else, in a folder this engine prepared or
// checkpointed (meta.json or state.json beside tokenizer.model), "brigade"; else the Hugging Face
// files by precedence: tokenizer.model, vocab.json + merges.txt, tokenizer.json.
// The end token of the BPE kinds is tokenizer_config.json's eos_token when the folder has one,
// else the first of <|endoftext|>, <|end_of_text|>, </s> in the vocabulary.
// encode/decode are const and safe to call concurrently.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace brigade::data {

class Tokenizer;
inline constexpr const char* kTokenizerMarker = "brigade_tokenizer.json";

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  virtual std::string kind() const = 0;  // "brigade", "sentencepiece", "gpt2-bpe", "tokenizer-json"
  virtual int64_t vocab_size() const = 0;
  // The ids of `text` alone, without document tokens.
  virtual std::vector<int> encode(std::string_view text) const = 0;
  // Like encode(), but a DataError listing the characters the vocabulary cannot represent
  // (`what` names the text: "prompt", ...). Byte-level and byte-fallback models represent all.
  virtual std::vector<int> encode_strict(std::string_view text, std::string_view what) const = 0;
  virtual std::string decode(std::span<const int> ids) const = 0;
  // A document is document_prefix() + encode(text) + document_suffix().
  virtual std::vector<int> document_prefix() const = 0;
  virtual std::vector<int> document_suffix() const = 0;
  // The token that ends a sample (SFT) or a line; -1 when the tokenizer has none.
  virtual int end_id() const = 0;
  // The token generation starts from when the prompt is empty.
  virtual int begin_id() const = 0;
  // True when a document may be encoded line by line (the result is the same): only "brigade".
  virtual bool line_separable() const = 0;
  // The files it was read from, by name in its folder (brigade_tokenizer.json not included).
  virtual std::vector<std::string> files() const = 0;
  // The folder it was read from.
  const std::string& folder() const { return folder_; }

 protected:
  std::string folder_;
};

// The kind of tokenizer `dir` holds, by the rules above; "" when it holds none.
std::string detect_tokenizer(const std::string& dir);
// Loads the tokenizer of `dir`. DataError naming the folder and the files it looked for when it
// holds none, or naming the file at fault when one cannot be read.
std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::string& dir);
// This engine's own tokenizer, saved as tokenizer.model in `folder` (prepare() just trained it).
std::unique_ptr<TextTokenizer> brigade_tokenizer(Tokenizer tok, const std::string& folder);
// `tok`'s files as (name, bytes), plus brigade_tokenizer.json when the kind is not "brigade" or
// its folder has one: what a checkpoint stores, so the copy reads back as the same kind.
std::vector<std::pair<std::string, std::string>> tokenizer_contents(const TextTokenizer& tok);
// Writes `tok`'s files and brigade_tokenizer.json (always) into `dir`, each atomically.
void copy_tokenizer(const TextTokenizer& tok, const std::string& dir);
// The contents of brigade_tokenizer.json for `tok`.
std::string tokenizer_marker(const TextTokenizer& tok);

}  // namespace brigade::data
