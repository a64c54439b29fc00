// Tokenizer: SentencePiece BPE behind a small API with the newline <-> EOS rule.
// See tokenizer.h for the conventions (ids, normalisation, strict encoding).
#include "brigade/data/text/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"
#include "brigade/data/text/corpus.h"

namespace brigade::data {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string serialized;
};

namespace {

// Feeds the non-empty lines of `text` to the trainer, chunking lines longer than
// `max_len` bytes at UTF-8 character boundaries (the trainer drops longer lines).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  LineIterator(std::string_view text, size_t max_len) : text_(text), max_len_(max_len) { Next(); }
  bool done() const override { return done_; }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }
  void Next() override {
    while (true) {
      if (line_.empty()) {
        if (pos_ >= text_.size()) {
          done_ = true;
          return;
        }
        size_t nl = text_.find('\n', pos_);
        size_t end = nl == std::string_view::npos ? text_.size() : nl;
        line_ = text_.substr(pos_, end - pos_);
        pos_ = end + 1;
        if (line_.empty()) continue;
      }
      size_t take = line_.size();
      if (take > max_len_) {
        take = max_len_;
        while (take > 0 && (static_cast<unsigned char>(line_[take]) & 0xC0) == 0x80) --take;
        if (take == 0) take = max_len_;
      }
      value_.assign(line_.substr(0, take));
      line_.remove_prefix(take);
      return;
    }
  }

 private:
  std::string_view text_;
  size_t max_len_;
  size_t pos_ = 0;
  std::string_view line_;
  std::string value_;
  bool done_ = false;
};

// Decodes UTF-8 leniently (invalid bytes become U+FFFD) — only used for messages.
std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = p[i];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > n) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void check_status(const sentencepiece::util::Status& st, const std::string& what) {
  BRIGADE_CHECK(st.ok(), DataError, "{}: SentencePiece error: {}", what, st.ToString());
}

}  // namespace

std::string describe_chars(const std::vector<char32_t>& chars) {
  std::string out;
  for (size_t i = 0; i < chars.size(); ++i) {
    if (i) out += ", ";
    char32_t cp = chars[i];
    std::string shown;
    switch (cp) {
      case '\t': shown = "\\t"; break;
      case '\r': shown = "\\r"; break;
      case '\n': shown = "\\n"; break;
      default: shown = (cp < 0x20 || cp == 0x7F) ? "?" : encode_utf8(cp);
    }
    out += fmt::format("'{}' (U+{:04X})", shown, uint32_t(cp));
  }
  return out;
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::train(std::string_view text, const TokenizerTrainOptions& opt) {
  BRIGADE_CHECK(opt.vocab_size >= 8 && opt.vocab_size <= (int64_t(1) << 30), DataError,
                "tokenizer vocab_size {} is out of range; use a value between 8 and 2^30 (model.vocab_size)",
                opt.vocab_size);
  BRIGADE_CHECK(opt.max_sentence_length >= 64, ValueError, "max_sentence_length {} is too small; use >= 64",
                opt.max_sentence_length);
  const std::unordered_map<std::string, std::string> kwargs = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "false"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"split_digits", "false"},
      {"max_sentence_length", std::to_string(opt.max_sentence_length)},
      {"input_sentence_size", "0"},  // use every line: no sampling
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},  // reproducible regardless of the machine
      {"hard_vocab_limit", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", "2"},  // quiet: errors come back as a Status
  };
  sentencepiece::SetRandomGeneratorSeed(opt.seed);
  LineIterator it(text, size_t(opt.max_sentence_length));
  BRIGADE_CHECK(!it.done(), DataError, "{} has no text to train a tokenizer on; check data.corpus", opt.origin);
  std::string proto;
  auto st = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, &proto);
  BRIGADE_CHECK(st.ok(), DataError,
                "cannot train a {}-token BPE tokenizer on {}: {}; lower model.vocab_size or use a larger corpus",
                opt.vocab_size, opt.origin, st.ToString());
  Tokenizer t;
  t.impl_ = std::make_unique<Impl>();
  check_status(t.impl_->sp.LoadFromSerializedProto(proto), "loading the freshly trained tokenizer");
  t.impl_->serialized = std::move(proto);
  return t;
}

