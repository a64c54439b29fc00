// Hugging Face model directories in; see hf_dir.h.
#include "brigade/models/hf/hf_dir.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <type_traits>

#include "brigade/ckpt/checkpoint_dir.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/core/json_number.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"

namespace brigade::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Caps on config.json's sizes, far above any published model (GPT-3 and LLaMA-3-405B: 12288 and
// 16384 wide, 96 and 126 layers, vocabularies up to 262144), so that no product of sizes a model
// computes can overflow.
constexpr int64_t kMaxVocab = int64_t(1) << 24, kMaxPositions = int64_t(1) << 24, kMaxWidth = int64_t(1) << 17,
                  kMaxLayers = int64_t(1) << 12;

// The config's fields, each read at most once through these, so the messages name the file.
struct Config {
  std::string path;
  json j;
  bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  template <class T>
  T get(const char* k) const {
    BRIGADE_CHECK(has(k), CheckpointError, "{}: no \"{}\" field", path, k);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // checked: get<int64_t>() of a float such as 1e300 is undefined behaviour
      const std::optional<int64_t> v = json_int64(j.at(k));
      BRIGADE_CHECK(v && *v >= int64_t(std::numeric_limits<T>::min()) && *v <= int64_t(std::numeric_limits<T>::max()),
                    CheckpointError, "{}: \"{}\" = {} is not a whole number; fix the field", path, k, j.at(k).dump());
      return T(*v);
    } else {
      try {
        return j.at(k).get<T>();
      } catch (const json::exception&) {
        throw CheckpointError(fmt::format("{}: \"{}\" has the wrong type ({})", path, k, j.at(k).dump()));
      }
    }
  }
  // A size field: a whole number in [1, max] (the caps keep every product of sizes far from overflow).
  int64_t size(const char* k, int64_t max) const {
    const int64_t v = get<int64_t>(k);
    BRIGADE_CHECK(v >= 1 && v <= max, CheckpointError,
                  "{}: \"{}\" = {} is outside [1, {}]; the config is damaged or "
                  "not one of a model this engine can build",
                  path, k, v, max);
    return v;
  }
  template <class T>
  T size_or(const char* k, T fallback, int64_t max) const {
    return has(k) ? T(size(k, max)) : fallback;
  }
  template <class T>
  T get_or(const char* k, T fallback) const {
    return has(k) ? get<T>(k) : fallback;
  }
  // A field the engine's model cannot represent unless it holds `ok`.
  template <class T>
  void require(const char* k, T ok, const char* why) const {
    if (!has(k)) return;
    BRIGADE_CHECK(get<T>(k) == ok, ConfigError, "{}: {} = {} is not supported: {}", path, k, j.at(k).dump(), why);
  }
};

GPTConfig gpt2_from(const Config& c, std::vector<std::string>& notes) {
  GPTConfig g;
  g.vocab_size = c.size("vocab_size", kMaxVocab);
  g.block_size = c.size("n_positions", kMaxPositions);
  g.n_layer = c.size("n_layer", kMaxLayers);
  g.n_head = c.size("n_head", kMaxWidth);
  g.n_embd = c.size("n_embd", kMaxWidth);
  g.layer_norm_eps = c.get_or<double>("layer_norm_epsilon", 1e-5);
  if (c.has("n_inner"))
    BRIGADE_CHECK(c.get<int64_t>("n_inner") == 4 * g.n_embd, ConfigError,
                  "{}: n_inner = {} is not supported: this GPT-2's MLP is 4 x n_embd = {} wide", c.path,
                  c.get<int64_t>("n_inner"), 4 * g.n_embd);
  c.require<std::string>("activation_function", "gelu_new", "this GPT-2 uses the tanh GELU (\"gelu_new\")");
  c.require<bool>("tie_word_embeddings", true, "this GPT-2 ties its head to wte");
  c.require<bool>("scale_attn_weights", true, "attention is scaled by 1/sqrt(head size)");
  c.require<bool>("scale_attn_by_inverse_layer_idx", false, "attention is scaled by 1/sqrt(head size) only");
  c.require<bool>("reorder_and_upcast_attn", false, "not implemented");
  // This GPT-2 drops out the embeddings and each residual branch with one probability, and has no
  // dropout on the attention probabilities.
  const double attn = c.get_or<double>("attn_pdrop", 0.1), embd = c.get_or<double>("embd_pdrop", 0.1),
               resid = c.get_or<double>("resid_pdrop", 0.1);
  BRIGADE_CHECK(embd == resid, ConfigError,
                "{}: embd_pdrop = {} and resid_pdrop = {}: this GPT-2 has one dropout probability for both; set "
                "them equal",
                c.path, embd, resid);
  g.dropout = resid;
  if (attn > 0)
    notes.push_back(
        fmt::format("attn_pdrop = {} is not applied: this GPT-2 has no dropout on the attention "
                    "probabilities (embd_pdrop and resid_pdrop = {} are)",
                    attn, resid));
  return g;
}

