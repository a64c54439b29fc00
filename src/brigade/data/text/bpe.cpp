// Byte-level BPE (GPT-2, Hugging Face tokenizers): loading, pre-tokenization with PCRE2,
// merges by rank, special tokens. See bpe.h for the contract and docs/tokenizers.md.
#include "brigade/data/text/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "brigade/core/error.h"
#include "brigade/data/text/corpus.h"

namespace brigade::data {

namespace {

using json = nlohmann::json;

// ---- bytes_to_unicode ------------------------------------------------------------------

// GPT-2's table: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves,
// the other 68 bytes take code points 256, 257, ... in byte order.
struct ByteMap {
  char32_t to_cp[256];
  std::string to_utf8[256];
  int from_cp[512];  // code point -> byte, -1 when the code point stands for no byte
  ByteMap() {
    std::fill(std::begin(from_cp), std::end(from_cp), -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? char32_t(b) : char32_t(256 + n++);
      from_cp[to_cp[b]] = b;
      to_utf8[b] = encode_utf8(to_cp[b]);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when s[i] does not start
// one (stray continuation byte, overlong form, surrogate, > U+10FFFF, truncated sequence).
size_t utf8_seq_len(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char c = p[i];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else
    return 0;
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((p[i + k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (p[i + k] & 0x3F);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return 0;
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// Decodes one UTF-8 character of a vocabulary token (tokens come from JSON, so valid UTF-8).
char32_t next_cp(std::string_view s, size_t& i) {
  size_t len = utf8_seq_len(s, i);
  if (len == 0) {  // cannot happen for JSON strings; keep the byte as itself
    return char32_t(static_cast<unsigned char>(s[i++])) | 0x80000000u;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  char32_t cp = len == 1 ? p[0] : len == 2 ? (p[0] & 0x1F) : len == 3 ? (p[0] & 0x0F) : (p[0] & 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[k] & 0x3F);
  i += len;
  return cp;
}

// ---- PCRE2 ---------------------------------------------------------------------------------

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<char*>(buf), size_t(n));
}

// A compiled pattern: UTF + UCP (\s, \p{L}, ... by Unicode properties), JIT-compiled when the
// library supports it. Matching creates its own match data, so one Regex serves many threads.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code* c =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
    BRIGADE_CHECK(c != nullptr, DataError, "{}: the regex '{}' does not compile (PCRE2, at offset {}: {})", where,
                  pattern, size_t(off), pcre2_message(err));
    code_.reset(c);
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // optional speed-up; interpretation is the fallback
  }

  // Appends the pieces of `s` (valid UTF-8) to `out` with tokenizers' "Isolated" behaviour:
  // every match is a piece and so is every non-empty stretch between matches.
  template <class Emit>
  void split(std::string_view s, Emit&& emit) const {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    BRIGADE_CHECK(md != nullptr, IoError, "out of memory creating PCRE2 match data");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0, last = 0;
    while (pos <= s.size()) {
      int rc = pcre2_match(code_.get(), subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // e.g. the JIT stack limit: retry interpreted
        rc = pcre2_match(code_.get(), subject, s.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      BRIGADE_CHECK(rc >= 0, ValueError, "pre-tokenizer regex '{}' failed on a {}-byte text: {}", pattern_, s.size(),
                    pcre2_message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match splits nothing: step over one character
        if (b >= s.size()) break;
        pos = b + std::max<size_t>(1, utf8_seq_len(s, b));
        continue;
      }
      if (b > last) emit(s.substr(last, b - last));
      emit(s.substr(b, e - b));
      last = pos = e;
    }
    if (last < s.size()) emit(s.substr(last));
  }
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

// ---- files and JSON ------------------------------------------------------------------------

std::string read_whole(const std::string& path, const char* what) {
  BRIGADE_CHECK(std::filesystem::is_regular_file(path), DataError,
                "{} '{}' not found; check the path (a Hugging Face tokenizer folder has vocab.json, merges.txt or "
                "tokenizer.json)",
                what, path);
  std::ifstream in(path, std::ios::binary);
  BRIGADE_CHECK(in.good(), DataError, "{} '{}' cannot be opened; check its permissions", what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  BRIGADE_CHECK(!in.bad(), DataError, "{} '{}' could not be read", what, path);
  return std::move(ss).str();
}

json parse_json(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("'{}' is not valid JSON ({}); re-download or regenerate it", path, e.what()));
  }
}

std::string type_name(const json& j) { return j.type_name(); }

constexpr int64_t kMaxTokenId = int64_t(1) << 24;  // ids are below this (add_token)

// A string as a JSON literal for messages; bytes that are not UTF-8 (a merges.txt line) are shown
// as U+FFFD rather than making json::dump throw.
std::string quote(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string gpt2_byte_to_unicode(unsigned char b) { return byte_map().to_utf8[b]; }

// ---- the tokenizer -------------------------------------------------------------------------

struct ByteLevelBpe::Impl {
  std::string origin;  // the file(s) it came from, for messages

  std::unordered_map<std::string, int> vocab;  // the model's tokens (byte-mapped) -> id
  std::unordered_map<std::string, int> extra;  // added tokens outside the model's vocabulary -> id
  std::vector<std::string> tokens;             // id -> token ("" where no token has the id)
  std::vector<char> has_token;                 // id -> whether it names a token
  int byte_id[256] = {};                       // id of each single-byte token
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int, int>> merges;
  bool ignore_merges = false;

  struct Added {
    std::string content;
    int id;
    bool special;
  };
  std::vector<Added> added;  // longest content first (leftmost-longest matching)
  std::unordered_map<int, size_t> added_by_id;
  bool added_first_byte[256] = {};  // whether some added token starts with the byte

  // Pre-tokenizer steps before the byte mapping: each splits every piece further.
  struct Step {
    std::unique_ptr<Regex> regex;  // null: no split
    bool add_prefix_space = false;
  };
  std::vector<Step> steps;

  std::vector<int> prefix_ids, suffix_ids;  // post-processor (add_special_tokens)

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int>> cache;  // pre-token bytes -> ids
  static constexpr size_t kCacheMax = 1 << 18;

  // A model token (`model` true: merges and ignore_merges see it) or an added token outside the
  // model's vocabulary (LLaMA-3's specials), which only added-token matching produces.
  void add_token(const std::string& tok, int64_t id, const std::string& where, bool model = true) {
    // id -> token is a dense table, so an id is capped well below what would exhaust memory
    // (2^24 = 16.7M, 64 times the largest published vocabularies; the 2^30 of before meant a 32 GiB table)
    BRIGADE_CHECK(id >= 0 && id < kMaxTokenId, DataError,
                  "{}: token {} has id {}, outside [0, 2^24); a vocabulary's ids count from 0 with no large gaps",
                  where, quote(tok), id);
    auto [it, fresh] = (model ? vocab : extra).emplace(tok, int(id));
    BRIGADE_CHECK(fresh, DataError, "{}: token {} appears twice", where, quote(tok));
    if (size_t(id) >= tokens.size()) {
      tokens.resize(size_t(id) + 1);
      has_token.resize(size_t(id) + 1, 0);
    }
    BRIGADE_CHECK(!has_token[size_t(id)], DataError, "{}: id {} is given to both {} and {}; ids must be unique", where,
                  id, quote(tokens[size_t(id)]), quote(tok));
    tokens[size_t(id)] = tok;
    has_token[size_t(id)] = 1;
  }

  void finish_vocab(const std::string& where) {
    const ByteMap& bm = byte_map();
    for (int b = 0; b < 256; ++b) {
      auto it = vocab.find(bm.to_utf8[b]);
      BRIGADE_CHECK(it != vocab.end(), DataError,
                    "{}: the vocabulary lacks the byte-level token {} for byte 0x{:02X}; a byte-level BPE "
                    "vocabulary must hold all 256 (is this a byte-level tokenizer?)",
                    where, quote(bm.to_utf8[b]), b);
      byte_id[b] = it->second;
    }
  }

  // Merge number `rank` "a b"; `where` locates it ("merges.txt:12", "tokenizer.json: model.merges[11]").
  void add_merge(const std::string& a, const std::string& b, int rank, const std::string& where) {
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    BRIGADE_CHECK(ia != vocab.end(), DataError, "{}: merge part {} is not in the vocabulary", where, quote(a));
    BRIGADE_CHECK(ib != vocab.end(), DataError, "{}: merge part {} is not in the vocabulary", where, quote(b));
    BRIGADE_CHECK(iab != vocab.end(), DataError, "{}: the merge result {} is not in the vocabulary", where,
                  quote(a + b));
    // A repeated pair takes its last rank, as GPT-2's dict(zip(merges, range(...))) does.
    merges[(uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second)] = {rank, iab->second};
  }

  void add_added(const std::string& content, int id, bool special, const std::string& where) {
    BRIGADE_CHECK(!content.empty(), DataError, "{}: an added token has empty content", where);
    added_by_id[id] = added.size();
    added.push_back({content, id, special});
  }

  void finish_added() {
    std::stable_sort(added.begin(), added.end(),
                     [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
    added_by_id.clear();
    for (size_t i = 0; i < added.size(); ++i) {
      added_by_id[added[i].id] = i;
      added_first_byte[static_cast<unsigned char>(added[i].content[0])] = true;
    }
  }

  // GPT-2's bpe(): merge the adjacent pair of lowest rank, every occurrence left to right,
  // until no adjacent pair is a merge.
  void bpe(std::string_view bytes, std::vector<int>& out) const {
    std::vector<int> w;
    w.reserve(bytes.size());
    for (unsigned char c : bytes) w.push_back(byte_id[c]);
    std::vector<int> next;
    while (w.size() > 1) {
      int best_rank = INT_MAX, best_left = 0, best_right = 0, best_id = 0;
      for (size_t i = 0; i + 1 < w.size(); ++i) {
        auto it = merges.find((uint64_t(uint32_t(w[i])) << 32) | uint32_t(w[i + 1]));
        if (it != merges.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          best_id = it->second.second;
          best_left = w[i];
          best_right = w[i + 1];
        }
      }
      if (best_rank == INT_MAX) break;
      next.clear();
      for (size_t i = 0; i < w.size();) {
        if (i + 1 < w.size() && w[i] == best_left && w[i + 1] == best_right) {
          next.push_back(best_id);
          i += 2;
        } else {
          next.push_back(w[i++]);
        }
      }
      w.swap(next);
    }
    out.insert(out.end(), w.begin(), w.end());
  }

  void encode_pretoken(std::string_view bytes, std::vector<int>& out) const {
    if (ignore_merges) {  // tokenizers: a pre-token that is itself a token is emitted whole
      std::string mapped;
      for (unsigned char c : bytes) mapped += byte_map().to_utf8[c];
      auto it = vocab.find(mapped);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::string key(bytes);
    {
      std::lock_guard<std::mutex> lock(cache_mu);
      auto it = cache.find(key);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int> ids;
    bpe(bytes, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kCacheMax) cache.clear();
    cache.emplace(std::move(key), std::move(ids));
  }

  // One stretch of text between added tokens: pre-tokenize, then BPE each pre-token.
  void encode_segment(std::string_view seg, std::vector<int>& out) const {
    // A piece is text still to be split by the steps (valid UTF-8), or a raw invalid byte,
    // which no step touches. `after_raw`: the piece continues the text right after an invalid
    // byte, so add_prefix_space (meant for the start of a stretch) leaves it alone.
    struct Piece {
      std::string text;
      bool raw;
      bool after_raw = false;
    };
    std::vector<Piece> pieces, next;
    for (size_t i = 0, run = 0; i <= seg.size();) {
      const size_t len = i < seg.size() ? utf8_seq_len(seg, i) : 0;
      if (len > 0) {
        i += len;
        continue;
      }
      if (i > run) pieces.push_back({std::string(seg.substr(run, i - run)), false, run > 0});
      if (i == seg.size()) break;
      pieces.push_back({std::string(1, seg[i]), true, run > 0});
      run = ++i;
    }
    for (const Step& st : steps) {
      next.clear();
      for (Piece& p : pieces) {
        if (p.raw) {
          next.push_back(std::move(p));
          continue;
        }
        if (st.add_prefix_space && !p.after_raw && (p.text.empty() || p.text[0] != ' '))
          p.text.insert(p.text.begin(), ' ');
        if (!st.regex) {
          next.push_back(std::move(p));
          continue;
        }
        bool first = true;
        st.regex->split(p.text, [&](std::string_view s) {
          next.push_back({std::string(s), false, first && p.after_raw});
          first = false;
        });
      }
      pieces.swap(next);
    }
    for (const Piece& p : pieces)
      if (!p.text.empty()) encode_pretoken(p.text, out);
  }
};

ByteLevelBpe::ByteLevelBpe() = default;
ByteLevelBpe::~ByteLevelBpe() = default;
ByteLevelBpe::ByteLevelBpe(ByteLevelBpe&&) noexcept = default;
ByteLevelBpe& ByteLevelBpe::operator=(ByteLevelBpe&&) noexcept = default;

ByteLevelBpe ByteLevelBpe::from_gpt2_files(const std::string& vocab_json, const std::string& merges_txt,
                                           std::optional<std::vector<std::string>> special_tokens) {
  ByteLevelBpe t;
  t.impl_ = std::make_unique<Impl>();
  Impl& m = *t.impl_;
  m.origin = vocab_json + " + " + merges_txt;

  const json v = parse_json(read_whole(vocab_json, "vocabulary"), vocab_json);
  BRIGADE_CHECK(v.is_object(), DataError, "'{}' must be a JSON object mapping token -> id, found {}", vocab_json,
                type_name(v));
  for (const auto& [tok, id] : v.items()) {
    BRIGADE_CHECK(id.is_number_integer(), DataError, "'{}': the id of token {} is {} ({}), not an integer", vocab_json,
                  quote(tok), id.dump(), type_name(id));
    m.add_token(tok, id.get<int64_t>(), "'" + vocab_json + "'");
  }
  m.finish_vocab("'" + vocab_json + "'");

  const std::string text = read_whole(merges_txt, "merges file");
  size_t pos = 0;
  int line_no = 0, rank = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl;
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;  // the trailing newline, blank lines
    const std::string where = fmt::format("'{}' line {}", merges_txt, line_no);
    const size_t sp = line.find(' ');
    BRIGADE_CHECK(
        sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
        DataError, "{}: expected two tokens separated by one space (\"a b\"), found {}", where, quote(line));
    m.add_merge(line.substr(0, sp), line.substr(sp + 1), rank++, where);
  }

  // GPT-2's pre-tokenizer; <|endoftext|> (or the caller's list) as special tokens.
  m.steps.push_back({std::make_unique<Regex>(kGpt2Pattern, false, "GPT-2 pattern"), false});
  std::vector<std::string> specials;
  if (special_tokens) {
    specials = *special_tokens;
  } else if (m.vocab.count("<|endoftext|>")) {
    specials = {"<|endoftext|>"};
  }
  for (const std::string& s : specials) {
    auto it = m.vocab.find(s);
    BRIGADE_CHECK(it != m.vocab.end(), DataError, "special token {} is not in the vocabulary '{}'", quote(s),
                  vocab_json);
    m.add_added(s, it->second, true, "'" + vocab_json + "'");
  }
  m.finish_added();
  return t;
}

namespace {

// Field access for tokenizer.json with messages that name the field and the file.
struct JsonCtx {
  std::string path;
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw DataError(fmt::format("'{}': {}: {}", path, field, what));
  }
  const json& at(const json& j, const char* key, const std::string& field) const {
    if (!j.is_object() || !j.contains(key)) fail(field, "missing");
    return j.at(key);
  }
  std::string str(const json& j, const std::string& field) const {
    if (!j.is_string()) fail(field, fmt::format("expected a string, found {}", j.dump()));
    return j.get<std::string>();
  }
  bool boolean(const json& j, const char* key, bool dflt, const std::string& field) const {
    if (!j.contains(key) || j.at(key).is_null()) return dflt;
    if (!j.at(key).is_boolean()) fail(field, fmt::format("expected true or false, found {}", j.at(key).dump()));
    return j.at(key).get<bool>();
  }
  void unsupported(const std::string& field, const std::string& value, const std::string& supported) const {
    fail(field, fmt::format("{} is not supported by Brigade's byte-level BPE (supported: {}); use a tokenizer "
                            "without it",
                            value, supported));
  }
};

}  // namespace

ByteLevelBpe ByteLevelBpe::from_tokenizer_json(const std::string& path) {
  ByteLevelBpe t;
  t.impl_ = std::make_unique<Impl>();
  Impl& m = *t.impl_;
  m.origin = path;
  const JsonCtx c{path};
  const json root = parse_json(read_whole(path, "tokenizer.json"), path);
  if (!root.is_object()) c.fail("(top level)", "expected a JSON object, found " + type_name(root));

  // -- model
  const json& model = c.at(root, "model", "model");
  const std::string mtype = model.contains("type") ? c.str(model.at("type"), "model.type") : "(none)";
  if (mtype != "BPE") c.unsupported("model.type", quote(mtype), "\"BPE\"");
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0))
    c.unsupported("model.dropout", model.at("dropout").dump(), "null");
  if (c.boolean(model, "byte_fallback", false, "model.byte_fallback"))
    c.unsupported("model.byte_fallback", "true", "false (byte-level BPE needs no byte fallback)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && !model.at(k).is_null() && model.at(k) != "")
      c.unsupported(std::string("model.") + k, model.at(k).dump(), "null or \"\"");
  }
  m.ignore_merges = c.boolean(model, "ignore_merges", false, "model.ignore_merges");

  const json& vocab = c.at(model, "vocab", "model.vocab");
  if (!vocab.is_object()) c.fail("model.vocab", "expected an object token -> id, found " + type_name(vocab));
  for (const auto& [tok, id] : vocab.items()) {
    if (!id.is_number_integer()) c.fail("model.vocab[" + quote(tok) + "]", "expected an integer id");
    m.add_token(tok, id.get<int64_t>(), "'" + path + "': model.vocab");
  }
  m.finish_vocab("'" + path + "': model.vocab");

  const json& merges = c.at(model, "merges", "model.merges");
  if (!merges.is_array()) c.fail("model.merges", "expected an array, found " + type_name(merges));
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string field = fmt::format("model.merges[{}]", i);
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
        c.fail(field, "expected \"a b\" (two tokens, one space), found " + e.dump());
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      c.fail(field, "expected \"a b\" or [\"a\", \"b\"], found " + e.dump());
    }
    m.add_merge(a, b, int(i), "'" + path + "': " + field);
  }

  // -- normalizer: none (a Sequence of none is none too)
  if (root.contains("normalizer") && !root.at("normalizer").is_null()) {
    const json& n = root.at("normalizer");
    const bool empty_seq = n.is_object() && n.value("type", "") == "Sequence" && n.contains("normalizers") &&
                           n.at("normalizers").is_array() && n.at("normalizers").empty();
    if (!empty_seq)
      c.unsupported("normalizer", n.is_object() && n.contains("type") ? n.at("type").dump() : n.dump(), "null");
  }
  for (const char* k : {"truncation", "padding"}) {
    if (root.contains(k) && !root.at(k).is_null())
      c.unsupported(k, root.at(k).dump().substr(0, 80), "null (truncate or pad the ids yourself)");
  }

  // -- pre_tokenizer: [Split(Regex|String, Isolated)]* then ByteLevel, or ByteLevel alone
  if (!root.contains("pre_tokenizer") || root.at("pre_tokenizer").is_null())
    c.unsupported("pre_tokenizer", "null", "ByteLevel, or a Sequence of Split steps ending in ByteLevel");
  const json& pre = root.at("pre_tokenizer");
  std::vector<std::pair<const json*, std::string>> steps;
  if (c.str(c.at(pre, "type", "pre_tokenizer.type"), "pre_tokenizer.type") == "Sequence") {
    const json& list = c.at(pre, "pretokenizers", "pre_tokenizer.pretokenizers");
    if (!list.is_array()) c.fail("pre_tokenizer.pretokenizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back({&list[i], fmt::format("pre_tokenizer.pretokenizers[{}]", i)});
  } else {
    steps.push_back({&pre, "pre_tokenizer"});
  }
  bool byte_level = false;
  for (const auto& [sp, field] : steps) {
    const json& s = *sp;
    const std::string type = c.str(c.at(s, "type", field + ".type"), field + ".type");
    if (byte_level) c.unsupported(field, quote(type) + " after ByteLevel", "ByteLevel as the last step");
    if (type == "ByteLevel") {
      byte_level = true;
      Impl::Step st;
      st.add_prefix_space = c.boolean(s, "add_prefix_space", false, field + ".add_prefix_space");
      if (c.boolean(s, "use_regex", true, field + ".use_regex"))
        st.regex = std::make_unique<Regex>(kGpt2Pattern, false, "'" + path + "': " + field);
      m.steps.push_back(std::move(st));
    } else if (type == "Split") {
      const json& pat = c.at(s, "pattern", field + ".pattern");
      bool literal;
      std::string p;
      if (pat.is_object() && pat.contains("Regex")) {
        literal = false;
        p = c.str(pat.at("Regex"), field + ".pattern.Regex");
      } else if (pat.is_object() && pat.contains("String")) {
        literal = true;
        p = c.str(pat.at("String"), field + ".pattern.String");
      } else {
        c.fail(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}, found " + pat.dump());
      }
      const std::string behavior = c.str(c.at(s, "behavior", field + ".behavior"), field + ".behavior");
      if (behavior != "Isolated") c.unsupported(field + ".behavior", quote(behavior), "\"Isolated\"");
      if (c.boolean(s, "invert", false, field + ".invert")) c.unsupported(field + ".invert", "true", "false");
      Impl::Step st;
      st.regex = std::make_unique<Regex>(p, literal, "'" + path + "': " + field + ".pattern");
      m.steps.push_back(std::move(st));
    } else {
      c.unsupported(field + ".type", quote(type), "\"ByteLevel\", \"Split\" (before ByteLevel), \"Sequence\"");
    }
  }
  if (!byte_level) c.unsupported("pre_tokenizer", "a pre-tokenizer without ByteLevel", "one that ends in ByteLevel");

  // -- decoder: ByteLevel
  {
    const json* d = root.contains("decoder") ? &root.at("decoder") : nullptr;
    const std::string type = d && d->is_object() && d->contains("type") ? d->at("type").dump() : "null";
    if (type != "\"ByteLevel\"") c.unsupported("decoder.type", type, "\"ByteLevel\"");
  }

  // -- added tokens
  if (root.contains("added_tokens") && !root.at("added_tokens").is_null()) {
    const json& list = root.at("added_tokens");
    if (!list.is_array()) c.fail("added_tokens", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string field = fmt::format("added_tokens[{}]", i);
      const json& a = list[i];
      const json& idj = c.at(a, "id", field + ".id");
      if (!idj.is_number_integer()) c.fail(field + ".id", "expected an integer");
      const int64_t id = idj.get<int64_t>();
      const std::string content = c.str(c.at(a, "content", field + ".content"), field + ".content");
      for (const char* k : {"single_word", "lstrip", "rstrip"})
        if (c.boolean(a, k, false, field + "." + k)) c.unsupported(field + "." + k, "true", "false");
      const bool special = c.boolean(a, "special", false, field + ".special");
      auto it = m.vocab.find(content);
      if (it != m.vocab.end()) {
        if (it->second != id)
          c.fail(field, fmt::format("content {} has id {} here but {} in model.vocab", quote(content), id, it->second));
      } else {
        BRIGADE_CHECK(!m.extra.count(content), DataError, "'{}': {}: content {} is added twice", path, field,
                      quote(content));
        m.add_token(content, id, "'" + path + "': " + field, /*model=*/false);
      }
      m.add_added(content, int(id), special, "'" + path + "': " + field);
    }
  }
  m.finish_added();

  // -- post_processor: none, ByteLevel (offsets only), TemplateProcessing (single), or a Sequence of them
  std::function<void(const json&, const std::string&)> post = [&](const json& p, const std::string& field) {
    if (p.is_null()) return;
    const std::string type = c.str(c.at(p, "type", field + ".type"), field + ".type");
    if (type == "ByteLevel") return;  // trims offsets; ids unchanged
    if (type == "Sequence") {
      const json& list = c.at(p, "processors", field + ".processors");
      if (!list.is_array()) c.fail(field + ".processors", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) post(list[i], fmt::format("{}.processors[{}]", field, i));
      return;
    }
    if (type != "TemplateProcessing")
      c.unsupported(field + ".type", quote(type), "\"ByteLevel\", \"TemplateProcessing\", \"Sequence\"");
    if (!m.prefix_ids.empty() || !m.suffix_ids.empty()) c.unsupported(field, "a second TemplateProcessing", "one");
    const json& single = c.at(p, "single", field + ".single");
    if (!single.is_array()) c.fail(field + ".single", "expected an array");
    const json& specials = p.contains("special_tokens") ? p.at("special_tokens") : json::object();
    int sequences = 0;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string f = fmt::format("{}.single[{}]", field, i);
      const json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        const std::string sid = c.str(c.at(item.at("Sequence"), "id", f + ".Sequence.id"), f + ".Sequence.id");
        if (sid != "A") c.unsupported(f + ".Sequence.id", quote(sid), "\"A\" (single sequences)");
        ++sequences;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name =
            c.str(c.at(item.at("SpecialToken"), "id", f + ".SpecialToken.id"), f + ".SpecialToken.id");
        const json& entry = c.at(specials, name.c_str(), field + ".special_tokens[" + quote(name) + "]");
        const json& ids = c.at(entry, "ids", field + ".special_tokens[" + quote(name) + "].ids");
        if (!ids.is_array()) c.fail(field + ".special_tokens[" + quote(name) + "].ids", "expected an array");
        for (const json& id : ids) {
          if (!id.is_number_integer()) c.fail(field + ".special_tokens[" + quote(name) + "].ids", "expected integers");
          const int64_t v = id.get<int64_t>();  // range-checked before the narrowing to int
          if (v < 0 || v >= kMaxTokenId)
            c.fail(field + ".special_tokens[" + quote(name) + "].ids", fmt::format("id {} names no token", id.dump()));
          (sequences == 0 ? m.prefix_ids : m.suffix_ids).push_back(int(v));
        }
      } else {
        c.fail(f, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, found " + item.dump());
      }
    }
    if (sequences != 1) c.fail(field + ".single", "expected exactly one {\"Sequence\": {\"id\": \"A\"}}");
  };
  if (root.contains("post_processor")) post(root.at("post_processor"), "post_processor");
  for (int id : m.prefix_ids)
    BRIGADE_CHECK(size_t(id) < m.has_token.size() && m.has_token[size_t(id)], DataError,
                  "'{}': post_processor adds id {}, which names no token", path, id);
  for (int id : m.suffix_ids)
    BRIGADE_CHECK(size_t(id) < m.has_token.size() && m.has_token[size_t(id)], DataError,
                  "'{}': post_processor adds id {}, which names no token", path, id);
  return t;
}

std::vector<int> ByteLevelBpe::encode(std::string_view text, const BpeEncodeOptions& opt) const {
  BRIGADE_ASSERT(impl_, "encode() on an empty ByteLevelBpe");
  const Impl& m = *impl_;
  std::vector<int> out;
  out.reserve(text.size() / 3 + 4);
  if (opt.add_special_tokens) out.insert(out.end(), m.prefix_ids.begin(), m.prefix_ids.end());
  // Added tokens are cut out first (leftmost, then longest), the text between them is encoded.
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    const Impl::Added* hit = nullptr;
    if (m.added_first_byte[static_cast<unsigned char>(text[i])]) {
      for (const Impl::Added& a : m.added) {
        if ((a.special && !opt.allow_special) || a.content[0] != text[i]) continue;
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;  // longest first
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > seg) m.encode_segment(text.substr(seg, i - seg), out);
    out.push_back(hit->id);
    i += hit->content.size();
    seg = i;
  }
  if (seg < text.size()) m.encode_segment(text.substr(seg), out);
  if (opt.add_special_tokens) out.insert(out.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return out;
}

std::string ByteLevelBpe::decode(std::span<const int> ids) const {
  BRIGADE_ASSERT(impl_, "decode() on an empty ByteLevelBpe");
  const Impl& m = *impl_;
  const ByteMap& bm = byte_map();
  std::string out;
  for (int id : ids) {
    BRIGADE_CHECK(id >= 0 && size_t(id) < m.has_token.size() && m.has_token[size_t(id)], ValueError,
                  "decode: token id {} names no token of this tokenizer ({}; ids in [0, {}))", id, m.origin,
                  m.has_token.size());
    if (auto it = m.added_by_id.find(id); it != m.added_by_id.end()) {
      out += m.added[it->second].content;  // added tokens are text, not byte-mapped
      continue;
    }
    const std::string& tok = m.tokens[size_t(id)];
    for (size_t k = 0; k < tok.size();) {
      const size_t start = k;
      const char32_t cp = next_cp(tok, k);
      if (cp < 512 && bm.from_cp[cp] >= 0) {
        out += char(bm.from_cp[cp]);
      } else {  // a character that stands for no byte: kept as written, as tokenizers does
        out.append(tok, start, k - start);
      }
    }
  }
  return out;
}

int64_t ByteLevelBpe::vocab_size() const {
  BRIGADE_ASSERT(impl_, "vocab_size() on an empty ByteLevelBpe");
  return int64_t(impl_->has_token.size());
}

int ByteLevelBpe::token_to_id(std::string_view token) const {
  BRIGADE_ASSERT(impl_, "token_to_id() on an empty ByteLevelBpe");
  const std::string key(token);
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  auto it = impl_->extra.find(key);
  return it == impl_->extra.end() ? -1 : it->second;
}

std::string ByteLevelBpe::id_to_token(int id) const {
  BRIGADE_ASSERT(impl_, "id_to_token() on an empty ByteLevelBpe");
  BRIGADE_CHECK(id >= 0 && size_t(id) < impl_->has_token.size() && impl_->has_token[size_t(id)], ValueError,
                "token id {} names no token of this tokenizer ({})", id, impl_->origin);
  return impl_->tokens[size_t(id)];
}

std::vector<std::string> ByteLevelBpe::merges() const {
  BRIGADE_ASSERT(impl_, "merges() on an empty ByteLevelBpe");
  std::vector<std::pair<int, std::string>> ranked;
  ranked.reserve(impl_->merges.size());
  for (const auto& [pair, rm] : impl_->merges)
    ranked.emplace_back(rm.first, impl_->tokens[size_t(pair >> 32)] + " " + impl_->tokens[size_t(uint32_t(pair))]);
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::string> out;
  out.reserve(ranked.size());
  for (auto& [rank, m] : ranked) out.push_back(std::move(m));
  return out;
}

std::vector<std::string> ByteLevelBpe::pre_tokenizer_patterns() const {
  BRIGADE_ASSERT(impl_, "pre_tokenizer_patterns() on an empty ByteLevelBpe");
  std::vector<std::string> out;
  for (const auto& st : impl_->steps) out.push_back(st.regex ? st.regex->pattern() : "");
  return out;
}

bool ByteLevelBpe::is_added(int id) const {
  BRIGADE_ASSERT(impl_, "is_added() on an empty ByteLevelBpe");
  return impl_->added_by_id.count(id) > 0;
}

const std::vector<int>& ByteLevelBpe::post_prefix() const {
  BRIGADE_ASSERT(impl_, "post_prefix() on an empty ByteLevelBpe");
  return impl_->prefix_ids;
}

const std::vector<int>& ByteLevelBpe::post_suffix() const {
  BRIGADE_ASSERT(impl_, "post_suffix() on an empty ByteLevelBpe");
  return impl_->suffix_ids;
}

bool ByteLevelBpe::is_special(int id) const {
  BRIGADE_ASSERT(impl_, "is_special() on an empty ByteLevelBpe");
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

}  // namespace brigade::data