Tokenizer Tokenizer::load(const std::string& path) {
  BRIGADE_CHECK(std::filesystem::is_regular_file(path), DataError,
                "tokenizer '{}' not found; run `brigade prepare` (or check data.dir)", path);
  std::ifstream in(path, std::ios::binary);
  BRIGADE_CHECK(in.good(), DataError, "tokenizer '{}' cannot be opened; check its permissions", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  Tokenizer t;
  t.impl_ = std::make_unique<Impl>();
  t.impl_->serialized = std::move(ss).str();
  auto st = t.impl_->sp.LoadFromSerializedProto(t.impl_->serialized);
  BRIGADE_CHECK(st.ok(), DataError,
                "tokenizer '{}' is not a valid SentencePiece model ({}); delete it and run `brigade prepare`", path,
                st.ToString());
  const auto& sp = t.impl_->sp;
  BRIGADE_CHECK(sp.unk_id() == kUnkId && sp.bos_id() == kBosId && sp.eos_id() == kEosId, DataError,
                "tokenizer '{}' uses unk/bos/eos ids {}/{}/{}, Brigade expects 0/1/2; rebuild it with `brigade "
                "prepare`",
                path, sp.unk_id(), sp.bos_id(), sp.eos_id());
  return t;
}

void Tokenizer::save(const std::string& path) const {
  BRIGADE_ASSERT(impl_, "save() on an empty Tokenizer");
  write_file_atomic(path, impl_->serialized);
}

int64_t Tokenizer::vocab_size() const {
  BRIGADE_ASSERT(impl_, "vocab_size() on an empty Tokenizer");
  return impl_->sp.GetPieceSize();
}

const std::string& Tokenizer::serialized() const {
  BRIGADE_ASSERT(impl_, "serialized() on an empty Tokenizer");
  return impl_->serialized;
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
  BRIGADE_ASSERT(impl_, "encode() on an empty Tokenizer");
  std::vector<int> out;
  out.reserve(text.size() / 3 + 1);
  std::vector<int> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? text.size() : nl;
    if (end > pos) {
      ids.clear();
      check_status(impl_->sp.Encode(text.substr(pos, end - pos), &ids), "encode");
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (nl == std::string_view::npos) break;
    out.push_back(kEosId);
    pos = nl + 1;
  }
  return out;
}

std::vector<char32_t> Tokenizer::unknown_chars(std::string_view text) const {
  BRIGADE_ASSERT(impl_, "unknown_chars() on an empty Tokenizer");
  std::vector<char32_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? text.size() : nl;
    if (end > pos) {
      auto spt = impl_->sp.EncodeAsImmutableProto(text.substr(pos, end - pos));
      for (const auto& piece : spt.pieces()) {
        if (int(piece.id()) != kUnkId) continue;
        for (char32_t cp : code_points(piece.surface())) {
          if (cp == ' ') continue;
          if (std::find(out.begin(), out.end(), cp) == out.end()) out.push_back(cp);
        }
      }
    }
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  return out;
}

std::vector<int> Tokenizer::encode_strict(std::string_view text, std::string_view what) const {
  std::vector<int> ids = encode(text);
  if (std::find(ids.begin(), ids.end(), kUnkId) != ids.end()) {
    auto unk = unknown_chars(text);
    throw DataError(fmt::format(
        "{} contains characters the tokenizer was not trained on: {}; use only characters from the training corpus",
        what, unk.empty() ? std::string("(unknown)") : describe_chars(unk)));
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int> ids) const {
  BRIGADE_ASSERT(impl_, "decode() on an empty Tokenizer");
  const int n = impl_->sp.GetPieceSize();
  std::string out;
  std::vector<int> line;
  std::string piece;
  auto flush = [&] {
    if (line.empty()) return;
    piece.clear();
    check_status(impl_->sp.Decode(line, &piece), "decode");
    out += piece;
    line.clear();
  };
  for (int id : ids) {
    BRIGADE_CHECK(id >= 0 && id < n, ValueError, "decode: token id {} is outside the vocabulary [0, {})", id, n);
    if (id == kEosId) {
      flush();
      out.push_back('\n');
    } else if (id != kBosId) {
      line.push_back(id);
    }
  }
  flush();
  return out;
}

std::string Tokenizer::id_to_piece(int id) const {
  BRIGADE_ASSERT(impl_, "id_to_piece() on an empty Tokenizer");
  BRIGADE_CHECK(id >= 0 && id < impl_->sp.GetPieceSize(), ValueError, "token id {} is outside the vocabulary [0, {})",
                id, impl_->sp.GetPieceSize());
  return impl_->sp.IdToPiece(id);
}

struct SentencePieceHf::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string path;
};

SentencePieceHf::SentencePieceHf() = default;
SentencePieceHf::~SentencePieceHf() = default;
SentencePieceHf::SentencePieceHf(SentencePieceHf&&) noexcept = default;
SentencePieceHf& SentencePieceHf::operator=(SentencePieceHf&&) noexcept = default;

SentencePieceHf SentencePieceHf::load(const std::string& path) {
  BRIGADE_CHECK(std::filesystem::is_regular_file(path), DataError,
                "SentencePiece model '{}' not found; check the path (a LLaMA checkpoint folder has tokenizer.model)",
                path);
  std::ifstream in(path, std::ios::binary);
  BRIGADE_CHECK(in.good(), DataError, "SentencePiece model '{}' cannot be opened; check its permissions", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  SentencePieceHf t;
  t.impl_ = std::make_unique<Impl>();
  t.impl_->path = path;
  auto st = t.impl_->sp.LoadFromSerializedProto(ss.str());
  BRIGADE_CHECK(st.ok(), DataError, "'{}' is not a valid SentencePiece model ({}); re-download tokenizer.model", path,
                st.ToString());
  return t;
}

std::vector<int> SentencePieceHf::encode(std::string_view text, bool add_bos, bool add_eos) const {
  BRIGADE_ASSERT(impl_, "encode() on an empty SentencePieceHf");
  const auto& sp = impl_->sp;
  BRIGADE_CHECK(!add_bos || sp.bos_id() >= 0, ValueError, "'{}' has no BOS token; encode with add_bos = false",
                impl_->path);
  BRIGADE_CHECK(!add_eos || sp.eos_id() >= 0, ValueError, "'{}' has no EOS token; encode with add_eos = false",
                impl_->path);
  std::vector<int> ids;
  check_status(sp.Encode(text, &ids), "encode with '" + impl_->path + "'");
  if (add_bos) ids.insert(ids.begin(), sp.bos_id());
  if (add_eos) ids.push_back(sp.eos_id());
  return ids;
}

std::string SentencePieceHf::decode(std::span<const int> ids) const {
  BRIGADE_ASSERT(impl_, "decode() on an empty SentencePieceHf");
  const int n = impl_->sp.GetPieceSize();
  for (int id : ids)
    BRIGADE_CHECK(id >= 0 && id < n, ValueError, "decode: token id {} is outside the vocabulary [0, {}) of '{}'", id, n,
                  impl_->path);
  std::string out;
  check_status(impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &out), "decode with '" + impl_->path + "'");
  return out;
}

int64_t SentencePieceHf::vocab_size() const {
  BRIGADE_ASSERT(impl_, "vocab_size() on an empty SentencePieceHf");
  return impl_->sp.GetPieceSize();
}
int SentencePieceHf::bos_id() const {
  BRIGADE_ASSERT(impl_, "bos_id() on an empty SentencePieceHf");
  return impl_->sp.bos_id();
}
int SentencePieceHf::eos_id() const {
  BRIGADE_ASSERT(impl_, "eos_id() on an empty SentencePieceHf");
  return impl_->sp.eos_id();
}
int SentencePieceHf::unk_id() const {
  BRIGADE_ASSERT(impl_, "unk_id() on an empty SentencePieceHf");
  return impl_->sp.unk_id();
}
std::string SentencePieceHf::id_to_piece(int id) const {
  BRIGADE_ASSERT(impl_, "id_to_piece() on an empty SentencePieceHf");
  BRIGADE_CHECK(id >= 0 && id < impl_->sp.GetPieceSize(), ValueError, "token id {} is outside the vocabulary [0, {})",
                id, impl_->sp.GetPieceSize());
  return impl_->sp.IdToPiece(id);
}
int SentencePieceHf::piece_to_id(std::string_view piece) const {
  BRIGADE_ASSERT(impl_, "piece_to_id() on an empty SentencePieceHf");
  return impl_->sp.PieceToId(piece);
}

}  // namespace brigade::data
