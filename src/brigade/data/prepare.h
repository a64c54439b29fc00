// prepare(): corpus -> SentencePiece BPE tokenizer -> token ids -> train/val files.
// Writes into out_dir: tokenizer.model, train.bin, val.bin (token_file.h) and
// meta.json (corpus, vocab, token counts, FNV-1a hash and size of the corpus text,
// time). Idempotent: when meta.json and the files match the same corpus text and
// options, nothing is rebuilt (result.skipped). meta.json is written last and
// removed first, so an interrupted run is never mistaken for a finished one.
// Split: val is the contiguous tail holding round(val_fraction * N) tokens, moved
// forward to the next line start (after an EOS) when one exists; train is the rest.
// Not the CLI (cli/ prints the progress) and not the sampler (sampler.h).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace brigade::data {

inline constexpr const char* kTokenizerFile = "tokenizer.model";
inline constexpr const char* kTrainFile = "train.bin";
inline constexpr const char* kValFile = "val.bin";
inline constexpr const char* kMetaFile = "meta.json";
inline constexpr int kPrepareFormat = 1;  // bump when the pipeline changes what it writes

struct PrepareOptions {
  std::string corpus = "kjv";   // "kjv", a text file or a folder (corpus.h)
  std::string out_dir = "data/kjv";
  int64_t vocab_size = 4096;
  double val_fraction = 0.05;   // in [0, 1); 0 gives an empty val.bin
  bool force = false;           // rebuild even when out_dir is up to date
};

struct PrepareProgress {
  std::string stage;    // "corpus", "tokenizer", "encode", "write", "warning", "skip", "done"
  std::string message;  // one human-readable line
  double fraction = 0;  // overall progress in [0, 1]
};
using PrepareProgressFn = std::function<void(const PrepareProgress&)>;

struct PrepareResult {
  bool skipped = false;         // out_dir was already up to date
  std::string out_dir;
  int64_t vocab_size = 0;       // of the tokenizer (== options.vocab_size)
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t corpus_bytes = 0;
  std::string corpus_hash;      // FNV-1a 64 of the corpus text, 16 hex digits
  double seconds = 0;           // wall time of this call
};

// Throws DataError (corpus, tokenizer training), ValueError (options) or IoError (writing).
PrepareResult prepare(const PrepareOptions& options, const PrepareProgressFn& progress = {});

// FNV-1a 64-bit hash of `bytes` as 16 lowercase hex digits.
std::string fnv1a64_hex(std::string_view bytes);

}  // namespace brigade::data
