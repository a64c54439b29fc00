// The tokenizer kinds behind TextTokenizer; see text_tokenizer.h.
#include "brigade/data/text/text_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"
#include "brigade/data/text/bpe.h"
#include "brigade/data/text/tokenizer.h"

namespace brigade::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  BRIGADE_CHECK(in.good(), DataError, "cannot read {}; check that it exists and its permissions", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tokenizer_config.json, when the folder has one ({} otherwise). A token field is a string or
// an AddedToken object {"content": ...}.
json tokenizer_config(const fs::path& dir) {
  const fs::path p = dir / "tokenizer_config.json";
  if (!is_file(p)) return json::object();
  json j = json::parse(read_bytes(p), nullptr, /*allow_exceptions=*/false);
  BRIGADE_CHECK(!j.is_discarded() && j.is_object(), DataError,
                "{} is not a JSON object; fix or remove it (it only names the special tokens)", p.string());
  return j;
}

std::optional<std::string> config_token(const json& cfg, const char* key, const fs::path& dir) {
  if (!cfg.contains(key) || cfg.at(key).is_null()) return std::nullopt;
  const json& v = cfg.at(key);
  if (v.is_string()) return v.get<std::string>();
  BRIGADE_CHECK(v.is_object() && v.contains("content") && v.at("content").is_string(), DataError,
                "{}: \"{}\" must be a string or {{\"content\": ...}}, got {}", (dir / "tokenizer_config.json").string(),
                key, v.dump());
  return v.at("content").get<std::string>();
}

std::optional<bool> config_bool(const json& cfg, const char* key, const fs::path& dir) {
  if (!cfg.contains(key) || cfg.at(key).is_null()) return std::nullopt;
  BRIGADE_CHECK(cfg.at(key).is_boolean(), DataError, "{}: \"{}\" must be true or false, got {}",
                (dir / "tokenizer_config.json").string(), key, cfg.at(key).dump());
  return cfg.at(key).get<bool>();
}

class BrigadeTok final : public TextTokenizer {
 public:
  explicit BrigadeTok(const fs::path& dir) : tok_(Tokenizer::load((dir / "tokenizer.model").string())) {
    folder_ = dir.string();
  }
  BrigadeTok(Tokenizer tok, std::string folder) : tok_(std::move(tok)) { folder_ = std::move(folder); }
  std::string kind() const override { return "brigade"; }
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  std::vector<int> encode(std::string_view text) const override { return tok_.encode(text); }
  std::vector<int> encode_strict(std::string_view text, std::string_view what) const override {
    return tok_.encode_strict(text, what);
  }
  std::string decode(std::span<const int> ids) const override { return tok_.decode(ids); }
  std::vector<int> document_prefix() const override { return {}; }
  std::vector<int> document_suffix() const override { return {}; }
  int end_id() const override { return Tokenizer::kEosId; }
  int begin_id() const override { return Tokenizer::kEosId; }  // a line break
  bool line_separable() const override { return true; }
  std::vector<std::string> files() const override { return {"tokenizer.model"}; }

 private:
  Tokenizer tok_;
};

class SentencePieceTok final : public TextTokenizer {
 public:
  explicit SentencePieceTok(const fs::path& dir) : sp_(SentencePieceHf::load((dir / "tokenizer.model").string())) {
    folder_ = dir.string();
    const json cfg = tokenizer_config(dir);
    has_config_ = is_file(dir / "tokenizer_config.json");
    add_bos_ = config_bool(cfg, "add_bos_token", dir).value_or(true);
    add_eos_ = config_bool(cfg, "add_eos_token", dir).value_or(false);
    BRIGADE_CHECK(!add_bos_ || sp_.bos_id() >= 0, DataError,
                  "{}/tokenizer.model has no BOS token, but add_bos_token is true; set \"add_bos_token\": false in "
                  "tokenizer_config.json",
                  folder_);
    // The control tokens' text is split out first, as transformers' LlamaTokenizer does.
    for (int id : {sp_.bos_id(), sp_.eos_id(), sp_.unk_id()})
      if (id >= 0 && !sp_.id_to_piece(id).empty()) specials_.emplace_back(sp_.id_to_piece(id), id);
  }
  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_.vocab_size(); }
  std::vector<int> encode(std::string_view text) const override {
    std::vector<int> out;
    size_t pos = 0;
    while (pos <= text.size()) {
      // the leftmost control-token text, the longest at a tie
      size_t best = std::string_view::npos, len = 0;
      int id = -1;
      for (const auto& [piece, pid] : specials_) {
        const size_t at = text.find(piece, pos);
        if (at != std::string_view::npos && (at < best || (at == best && piece.size() > len))) {
          best = at;
          len = piece.size();
          id = pid;
        }
      }
      const std::string_view seg =
          text.substr(pos, best == std::string_view::npos ? std::string_view::npos : best - pos);
      if (!seg.empty()) {
        const std::vector<int> ids = sp_.encode(seg, /*add_bos=*/false, /*add_eos=*/false);
        out.insert(out.end(), ids.begin(), ids.end());
      }
      if (best == std::string_view::npos) break;
      out.push_back(id);
      pos = best + len;
    }
    return out;
  }
  std::vector<int> encode_strict(std::string_view text, std::string_view what) const override {
    std::vector<int> ids = encode(text);
    const int unk = sp_.unk_id();
    for (int id : ids)
      BRIGADE_CHECK(id != unk || text.find(sp_.id_to_piece(unk)) != std::string_view::npos, DataError,
                    "{} contains characters {}/tokenizer.model cannot represent (they become {}); remove them", what,
                    folder_, sp_.id_to_piece(unk));
    return ids;
  }
  std::string decode(std::span<const int> ids) const override { return sp_.decode(ids); }
  std::vector<int> document_prefix() const override {
    return add_bos_ ? std::vector<int>{sp_.bos_id()} : std::vector<int>{};
  }
  std::vector<int> document_suffix() const override {
    return add_eos_ && sp_.eos_id() >= 0 ? std::vector<int>{sp_.eos_id()} : std::vector<int>{};
  }
  int end_id() const override { return sp_.eos_id(); }
  int begin_id() const override { return sp_.bos_id() >= 0 ? sp_.bos_id() : sp_.eos_id(); }
  bool line_separable() const override { return false; }
  std::vector<std::string> files() const override {
    if (has_config_) return {"tokenizer.model", "tokenizer_config.json"};
    return {"tokenizer.model"};
  }

 private:
  SentencePieceHf sp_;
  bool add_bos_ = true, add_eos_ = false, has_config_ = false;
  std::vector<std::pair<std::string, int>> specials_;
};

