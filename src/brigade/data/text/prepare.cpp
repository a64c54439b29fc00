// prepare(): the data pipeline behind `brigade prepare` (contract in prepare.h).
// Encoding runs line-chunked across OpenMP threads; the result does not depend on
// the thread count because every line is encoded independently.
#include "brigade/data/text/prepare.h"

#include <omp.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"
#include "brigade/data/text/corpus.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/data/text/token_file.h"
#include "brigade/data/text/tokenizer.h"

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

// The tokenizer training settings prepare() uses for `o` (recorded in meta.json as
// "tokenizer_train" and compared by check_prepared, so a build that trains the
// tokenizer differently prepares again).
TokenizerTrainOptions tokenizer_options(const PrepareOptions& o) {
  TokenizerTrainOptions t;
  t.vocab_size = o.vocab_size;
  t.origin = fmt::format("corpus '{}'", o.corpus);
  return t;
}

// What makes the tokenizer: the training settings, or the given model file's content (size and
// hash: another tokenizer prepares again; a copy of the same one elsewhere does not).
json tokenizer_train_json(const TokenizerTrainOptions& t, const std::string& given = "") {
  if (!given.empty()) {
    const std::unique_ptr<TextTokenizer> tok = load_text_tokenizer(given);
    std::string bytes;
    for (const auto& [name, content] : tokenizer_contents(*tok)) bytes += name + '\0' + content + '\0';
    return {{"algorithm", "given"},
            {"kind", tok->kind()},
            {"bytes", int64_t(bytes.size())},
            {"fnv1a64", fnv1a64_hex(bytes)}};
  }
  return {{"algorithm", "sentencepiece-bpe"},
          {"vocab_size", t.vocab_size},
          {"max_sentence_length", t.max_sentence_length},
          {"seed", t.seed}};
}

// The corpus source's identity and file metadata, taken before the corpus is read (so
// an edit racing with prepare() is seen as a change next time):
//   {"kind": "kjv" | "file" | "folder", "path": absolute path (not for kjv),
//    "files": [{"path", "bytes", "mtime_ns", "ctime_ns", "inode"}, ...]}
// ctime and inode catch a file replaced with one of the same size and mtime (cp -p, rsync -t).
struct Source {
  json j;
  bool available = true;  // false: the corpus does not exist (any more) or cannot be listed
  std::string error;      // why, when !available
};

std::string abs_path(const std::string& spec) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(spec), ec);
  return (ec ? fs::path(spec) : p).lexically_normal().string();
}

Source corpus_source(const std::string& spec) {
  Source s;
  s.j = json::object();
  std::error_code ec;
  if (spec == "kjv") {
    s.j["kind"] = "kjv";
  } else {
    s.j["kind"] = fs::is_directory(spec, ec) ? "folder" : "file";
    s.j["path"] = abs_path(spec);
  }
  json files = json::array();
  try {
    for (const std::string& f : corpus_source_files(spec)) {
      struct stat st {};
      if (::stat(f.c_str(), &st) != 0) continue;  // vanished while listing: it is not part of the corpus
      files.push_back({{"path", f},
                       {"bytes", int64_t(st.st_size)},
                       {"mtime_ns", int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec},
                       {"ctime_ns", int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec},
                       {"inode", uint64_t(st.st_ino)}});
    }
  } catch (const DataError& e) {
    s.available = false;
    s.error = e.what();
  }
  if (spec == "kjv" && files.empty()) {
    s.available = false;
    s.error = "bible-kjv is not installed";
  }
  s.j["files"] = std::move(files);
  return s;
}