// LlamaConfig's rope_scaling (transformers' modeling_rope_utils.py): null, or an object whose
// "rope_type" (or the legacy "type") is "default" (none), "linear" (needs factor) or "llama3"
// (needs factor, low_freq_factor, high_freq_factor, original_max_position_embeddings). The
// other types change the forward in ways this LLaMA does not implement: refused by name.
void rope_scaling_from(const Config& c, LLaMAConfig& l, std::vector<std::string>& notes) {
  if (!c.has("rope_scaling")) return;
  const json& rs = c.j.at("rope_scaling");
  BRIGADE_CHECK(rs.is_object(), CheckpointError, "{}: rope_scaling = {} is neither null nor an object", c.path,
                rs.dump());
  const char* type_key = rs.contains("rope_type") ? "rope_type" : "type";
  BRIGADE_CHECK(rs.contains(type_key) && rs.at(type_key).is_string(), CheckpointError,
                "{}: rope_scaling = {} has no \"rope_type\" (or \"type\") string", c.path, rs.dump());
  const std::string type = rs.at(type_key).get<std::string>();
  if (type == "default") return;
  BRIGADE_CHECK(type == "linear" || type == "llama3", ConfigError,
                "{}: rope_scaling {} = \"{}\" is not supported: this LLaMA implements the \"linear\" and "
                "\"llama3\" RoPE scalings (not dynamic, yarn, longrope or others); the model cannot run correctly "
                "without its scaling",
                c.path, type_key, type);
  std::set<std::string> read{"rope_type", "type"};
  auto num = [&](const char* k) {
    read.insert(k);
    BRIGADE_CHECK(rs.contains(k) && rs.at(k).is_number(), CheckpointError,
                  "{}: rope_scaling of type \"{}\" needs a number \"{}\" (got {})", c.path, type, k, rs.dump());
    return rs.at(k).get<double>();
  };
  l.rope_factor = num("factor");
  if (type == "linear") {
    l.rope_scaling = ops::RopeScaling::Linear;
  } else {
    l.rope_scaling = ops::RopeScaling::Llama3;
    l.rope_low_freq_factor = num("low_freq_factor");
    l.rope_high_freq_factor = num("high_freq_factor");
    l.rope_original_max_positions = num("original_max_position_embeddings");
  }
  try {
    ops::check_rope_spec(l.rope(), "rope_scaling");
  } catch (const ValueError& e) {
    throw ConfigError(fmt::format("{}: {}", c.path, e.what()));
  }
  for (auto& [k, v] : rs.items())
    if (!read.count(k))
      notes.push_back(
          fmt::format("rope_scaling's \"{}\" = {} is not read: the {} scaling has no such parameter "
                      "(transformers ignores it too)",
                      k, v.dump(), type));
}

LLaMAConfig llama_from(const Config& c, std::vector<std::string>& notes) {
  LLaMAConfig l;
  l.vocab_size = c.size("vocab_size", kMaxVocab);
  l.hidden_size = c.size("hidden_size", kMaxWidth);
  l.intermediate_size = c.size("intermediate_size", kMaxWidth * 8);
  l.n_layer = c.size("num_hidden_layers", kMaxLayers);
  l.n_head = c.size("num_attention_heads", kMaxWidth);
  l.n_kv_head = c.size_or<int64_t>("num_key_value_heads", l.n_head, kMaxWidth);
  l.max_position = c.size("max_position_embeddings", kMaxPositions);
  l.rms_norm_eps = c.get_or<double>("rms_norm_eps", 1e-6);
  l.rope_theta = c.get_or<double>("rope_theta", 10000.0);
  BRIGADE_CHECK(l.n_head > 0 && l.hidden_size % l.n_head == 0, ConfigError,
                "{}: hidden_size = {} is not a multiple of num_attention_heads = {}", c.path, l.hidden_size, l.n_head);
  if (c.has("head_dim"))
    BRIGADE_CHECK(c.get<int64_t>("head_dim") == l.hidden_size / l.n_head, ConfigError,
                  "{}: head_dim = {} is not supported: this LLaMA's head size is hidden_size / num_attention_heads "
                  "= {}",
                  c.path, c.get<int64_t>("head_dim"), l.hidden_size / l.n_head);
  rope_scaling_from(c, l, notes);
  l.tie_word_embeddings = c.get_or<bool>("tie_word_embeddings", false);
  c.require<bool>("attention_bias", false, "this LLaMA's projections have no biases");
  c.require<bool>("mlp_bias", false, "this LLaMA's MLP has no biases");
  c.require<std::string>("hidden_act", "silu", "this LLaMA's MLP is SwiGLU (silu)");
  c.require<int64_t>("pretraining_tp", 1, "a pretraining_tp > 1 splits the MLP differently");
  c.require<double>("attention_dropout", 0.0, "this LLaMA has no dropout");
  return l;
}

