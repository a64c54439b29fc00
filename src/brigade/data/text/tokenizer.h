// Tokenizer: a SentencePiece BPE model trained on the corpus, plus the one rule
// SentencePiece has no notion of: newlines. Each line is encoded on its own and
// every '\n' becomes the EOS token (id 2), so "a\nb\n" -> ids(a) EOS ids(b) EOS and
// decode() turns EOS back into '\n'. BOS (id 1) is reserved and never emitted; UNK
// is id 0. There is no document separator beyond the newline. Normalisation is
// "identity" with whitespace kept, so decode(encode(s)) == s for any s made of
// characters seen in training. No byte fallback: unseen characters map to UNK,
// which encode_strict() turns into a DataError listing them.
// Not thread-hostile: encode/decode are const and safe to call concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace brigade::data {

struct TokenizerTrainOptions {
  int64_t vocab_size = 4096;              // exact (SentencePiece hard limit); includes UNK, BOS, EOS
  int64_t max_sentence_length = 1 << 16;  // bytes per training line; longer lines are fed in chunks
  uint32_t seed = 1337;                   // sentencepiece::SetRandomGeneratorSeed (BPE training does not sample)
  std::string origin = "corpus";          // names the corpus in error messages
};

class Tokenizer {
 public:
  static constexpr int kUnkId = 0;
  static constexpr int kBosId = 1;
  static constexpr int kEosId = 2;

  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Trains a BPE model on `text` (split on '\n'; empty lines ignored).
  // Deterministic: one thread, fixed seed, no input sampling or shuffling.
  // Throws DataError when the corpus cannot support `vocab_size` (too few distinct pieces/too many chars).
  static Tokenizer train(std::string_view text, const TokenizerTrainOptions& opt);
  // Loads a model written by save() (or any SentencePiece model with unk=0, bos=1, eos=2).
  // Throws DataError naming `path` and telling to run `brigade prepare` when it is missing or invalid.
  static Tokenizer load(const std::string& path);
  // Writes the serialized model atomically (temp file + fsync + rename). IoError on failure.
  void save(const std::string& path) const;

  bool loaded() const { return impl_ != nullptr; }
  int64_t vocab_size() const;
  std::vector<int> encode(std::string_view text) const;
  // Like encode(), but throws DataError listing every character that maps to UNK, e.g.
  // "prompt contains characters the tokenizer was not trained on: 'é' (U+00E9); use only ...".
  // `what` names the text in the message ("prompt", "val text", ...).
  std::vector<int> encode_strict(std::string_view text, std::string_view what = "text") const;
  // Distinct characters of `text` (code points, first-seen order) that the model maps to UNK.
  std::vector<char32_t> unknown_chars(std::string_view text) const;
  // EOS -> '\n'; BOS is dropped; UNK decodes to " ⁇ " (SentencePiece's surface). Ids outside
  // [0, vocab_size) throw ValueError.
  std::string decode(std::span<const int> ids) const;
  std::string id_to_piece(int id) const;  // the raw piece ("▁the", "<unk>", "</s>")
  const std::string& serialized() const;  // the model proto bytes (what save() writes)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A SentencePiece model (LLaMA's tokenizer.model, or any other) used the way sentencepiece's own
// encode() and Hugging Face transformers' LlamaTokenizer use it, for models trained elsewhere:
// the whole text goes to SentencePiece, newlines included (a model with byte_fallback gives
// byte tokens such as <0x0A>, one without it UNK), the model's normalizer spec decides
// add_dummy_prefix and whitespace handling, and BOS (and EOS) are added only when asked. It has
// none of Tokenizer's rules (newline -> EOS, fixed unk/bos/eos ids), which Brigade's own recipes
// and token files depend on; the two classes share nothing but the library.
// encode/decode are const and safe to call concurrently.
class SentencePieceHf {
 public:
  SentencePieceHf();
  ~SentencePieceHf();
  SentencePieceHf(SentencePieceHf&&) noexcept;
  SentencePieceHf& operator=(SentencePieceHf&&) noexcept;

  // DataError naming `path` when it is missing or not a SentencePiece model.
  static SentencePieceHf load(const std::string& path);

  // sentencepiece's encode(text), with the model's BOS first when `add_bos` (LlamaTokenizer's
  // default) and its EOS last when `add_eos`. ValueError when the model has no such token.
  std::vector<int> encode(std::string_view text, bool add_bos = true, bool add_eos = false) const;
  // sentencepiece's decode(ids): control tokens (BOS, EOS) vanish, byte tokens become their
  // bytes. Ids outside [0, vocab_size) throw ValueError.
  std::string decode(std::span<const int> ids) const;
  int64_t vocab_size() const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;
  int unk_id() const;
  std::string id_to_piece(int id) const;
  int piece_to_id(std::string_view piece) const;  // unk_id() for an unknown piece, as sentencepiece

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "'é' (U+00E9), '\t' (U+0009)": the formatting used in unknown-character messages.
std::string describe_chars(const std::vector<char32_t>& chars);

}  // namespace brigade::data
