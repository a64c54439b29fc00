// Supervised fine-tuning data from JSONL; see sft.h.
#include "brigade/data/text/sft.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"

namespace brigade::data {

using nlohmann::json;

std::vector<Piece> render_chat(const std::vector<std::pair<std::string, std::string>>& messages, const std::string& t,
                               const std::string& where) {
  std::vector<Piece> out;
  bool any_assistant = false;
  for (auto& [role, content] : messages) {
    BRIGADE_CHECK(role == "system" || role == "user" || role == "assistant", DataError,
                  "{}: role \"{}\" is not one of \"system\", \"user\", \"assistant\"", where, role);
    any_assistant = any_assistant || role == "assistant";
  }
  BRIGADE_CHECK(any_assistant, DataError, "{}: no \"assistant\" message, so nothing to train on", where);
  if (t == "chatml") {
    for (auto& [role, content] : messages) {
      const bool a = role == "assistant";
      out.push_back({"<|im_start|>" + role + "\n", false});
      out.push_back({content + "<|im_end|>\n", a});
    }
  } else if (t == "llama-3") {
    for (auto& [role, content] : messages) {
      const bool a = role == "assistant";
      out.push_back({"<|start_header_id|>" + role + "<|end_header_id|>\n\n", false});
      out.push_back({content + "<|eot_id|>", a});
    }
  } else if (t == "llama-2") {
    std::string system;
    size_t i = 0;
    if (!messages.empty() && messages[0].first == "system") system = messages[i++].second;
    bool first = true;
    for (; i < messages.size(); ++i) {
      const auto& [role, content] = messages[i];
      if (role == "user") {
        std::string s = "<s>[INST] ";
        if (first && !system.empty()) s += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
        out.push_back({s + content + " [/INST]", false});
        first = false;
      } else if (role == "assistant") {
        out.push_back({" " + content + " </s>", true});
      } else {
        throw DataError(fmt::format("{}: llama-2's template has a system message only first", where));
      }
    }
  } else {
    throw ConfigError(
        fmt::format("data.chat_template = \"{}\" is not a template; use \"chatml\", \"llama-2\" or "
                    "\"llama-3\"",
                    t));
  }
  return out;
}

namespace {

void append(SftSample& s, const std::vector<int>& ids, bool trained) {
  s.ids.insert(s.ids.end(), ids.begin(), ids.end());
  s.trained.insert(s.trained.end(), ids.size(), trained ? 1 : 0);
}

std::string string_field(const json& j, const char* key, const std::string& where) {
  const json& v = j.at(key);
  // a scalar is shown as written; an array or object only by its kind (dumping one would recurse
  // as deep as the line nests, which a hostile file can make deeper than the stack)
  BRIGADE_CHECK(v.is_string(), DataError, "{}: \"{}\" must be a string, got {}", where, key,
                v.is_structured() ? std::string(v.is_array() ? "an array" : "an object") : v.dump().substr(0, 60));
  return v.get<std::string>();
}

}  // namespace

SftData read_sft_jsonl(const std::string& path, const TextTokenizer& tok, const SftOptions& o) {
  BRIGADE_CHECK(tok.end_id() >= 0, DataError,
                "the tokenizer of {} has no end-of-text token to end each sample with; add eos_token to its "
                "tokenizer_config.json",
                tok.folder());
  const std::vector<int> prefix = tok.document_prefix();
  std::ifstream in(path, std::ios::binary);
  BRIGADE_CHECK(in.good(), DataError, "cannot read the SFT data {}; check data.corpus", path);
  SftData out;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, n);
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    BRIGADE_CHECK(!j.is_discarded() && j.is_object(), DataError,
                  "{}: not a JSON object; each line is one sample: {{\"text\"}}, {{\"prompt\", \"completion\"}} or "
                  "{{\"messages\"}}",
                  where);
    const bool text = j.contains("text"), pc = j.contains("prompt") || j.contains("completion"),
               msgs = j.contains("messages");
    BRIGADE_CHECK(int(text) + int(pc) + int(msgs) == 1, DataError,
                  "{}: a sample has exactly one of \"text\", \"prompt\" + \"completion\", \"messages\"", where);
    const std::string shape = text ? "text" : pc ? "prompt-completion" : "messages";
    if (out.shape.empty()) out.shape = shape;
    BRIGADE_CHECK(shape == out.shape, DataError, "{}: a {} sample in a file of {} samples (its first line's shape)",
                  where, shape, out.shape);
    SftSample s;
    s.line = n;
    if (text) {
      append(s, tok.encode(string_field(j, "text", where)), true);
    } else if (pc) {
      BRIGADE_CHECK(j.contains("prompt") && j.contains("completion"), DataError,
                    "{}: a prompt-completion sample needs both \"prompt\" and \"completion\"", where);
      append(s, tok.encode(string_field(j, "prompt", where)), o.loss_on_all);
      append(s, tok.encode(string_field(j, "completion", where)), true);
    } else {
      BRIGADE_CHECK(j.at("messages").is_array(), DataError,
                    "{}: \"messages\" must be a list of {{\"role\", "
                    "\"content\"}}",
                    where);
      std::vector<std::pair<std::string, std::string>> m;
      for (const json& e : j.at("messages")) {
        BRIGADE_CHECK(e.is_object() && e.contains("role") && e.contains("content"), DataError,
                      "{}: every message is {{\"role\": ..., \"content\": ...}}", where);
        m.emplace_back(string_field(e, "role", where), string_field(e, "content", where));
      }
      for (const Piece& p : render_chat(m, o.chat_template, where))
        append(s, tok.encode(p.text), p.trained || o.loss_on_all);
    }
    // the tokenizer's document prefix (LLaMA's BOS; never a target), unless the text began with it
    // (the llama-2 template's "<s>")
    if (s.ids.size() < prefix.size() || !std::equal(prefix.begin(), prefix.end(), s.ids.begin())) {
      s.ids.insert(s.ids.begin(), prefix.begin(), prefix.end());
      s.trained.insert(s.trained.begin(), prefix.size(), 0);
    }
    // every sample ends with the end token, trained on when its last piece is
    if (s.ids.empty() || s.ids.back() != tok.end_id())
      append(s, {tok.end_id()}, s.trained.empty() ? true : s.trained.back() != 0);
    bool any = false;
    for (size_t i = 1; i < s.ids.size(); ++i) any = any || s.trained[i];
    if (!any) {
      ++out.skipped;
      continue;
    }
    out.samples.push_back(std::move(s));
  }
  BRIGADE_CHECK(!out.samples.empty(), DataError, "{}: no sample with a token to train on ({} lines)", path, n);
  return out;
}

}  // namespace brigade::data