// The file's key as this engine's parameter name ("" for a key to skip, with `why`).
std::string engine_name(const std::string& type, bool tied, const std::string& key, std::string& why) {
  static const std::regex gpt2_buffer(R"((transformer\.)?h\.\d+\.attn\.(bias|masked_bias))");
  static const std::regex llama_buffer(R"((model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  if (type == "gpt2") {
    if (std::regex_match(key, gpt2_buffer)) return why = "a causal-mask buffer", "";
    if (key == "lm_head.weight") return why = "the head, tied to wte (checked equal)", "";
    return key.rfind("transformer.", 0) == 0 ? key : "transformer." + key;
  }
  if (std::regex_match(key, llama_buffer)) return why = "a rotary buffer", "";
  if (key == "lm_head.weight" && tied) return why = "the head, tied to embed_tokens (checked equal)", "";
  if (key == "lm_head.weight" || key.rfind("model.", 0) == 0) return key;
  return "model." + key;
}

}  // namespace

HfConfig read_hf_config(const std::string& dir) {
  const fs::path cfg_path = fs::path(dir) / "config.json";
  BRIGADE_CHECK(fs::is_regular_file(cfg_path), CheckpointError,
                "{}: no config.json; a Hugging Face model directory holds config.json and model.safetensors (or "
                "its shards and model.safetensors.index.json)",
                dir);
  Config c;
  c.path = cfg_path.string();
  c.j = json::parse(ckpt::read_checkpoint_file(cfg_path), nullptr, /*allow_exceptions=*/false);
  BRIGADE_CHECK(!c.j.is_discarded() && c.j.is_object(), CheckpointError, "{}: not a JSON object", c.path);
  HfConfig out;
  out.model_type = c.get<std::string>("model_type");
  if (out.model_type == "gpt2")
    out.gpt = gpt2_from(c, out.notes);
  else if (out.model_type == "llama")
    out.llama = llama_from(c, out.notes);
  else
    throw ConfigError(
        fmt::format("{}: model_type \"{}\" is not supported; supported: \"gpt2\" (GPT2LMHeadModel), "
                    "\"llama\" (LlamaForCausalLM)",
                    c.path, out.model_type));
  return out;
}

std::unique_ptr<CausalLM> make_hf_model(const HfConfig& c) {
  if (c.model_type == "gpt2") return std::make_unique<GPT>(c.gpt);
  return std::make_unique<LLaMA>(c.llama);
}

