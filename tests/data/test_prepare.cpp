// prepare(): a text file and a folder end to end, the train/val split, meta.json,
// idempotency (skip when unchanged; rebuild on changed corpus/options/missing files), KJV speed;
// ensure_prepared()/check_prepared(): a prepared folder is rebuilt when the recipe asks for another
// corpus, an edited one or other options (saying why), left untouched when nothing changed, and a
// foreign or unreadable folder is a DataError.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"
#include "brigade/data/text/prepare.h"
#include "brigade/data/text/token_file.h"
#include "brigade/data/text/tokenizer.h"
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

// ---- ensure_prepared

struct Events {
  std::vector<PrepareProgress> all;
  PrepareProgressFn fn() {
    return [this](const PrepareProgress& p) { all.push_back(p); };
  }
  std::string stage(const std::string& name) const {  // the messages of one stage, joined
    std::string out;
    for (const auto& e : all)
      if (e.stage == name) out += e.message + "\n";
    return out;
  }
};

PrepareOptions small_options(const TempDir& d, const std::string& corpus) {
  PrepareOptions o;
  o.corpus = d.file(corpus);
  o.out_dir = d.file("prepared");
  o.vocab_size = 200;
  o.val_fraction = 0.1;
  return o;
}

std::string decoded_tokens(const TempDir& d) {  // train ++ val, decoded with the folder's tokenizer
  Tokenizer tok = Tokenizer::load(d.file("prepared/tokenizer.model"));
  auto t = all_tokens(TokenDataset(d.file("prepared/train.bin")));
  auto v = all_tokens(TokenDataset(d.file("prepared/val.bin")));
  t.insert(t.end(), v.begin(), v.end());
  return tok.decode(std::vector<int>(t.begin(), t.end()));
}

TEST(EnsurePrepared, PreparesAMissingFolderAndSaysSo) {
  TempDir d;
  testing::write_text(d.file("a.txt"), testing::make_corpus(1200, 1));
  PrepareOptions o = small_options(d, "a.txt");
  Events ev;
  PrepareResult r = ensure_prepared(o, ev.fn());
  EXPECT_FALSE(r.skipped);
  EXPECT_NE(ev.stage("stale").find("not prepared yet: preparing it from " + o.corpus), std::string::npos)
      << ev.stage("stale");
  EXPECT_TRUE(decoded_tokens(d) == testing::make_corpus(1200, 1)) << "the token files do not hold that corpus";
  EXPECT_EQ(check_prepared(o).state, PreparedStatus::State::kUpToDate);
}

TEST(EnsurePrepared, AnotherCorpusIsPreparedAgainAndTheProgressSaysWhy) {
  TempDir d;
  testing::write_text(d.file("a.txt"), testing::make_corpus(1200, 1));
  testing::write_text(d.file("b.txt"), testing::make_corpus(1300, 5));
  PrepareOptions a = small_options(d, "a.txt"), b = small_options(d, "b.txt");
  prepare(a);
  const std::string train_a = testing::read_bytes(d.file("prepared/train.bin"));

  // What `brigade train RECIPE --set data.corpus=b.txt` does with data.dir already prepared from a.txt.
  Events ev;
  PrepareResult r = ensure_prepared(b, ev.fn());
  EXPECT_FALSE(r.skipped);
  const std::string why = ev.stage("stale");
  EXPECT_NE(why.find(a.out_dir + " was prepared from " + a.corpus + ", the recipe asks for " + b.corpus +
                     ": preparing again"),
            std::string::npos)
      << why;
  EXPECT_NE(r.reason.find(b.corpus), std::string::npos);
  EXPECT_TRUE(testing::read_bytes(d.file("prepared/train.bin")) != train_a) << "train.bin still holds corpus A";
  EXPECT_TRUE(decoded_tokens(d) == testing::make_corpus(1300, 5)) << "the token files do not hold that corpus";
  std::ifstream in(d.file("prepared/meta.json"));
  EXPECT_EQ(nlohmann::json::parse(in)["corpus"], b.corpus);
}