// "2024-05-01 10:00:00.123Z" from nanoseconds since the epoch.
std::string fmt_mtime(int64_t ns) {
  std::time_t t = std::time_t(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{}.{:03}Z", buf, (ns / 1000000) % 1000);
}

std::string describe_file(const json& f) {
  return fmt::format("{} bytes, modified {}", f.at("bytes").get<int64_t>(), fmt_mtime(f.at("mtime_ns").get<int64_t>()));
}

// "" when the recorded and current file lists agree, else what changed (one line).
std::string source_files_change(const std::string& dir, const json& then_src, const json& now_src) {
  std::map<std::string, json> then, now;
  for (const auto& f : then_src.at("files")) then[f.at("path").get<std::string>()] = f;
  for (const auto& f : now_src.at("files")) now[f.at("path").get<std::string>()] = f;
  std::vector<std::string> added, removed, changed;
  for (const auto& [p, f] : now)
    if (!then.count(p)) added.push_back(p);
  for (const auto& [p, f] : then) {
    auto it = now.find(p);
    if (it == now.end())
      removed.push_back(p);
    else if (it->second != f)
      changed.push_back(p);
  }
  if (added.empty() && removed.empty() && changed.empty()) return "";
  const std::string kind = now_src.value("kind", "");
  if (added.empty() && removed.empty() && changed.size() == 1) {
    const json &a = then.at(changed[0]), &b = now.at(changed[0]);
    const bool same_shape = a.at("bytes") == b.at("bytes") && a.at("mtime_ns") == b.at("mtime_ns");
    return fmt::format("{} changed since {} was prepared ({} then; {} now{})", changed[0], dir, describe_file(a),
                       describe_file(b), same_shape ? ", but it was replaced or its inode metadata changed" : "");
  }
  std::vector<std::string> parts;
  auto part = [&](const std::vector<std::string>& v, const char* what) {
    if (!v.empty()) parts.push_back(fmt::format("{} {} (e.g. {})", v.size(), what, v.front()));
  };
  part(added, "file(s) added");
  part(removed, "file(s) removed");
  part(changed, "file(s) changed");
  std::string joined;
  for (const auto& x : parts) joined += (joined.empty() ? "" : ", ") + x;
  if (kind == "kjv") return fmt::format("the bible-kjv data changed since {} was prepared: {}", dir, joined);
  return fmt::format("corpus {} changed since {} was prepared: {}", now_src.value("path", ""), dir, joined);
}

// Encodes the corpus, in parallel, concatenated in order. A tokenizer that encodes line by line
// gets chunks of whole lines; any other gets one call per document (a file of the corpus), each
// as document_prefix() + encode(text) + document_suffix().
std::vector<int32_t> encode_corpus(const TextTokenizer& tok, const Corpus& corpus) {
  const std::string_view text = corpus.text;
  std::vector<std::string_view> chunks;
  if (tok.line_separable()) {
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
  } else {
    for (size_t i = 0; i < corpus.file_starts.size(); ++i) {
      const size_t b = corpus.file_starts[i],
                   e = i + 1 < corpus.file_starts.size() ? corpus.file_starts[i + 1] : text.size();
      if (e > b) chunks.push_back(text.substr(b, e - b));
    }
  }
  const std::vector<int> prefix = tok.line_separable() ? std::vector<int>{} : tok.document_prefix(),
                         suffix = tok.line_separable() ? std::vector<int>{} : tok.document_suffix();
  std::vector<std::vector<int>> parts(chunks.size());
  std::string first_error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < int64_t(chunks.size()); ++i) {
    try {
      std::vector<int> ids = tok.encode(chunks[size_t(i)]);
      ids.insert(ids.begin(), prefix.begin(), prefix.end());
      ids.insert(ids.end(), suffix.begin(), suffix.end());
      parts[size_t(i)] = std::move(ids);
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
// `m` receives the parsed meta.json.
bool up_to_date(const fs::path& dir, const PrepareOptions& o, const std::string& hash, int64_t bytes, PrepareResult& r,
                json& m) {
  try {
    std::ifstream in(dir / kMetaFile);
    if (!in.good()) return false;
    m = json::parse(in);
    if (m.value("format", 0) != kPrepareFormat || m.value("corpus", "") != o.corpus ||
        m.value("corpus_fnv1a64", "") != hash || m.value("corpus_bytes", int64_t(-1)) != bytes ||
        m.value("vocab_size", int64_t(-1)) != o.vocab_size || m.value("val_fraction", -1.0) != o.val_fraction ||
        m.value("tokenizer_train", json()) != tokenizer_train_json(tokenizer_options(o), o.tokenizer))
      return false;
    if (detect_tokenizer(dir.string()).empty()) return false;
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
  const json source = corpus_source(o.corpus).j;  // before reading: an edit during the read shows next time
  Corpus corpus = read_corpus(o.corpus, [&](const std::string& w) { report("warning", w, 0.0); });
  r.corpus_bytes = int64_t(corpus.text.size());
  r.corpus_hash = fnv1a64_hex(corpus.text);
  report("corpus",
         fmt::format("read {} bytes, {} lines{}", r.corpus_bytes, corpus.lines,
                     corpus.files.empty() ? "" : fmt::format(" from {} file(s)", corpus.files.size())),
         0.05);

  json old_meta;
  if (!o.force && up_to_date(dir, o, r.corpus_hash, r.corpus_bytes, r, old_meta)) {
    r.skipped = true;
    if (old_meta.value("corpus_source", json()) != source) {
      // Same text, other file metadata (touched, copied, moved): record the new metadata so the
      // next check_prepared() needs no read. The token files stay as they are.
      old_meta["corpus_source"] = source;
      old_meta["refreshed_utc"] = now_iso8601();
      write_file_atomic((dir / kMetaFile).string(), old_meta.dump(2) + "\n");
      report("skip",
             fmt::format("the corpus text is unchanged (FNV-1a {}); kept the token files and updated {}", r.corpus_hash,
                         (dir / kMetaFile).string()),
             1.0);
    }
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

  const TokenizerTrainOptions topt = tokenizer_options(o);
  std::unique_ptr<TextTokenizer> tok;
  if (!o.tokenizer.empty()) {
    tok = load_text_tokenizer(o.tokenizer);
    report("tokenizer", fmt::format("encoding with the given {} tokenizer of {}", tok->kind(), o.tokenizer), 0.1);
    // A pretrained model's embedding may have more rows than its tokenizer has tokens (padding).
    const bool ok = tok->kind() == "brigade" ? tok->vocab_size() == o.vocab_size : tok->vocab_size() <= o.vocab_size;
    BRIGADE_CHECK(ok, DataError,
                  "prepare: the tokenizer of {} has {} tokens but the model's vocabulary is {}; use the model's own "
                  "tokenizer",
                  o.tokenizer, tok->vocab_size(), o.vocab_size);
    copy_tokenizer(*tok, o.out_dir);
  } else {
    report("tokenizer", fmt::format("training a {}-token BPE tokenizer", o.vocab_size), 0.1);
    Tokenizer trained = Tokenizer::train(corpus.text, topt);
    report("tokenizer", fmt::format("tokenizer trained in {:.1f}s", elapsed()), 0.5);
    trained.save((dir / kTokenizerFile).string());
    tok = brigade_tokenizer(std::move(trained), o.out_dir);
  }
  r.vocab_size = o.vocab_size;

  report("encode", "encoding the corpus", 0.5);
  std::vector<int32_t> ids = encode_corpus(*tok, corpus);
  const int64_t n = int64_t(ids.size());
  report("encode", fmt::format("{} tokens ({:.2f} bytes/token)", n, n ? double(r.corpus_bytes) / double(n) : 0.0),
         0.85);

  int64_t split = n - int64_t(std::llround(o.val_fraction * double(n)));
  if (split < n) {
    int64_t s = split;
    // after a token whose text ends a line (this engine's EOS, GPT-2's "\n", a <0x0A> byte)
    auto ends_line = [&](int32_t id) {
      const int v = int(id);
      const std::string t = tok->decode(std::span<const int>(&v, 1));
      return !t.empty() && t.back() == '\n';
    };
    while (s < n && !(s > 0 && ends_line(ids[size_t(s - 1)]))) ++s;
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
      {"corpus_source", source},
      {"vocab_size", r.vocab_size},
      {"val_fraction", o.val_fraction},
      {"train_tokens", r.train_tokens},
      {"val_tokens", r.val_tokens},
      {"token_bytes", token_bytes_for_vocab(r.vocab_size)},
      {"tokenizer", tok->kind() == "brigade" ? json{{"type", "sentencepiece-bpe"},
                                                    {"file", kTokenizerFile},
                                                    {"unk_id", Tokenizer::kUnkId},
                                                    {"bos_id", Tokenizer::kBosId},
                                                    {"eos_id", Tokenizer::kEosId},
                                                    {"newline", "eos"}}
                                             : json{{"type", tok->kind()},
                                                    {"files", tok->files()},
                                                    {"tokens", tok->vocab_size()},
                                                    {"document_prefix", tok->document_prefix()},
                                                    {"document_suffix", tok->document_suffix()}}},
      {"tokenizer_train", tokenizer_train_json(topt, o.tokenizer)},
      {"split", "val = contiguous tail from a line start"},
      {"created_utc", now_iso8601()},
      {"seconds", r.seconds},
  };
  write_file_atomic((dir / kMetaFile).string(), meta.dump(2) + "\n");
  report("done",
         fmt::format("prepared '{}' in {:.1f}s: vocab {}, {} train + {} val tokens", o.out_dir, r.seconds, r.vocab_size,
                     r.train_tokens, r.val_tokens),
         1.0);
  return r;
}

namespace {

// Names prepare() writes into a folder before meta.json (its AtomicFile temporaries too).
bool is_prepare_output(const std::string& name) {
  for (const char* own : {kTokenizerFile, kTrainFile, kValFile, kMetaFile, kTokenizerMarker, "vocab.json", "merges.txt",
                          "tokenizer.json", "tokenizer_config.json"}) {
    const std::string o(own);
    if (name == o || name.rfind(o + ".tmp.", 0) == 0) return true;
  }
  return false;
}

// The corpus as the recipe names it, with its absolute path when that tells two equal
// spellings apart ("x.txt (/a/x.txt)").
std::string corpus_shown(const std::string& spec, const std::string& path, bool with_path) {
  return with_path && spec != "kjv" ? fmt::format("{} ({})", spec, path) : spec;
}

json read_meta(const fs::path& meta_path, const std::string& dir) {
  std::ifstream in(meta_path);
  BRIGADE_CHECK(in.good(), DataError,
                "data folder {}: {} cannot be read; check its permissions, or remove the folder so it is "
                "prepared again",
                dir, meta_path.string());
  json m;
  try {
    m = json::parse(in);
  } catch (const json::exception& e) {
    throw DataError(
        fmt::format("data folder {}: {} is corrupted ({}); run `brigade prepare` with this recipe to "
                    "rebuild it, or remove the folder",
                    dir, meta_path.string(), e.what()));
  }
  BRIGADE_CHECK(m.is_object(), DataError,
                "data folder {}: {} is not a JSON object; run `brigade prepare` with this recipe to rebuild it, or "
                "remove the folder",
                dir, meta_path.string());
  return m;
}

}  // namespace

PreparedStatus check_prepared(const PrepareOptions& o) {
  using State = PreparedStatus::State;
  const std::string& dir_s = o.out_dir;
  const fs::path dir(o.out_dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return {State::kMissing, fmt::format("{} is not prepared yet", dir_s)};
  BRIGADE_CHECK(fs::is_directory(dir, ec), DataError,
                "data.dir {} is a file, not a folder; point data.dir at a folder (it is created when missing)", dir_s);
  const fs::path meta_path = dir / kMetaFile;
  if (!fs::exists(meta_path, ec)) {
    std::string foreign;
    bool empty = true;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      empty = false;
      const std::string name = e.path().filename().string();
      if (!is_prepare_output(name)) {
        foreign = name;
        break;
      }
    }
    BRIGADE_CHECK(!ec, DataError, "data folder {} cannot be listed ({}); check its permissions", dir_s, ec.message());
    if (empty) return {State::kMissing, fmt::format("{} is empty", dir_s)};
    BRIGADE_CHECK(foreign.empty(), DataError,
                  "data folder {} holds files (e.g. {}) but no {}, so `brigade prepare` did not make it; point "
                  "data.dir at a new or empty folder, or remove {}",
                  dir_s, foreign, kMetaFile, dir_s);
    return {State::kMissing, fmt::format("{} holds no {}, only the files of an unfinished prepare", dir_s, kMetaFile)};
  }

  const json m = read_meta(meta_path, dir_s);
  try {
    const int format = m.contains("format") && m.at("format").is_number_integer() ? m.at("format").get<int>() : 0;
    BRIGADE_CHECK(format <= kPrepareFormat, DataError,
                  "data folder {} was prepared by a newer Brigade ({} format {}, this build reads {}); use that "
                  "build, or point data.dir at another folder",
                  dir_s, kMetaFile, format, kPrepareFormat);
    if (format < kPrepareFormat)
      return {State::kStale,
              fmt::format("{} was prepared by an older Brigade ({} format {}, now {}) that did not record its "
                          "corpus files and tokenizer settings, so it may not match the recipe",
                          dir_s, kMetaFile, format, kPrepareFormat)};

    const std::string then_corpus = m.at("corpus").get<std::string>();
    const json& then_src = m.at("corpus_source");
    const Source now = corpus_source(o.corpus);
    const std::string then_kind = then_src.at("kind").get<std::string>();
    const std::string now_kind = now.j.at("kind").get<std::string>();
    const std::string then_path = then_src.value("path", "");
    const std::string now_path = now.j.value("path", "");
    const bool same_corpus = (then_kind == "kjv" || now_kind == "kjv") ? then_kind == now_kind : then_path == now_path;
    if (!same_corpus) {
      const bool paths = then_corpus == o.corpus;  // same spelling, another folder: show where
      return {State::kStale,
              fmt::format("{} was prepared from {}, the recipe asks for {}", dir_s,
                          corpus_shown(then_corpus, then_path, paths), corpus_shown(o.corpus, now_path, paths))};
    }
    const int64_t then_vocab = m.at("vocab_size").get<int64_t>();
    if (then_vocab != o.vocab_size)
      return {State::kStale, fmt::format("{} was prepared with vocab_size {}, the recipe asks for {}", dir_s,
                                         then_vocab, o.vocab_size)};
    const double then_val = m.at("val_fraction").get<double>();
    if (then_val != o.val_fraction)
      return {State::kStale, fmt::format("{} was prepared with val_fraction {}, the recipe asks for {}", dir_s,
                                         then_val, o.val_fraction)};
    const json then_tok = m.at("tokenizer_train"), now_tok = tokenizer_train_json(tokenizer_options(o), o.tokenizer);
    if (then_tok != now_tok)
      return {State::kStale, fmt::format("{}'s tokenizer was made with {}, the recipe asks for {}", dir_s,
                                         then_tok.dump(), now_tok.dump())};
    for (const char* f : {kTrainFile, kValFile})
      if (!fs::is_regular_file(dir / f, ec)) return {State::kStale, fmt::format("{} is missing", (dir / f).string())};
    if (detect_tokenizer(dir_s).empty()) return {State::kStale, fmt::format("{} has no tokenizer any more", dir_s)};
    if (!now.available)  // the data is still what the recipe asks for; only its source is gone
      return {State::kUpToDate, fmt::format("the corpus {} cannot be read any more ({}); using {} as it was "
                                            "prepared from it",
                                            o.corpus, now.error, dir_s)};
    const std::string change = source_files_change(dir_s, then_src, now.j);
    if (!change.empty()) return {State::kStale, change};
    return {State::kUpToDate, ""};
  } catch (const json::exception& e) {
    throw DataError(
        fmt::format("data folder {}: {} lacks a field or has one of the wrong type ({}); run `brigade "
                    "prepare` with this recipe to rebuild it, or remove the folder",
                    dir_s, meta_path.string(), e.what()));
  }
}

PrepareResult ensure_prepared(const PrepareOptions& o, const PrepareProgressFn& progress) {
  auto report = [&](const char* stage, std::string msg, double frac) {
    if (progress) progress(PrepareProgress{stage, std::move(msg), frac});
  };
  const auto t0 = std::chrono::steady_clock::now();
  const PreparedStatus st = check_prepared(o);
  if (st.state == PreparedStatus::State::kUpToDate) {
    if (!st.reason.empty()) report("warning", st.reason, 0.0);
    const json m = read_meta(fs::path(o.out_dir) / kMetaFile, o.out_dir);
    PrepareResult r;
    r.skipped = true;
    r.out_dir = o.out_dir;
    r.vocab_size = m.value("vocab_size", int64_t(0));
    r.train_tokens = m.value("train_tokens", int64_t(0));
    r.val_tokens = m.value("val_tokens", int64_t(0));
    r.corpus_bytes = m.value("corpus_bytes", int64_t(0));
    r.corpus_hash = m.value("corpus_fnv1a64", "");
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report("skip",
           fmt::format("{} is up to date (prepared from {}: {} train + {} val tokens, vocab {})", o.out_dir,
                       m.value("corpus", o.corpus), r.train_tokens, r.val_tokens, r.vocab_size),
           1.0);
    return r;
  }
  report("stale",
         st.state == PreparedStatus::State::kMissing ? fmt::format("{}: preparing it from {}", st.reason, o.corpus)
                                                     : st.reason + ": preparing again",
         0.0);
  PrepareResult r = prepare(o, progress);
  r.reason = st.reason;
  return r;
}

}  // namespace brigade::data