std::vector<std::string> load_hf_weights(const std::string& dir, const std::string& model_type, CausalLM& model) {
  const fs::path root(dir);
  BRIGADE_CHECK(model_type == "gpt2" || model_type == "llama", ValueError,
                "load_hf_weights: model_type \"{}\"; \"gpt2\" or \"llama\"", model_type);
  BRIGADE_CHECK(model_type == (dynamic_cast<const GPT*>(&model) ? "gpt2" : "llama"), ConfigError,
                "{}: a {} checkpoint cannot load into a {} model", dir, model_type, model.arch());
  // The head is tied for every GPT-2 and for a LLaMA with tie_word_embeddings; its embedding:
  const auto* llama = dynamic_cast<const LLaMA*>(&model);
  const bool tied = model_type == "gpt2" || (llama && llama->config().tie_word_embeddings);
  const std::string embedding = model_type == "gpt2" ? "transformer.wte.weight" : "model.embed_tokens.weight";
  std::vector<std::string> skipped;
  // The weight files: one, or the shards of the index.
  std::vector<fs::path> files;
  const fs::path single = root / "model.safetensors", index = root / "model.safetensors.index.json";
  if (fs::is_regular_file(single)) {
    files.push_back(single);
  } else {
    BRIGADE_CHECK(fs::is_regular_file(index), CheckpointError,
                  "{}: neither model.safetensors nor model.safetensors.index.json", dir);
    const json ij = json::parse(ckpt::read_checkpoint_file(index), nullptr, /*allow_exceptions=*/false);
    BRIGADE_CHECK(!ij.is_discarded() && ij.contains("weight_map") && ij.at("weight_map").is_object(), CheckpointError,
                  "{}: no \"weight_map\" object", index.string());
    std::set<std::string> names;
    for (auto& [key, file] : ij.at("weight_map").items()) {
      BRIGADE_CHECK(file.is_string(), CheckpointError,
                    "{}: weight_map[{}] = {} is not a shard file name; the index is damaged", index.string(),
                    json(key).dump(), file.dump());
      const std::string n = file.get<std::string>();
      // a shard is a file of the model folder: never read a file elsewhere that the index names
      BRIGADE_CHECK(ckpt::path_stays_inside(n), CheckpointError,
                    "{}: weight_map[{}] names shard {}, which is not a file of {} (an absolute path or one with "
                    "\"..\"); the index is damaged or not a Hugging Face index",
                    index.string(), json(key).dump(), file.dump(), dir);
      names.insert(n);
    }
    for (const std::string& n : names) {
      std::error_code ec;
      BRIGADE_CHECK(fs::is_regular_file(root / n, ec), CheckpointError, "{}: lists shard {}, which is missing from {}",
                    index.string(), n, dir);
      files.push_back(root / n);
    }
  }

  // The base weights only: LoRA adapters (named "...lora_A.weight") are not in HF files.
  std::map<std::string, Tensor> params;
  for (auto& [name, p] : model.named_parameters())
    if (name.find(".lora_") == std::string::npos) params.emplace(name, p);
  std::set<std::string> loaded;
  std::pair<fs::path, std::string> tied_head;  // a tied model's lm_head.weight in the files: it must be the embedding
  for (const fs::path& file : files) {
    ckpt::SafetensorsReader r(file.string());
    for (const std::string& key : r.names()) {
      std::string why;
      const std::string name = engine_name(model_type, tied, key, why);
      if (name.empty()) {
        skipped.push_back(key + " (" + why + ")");
        if (key == "lm_head.weight") tied_head = {file, key};
        continue;
      }
      auto it = params.find(name);
      BRIGADE_CHECK(it != params.end(), CheckpointError,
                    "{}: tensor \"{}\" is not a parameter of this {} model (config.json's sizes may not match "
                    "the weights)",
                    file.string(), key, model_type);
      BRIGADE_CHECK(!loaded.count(name), CheckpointError, "{}: \"{}\" appears twice in the weight files", dir, name);
      const ckpt::TensorInfo& info = r.info(key);
      BRIGADE_CHECK(info.shape == it->second.shape(), CheckpointError, "{}: \"{}\" has shape {}, this model's {} is {}",
                    file.string(), key, shape_str(info.shape), name, shape_str(it->second.shape()));
      BRIGADE_CHECK(info.dtype_name == "F32" || info.dtype_name == "BF16" || info.dtype_name == "F16", CheckpointError,
                    "{}: \"{}\" is {}; weights load from F32, BF16 or F16", file.string(), key, info.dtype_name);
      it->second.copy_(r.get(key));  // to the fp32 parameter; the read tensor is dropped here
      loaded.insert(name);
    }
  }
  for (auto& [name, p] : params)
    BRIGADE_CHECK(loaded.count(name), CheckpointError, "{}: no weight for \"{}\" in {}", dir, name,
                  files.size() == 1 ? files[0].filename().string() : "any shard");
  if (!tied_head.second.empty()) {
    const Tensor head = ckpt::SafetensorsReader(tied_head.first.string()).get(tied_head.second).to(DType::F32);
    const Tensor& emb = params.at(embedding);
    BRIGADE_CHECK(head.shape() == emb.shape() && head.to_vector() == emb.to_vector(), CheckpointError,
                  "{}: lm_head.weight differs from {}, but {}; this checkpoint's untied head cannot load{}",
                  tied_head.first.string(), model_type == "gpt2" ? "wte.weight" : embedding,
                  model_type == "gpt2" ? "GPT-2 ties its head to the token embedding"
                                       : "config.json says tie_word_embeddings = true (the head is the token "
                                         "embedding)",
                  model_type == "gpt2" ? "" : " as tied; set tie_word_embeddings = false if the head is its own");
  }
  return skipped;
}