TEST(EnsurePrepared, TheSameCorpusTouchesNothing) {
  TempDir d;
  testing::write_text(d.file("a.txt"), testing::make_corpus(1200, 1));
  PrepareOptions o = small_options(d, "a.txt");
  PrepareResult first = prepare(o);
  namespace fs = std::filesystem;
  const std::vector<std::string> files = {"prepared/train.bin", "prepared/val.bin", "prepared/tokenizer.model",
                                          "prepared/meta.json"};
  std::vector<fs::file_time_type> times;
  for (const auto& f : files) times.push_back(fs::last_write_time(d.file(f)));
  const std::string meta = testing::read_bytes(d.file("prepared/meta.json"));

  Events ev;
  PrepareResult r = ensure_prepared(o, ev.fn());
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(r.reason.empty());
  EXPECT_EQ(ev.stage("stale"), "");
  EXPECT_NE(ev.stage("skip").find("is up to date"), std::string::npos);
  EXPECT_EQ(r.train_tokens, first.train_tokens);
  EXPECT_EQ(r.val_tokens, first.val_tokens);
  EXPECT_EQ(r.vocab_size, 200);
  for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(fs::last_write_time(d.file(files[i])), times[i]) << files[i];
  EXPECT_TRUE(testing::read_bytes(d.file("prepared/meta.json")) == meta) << "meta.json was rewritten";

  // Another spelling of the same file is the same corpus.
  PrepareOptions dotted = o;
  dotted.corpus = (d.path() / "." / "a.txt").string();
  EXPECT_TRUE(ensure_prepared(dotted).skipped);
}

TEST(EnsurePrepared, AnEditedCorpusFileIsDetected) {
  TempDir d;
  std::string text = testing::make_corpus(1200, 1);
  testing::write_text(d.file("a.txt"), text);
  PrepareOptions o = small_options(d, "a.txt");
  prepare(o);
  const std::string train_before = testing::read_bytes(d.file("prepared/train.bin"));
  // Same size, other text: only the modification time (and ctime) tell.
  const size_t at = text.find("the");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 3, "day");
  testing::write_text(d.file("a.txt"), text);
  ASSERT_EQ(std::filesystem::file_size(d.file("a.txt")), testing::make_corpus(1200, 1).size());

  Events ev;
  PrepareResult r = ensure_prepared(o, ev.fn());
  EXPECT_FALSE(r.skipped);
  const std::string why = ev.stage("stale");
  EXPECT_NE(why.find(std::filesystem::path(o.corpus).lexically_normal().string() + " changed since " + o.out_dir +
                     " was prepared"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("preparing again"), std::string::npos) << why;
  EXPECT_TRUE(testing::read_bytes(d.file("prepared/train.bin")) != train_before)
      << "train.bin still holds the old text";
  EXPECT_TRUE(decoded_tokens(d) == text) << "the token files do not hold that corpus";
  EXPECT_TRUE(ensure_prepared(o).skipped);
}

TEST(EnsurePrepared, ATouchedButUnchangedFileKeepsTheTokenFiles) {
  TempDir d;
  testing::write_text(d.file("a.txt"), testing::make_corpus(1200, 1));
  PrepareOptions o = small_options(d, "a.txt");
  prepare(o);
  namespace fs = std::filesystem;
  const auto train_time = fs::last_write_time(d.file("prepared/train.bin"));
  fs::last_write_time(d.file("a.txt"), fs::last_write_time(d.file("a.txt")) + std::chrono::seconds(5));

  Events ev;
  PrepareResult r = ensure_prepared(o, ev.fn());
  EXPECT_NE(ev.stage("stale").find("changed since"), std::string::npos);
  EXPECT_TRUE(r.skipped);  // prepare() found the same text
  EXPECT_NE(ev.stage("skip").find("unchanged"), std::string::npos) << ev.stage("skip");
  EXPECT_EQ(fs::last_write_time(d.file("prepared/train.bin")), train_time);
  Events again;
  EXPECT_TRUE(ensure_prepared(o, again.fn()).skipped);  // meta.json now records the new time
  EXPECT_EQ(again.stage("stale"), "");
}

