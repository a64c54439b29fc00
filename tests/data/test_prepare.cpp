// prepare(): a text file and a folder end to end, the train/val split, meta.json,
// idempotency (skip when unchanged; rebuild on changed corpus/options/missing files), KJV speed.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"
#include "brigade/data/prepare.h"
#include "brigade/data/token_file.h"
#include "brigade/data/tokenizer.h"
#include "test_util.h"

namespace brigade::data {
namespace {
using testing::TempDir;

std::vector<int64_t> all_tokens(const TokenDataset& ds) {
  std::vector<int64_t> v(size_t(ds.size()));
  ds.read(0, ds.size(), v.data());
  return v;
}

TEST(Prepare, TextFileEndToEnd) {
  TempDir d;
  const std::string text = testing::make_corpus(3000);
  testing::write_text(d.file("corpus.txt"), text);
  PrepareOptions o;
  o.corpus = d.file("corpus.txt");
  o.out_dir = d.file("out");
  o.vocab_size = 300;
  o.val_fraction = 0.1;
  std::vector<PrepareProgress> events;
  PrepareResult r = prepare(o, [&](const PrepareProgress& p) { events.push_back(p); });
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.vocab_size, 300);
  EXPECT_EQ(r.corpus_bytes, int64_t(text.size()));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().stage, "done");
  EXPECT_DOUBLE_EQ(events.back().fraction, 1.0);

  Tokenizer tok = Tokenizer::load(d.file("out/tokenizer.model"));
  TokenDataset train(d.file("out/train.bin")), val(d.file("out/val.bin"));
  EXPECT_EQ(train.vocab_size(), 300);
  EXPECT_EQ(train.size(), r.train_tokens);
  EXPECT_EQ(val.size(), r.val_tokens);
  // train ++ val is exactly the encoded corpus; val starts on a line boundary.
  std::vector<int> expect = tok.encode(text);
  auto t = all_tokens(train), v = all_tokens(val);
  ASSERT_EQ(t.size() + v.size(), expect.size());
  t.insert(t.end(), v.begin(), v.end());
  EXPECT_TRUE(std::equal(t.begin(), t.end(), expect.begin()));
  EXPECT_EQ(t[size_t(r.train_tokens - 1)], Tokenizer::kEosId);
  double frac = double(r.val_tokens) / double(expect.size());
  EXPECT_NEAR(frac, 0.1, 0.01);
  // Decoding everything gives the corpus back.
  std::vector<int> all(t.begin(), t.end());
  EXPECT_EQ(tok.decode(all), text);

  std::ifstream in(d.file("out/meta.json"));
  nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_EQ(m["corpus"], o.corpus);
  EXPECT_EQ(m["vocab_size"], 300);
  EXPECT_EQ(m["train_tokens"], r.train_tokens);
  EXPECT_EQ(m["val_tokens"], r.val_tokens);
  EXPECT_EQ(m["corpus_bytes"], int64_t(text.size()));
  EXPECT_EQ(m["corpus_fnv1a64"], fnv1a64_hex(text));
  EXPECT_TRUE(m.contains("created_utc"));
}