HfModel load_hf_directory(const std::string& dir) {
  const HfConfig c = read_hf_config(dir);
  HfModel out;
  out.model_type = c.model_type;
  out.notes = c.notes;
  out.model = make_hf_model(c);
  out.skipped = load_hf_weights(dir, c.model_type, *out.model);
  return out;
}

void save_hf_directory(const CausalLM& model, const std::string& dir, DType dtype,
                       const std::vector<std::pair<std::string, std::string>>& extra_files) {
  BRIGADE_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16, ValueError,
                "save_hf_directory: dtype {} is not a weight dtype; use F32, BF16 or F16", dtype_name(dtype));
  const char* torch_dtype = dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";
  nlohmann::ordered_json j;
  if (const auto* g = dynamic_cast<const GPT*>(&model)) {
    const GPTConfig& c = g->config();
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["activation_function"] = "gelu_new";
    j["attn_pdrop"] = 0.0;  // no dropout on the attention probabilities here
    j["embd_pdrop"] = c.dropout;
    j["resid_pdrop"] = c.dropout;
    j["initializer_range"] = c.init_std;
    j["layer_norm_epsilon"] = c.layer_norm_eps;
    j["n_ctx"] = c.block_size;
    j["n_embd"] = c.n_embd;
    j["n_head"] = c.n_head;
    j["n_inner"] = nullptr;
    j["n_layer"] = c.n_layer;
    j["n_positions"] = c.block_size;
    j["tie_word_embeddings"] = true;
    j["torch_dtype"] = torch_dtype;
    j["vocab_size"] = c.vocab_size;
  } else if (const auto* l = dynamic_cast<const LLaMA*>(&model)) {
    const LLaMAConfig& c = l->config();
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["attention_bias"] = false;
    j["head_dim"] = c.hidden_size / c.n_head;
    j["hidden_act"] = "silu";
    j["hidden_size"] = c.hidden_size;
    j["initializer_range"] = c.init_std;
    j["intermediate_size"] = c.intermediate_size;
    j["max_position_embeddings"] = c.max_position;
    j["mlp_bias"] = false;
    j["num_attention_heads"] = c.n_head;
    j["num_hidden_layers"] = c.n_layer;
    j["num_key_value_heads"] = c.n_kv_head;
    j["rms_norm_eps"] = c.rms_norm_eps;
    if (c.rope_scaling == ops::RopeScaling::None) {
      j["rope_scaling"] = nullptr;
    } else {
      nlohmann::ordered_json rs;
      rs["factor"] = c.rope_factor;
      if (c.rope_scaling == ops::RopeScaling::Llama3) {
        rs["high_freq_factor"] = c.rope_high_freq_factor;
        rs["low_freq_factor"] = c.rope_low_freq_factor;
        rs["original_max_position_embeddings"] = int64_t(c.rope_original_max_positions);
      }
      rs["rope_type"] = ops::rope_scaling_name(c.rope_scaling);
      j["rope_scaling"] = rs;
    }
    j["rope_theta"] = c.rope_theta;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["torch_dtype"] = torch_dtype;
    j["vocab_size"] = c.vocab_size;
  } else {
    throw ValueError(
        fmt::format("save_hf_directory: a {} model has no Hugging Face layout here; GPT-2 and LLaMA "
                    "do",
                    model.arch()));
  }
  ckpt::NamedTensors weights;
  for (auto& [name, p] : model.named_parameters()) {
    BRIGADE_CHECK(name.find(".lora_") == std::string::npos, ValueError,
                  "save_hf_directory: the model has LoRA adapters ({}); merge them into the base first "
                  "(nn::merge_lora) or save them with ckpt::save_peft_adapter",
                  name);
    weights.emplace_back(name, dtype == DType::F32 ? p : p.to(dtype));
  }
  const std::string tmp = ckpt::begin_checkpoint(dir);
  ckpt::save_safetensors((fs::path(tmp) / "model.safetensors").string(), weights, {{"format", "pt"}});
  {
    std::ofstream f(fs::path(tmp) / "config.json");
    f << j.dump(2) << '\n';
    BRIGADE_CHECK(f.good(), IoError, "cannot write {}/config.json", tmp);
  }
  for (const auto& [name, bytes] : extra_files) {
    std::ofstream f(fs::path(tmp) / name, std::ios::binary);
    f << bytes;
    BRIGADE_CHECK(f.good(), IoError, "cannot write {}/{}", tmp, name);
  }
  ckpt::commit_checkpoint(dir);
}

}  // namespace brigade::models
