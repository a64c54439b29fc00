// Tokenizer: train/encode/decode round trip, newline <-> EOS, save/load, determinism,
// strict encoding of unknown characters, and the errors for bad models and vocab sizes.
#include <gtest/gtest.h>

#include <algorithm>

#include "brigade/core/error.h"
#include "brigade/data/text/tokenizer.h"
#include "test_util.h"

namespace brigade::data {
namespace {
using testing::TempDir;

Tokenizer small_tokenizer(int64_t vocab = 200) {
  TokenizerTrainOptions opt;
  opt.vocab_size = vocab;
  return Tokenizer::train(testing::make_corpus(2000), opt);
}

TEST(Tokenizer, TrainEncodeDecodeRoundTrip) {
  Tokenizer tok = small_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 200);
  EXPECT_EQ(tok.id_to_piece(Tokenizer::kUnkId), "<unk>");
  EXPECT_EQ(tok.id_to_piece(Tokenizer::kEosId), "</s>");
  for (std::string s : {"The lord said unto moses.", "Israel went into the land, and 12 more.\nDay and night.\n",
                        "  leading spaces and  double  spaces ", "\n\nblank lines\n\n", ""}) {
    std::vector<int> ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s) << "input: [" << s << "]";
    for (int id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok.vocab_size());
      EXPECT_NE(id, Tokenizer::kUnkId);
      EXPECT_NE(id, Tokenizer::kBosId);
    }
  }
  // Merges happened: the text is shorter in tokens than in characters.
  std::string text = testing::make_corpus(50, 99);
  EXPECT_LT(tok.encode(text).size() * 2, text.size());
}

TEST(Tokenizer, NewlineIsEos) {
  Tokenizer tok = small_tokenizer();
  std::vector<int> a = tok.encode("the lord");
  std::vector<int> ab = tok.encode("the lord\nthe lord\n");
  ASSERT_EQ(ab.size(), 2 * a.size() + 2);
  EXPECT_EQ(ab[a.size()], Tokenizer::kEosId);
  EXPECT_EQ(ab.back(), Tokenizer::kEosId);
  EXPECT_EQ(std::count(ab.begin(), ab.end(), Tokenizer::kEosId), 2);
  EXPECT_EQ(tok.decode(std::vector<int>{Tokenizer::kBosId, Tokenizer::kEosId}), "\n");
  EXPECT_THROW(tok.decode(std::vector<int>{-1}), ValueError);
  EXPECT_THROW(tok.decode(std::vector<int>{200}), ValueError);
}

TEST(Tokenizer, TrainingIsDeterministicAndSaveLoadRoundTrips) {
  Tokenizer a = small_tokenizer();
  Tokenizer b = small_tokenizer();
  EXPECT_EQ(a.serialized(), b.serialized());
  TempDir d;
  a.save(d.file("tok.model"));
  Tokenizer c = Tokenizer::load(d.file("tok.model"));
  EXPECT_EQ(c.vocab_size(), a.vocab_size());
  std::string text = testing::make_corpus(20, 7);
  EXPECT_EQ(c.encode(text), a.encode(text));
  // Only the model is left behind (no temp file).
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(Tokenizer, StrictEncodeNamesUnknownCharacters) {
  Tokenizer tok = small_tokenizer();
  EXPECT_NO_THROW(tok.encode_strict("the lord said"));
  const std::string bad = "caf\xc3\xa9 costs 12\xe2\x82\xac, caf\xc3\xa9!";
  auto unk = tok.unknown_chars(bad);
  // 'é', '€', '!' never occur in the generated corpus (digits and ',' do).
  ASSERT_EQ(unk.size(), 3u);
  EXPECT_EQ(unk[0], U'\u00e9');
  EXPECT_EQ(unk[1], U'\u20ac');
  EXPECT_EQ(unk[2], U'!');
  // Plain encode maps them to UNK instead of failing.
  auto ids = tok.encode(bad);
  EXPECT_NE(std::find(ids.begin(), ids.end(), Tokenizer::kUnkId), ids.end());
  try {
    tok.encode_strict(bad, "prompt");
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("prompt contains characters the tokenizer was not trained on"), std::string::npos) << m;
    EXPECT_NE(m.find("'\xc3\xa9' (U+00E9)"), std::string::npos) << m;
    EXPECT_NE(m.find("(U+20AC)"), std::string::npos) << m;
    EXPECT_NE(m.find("use only characters from the training corpus"), std::string::npos) << m;
  }
  EXPECT_THROW(tok.encode_strict("tab\there"), DataError);
}

TEST(Tokenizer, LoadErrorsNameTheFile) {
  TempDir d;
  try {
    Tokenizer::load(d.file("nope.model"));
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("nope.model"), std::string::npos) << m;
    EXPECT_NE(m.find("brigade prepare"), std::string::npos) << m;
  }
  testing::write_text(d.file("garbage.model"), "this is not a protobuf \xff\xff\xff");
  try {
    Tokenizer::load(d.file("garbage.model"));
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("garbage.model"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, VocabTooLargeForCorpusIsDataError) {
  TokenizerTrainOptions opt;
  opt.vocab_size = 5000;
  opt.origin = "corpus 'tiny'";
  try {
    Tokenizer::train("a tiny corpus\nwith few words\n", opt);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("corpus 'tiny'"), std::string::npos) << m;
    EXPECT_NE(m.find("vocab_size"), std::string::npos) << m;
  }
  EXPECT_THROW(Tokenizer::train("\n\n", TokenizerTrainOptions{}), DataError);
}

TEST(Tokenizer, LongLinesAreChunkedForTraining) {
  // One 200 KB line (longer than max_sentence_length) still trains and round-trips.
  std::string corpus = testing::make_corpus(3000);
  std::replace(corpus.begin(), corpus.end(), '\n', ' ');
  TokenizerTrainOptions opt;
  opt.vocab_size = 150;
  Tokenizer tok = Tokenizer::train(corpus, opt);
  std::string s = corpus.substr(0, 1000);
  EXPECT_EQ(tok.decode(tok.encode_strict(s)), s);
}

}  // namespace
}  // namespace brigade::data