TEST(Prepare, IsIdempotentAndRebuildsWhenInputsChange) {
  TempDir d;
  testing::write_text(d.file("corpus.txt"), testing::make_corpus(1500));
  PrepareOptions o;
  o.corpus = d.file("corpus.txt");
  o.out_dir = d.file("out");
  o.vocab_size = 200;
  PrepareResult first = prepare(o);
  EXPECT_FALSE(first.skipped);
  auto mtime = std::filesystem::last_write_time(d.file("out/train.bin"));

  std::string last_stage;
  PrepareResult again = prepare(o, [&](const PrepareProgress& p) { last_stage = p.stage; });
  EXPECT_TRUE(again.skipped);
  EXPECT_EQ(last_stage, "skip");
  EXPECT_EQ(again.train_tokens, first.train_tokens);
  EXPECT_EQ(again.val_tokens, first.val_tokens);
  EXPECT_EQ(std::filesystem::last_write_time(d.file("out/train.bin")), mtime);

  o.force = true;
  EXPECT_FALSE(prepare(o).skipped);
  o.force = false;

  o.vocab_size = 220;  // changed option
  PrepareResult r = prepare(o);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(TokenDataset(d.file("out/train.bin")).vocab_size(), 220);
  EXPECT_TRUE(prepare(o).skipped);

  testing::write_text(d.file("corpus.txt"), testing::make_corpus(1500, 77));  // changed corpus
  EXPECT_FALSE(prepare(o).skipped);

  std::filesystem::remove(d.file("out/val.bin"));  // damaged output
  EXPECT_FALSE(prepare(o).skipped);
  EXPECT_TRUE(std::filesystem::exists(d.file("out/val.bin")));

  testing::write_text(d.file("out/meta.json"), "{not json");
  EXPECT_FALSE(prepare(o).skipped);
  EXPECT_TRUE(prepare(o).skipped);
}

TEST(Prepare, FolderCorpus) {
  TempDir d;
  testing::write_text(d.file("texts/b.txt"), testing::make_corpus(800, 2));
  testing::write_text(d.file("texts/a/a.txt"), testing::make_corpus(800, 3));
  testing::write_text(d.file("texts/blob.dat"), std::string("\0\1\2", 3));
  PrepareOptions o;
  o.corpus = d.file("texts");
  o.out_dir = d.file("out");
  o.vocab_size = 200;
  o.val_fraction = 0.0;
  std::vector<std::string> warnings;
  PrepareResult r = prepare(o, [&](const PrepareProgress& p) {
    if (p.stage == "warning") warnings.push_back(p.message);
  });
  EXPECT_EQ(r.val_tokens, 0);
  EXPECT_GT(r.train_tokens, 1000);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("blob.dat"), std::string::npos);
  Tokenizer tok = Tokenizer::load(d.file("out/tokenizer.model"));
  TokenDataset train(d.file("out/train.bin"));
  std::vector<int64_t> t = all_tokens(train);
  std::vector<int> ids(t.begin(), t.end());
  EXPECT_EQ(tok.decode(ids), testing::make_corpus(800, 3) + testing::make_corpus(800, 2));
}

TEST(Prepare, BadInputs) {
  TempDir d;
  PrepareOptions o;
  o.corpus = d.file("missing.txt");
  o.out_dir = d.file("out");
  EXPECT_THROW(prepare(o), DataError);
  testing::write_text(d.file("c.txt"), "few words\n");
  o.corpus = d.file("c.txt");
  o.vocab_size = 4096;
  EXPECT_THROW(prepare(o), DataError);
  EXPECT_FALSE(std::filesystem::exists(d.file("out/meta.json")));
  o.val_fraction = 1.0;
  EXPECT_THROW(prepare(o), ValueError);
}

TEST(Prepare, WholeKjvIsFast) {
  if (!std::filesystem::exists("/usr/bin/bible")) GTEST_SKIP() << "bible-kjv is not installed";
  TempDir d;
  PrepareOptions o;
  o.corpus = "kjv";
  o.out_dir = d.file("kjv");
  o.vocab_size = 4096;
  auto t0 = std::chrono::steady_clock::now();
  PrepareResult r = prepare(o);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 60.0);
  EXPECT_EQ(r.vocab_size, 4096);
  EXPECT_GT(r.train_tokens, 500000);
  EXPECT_GT(r.val_tokens, 0);
  std::cout << "KJV: " << r.train_tokens << " train + " << r.val_tokens << " val tokens in " << s << " s\n";
  Tokenizer tok = Tokenizer::load(d.file("kjv/tokenizer.model"));
  auto ids = tok.encode_strict("In the beginning", "prompt");
  EXPECT_EQ(tok.decode(ids), "In the beginning");
  EXPECT_THROW(tok.encode_strict("caf\xc3\xa9", "prompt"), DataError);
  EXPECT_TRUE(prepare(o).skipped);
}

}  // namespace
}  // namespace brigade::data
