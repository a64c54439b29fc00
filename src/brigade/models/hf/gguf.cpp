// GGUF v3 export of GPT-2 and LLaMA; see gguf.h for the layout, names and transforms.
#include "brigade/models/hf/gguf.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/tensor.h"
#include "brigade/data/atomic_file.h"
#include "brigade/data/text/bpe.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"

namespace brigade::models {

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;

// gguf_metadata_value_type (ggml docs/gguf.md).
enum ValueType : uint32_t {
  // clang-format off
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  // clang-format on
};

// ggml_type ids of the dtypes written.
uint32_t ggml_type(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::BF16: return 30;
    default: throw InternalError(fmt::format("gguf: no ggml type for {}", dtype_name(t)));
  }
}

// general.file_type (llama_ftype): ALL_F32, MOSTLY_F16, MOSTLY_BF16.
uint32_t file_type(DType t) { return t == DType::F32 ? 0 : t == DType::F16 ? 1 : 32; }

// Little-endian byte sink (x86 and arm hosts are little-endian; the data is copied as stored).
struct Bytes {
  std::string b;
  template <class T>
  void raw(T v) {
    char c[sizeof(T)];
    std::memcpy(c, &v, sizeof(T));
    b.append(c, sizeof(T));
  }
  void u32(uint32_t v) { raw(v); }
  void i32(int32_t v) { raw(v); }
  void u64(uint64_t v) { raw(v); }
  void f32(float v) { raw(v); }
  void str(const std::string& s) {
    u64(s.size());
    b += s;
  }
};

// The metadata section, counted as it is built.
struct Metadata {
  Bytes out;
  uint64_t count = 0;
  void key(const std::string& k, ValueType t) {
    out.str(k);
    out.u32(t);
    ++count;
  }
  void u32(const std::string& k, int64_t v) {
    BRIGADE_CHECK(v >= 0 && v <= int64_t(UINT32_MAX), ValueError, "save_gguf: {} = {} does not fit a u32", k, v);
    key(k, kU32);
    out.u32(uint32_t(v));
  }
  void f32(const std::string& k, double v) {
    key(k, kF32);
    out.f32(float(v));
  }
  void boolean(const std::string& k, bool v) {
    key(k, kBool);
    out.raw<uint8_t>(v ? 1 : 0);
  }
  void str(const std::string& k, const std::string& v) {
    key(k, kString);
    out.str(v);
  }
  void strings(const std::string& k, const std::vector<std::string>& v) {
    key(k, kArray);
    out.u32(kString);
    out.u64(v.size());
    for (const std::string& s : v) out.str(s);
  }
  void f32s(const std::string& k, const std::vector<float>& v) {
    key(k, kArray);
    out.u32(kF32);
    out.u64(v.size());
    for (float x : v) out.f32(x);
  }
  void i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, kArray);
    out.u32(kI32);
    out.u64(v.size());
    for (int32_t x : v) out.i32(x);
  }
};

struct OutTensor {
  std::string name;
  Tensor data;  // contiguous, in the dtype written, torch (row-major) shape
};

uint64_t pad_to(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// 2-D weights in the chosen dtype, 1-D tensors in F32 (contiguous either way).
Tensor stored(const Tensor& t, DType dtype) {
  const Tensor c = t.dim() >= 2 ? t.to(dtype) : t.to(DType::F32);
  return c.contiguous();
}

// llama.cpp's converter permutation of q_proj / k_proj rows: (heads, 2, HS/2, C) with axes 1 and 2
// swapped, so each head's rotary pairs (i, i + HS/2) become adjacent rows (2i, 2i + 1).
Tensor permute_rope_rows(const Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), cols = w.size(1);
  BRIGADE_CHECK(heads > 0 && rows % (2 * heads) == 0, ValueError,
                "save_gguf: a rotary projection of {} rows cannot be split into {} heads of even size", rows, heads);
  return w.contiguous()
      .reshape({heads, 2, rows / heads / 2, cols})  // (H, 2, HS/2, C)
      .transpose(1, 2)                              // (H, HS/2, 2, C)
      .contiguous()
      .reshape({rows, cols});
}