TEST(EnsurePrepared, OptionsAndFolderContentsAreCompared) {
  TempDir d;
  testing::write_text(d.file("texts/a.txt"), testing::make_corpus(900, 2));
  testing::write_text(d.file("texts/b.txt"), testing::make_corpus(900, 3));
  PrepareOptions o = small_options(d, "texts");
  prepare(o);

  PrepareOptions v = o;
  v.vocab_size = 230;
  PreparedStatus st = check_prepared(v);
  EXPECT_EQ(st.state, PreparedStatus::State::kStale);
  EXPECT_NE(st.reason.find("vocab_size 200, the recipe asks for 230"), std::string::npos) << st.reason;
  PrepareOptions f = o;
  f.val_fraction = 0.2;
  st = check_prepared(f);
  EXPECT_EQ(st.state, PreparedStatus::State::kStale);
  EXPECT_NE(st.reason.find("val_fraction 0.1, the recipe asks for 0.2"), std::string::npos) << st.reason;

  testing::write_text(d.file("texts/c.txt"), testing::make_corpus(900, 4));  // a file added to the folder
  st = check_prepared(o);
  EXPECT_EQ(st.state, PreparedStatus::State::kStale);
  EXPECT_NE(st.reason.find("1 file(s) added"), std::string::npos) << st.reason;
  EXPECT_NE(st.reason.find("c.txt"), std::string::npos) << st.reason;
  EXPECT_FALSE(ensure_prepared(o).skipped);
  EXPECT_TRUE(decoded_tokens(d) ==
              testing::make_corpus(900, 2) + testing::make_corpus(900, 3) + testing::make_corpus(900, 4))
      << "the token files do not hold that corpus";
  std::filesystem::remove(d.file("texts/a.txt"));
  st = check_prepared(o);
  EXPECT_NE(st.reason.find("1 file(s) removed"), std::string::npos) << st.reason;

  prepare(o);
  EXPECT_EQ(check_prepared(o).state, PreparedStatus::State::kUpToDate);
  std::filesystem::remove(d.file("prepared/val.bin"));  // damaged output
  st = check_prepared(o);
  EXPECT_EQ(st.state, PreparedStatus::State::kStale);
  EXPECT_NE(st.reason.find("val.bin is missing"), std::string::npos) << st.reason;
}

TEST(EnsurePrepared, AnOldMetaWithoutTheNewFieldsIsPreparedAgain) {
  TempDir d;
  testing::write_text(d.file("a.txt"), testing::make_corpus(1200, 1));
  PrepareOptions o = small_options(d, "a.txt");
  prepare(o);
  nlohmann::json m;
  {
    std::ifstream in(d.file("prepared/meta.json"));
    m = nlohmann::json::parse(in);
  }
  m["format"] = 1;  // what format-1 prepare wrote: no corpus_source, no tokenizer_train
  m.erase("corpus_source");
  m.erase("tokenizer_train");
  testing::write_text(d.file("prepared/meta.json"), m.dump(2));
  Events ev;
  PrepareResult r = ensure_prepared(o, ev.fn());
  EXPECT_FALSE(r.skipped);
  EXPECT_NE(ev.stage("stale").find("older Brigade (meta.json format 1, now 2)"), std::string::npos)
      << ev.stage("stale");
  std::ifstream in(d.file("prepared/meta.json"));
  nlohmann::json now = nlohmann::json::parse(in);
  EXPECT_EQ(now["format"], kPrepareFormat);
  EXPECT_TRUE(now.contains("corpus_source"));
  EXPECT_TRUE(ensure_prepared(o).skipped);
}

TEST(EnsurePrepared, AForeignOrUnreadableFolderIsADataError) {
  TempDir d;
  testing::write_text(d.file("a.txt"), testing::make_corpus(1200, 1));
  PrepareOptions o = small_options(d, "a.txt");
  testing::write_text(d.file("prepared/notes.txt"), "mine\n");
  try {
    ensure_prepared(o);
    ADD_FAILURE() << "a folder of someone else's files was prepared into";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(o.out_dir), std::string::npos) << msg;
    EXPECT_NE(msg.find("notes.txt"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no meta.json"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(testing::read_bytes(d.file("prepared/notes.txt")), "mine\n");
  std::filesystem::remove(d.file("prepared/notes.txt"));

  // Only the files of an interrupted prepare (no meta.json yet): prepared again.
  testing::write_text(d.file("prepared/train.bin"), "partial");
  Events ev;
  EXPECT_FALSE(ensure_prepared(o, ev.fn()).skipped);
  EXPECT_NE(ev.stage("stale").find("unfinished prepare"), std::string::npos) << ev.stage("stale");

  testing::write_text(d.file("prepared/meta.json"), "{not json");
  try {
    ensure_prepared(o);
    ADD_FAILURE() << "a corrupted meta.json was accepted";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(d.file("prepared/meta.json")), std::string::npos) << msg;
    EXPECT_NE(msg.find("brigade prepare"), std::string::npos) << msg;
  }
}

TEST(EnsurePrepared, ACorpusThatIsGoneKeepsThePreparedData) {
  TempDir d;
  testing::write_text(d.file("a.txt"), testing::make_corpus(1200, 1));
  PrepareOptions o = small_options(d, "a.txt");
  prepare(o);
  std::filesystem::remove(d.file("a.txt"));
  Events ev;
  EXPECT_TRUE(ensure_prepared(o, ev.fn()).skipped);
  EXPECT_NE(ev.stage("warning").find("cannot be read any more"), std::string::npos) << ev.stage("warning");
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
