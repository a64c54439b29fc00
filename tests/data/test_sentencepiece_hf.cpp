// SentencePieceHf (data/text/tokenizer.h): a LLaMA-style SentencePiece model (BPE, byte_fallback)
// trained by python3-sentencepiece (tests/reference/sentencepiece_oracle.py), whose encode() and
// decode() are the expected values; BOS is prepended as transformers' LlamaTokenizer does.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/data/text/corpus.h"
#include "brigade/data/text/tokenizer.h"
#include "support/test_support.h"
#include "test_util.h"

namespace brigade::data {
namespace {
using json = nlohmann::json;
using testing::TempDir;
using testing::write_text;

const std::string kScript = std::string(BRIGADE_SOURCE_DIR) + "/tests/reference/sentencepiece_oracle.py";

// Training text: the generated corpus, a few accented lines, and the first 4000 KJV verses
// when bible-kjv is installed. Characters the test strings use beyond these (CJK, emoji,
// Cyrillic, tabs, newlines) can only come out as byte-fallback tokens.
std::string training_text() {
  std::string text = testing::make_corpus(3000, 3);
  for (int i = 0; i < 50; ++i) text += "the café was naïve, and 1234 people said: über!\n";
  try {
    const std::string kjv = read_kjv();
    size_t pos = 0;
    for (int k = 0; k < 4000 && pos < kjv.size(); ++k) {
      size_t nl = kjv.find('\n', pos);
      if (nl == std::string::npos) nl = kjv.size();
      text += kjv.substr(pos, nl - pos) + "\n";
      pos = nl + 1;
    }
  } catch (const DataError&) {
    // no bible-kjv: the generated text is enough for a 400-piece model
  }
  return text;
}

std::vector<std::string> test_strings() {
  std::vector<std::string> out = {
      // clang-format off
      "", " ", "  ", "a", "the lord", " the lord", "the lord ", "  two  spaces  ", "\n", "\n\n", "a\nb",
      "line one\nline two\n", "\r\n", "tab\tseparated", "café naïve über", "Ångström", "e\u0301", "日本語",
      "你好，世界", "Привет", "😀 emoji 👍🏽", "digits 1234567890", "3.14", "unseen ☃ snowman", "ǅ", "\x7f",
      "And God said, Let there be light: and there was light.", "<s> </s> <unk>", "<0x0A>", "▁", "▁▁x",
      // clang-format on
  };
  const std::vector<std::string> parts = {"the",    "lord", "said", "unto", "moses",   " ",    "  ",   "\n", "\t",
                                          ",",      ".",    "!",    "café", "ünïcödé", "東京", "🙂", "42", "2026",
                                          "Israel", "KING", "x",    "\n\n", " \n ",    "'s",   "—",    "«",  "»"};
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const int n = 1 + int(rng() % 10);
    for (int k = 0; k < n; ++k) s += parts[rng() % parts.size()];
    out.push_back(s);
  }
  return out;
}

TEST(SentencePieceHf, MatchesPythonSentencePieceWithBos) {
  if (std::system("/usr/bin/python3 -c 'import sentencepiece' >/dev/null 2>&1") != 0)
    FAIL() << "python3-sentencepiece is missing for /usr/bin/python3: run scripts/install-deps.sh";
  TempDir dir;
  write_text(dir.file("train.txt"), training_text());
  const std::vector<std::string> strings = test_strings();
  write_text(dir.file("in.json"), json(strings).dump());
  const auto r = test_support::run_in(dir.path(), "/usr/bin/python3 '" + kScript + "' '" + dir.file("train.txt") +
                                                      "' '" + dir.file("m") + "' 400 '" + dir.file("in.json") + "' '" +
                                                      dir.file("out.json") + "'");
  ASSERT_EQ(r.code, 0) << "sentencepiece_oracle.py failed:\n" << r.err;
  const json out = json::parse(testing::read_bytes(dir.file("out.json")));

  const SentencePieceHf sp = SentencePieceHf::load(dir.file("m.model"));
  EXPECT_EQ(sp.vocab_size(), out["vocab_size"].get<int64_t>());
  EXPECT_EQ(sp.bos_id(), 1);
  EXPECT_EQ(sp.eos_id(), 2);
  ASSERT_EQ(out["ids"].size(), strings.size());
  const int newline = sp.piece_to_id("<0x0A>");
  ASSERT_NE(newline, sp.unk_id()) << "the model should have byte-fallback pieces";
  int mismatches = 0, with_newline_byte = 0, with_byte_tokens = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    std::vector<int> want = out["ids"][i].get<std::vector<int>>();
    with_newline_byte += std::find(want.begin(), want.end(), newline) != want.end();
    with_byte_tokens += std::any_of(want.begin(), want.end(), [&](int id) {
      const std::string p = sp.id_to_piece(id);
      return p.size() == 6 && p.rfind("<0x", 0) == 0;
    });
    EXPECT_EQ(sp.encode(strings[i], /*add_bos=*/false), want) << json(strings[i]).dump();
    want.insert(want.begin(), out["bos_id"].get<int>());
    const std::vector<int> got = sp.encode(strings[i]);
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << "string " << json(strings[i]).dump() << "\n  got  " << json(got).dump() << "\n  want "
                    << json(want).dump();
    EXPECT_EQ(sp.decode(got), out["decoded"][i].get<std::string>()) << json(strings[i]).dump();
  }
  EXPECT_EQ(mismatches, 0);
  // The cases that make HF mode differ from Tokenizer's were exercised: newlines as <0x0A> and
  // characters unseen in training as byte tokens.
  EXPECT_GT(with_newline_byte, 50);
  EXPECT_GT(with_byte_tokens, 100);
  std::cout << "[ oracle ] " << strings.size() << " strings compared with python3-sentencepiece; " << with_newline_byte
            << " with <0x0A>, " << with_byte_tokens << " with byte tokens\n";

  std::vector<int> eos = sp.encode("a", true, true);
  EXPECT_EQ(eos.front(), 1);
  EXPECT_EQ(eos.back(), 2);
  EXPECT_THROW(sp.decode(std::vector<int>{int(sp.vocab_size())}), ValueError);
}

TEST(SentencePieceHf, LoadErrorsNameThePath) {
  TempDir dir;
  try {
    SentencePieceHf::load(dir.file("tokenizer.model"));
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("tokenizer.model")), std::string::npos) << e.what();
  }
  write_text(dir.file("bad.model"), "not a protobuf");
  try {
    SentencePieceHf::load(dir.file("bad.model"));
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.model' is not a valid SentencePiece model"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace brigade::data