std::vector<OutTensor> gpt2_tensors(const GPT& g, DType dtype) {
  static const std::regex block(
      R"(transformer\.h\.(\d+)\.(ln_1|attn\.c_attn|attn\.c_proj|ln_2|mlp\.c_fc|mlp\.c_proj)\.(weight|bias))");
  static const std::map<std::string, std::string> part = {{"ln_1", "attn_norm"},          {"attn.c_attn", "attn_qkv"},
                                                          {"attn.c_proj", "attn_output"}, {"ln_2", "ffn_norm"},
                                                          {"mlp.c_fc", "ffn_up"},         {"mlp.c_proj", "ffn_down"}};
  std::vector<OutTensor> out;
  Tensor wte;
  for (auto& [name, p] : g.named_parameters()) {
    std::smatch m;
    if (name == "transformer.wte.weight") {
      wte = stored(p, dtype);
      out.push_back({"token_embd.weight", wte});
    } else if (name == "transformer.wpe.weight") {
      out.push_back({"position_embd.weight", stored(p, dtype)});
    } else if (name == "transformer.ln_f.weight" || name == "transformer.ln_f.bias") {
      out.push_back({"output_norm." + name.substr(name.rfind('.') + 1), stored(p, dtype)});
    } else if (std::regex_match(name, m, block)) {
      const bool conv1d_weight = m[3] == "weight" && p.dim() == 2;  // HF Conv1D: (in, out) -> (out, in)
      out.push_back({"blk." + m[1].str() + "." + part.at(m[2].str()) + "." + m[3].str(),
                     stored(conv1d_weight ? p.transpose(0, 1) : p, dtype)});
    } else {
      throw InternalError(fmt::format("save_gguf: GPT-2 parameter {} has no GGUF name", name));
    }
  }
  // GPT-2's head is tied to wte. Earlier converters wrote it out again as output.weight and some
  // llama.cpp builds require it (newer ones fall back to token_embd), so the copy is written.
  BRIGADE_CHECK(wte.defined(), InternalError, "save_gguf: GPT-2 model without transformer.wte.weight");
  out.push_back({"output.weight", wte});
  return out;
}

