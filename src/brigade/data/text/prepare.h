// prepare(): corpus -> SentencePiece BPE tokenizer (trained, or given) -> token ids -> train/val files.
// Writes into out_dir: tokenizer.model (or a given tokenizer's files), train.bin, val.bin (token_file.h) and
// meta.json (corpus, vocab, token counts, FNV-1a hash and size of the corpus text,
// the tokenizer's training settings, the corpus source's files with size, mtime,
// ctime and inode, time). Idempotent: when meta.json and the files match the same
// corpus text and options, nothing is rebuilt (result.skipped). meta.json is written
// last and removed first, so an interrupted run is never mistaken for a finished one.
// ensure_prepared(): what `brigade train` calls: prepares only when the folder is
// missing, empty, or was made from other inputs than the options ask for (corpus,
// its files' size/mtime, vocab, val split, tokenizer settings), and says why.
// Split: val is the contiguous tail holding round(val_fraction * N) tokens, moved
// forward to the next line start (after a token whose text ends with '\n': this engine's EOS)
// when one exists; train is the rest.
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
// Bump when the pipeline changes what it writes. 2: meta.json records its inputs
// ("corpus_source", "tokenizer_train"); a format-1 folder is prepared again.
inline constexpr int kPrepareFormat = 2;

struct PrepareOptions {
  std::string corpus = "kjv";  // "kjv", a text file or a folder (corpus.h)
  std::string out_dir = "data/kjv";
  int64_t vocab_size = 4096;
  double val_fraction = 0.05;  // in [0, 1); 0 gives an empty val.bin
  // A folder holding the tokenizer to encode with instead of training one (a pretrained model's
  // own, when fine-tuning; text_tokenizer.h says which files). Its vocabulary must be vocab_size
  // (this engine's own tokenizer) or at most vocab_size (a Hugging Face one: embeddings may be
  // padded). Its files are copied into out_dir, and meta.json records their size and hash, so
  // another tokenizer prepares again. Each corpus file is then one document: the tokenizer's
  // document tokens (LLaMA's BOS, GPT-2's <|endoftext|>) around its text.
  std::string tokenizer = "";
  bool force = false;  // rebuild even when out_dir is up to date
};

struct PrepareProgress {
  std::string stage;    // "corpus", "tokenizer", "encode", "write", "warning", "skip", "done",
                        // "stale" (ensure_prepared: why it prepares)
  std::string message;  // one human-readable line
  double fraction = 0;  // overall progress in [0, 1]
};
using PrepareProgressFn = std::function<void(const PrepareProgress&)>;

struct PrepareResult {
  bool skipped = false;  // out_dir was already up to date
  std::string out_dir;
  int64_t vocab_size = 0;  // of the tokenizer (== options.vocab_size)
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t corpus_bytes = 0;
  std::string corpus_hash;  // FNV-1a 64 of the corpus text, 16 hex digits
  double seconds = 0;       // wall time of this call
  std::string reason;       // ensure_prepared: why it prepared ("" when the folder was up to date)
};

// Throws DataError (corpus, tokenizer training), ValueError (options) or IoError (writing).
PrepareResult prepare(const PrepareOptions& options, const PrepareProgressFn& progress = {});

// Whether out_dir holds what `options` would prepare, judged from meta.json and the
// corpus source's file metadata (no corpus is read, no token file opened).
struct PreparedStatus {
  enum class State {
    kUpToDate,  // meta.json matches the options and the corpus files are unchanged
    kMissing,   // no folder, an empty one, or one an interrupted prepare left (its own files, no meta.json)
    kStale,     // prepared from other inputs, an older format, or an output file is gone
  };
  State state = State::kMissing;
  std::string reason;  // one line naming both values, e.g. "data/kjv was prepared from kjv, the recipe asks for
                       // /tmp/my.txt"; for kUpToDate, a warning or "" (see ensure_prepared)
};
// Throws DataError (one line naming the folder and what to do) when out_dir holds
// files but no meta.json that are not prepare's own, when meta.json cannot be read
// or parsed, or when it comes from a newer format.
PreparedStatus check_prepared(const PrepareOptions& options);

// check_prepared(), then: kUpToDate: nothing is touched (result.skipped, counts from
// meta.json; progress "skip"); otherwise progress "stale" with the reason and
// "...: preparing again", then prepare(options) into out_dir (result.reason). When
// only file metadata changed (a `touch`) prepare() finds the same corpus text, keeps
// the token files and refreshes meta.json. A corpus that no longer exists, with
// everything else matching, keeps the prepared data (progress "warning").
// The training loops call this instead of `if (!exists(meta)) prepare(...)`.
PrepareResult ensure_prepared(const PrepareOptions& options, const PrepareProgressFn& progress = {});

// FNV-1a 64-bit hash of `bytes` as 16 lowercase hex digits.
std::string fnv1a64_hex(std::string_view bytes);

}  // namespace brigade::data
