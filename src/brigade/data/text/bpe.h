// Byte-level BPE as GPT-2 and Hugging Face `tokenizers` define it, exactly: text is split
// into pre-tokens by a regex (GPT-2's by default), each pre-token's UTF-8 bytes are mapped
// to printable characters (GPT-2's bytes_to_unicode), and the merges are applied by rank
// (lowest first, every occurrence left to right, as GPT-2's bpe()), giving vocabulary ids.
//
// Loads GPT-2's own files (vocab.json / encoder.json + merges.txt / vocab.bpe) or a
// Hugging Face tokenizer.json whose model is BPE with a byte-level pre-tokenizer: plain
// `ByteLevel` (GPT-2, RoBERTa) or `Sequence[Split(Regex, Isolated), ByteLevel(use_regex
// false)]` (LLaMA-3), with `ignore_merges`, added/special tokens and a TemplateProcessing
// post-processor (BOS/EOS). Everything else a tokenizer.json can say and this class does
// not implement (normalizers, other models and pre-tokenizers, byte_fallback, dropout,
// ...) is refused at load with a DataError naming the field and the file, so a file that
// loads encodes as `tokenizers` would. docs/tokenizers.md has the details and the tests.
//
// Input text: valid UTF-8 runs go through the regex; each byte of an invalid UTF-8
// sequence is a pre-token of its own (a one-byte token), so any byte string encodes and
// decode(encode(s)) == s for every s. The regex runs with PCRE2_NO_UTF_CHECK only on runs
// this class has validated itself.
//
// Thread safety: encode/decode are const and safe to call concurrently; the per-word merge
// cache is guarded by a mutex.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace brigade::data {

// GPT-2's pre-tokenizer regex (also ByteLevel's `use_regex: true` in tokenizers).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// LLaMA-3's Split regex (its tokenizer.json), which llama.cpp calls the "llama-bpe" pre-tokenizer.
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct BpeEncodeOptions {
  // Special tokens (`<|endoftext|>`, added tokens marked special) found in the text become
  // their ids; when false they are encoded as ordinary text, as GPT-2's encoder and
  // tiktoken's default do. Non-special added tokens are always matched, as in tokenizers.
  bool allow_special = false;
  // Adds the post-processor's tokens (tokenizer.json TemplateProcessing, e.g. LLaMA-3's
  // BOS <|begin_of_text|>); nothing for GPT-2, which has none.
  bool add_special_tokens = false;
};

class ByteLevelBpe {
 public:
  ByteLevelBpe();
  ~ByteLevelBpe();
  ByteLevelBpe(ByteLevelBpe&&) noexcept;
  ByteLevelBpe& operator=(ByteLevelBpe&&) noexcept;

  // GPT-2's files: `vocab_json` maps token -> id; `merges_txt` holds one "a b" merge per line
  // in rank order, after an optional first line starting with "#version". `special_tokens`
  // names vocabulary entries to treat as special (each must be in the vocabulary); by default
  // `<|endoftext|>` when the vocabulary has it. DataError names the file (and line) at fault.
  static ByteLevelBpe from_gpt2_files(const std::string& vocab_json, const std::string& merges_txt,
                                      std::optional<std::vector<std::string>> special_tokens = std::nullopt);
  // A Hugging Face tokenizer.json with model.type "BPE" and a byte-level pre-tokenizer (see
  // above). DataError names the unsupported or malformed field and the file.
  static ByteLevelBpe from_tokenizer_json(const std::string& path);

  std::vector<int> encode(std::string_view text, const BpeEncodeOptions& opt = {}) const;
  // Concatenated token bytes: vocabulary tokens through the inverse byte map, added tokens as
  // their text. ValueError for an id that names no token.
  std::string decode(std::span<const int> ids) const;

  // One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const;
  // The id of a token string as the vocabulary spells it ("Ġthe", "<|endoftext|>"), or -1.
  int token_to_id(std::string_view token) const;
  // The token string of `id` (vocabulary spelling); ValueError when no token has that id.
  std::string id_to_token(int id) const;
  // Whether `id` is a special token (GPT-2's <|endoftext|>, tokenizer.json's special added tokens).
  bool is_special(int id) const;
  // The ids the post-processor puts before and after a text (add_special_tokens); none for
  // GPT-2's own files.
  const std::vector<int>& post_prefix() const;
  const std::vector<int>& post_suffix() const;
  // Whether `id` is an added token (special or not) rather than a vocabulary token of the model.
  bool is_added(int id) const;
  // The merges as "a b" (vocabulary spellings), lowest rank first (a pair given twice: its last rank).
  std::vector<std::string> merges() const;
  // The regex of each pre-tokenizer split step in order ("" for a step that does not split, as
  // LLaMA-3's ByteLevel(use_regex false)); GPT-2's files give {kGpt2Pattern}.
  std::vector<std::string> pre_tokenizer_patterns() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GPT-2's bytes_to_unicode(): the printable character (as UTF-8) standing for byte `b`.
std::string gpt2_byte_to_unicode(unsigned char b);

}  // namespace brigade::data