std::vector<OutTensor> llama_tensors(const LLaMA& l, DType dtype) {
  const LLaMAConfig& c = l.config();
  static const std::regex block(
      R"(model\.layers\.(\d+)\.(input_layernorm|self_attn\.[qkvo]_proj|post_attention_layernorm|mlp\.(gate|up|down)_proj)\.weight)");
  static const std::map<std::string, std::string> part = {
      {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"},      {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},           {"mlp.down_proj", "ffn_down"}};
  std::vector<OutTensor> out;
  for (auto& [name, p] : l.named_parameters()) {
    std::smatch m;
    if (name == "model.embed_tokens.weight") {
      out.push_back({"token_embd.weight", stored(p, dtype)});
    } else if (name == "model.norm.weight") {
      out.push_back({"output_norm.weight", stored(p, dtype)});
    } else if (name == "lm_head.weight") {
      out.push_back({"output.weight", stored(p, dtype)});
    } else if (std::regex_match(name, m, block)) {
      const std::string what = m[2].str();
      Tensor t = p;
      if (what == "self_attn.q_proj") t = permute_rope_rows(p, c.n_head);
      if (what == "self_attn.k_proj") t = permute_rope_rows(p, c.n_kv_head);
      out.push_back({"blk." + m[1].str() + "." + part.at(what) + ".weight", stored(t, dtype)});
    } else {
      throw InternalError(fmt::format("save_gguf: LLaMA parameter {} has no GGUF name", name));
    }
  }
  return out;
}

// tokenizer.ggml.* from a SentencePiece model, as the converter's SentencePiece vocabulary.
void tokenizer_metadata(Metadata& md, const std::string& path, int64_t vocab_size, bool add_bos) {
  BRIGADE_CHECK(fs::is_regular_file(path), IoError, "save_gguf: tokenizer model {} does not exist", path);
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  BRIGADE_CHECK(f.good() || f.eof(), IoError, "save_gguf: cannot read tokenizer model {}", path);
  sentencepiece::SentencePieceProcessor sp;
  const auto st = sp.LoadFromSerializedProto(ss.str());
  BRIGADE_CHECK(st.ok(), DataError, "save_gguf: {} is not a SentencePiece model: {}", path, st.ToString());
  const int64_t n = sp.GetPieceSize();
  BRIGADE_CHECK(n <= vocab_size, ValueError,
                "save_gguf: the tokenizer {} has {} pieces but the model's vocabulary is {}; they must belong "
                "together",
                path, n, vocab_size);
  // llama_token_type (gguf-py TokenType / SentencePieceTokenTypes).
  constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUnused = 5, kByte = 6;
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int id = 0; id < n; ++id) {
    tokens.push_back(sp.IdToPiece(id));
    scores.push_back(sp.GetScore(id));
    types.push_back(sp.IsUnknown(id)   ? kUnknown
                    : sp.IsControl(id) ? kControl
                    : sp.IsUnused(id)  ? kUnused
                    : sp.IsByte(id)    ? kByte
                                       : kNormal);
  }
  for (int64_t id = n; id < vocab_size; ++id) {  // rows the model has past the tokenizer's pieces
    tokens.push_back("[PAD" + std::to_string(id) + "]");
    scores.push_back(-10000.0f);
    types.push_back(kUnused);
  }
  md.str("tokenizer.ggml.model", "llama");
  md.str("tokenizer.ggml.pre", "default");
  md.strings("tokenizer.ggml.tokens", tokens);
  md.f32s("tokenizer.ggml.scores", scores);
  md.i32s("tokenizer.ggml.token_type", types);
  if (sp.bos_id() >= 0) md.u32("tokenizer.ggml.bos_token_id", sp.bos_id());
  if (sp.eos_id() >= 0) md.u32("tokenizer.ggml.eos_token_id", sp.eos_id());
  if (sp.unk_id() >= 0) md.u32("tokenizer.ggml.unknown_token_id", sp.unk_id());
  if (sp.pad_id() >= 0) md.u32("tokenizer.ggml.padding_token_id", sp.pad_id());
  // This engine trains without BOS (and ends lines with EOS itself): a runner should not prepend one.
  // A LlamaTokenizer model's documents start with BOS (add_bos_token).
  md.boolean("tokenizer.ggml.add_bos_token", add_bos);
  md.boolean("tokenizer.ggml.add_eos_token", false);
}

// tokenizer.ggml.* from a byte-level BPE, as the converter's gpt2 vocabulary: the tokens by id in
// their byte-mapped spelling, the merges, the token types, and the pre-tokenizer by llama.cpp's name.
void bpe_tokenizer_metadata(Metadata& md, const GgufOptions& o, int64_t vocab_size) {
  const fs::path dir(o.bpe_tokenizer_dir);
  std::error_code ec;
  const data::ByteLevelBpe bpe =
      fs::is_regular_file(dir / "vocab.json", ec) && fs::is_regular_file(dir / "merges.txt", ec)
          ? data::ByteLevelBpe::from_gpt2_files((dir / "vocab.json").string(), (dir / "merges.txt").string())
          : data::ByteLevelBpe::from_tokenizer_json((dir / "tokenizer.json").string());
  const std::vector<std::string> pats = bpe.pre_tokenizer_patterns();
  std::string pre;
  if (pats == std::vector<std::string>{data::kGpt2Pattern}) pre = "gpt-2";
  if (pats == std::vector<std::string>{data::kLlama3Pattern, ""}) pre = "llama-bpe";
  BRIGADE_CHECK(!pre.empty(), ValueError,
                "save_gguf: the tokenizer of {} splits text with a regex that is neither GPT-2's nor LLaMA-3's, so "
                "llama.cpp has no pre-tokenizer to match it; export without the tokenizer",
                o.bpe_tokenizer_dir);
  const int64_t n = bpe.vocab_size();
  BRIGADE_CHECK(n <= vocab_size, ValueError,
                "save_gguf: the tokenizer of {} has {} tokens but the model's vocabulary is {}; they must belong "
                "together",
                o.bpe_tokenizer_dir, n, vocab_size);
  // llama_token_type (gguf-py TokenType)
  constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int64_t id = 0; id < vocab_size; ++id) {
    std::string t;
    int32_t type = kUnused;
    if (id < n) {
      try {
        t = bpe.id_to_token(int(id));
        type = bpe.is_special(int(id)) ? kControl : bpe.is_added(int(id)) ? kUserDefined : kNormal;
      } catch (const ValueError&) {
        t.clear();  // an id no token has: padding
      }
    }
    tokens.push_back(t.empty() ? "[PAD" + std::to_string(id) + "]" : t);
    types.push_back(t.empty() ? kUnused : type);
  }
  md.str("tokenizer.ggml.model", "gpt2");
  md.str("tokenizer.ggml.pre", pre);
  md.strings("tokenizer.ggml.tokens", tokens);
  md.i32s("tokenizer.ggml.token_type", types);
  md.strings("tokenizer.ggml.merges", bpe.merges());
  if (o.bos_token_id >= 0) md.u32("tokenizer.ggml.bos_token_id", o.bos_token_id);
  if (o.eos_token_id >= 0) md.u32("tokenizer.ggml.eos_token_id", o.eos_token_id);
  md.boolean("tokenizer.ggml.add_bos_token", o.add_bos_token);
  md.boolean("tokenizer.ggml.add_eos_token", false);
}

}  // namespace