class BpeTok final : public TextTokenizer {
 public:
  BpeTok(const fs::path& dir, bool gpt2_files)
      : bpe_(gpt2_files ? ByteLevelBpe::from_gpt2_files((dir / "vocab.json").string(), (dir / "merges.txt").string())
                        : ByteLevelBpe::from_tokenizer_json((dir / "tokenizer.json").string())),
        gpt2_files_(gpt2_files) {
    folder_ = dir.string();
    const json cfg = tokenizer_config(dir);
    has_config_ = is_file(dir / "tokenizer_config.json");
    if (const auto eos = config_token(cfg, "eos_token", dir)) {
      end_ = bpe_.token_to_id(*eos);
      BRIGADE_CHECK(end_ >= 0, DataError, "{}/tokenizer_config.json: eos_token \"{}\" is not a token of {}", folder_,
                    *eos, gpt2_files ? "vocab.json" : "tokenizer.json");
    } else {
      for (const char* t : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
        if (end_ < 0) end_ = bpe_.token_to_id(t);
    }
  }
  std::string kind() const override { return gpt2_files_ ? "gpt2-bpe" : "tokenizer-json"; }
  int64_t vocab_size() const override { return bpe_.vocab_size(); }
  std::vector<int> encode(std::string_view text) const override {
    BpeEncodeOptions o;
    o.allow_special = true;
    return bpe_.encode(text, o);
  }
  std::vector<int> encode_strict(std::string_view text, std::string_view) const override { return encode(text); }
  std::string decode(std::span<const int> ids) const override { return bpe_.decode(ids); }
  std::vector<int> document_prefix() const override { return bpe_.post_prefix(); }
  std::vector<int> document_suffix() const override {
    if (!bpe_.post_prefix().empty() || !bpe_.post_suffix().empty()) return bpe_.post_suffix();
    return end_ >= 0 ? std::vector<int>{end_} : std::vector<int>{};
  }
  int end_id() const override { return end_; }
  int begin_id() const override { return bpe_.post_prefix().empty() ? end_ : bpe_.post_prefix().front(); }
  bool line_separable() const override { return false; }
  std::vector<std::string> files() const override {
    std::vector<std::string> f =
        gpt2_files_ ? std::vector<std::string>{"vocab.json", "merges.txt"} : std::vector<std::string>{"tokenizer.json"};
    if (has_config_) f.push_back("tokenizer_config.json");
    return f;
  }

 private:
  ByteLevelBpe bpe_;
  bool gpt2_files_ = false, has_config_ = false;
  int end_ = -1;
};

const char* const kKinds[] = {"brigade", "sentencepiece", "gpt2-bpe", "tokenizer-json"};

}  // namespace

