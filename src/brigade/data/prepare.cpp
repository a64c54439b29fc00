// prepare(): the data pipeline behind `brigade prepare` (contract in prepare.h).
// Encoding runs line-chunked across OpenMP threads; the result does not depend on
// the thread count because every line is encoded independently.
#include "brigade/data/prepare.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"
#include "brigade/data/corpus.h"
#include "brigade/data/token_file.h"
#include "brigade/data/tokenizer.h"

namespace brigade::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string fnv1a64_hex(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

namespace {

std::string now_iso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Encodes `text` in chunks of whole lines, in parallel, concatenated in order.
std::vector<int32_t> encode_corpus(const Tokenizer& tok, std::string_view text) {
  std::vector<std::string_view> chunks;
  constexpr size_t kChunkBytes = 64 * 1024;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = std::min(text.size(), pos + kChunkBytes);
    if (end < text.size()) {
      size_t nl = text.find('\n', end);
      end = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    chunks.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  std::vector<std::vector<int>> parts(chunks.size());
  std::string first_error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < int64_t(chunks.size()); ++i) {
    try {
      parts[size_t(i)] = tok.encode(chunks[size_t(i)]);
    } catch (const std::exception& e) {
#pragma omp critical
      if (first_error.empty()) first_error = e.what();
    }
  }
  BRIGADE_CHECK(first_error.empty(), DataError, "encoding the corpus failed: {}", first_error);
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  std::vector<int32_t> out;
  out.reserve(total);
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// True when out_dir holds a finished prepare of the same corpus text and options.
bool up_to_date(const fs::path& dir, const PrepareOptions& o, const std::string& hash, int64_t bytes,
                PrepareResult& r) {
  try {
    std::ifstream in(dir / kMetaFile);
    if (!in.good()) return false;
    json m = json::parse(in);
    if (m.value("format", 0) != kPrepareFormat || m.value("corpus", "") != o.corpus ||
        m.value("corpus_fnv1a64", "") != hash || m.value("corpus_bytes", int64_t(-1)) != bytes ||
        m.value("vocab_size", int64_t(-1)) != o.vocab_size || m.value("val_fraction", -1.0) != o.val_fraction)
      return false;
    if (!fs::is_regular_file(dir / kTokenizerFile)) return false;
    TokenDataset train((dir / kTrainFile).string(), /*verify_tokens=*/false);
    TokenDataset val((dir / kValFile).string(), /*verify_tokens=*/false);
    if (train.size() != m.value("train_tokens", int64_t(-1)) || val.size() != m.value("val_tokens", int64_t(-1)) ||
        train.vocab_size() != o.vocab_size || val.vocab_size() != o.vocab_size)
      return false;
    r.train_tokens = train.size();
    r.val_tokens = val.size();
    r.vocab_size = o.vocab_size;
    return true;
  } catch (const std::exception&) {
    return false;  // anything unreadable means "rebuild"
  }
}

}  // namespace

PrepareResult prepare(const PrepareOptions& o, const PrepareProgressFn& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto report = [&](const char* stage, std::string msg, double frac) {
    if (progress) progress(PrepareProgress{stage, std::move(msg), frac});
  };
  BRIGADE_CHECK(o.vocab_size >= 8 && o.vocab_size <= int64_t(UINT32_MAX), ValueError,
                "prepare: vocab_size {} is out of range; use a value >= 8 (model.vocab_size)", o.vocab_size);
  BRIGADE_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, ValueError,
                "prepare: val_fraction {} must be in [0, 1) (data.val_fraction)", o.val_fraction);
  BRIGADE_CHECK(!o.out_dir.empty(), ValueError, "prepare: the output folder is empty; set data.dir");

  PrepareResult r;
  r.out_dir = o.out_dir;
  const fs::path dir(o.out_dir);

  report("corpus", fmt::format("reading corpus '{}'", o.corpus), 0.0);
  Corpus corpus = read_corpus(o.corpus, [&](const std::string& w) { report("warning", w, 0.0); });
  r.corpus_bytes = int64_t(corpus.text.size());
  r.corpus_hash = fnv1a64_hex(corpus.text);
  report("corpus",
         fmt::format("read {} bytes, {} lines{}", r.corpus_bytes, corpus.lines,
                     corpus.files.empty() ? "" : fmt::format(" from {} file(s)", corpus.files.size())),
         0.05);

  if (!o.force && up_to_date(dir, o, r.corpus_hash, r.corpus_bytes, r)) {
    r.skipped = true;
    r.seconds = elapsed();
    report("skip",
           fmt::format("'{}' is up to date ({} train + {} val tokens, vocab {}); nothing to do", o.out_dir,
                       r.train_tokens, r.val_tokens, r.vocab_size),
           1.0);
    return r;
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  BRIGADE_CHECK(!ec, IoError, "cannot create the data folder '{}': {}; check data.dir and permissions", o.out_dir,
                ec.message());
  fs::remove(dir / kMetaFile, ec);  // the folder is "unfinished" until meta.json is back

  report("tokenizer", fmt::format("training a {}-token BPE tokenizer", o.vocab_size), 0.1);
  TokenizerTrainOptions topt;
  topt.vocab_size = o.vocab_size;
  topt.origin = fmt::format("corpus '{}'", o.corpus);
  Tokenizer tok = Tokenizer::train(corpus.text, topt);
  tok.save((dir / kTokenizerFile).string());
  r.vocab_size = tok.vocab_size();
  report("tokenizer", fmt::format("tokenizer trained in {:.1f}s", elapsed()), 0.5);

  report("encode", "encoding the corpus", 0.5);
  std::vector<int32_t> ids = encode_corpus(tok, corpus.text);
  const int64_t n = int64_t(ids.size());
  report("encode", fmt::format("{} tokens ({:.2f} bytes/token)", n, n ? double(r.corpus_bytes) / double(n) : 0.0),
         0.85);

  int64_t split = n - int64_t(std::llround(o.val_fraction * double(n)));
  if (split < n) {
    int64_t s = split;
    while (s < n && !(s > 0 && ids[size_t(s - 1)] == Tokenizer::kEosId)) ++s;
    if (s < n) split = s;  // val starts at a line start; otherwise keep the raw cut
  }
  r.train_tokens = split;
  r.val_tokens = n - split;

  report("write", fmt::format("writing {} train + {} val tokens", r.train_tokens, r.val_tokens), 0.9);
  const std::span<const int32_t> all(ids);
  write_token_file((dir / kTrainFile).string(), all.subspan(0, size_t(split)), r.vocab_size);
  write_token_file((dir / kValFile).string(), all.subspan(size_t(split)), r.vocab_size);

  r.seconds = elapsed();
  json meta = {
      {"format", kPrepareFormat},
      {"corpus", o.corpus},
      {"corpus_files", corpus.files},
      {"corpus_skipped", corpus.skipped},
      {"corpus_bytes", r.corpus_bytes},
      {"corpus_lines", corpus.lines},
      {"corpus_fnv1a64", r.corpus_hash},
      {"vocab_size", r.vocab_size},
      {"val_fraction", o.val_fraction},
      {"train_tokens", r.train_tokens},
      {"val_tokens", r.val_tokens},
      {"token_bytes", token_bytes_for_vocab(r.vocab_size)},
      {"tokenizer", {{"type", "sentencepiece-bpe"}, {"file", kTokenizerFile}, {"unk_id", Tokenizer::kUnkId},
                     {"bos_id", Tokenizer::kBosId}, {"eos_id", Tokenizer::kEosId}, {"newline", "eos"}}},
      {"split", "val = contiguous tail from a line start"},
      {"created_utc", now_iso8601()},
      {"seconds", r.seconds},
  };
  write_file_atomic((dir / kMetaFile).string(), meta.dump(2) + "\n");
  report("done",
         fmt::format("prepared '{}' in {:.1f}s: vocab {}, {} train + {} val tokens", o.out_dir, r.seconds,
                     r.vocab_size, r.train_tokens, r.val_tokens),
         1.0);
  return r;
}

}  // namespace brigade::data