void save_gguf(const CausalLM& model, const std::string& path, const GgufOptions& o) {
  BRIGADE_CHECK(o.dtype == DType::F32 || o.dtype == DType::F16 || o.dtype == DType::BF16, ValueError,
                "save_gguf: dtype {} is not a GGUF weight dtype here; use F32, F16 or BF16", dtype_name(o.dtype));
  for (auto& [name, p] : model.named_parameters())
    BRIGADE_CHECK(name.find(".lora_") == std::string::npos, ValueError,
                  "save_gguf: the model has LoRA adapters ({}); merge them into the base first (nn::merge_lora) "
                  "and remove them, or export the adapter with ckpt::save_peft_adapter",
                  name);
  const auto* gpt = dynamic_cast<const GPT*>(&model);
  const auto* llama = dynamic_cast<const LLaMA*>(&model);
  BRIGADE_CHECK(gpt || llama, ValueError, "save_gguf: a {} model has no GGUF layout here; GPT-2 and LLaMA do",
                model.arch());

  Metadata md;
  const std::string arch = gpt ? "gpt2" : "llama";
  md.str("general.architecture", arch);
  if (!o.name.empty()) md.str("general.name", o.name);
  md.u32("general.file_type", file_type(o.dtype));
  md.u32("general.quantization_version", 2);
  md.u32("general.alignment", kAlignment);
  std::vector<OutTensor> tensors;
  if (gpt) {
    const GPTConfig& c = gpt->config();
    md.u32("gpt2.context_length", c.block_size);
    md.u32("gpt2.embedding_length", c.n_embd);
    md.u32("gpt2.feed_forward_length", 4 * c.n_embd);
    md.u32("gpt2.block_count", c.n_layer);
    md.u32("gpt2.attention.head_count", c.n_head);
    md.f32("gpt2.attention.layer_norm_epsilon", c.layer_norm_eps);
    tensors = gpt2_tensors(*gpt, o.dtype);
  } else {
    const LLaMAConfig& c = llama->config();
    BRIGADE_CHECK(c.rope_scaling == ops::RopeScaling::None, ValueError,
                  "save_gguf: the model's RoPE uses the {} frequency scaling, which this GGUF writer does not "
                  "record yet (llama.cpp would run it unscaled); export a Hugging Face directory instead "
                  "(brigade export --format hf) and convert it with llama.cpp's convert_hf_to_gguf.py",
                  ops::rope_scaling_name(c.rope_scaling));
    md.u32("llama.context_length", c.max_position);
    md.u32("llama.embedding_length", c.hidden_size);
    md.u32("llama.feed_forward_length", c.intermediate_size);
    md.u32("llama.block_count", c.n_layer);
    md.u32("llama.attention.head_count", c.n_head);
    md.u32("llama.attention.head_count_kv", c.n_kv_head);
    md.f32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps);
    md.f32("llama.rope.freq_base", c.rope_theta);
    md.u32("llama.rope.dimension_count", c.hidden_size / c.n_head);
    md.u32("llama.vocab_size", c.vocab_size);
    tensors = llama_tensors(*llama, o.dtype);
  }
  BRIGADE_CHECK(o.tokenizer_model.empty() || o.bpe_tokenizer_dir.empty(), ValueError,
                "save_gguf: give tokenizer_model or bpe_tokenizer_dir, not both");
  if (!o.tokenizer_model.empty()) tokenizer_metadata(md, o.tokenizer_model, model.vocab_size(), o.add_bos_token);
  if (!o.bpe_tokenizer_dir.empty()) bpe_tokenizer_metadata(md, o, model.vocab_size());

  Bytes head;
  head.b = "GGUF";
  head.u32(kVersion);
  head.u64(tensors.size());
  head.u64(md.count);
  head.b += md.out.b;
  uint64_t offset = 0;
  for (const OutTensor& t : tensors) {
    head.str(t.name);
    head.u32(uint32_t(t.data.dim()));
    for (int64_t d = t.data.dim() - 1; d >= 0; --d) head.u64(uint64_t(t.data.size(d)));  // GGML order: reversed
    head.u32(ggml_type(t.data.dtype()));
    head.u64(offset);
    offset = pad_to(offset + t.data.nbytes(), kAlignment);
  }
  head.b.resize(pad_to(head.b.size(), kAlignment), '\0');

  const fs::path parent = fs::path(path).parent_path();
  BRIGADE_CHECK(parent.empty() || fs::is_directory(parent), IoError, "save_gguf: cannot write {}: no folder {}", path,
                parent.string());
  data::AtomicFile f(path);
  f.write(head.b);
  const std::string zeros(kAlignment, '\0');
  for (const OutTensor& t : tensors) {
    f.write(t.data.raw_data(), t.data.nbytes());
    f.write(zeros.data(), pad_to(t.data.nbytes(), kAlignment) - t.data.nbytes());
  }
  f.commit();
}

}  // namespace brigade::models