std::string detect_tokenizer(const std::string& dir_s) {
  const fs::path dir(dir_s);
  if (is_file(dir / kTokenizerMarker)) {
    const fs::path p = dir / kTokenizerMarker;
    const json j = json::parse(read_bytes(p), nullptr, /*allow_exceptions=*/false);
    BRIGADE_CHECK(!j.is_discarded() && j.is_object() && j.contains("type") && j.at("type").is_string(), DataError,
                  "{} is not a tokenizer marker ({{\"type\": ...}}); remove it, or copy the folder again", p.string());
    const std::string t = j.at("type").get<std::string>();
    bool known = false;
    for (const char* k : kKinds) known = known || t == k;
    BRIGADE_CHECK(known, DataError,
                  "{}: tokenizer type \"{}\" is not one this engine reads (brigade, sentencepiece, gpt2-bpe, "
                  "tokenizer-json); it was written by a newer version, or edited",
                  p.string(), t);
    return t;
  }
  const bool ours = is_file(dir / "meta.json") || is_file(dir / "state.json");
  if (is_file(dir / "tokenizer.model")) return ours ? "brigade" : "sentencepiece";
  if (is_file(dir / "vocab.json") && is_file(dir / "merges.txt")) return "gpt2-bpe";
  if (is_file(dir / "tokenizer.json")) return "tokenizer-json";
  return "";
}

std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::string& dir) {
  const std::string kind = detect_tokenizer(dir);
  BRIGADE_CHECK(!kind.empty(), DataError,
                "{} holds no tokenizer: it needs tokenizer.model (SentencePiece), vocab.json + merges.txt (GPT-2) or "
                "tokenizer.json (byte-level BPE)",
                dir);
  const fs::path d(dir);
  if (kind == "brigade") return std::make_unique<BrigadeTok>(d);
  if (kind == "sentencepiece") return std::make_unique<SentencePieceTok>(d);
  return std::make_unique<BpeTok>(d, kind == "gpt2-bpe");
}

std::unique_ptr<TextTokenizer> brigade_tokenizer(Tokenizer tok, const std::string& folder) {
  return std::make_unique<BrigadeTok>(std::move(tok), folder);
}

std::string tokenizer_marker(const TextTokenizer& tok) {
  return json{{"type", tok.kind()}, {"files", tok.files()}}.dump(2) + "\n";
}

std::vector<std::pair<std::string, std::string>> tokenizer_contents(const TextTokenizer& tok) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& f : tok.files()) out.emplace_back(f, read_bytes(fs::path(tok.folder()) / f));
  if (tok.kind() != "brigade" || is_file(fs::path(tok.folder()) / kTokenizerMarker))
    out.emplace_back(kTokenizerMarker, tokenizer_marker(tok));
  return out;
}

void copy_tokenizer(const TextTokenizer& tok, const std::string& dir) {
  for (const std::string& f : tok.files())
    write_file_atomic((fs::path(dir) / f).string(), read_bytes(fs::path(tok.folder()) / f));
  write_file_atomic((fs::path(dir) / kTokenizerMarker).string(), tokenizer_marker(tok));
}

}  // namespace brigade::data
