// Fine-tuning from a recipe: model.init_from and finetune.method; see finetune.h.
#include "brigade/train/finetune.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/ckpt/peft.h"
#include "brigade/core/error.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/data/text/token_file.h"
#include "brigade/models/causal_lm.h"
#include "brigade/models/hf/gguf.h"
#include "brigade/models/hf/hf_dir.h"
#include "brigade/nn/lora.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/task.h"
#include "brigade/train/tasks.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

namespace fs = std::filesystem;

namespace {

enum class Source { HuggingFace, Checkpoint };

// What kind of directory model.init_from names; ConfigError when it is neither.
Source source_of(const std::string& dir, const std::string& origin) {
  std::error_code ec;
  BRIGADE_CHECK(fs::is_directory(dir, ec), ConfigError,
                "recipe {}: model.init_from = \"{}\" is not a directory; give a Hugging Face model directory "
                "(config.json + model.safetensors) or a Brigade checkpoint (e.g. runs/gpt-kjv/checkpoint)",
                origin, dir);
  if (fs::is_regular_file(fs::path(dir) / "config.json", ec)) return Source::HuggingFace;
  if (fs::is_regular_file(fs::path(dir) / "recipe.toml", ec) &&
      fs::is_regular_file(fs::path(dir) / "model.safetensors", ec))
    return Source::Checkpoint;
  throw ConfigError(fmt::format(
      "recipe {}: model.init_from = \"{}\" holds neither config.json (a Hugging Face model directory) nor recipe.toml "
      "and model.safetensors (a Brigade checkpoint); point it at one of those",
      origin, dir));
}

// The model shape a Hugging Face directory describes, as recipe keys.
ModelConfig hf_model_config(const models::HfConfig& c) {
  ModelConfig m;
  if (c.model_type == "gpt2") {
    m.type = "gpt";
    m.vocab_size = c.gpt.vocab_size;
    m.block_size = c.gpt.block_size;
    m.n_layer = c.gpt.n_layer;
    m.n_head = c.gpt.n_head;
    m.n_embd = c.gpt.n_embd;
    m.layer_norm_eps = c.gpt.layer_norm_eps;
  } else {
    m.type = "llama";
    m.vocab_size = c.llama.vocab_size;
    m.block_size = c.llama.max_position;
    m.n_layer = c.llama.n_layer;
    m.n_head = c.llama.n_head;
    m.n_embd = c.llama.hidden_size;
    m.n_kv_head = c.llama.n_kv_head;
    m.intermediate_size = c.llama.intermediate_size;
    m.rope_theta = c.llama.rope_theta;
    m.layer_norm_eps = c.llama.rms_norm_eps;
    m.tie_embeddings = c.llama.tie_word_embeddings;
    if (c.llama.rope_scaling != ops::RopeScaling::None) {
      m.rope_scaling = ops::rope_scaling_name(c.llama.rope_scaling);
      m.rope_scaling_factor = c.llama.rope_factor;
    }
    if (c.llama.rope_scaling == ops::RopeScaling::Llama3) {
      m.rope_low_freq_factor = c.llama.rope_low_freq_factor;
      m.rope_high_freq_factor = c.llama.rope_high_freq_factor;
      m.rope_original_max_positions = int64_t(c.llama.rope_original_max_positions);
    }
  }
  return m;
}

// Keys that are training settings, not the shape of the weights: the recipe keeps its own.
bool training_setting(const std::string& key) {
  return key == "model.dropout" || key == "model.init_from" || key == "model.init_std";
}

}  // namespace

void resolve_init_from(Recipe& r, const std::string& origin) {
  if (r.model.init_from.empty()) return;
  const std::string dir = r.model.init_from;
  Recipe from;
  if (source_of(dir, origin) == Source::HuggingFace) {
    from.model = hf_model_config(models::read_hf_config(dir));
  } else {
    from.model = checkpoint_recipe(dir).model;
  }
  from.model.init_from = dir;
  // Every model.* key: the directory's value, unless the recipe set another one on purpose.
  const Recipe defaults;
  const auto now = recipe_values(r), def = recipe_values(defaults), theirs = recipe_values(from);
  std::vector<std::string> sets;
  for (auto& [key, value] : theirs) {
    if (key.rfind("model.", 0) != 0 || training_setting(key)) continue;
    if (now.at(key) == value) continue;
    BRIGADE_CHECK(now.at(key) == def.at(key), ConfigError,
                  "recipe {}: {} = {}, but model.init_from = \"{}\" holds a model with {} = {}; the weights fix the "
                  "model's shape, so remove {} from the recipe",
                  origin, key, now.at(key), dir, key, value, key);
    sets.push_back(key + "=" + value);
  }
  for (const std::string& s : sets) apply_override(r, s);
}

void validate_finetune(const Recipe& r, const Fail& fail) {
  // supervised fine-tuning data
  const Recipe defaults;
  const std::string& f = r.data.format;
  if (f != "text" && f != "jsonl")
    fail(
        fmt::format("data.format = \"{}\" is not a data format; use \"text\" (a corpus, prepared into token "
                    "files) or \"jsonl\" (fine-tuning samples)",
                    f));
  if (f == "jsonl") {
    if (r.model.type != "gpt" && r.model.type != "llama")
      fail(
          fmt::format("data.format = \"jsonl\" trains a causal language model (gpt, llama), not model.type = "
                      "\"{}\"",
                      r.model.type));
    if (r.data.corpus == defaults.data.corpus || r.data.corpus == "fashion-mnist")
      fail(
          fmt::format("data.format = \"jsonl\" reads data.corpus as a JSONL file of samples, not \"{}\"; set "
                      "data.corpus to the file",
                      r.data.corpus));
    if (r.parallel.tp > 1 || r.parallel.pp > 1)
      fail("data.format = \"jsonl\" runs under data parallelism only; set parallel.tp = 1 and parallel.pp = 1");
    if (!(r.data.val_fraction > 0))
      fail(
          "data.format = \"jsonl\" needs data.val_fraction > 0: the file's last samples are the held-out set every "
          "evaluation scores (e.g. 0.05)");
    const std::string& t = r.data.chat_template;
    if (t != "chatml" && t != "llama-2" && t != "llama-3")
      fail(
          fmt::format("data.chat_template = \"{}\" is not a template; use \"chatml\", \"llama-2\" or "
                      "\"llama-3\"",
                      t));
    if (r.train.loss_on != "completion" && r.train.loss_on != "all")
      fail(fmt::format("train.loss_on = \"{}\": use \"completion\" (completions and assistant turns) or \"all\"",
                       r.train.loss_on));
  } else {
    if (r.data.chat_template != defaults.data.chat_template)
      fail(fmt::format("data.chat_template = \"{}\" applies to data.format = \"jsonl\" only; remove it",
                       r.data.chat_template));
    if (r.train.loss_on != defaults.train.loss_on)
      fail(
          fmt::format("train.loss_on = \"{}\" applies to data.format = \"jsonl\" only (a text corpus trains on "
                      "every token); remove it",
                      r.train.loss_on));
  }

  const std::string& m = r.finetune.method;
  if (m != "full" && m != "lora")
    fail(
        fmt::format("finetune.method = \"{}\" is not a fine-tuning method; use \"full\" (every parameter trains) or "
                    "\"lora\" (LoRA adapters only)",
                    m));
  const std::string& bd = r.lora.base_dtype;
  if (bd != "f32" && bd != "bf16")
    fail(
        fmt::format("lora.base_dtype = \"{}\" is not a storage dtype for LoRA's frozen base; use \"f32\" or "
                    "\"bf16\"",
                    bd));
  if (m != "lora") {
    const LoraConfig d;
    if (bd != d.base_dtype)
      fail(
          fmt::format("lora.base_dtype = \"{}\" stores the frozen base of a LoRA run, but finetune.method = \"{}\" "
                      "freezes nothing (every parameter trains on fp32 master weights); set finetune.method = "
                      "\"lora\", or remove lora.base_dtype",
                      bd, m));
    else if (!(r.lora == d))
      fail(
          fmt::format("the recipe sets [lora] keys but finetune.method = \"{}\"; set finetune.method = \"lora\" or "
                      "remove the [lora] section",
                      m));
    return;
  }
  // The precision machinery's handling of a 16-bit frozen weight is checked for the ops GPT and
  // LLaMA use (linear, embedding, layer / RMS norm, the tied head); the other models' are not.
  if (bd == "bf16" && r.model.type != "gpt" && r.model.type != "llama")
    fail(
        fmt::format("lora.base_dtype = \"bf16\" is supported for model.type = \"gpt\" and \"llama\", not \"{}\"; "
                    "set lora.base_dtype = \"f32\"",
                    r.model.type));
  if (r.lora.r < 1) fail(fmt::format("lora.r = {} must be at least 1; use e.g. 8", r.lora.r));
  if (!(r.lora.alpha > 0)) fail(fmt::format("lora.alpha = {} must be > 0; use e.g. 16", r.lora.alpha));
  if (!(r.lora.dropout >= 0 && r.lora.dropout < 1))
    fail(fmt::format("lora.dropout = {} must be in [0, 1)", r.lora.dropout));
  if (r.lora.target_modules.empty() && r.model.type != "gpt" && r.model.type != "llama")
    fail(
        fmt::format("finetune.method = \"lora\" on model.type = \"{}\" needs lora.target_modules (comma-separated "
                    "names of its Linear layers, e.g. \"query,value\"); only gpt and llama have a default",
                    r.model.type));
  if (r.parallel.tp > 1 || r.parallel.pp > 1)
    fail(
        fmt::format("finetune.method = \"lora\" with parallel.tp = {} / parallel.pp = {}: LoRA runs under data "
                    "parallelism (parallel.dp, any ZeRO stage) only; set parallel.tp = 1 and parallel.pp = 1",
                    r.parallel.tp, r.parallel.pp));
}

std::string init_from_tokenizer(const Recipe& r) {
  if (!data::detect_tokenizer(r.model.init_from).empty()) return r.model.init_from;
  throw ConfigError(fmt::format(
      "recipe {}: model.init_from = \"{}\" holds no tokenizer, so its text cannot be encoded as the model was "
      "trained; put the model's tokenizer files in the directory (tokenizer.model, vocab.json + merges.txt, or "
      "tokenizer.json)",
      r.path, r.model.init_from));
}

std::vector<std::string> lora_targets(const Recipe& r) {
  std::vector<std::string> out;
  if (r.lora.target_modules.empty()) {
    if (r.model.type == "gpt") return {"c_attn"};
    if (r.model.type == "llama") return {"q_proj", "v_proj"};
    return {};
  }
  std::stringstream in(r.lora.target_modules);
  for (std::string t; std::getline(in, t, ',');) {
    const size_t b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
    BRIGADE_CHECK(b != std::string::npos, ConfigError,
                  "lora.target_modules = \"{}\" has an empty name; list layer names separated by commas",
                  r.lora.target_modules);
    out.push_back(t.substr(b, e - b + 1));
  }
  return out;
}

std::string apply_finetune(const Recipe& r, Task& task, bool load_weights) {
  std::string line;
  const std::string& dir = r.model.init_from;
  if (!dir.empty()) {
    if (load_weights) {
      if (source_of(dir, r.path) == Source::HuggingFace) {
        auto* lm = dynamic_cast<models::CausalLM*>(&task.model());
        BRIGADE_CHECK(lm, ConfigError, "model.init_from = \"{}\": a Hugging Face directory loads into gpt or llama",
                      dir);
        const models::HfConfig c = models::read_hf_config(dir);
        models::load_hf_weights(dir, c.model_type, *lm);
        line = fmt::format("init from {} (Hugging Face {})", dir, c.model_type);
        // the directory's dropout is its own run's training setting; this run trains with model.dropout
        if (c.model_type == "gpt2" && c.gpt.dropout != r.model.dropout)
          line += fmt::format(
              "; dropout {:g} (model.dropout), not the directory's resid_pdrop = {:g}: set "
              "model.dropout to train with it",
              r.model.dropout, c.gpt.dropout);
      } else {
        const Recipe saved = checkpoint_recipe(dir);
        BRIGADE_CHECK(saved.finetune.method != "lora", ConfigError,
                      "model.init_from = \"{}\" is a LoRA run's checkpoint (base and adapters); merge it first with "
                      "`brigade export --ckpt {} --out DIR` and start from DIR",
                      dir, dir);
        load_state((fs::path(dir) / "model.safetensors").string(), task.state_dict());
        line = fmt::format("init from {} (a Brigade checkpoint)", dir);
      }
    } else {
      line = fmt::format("init from {} (weights from the checkpoint)", dir);
    }
  }
  if (r.finetune.method == "lora") {
    nn::LoraOptions o;
    o.r = r.lora.r;
    o.alpha = r.lora.alpha;
    o.dropout = r.lora.dropout;
    o.rslora = r.lora.rslora;
    o.target_modules = lora_targets(r);
    o.dropout_generator = task.dropout_generator();
    BRIGADE_CHECK(o.dropout == 0 || o.dropout_generator, ConfigError,
                  "lora.dropout = {}: model.type = \"{}\" has no dropout stream to draw from; set lora.dropout = 0",
                  o.dropout, r.model.type);
    Generator init(r.run.seed + 2);  // run.seed: the model, + 1: its dropout
    const std::vector<std::string> adapted = nn::apply_lora(task.model(), o, init);
    int64_t trainable = 0, total = 0;
    for (auto& [name, p] : task.model().named_parameters()) {
      total += p.numel();
      if (p.requires_grad()) trainable += p.numel();
    }
    std::string targets;
    for (const std::string& t : o.target_modules) targets += (targets.empty() ? "" : ",") + t;
    line += fmt::format("{}LoRA r {}, alpha {:g}{} on {} ({} layers): {:.3f}M of {:.2f}M parameters train ({:.2f}%)",
                        line.empty() ? "" : " | ", o.r, o.alpha, o.rslora ? " (rsLoRA)" : "", targets, adapted.size(),
                        double(trainable) / 1e6, double(total) / 1e6, 100.0 * double(trainable) / double(total));
    // lora.base_dtype: the frozen base (every non-adapter parameter, norms and embeddings
    // included, as a PEFT user keeps a bf16 model whole in bf16) rounded once, here, after
    // init_from's weights are in; a checkpoint's bf16 values then load into it bitwise
    if (r.lora.base_dtype != "f32") {
      const DType dt = dtype_from_name(r.lora.base_dtype);
      const nn::FrozenStorage s = nn::store_frozen_parameters(task.model(), dt);
      line += fmt::format("; the frozen base in {}: {} tensors, {:.1f} MiB (f32: {:.1f} MiB)", r.lora.base_dtype,
                          s.tensors, double(s.bytes_after) / double(1 << 20), double(s.bytes_before) / double(1 << 20));
    }
  }
  return line;
}

void save_lora_adapter(const Recipe& r, const nn::NamedTensors& params, bool fan_in_fan_out, const std::string& dir) {
  ckpt::PeftLoraConfig c;
  c.r = r.lora.r;
  c.lora_alpha = r.lora.alpha;
  c.lora_dropout = r.lora.dropout;
  c.target_modules = lora_targets(r);
  c.fan_in_fan_out = fan_in_fan_out;
  c.use_rslora = r.lora.rslora;
  c.task_type = r.model.type == "gpt" || r.model.type == "llama" ? "CAUSAL_LM" : "FEATURE_EXTRACTION";
  c.base_model_name_or_path = r.model.init_from;
  nn::NamedTensors adapters;
  for (auto& [name, t] : params)
    if (name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight")) adapters.emplace_back(name, t);
  ckpt::save_peft_adapter(dir, adapters, c);
}

std::string export_checkpoint(const std::string& ckpt, const std::string& out, DType dtype, bool adapter_only,
                              const std::string& format) {
  BRIGADE_CHECK(format == "hf" || format == "gguf", ConfigError,
                "--format {}: use hf (a Hugging Face directory) or gguf (one GGUF file for llama.cpp)", format);
  BRIGADE_CHECK(!(adapter_only && format == "gguf"), ConfigError,
                "--adapter writes PEFT files; GGUF holds the whole model (the adapters merged): drop one of the two");
  const std::string dir = open_checkpoint(ckpt);  // repairs a save interrupted between its renames
  Recipe r = checkpoint_recipe(dir);
  const bool lora = r.finetune.method == "lora";
  // A base stored in bf16 (lora.base_dtype) is read into f32 parameters (exactly: every bf16 value
  // is an f32 one), so the adapters merge in fp32 and `dtype` alone decides what is written.
  if (lora) r.lora.base_dtype = "f32";
  BRIGADE_CHECK(!adapter_only || lora, ConfigError,
                "--ckpt {}: --adapter writes a LoRA run's adapters, but this run has finetune.method = \"{}\"; export "
                "the whole model without --adapter",
                ckpt, r.finetune.method);
  BRIGADE_CHECK(adapter_only || r.model.type == "gpt" || r.model.type == "llama", ConfigError,
                "--ckpt {}: a model.type = \"{}\" checkpoint has no Hugging Face layout here (gpt and llama do){}",
                ckpt, r.model.type, lora ? "; --adapter writes its LoRA adapters as PEFT files" : "");
  const std::unique_ptr<Task> task = make_task(r, /*init_weights=*/false);
  load_state((fs::path(dir) / "model.safetensors").string(), task->state_dict());
  if (adapter_only) {
    save_lora_adapter(r, task->model().named_parameters(), nn::lora_fan_in_fan_out(task->model()), out);
    return fmt::format("wrote the LoRA adapters of {} as PEFT files to {}", dir, out);
  }
  // The base model alone, with the adapters merged into its weights.
  if (lora) nn::merge_lora(task->model());
  const std::unique_ptr<models::CausalLM> base = make_causal_lm(r.model);
  std::map<std::string, Tensor> weights;
  for (auto& [name, p] : task->model().named_parameters()) weights.emplace(name, p);
  for (auto& [name, p] : base->named_parameters()) p.copy_(weights.at(name));
  // The tokenizer goes along. An HF directory has no meta.json or state.json to tell this engine's
  // own tokenizer.model from a LlamaTokenizer one, so brigade_tokenizer.json always says which.
  std::vector<std::pair<std::string, std::string>> extra;
  std::unique_ptr<data::TextTokenizer> tok;
  if (!data::detect_tokenizer(dir).empty()) {
    tok = data::load_text_tokenizer(dir);
    extra = data::tokenizer_contents(*tok);
    if (extra.back().first != data::kTokenizerMarker)
      extra.emplace_back(data::kTokenizerMarker, data::tokenizer_marker(*tok));
  }
  if (format == "gguf") {
    models::GgufOptions g;
    g.dtype = dtype;
    if (tok) {
      const bool sp = tok->kind() == "brigade" || tok->kind() == "sentencepiece";
      if (sp)
        g.tokenizer_model = (fs::path(dir) / "tokenizer.model").string();
      else
        g.bpe_tokenizer_dir = dir;
      g.add_bos_token = !tok->document_prefix().empty();
      g.bos_token_id = tok->begin_id();
      g.eos_token_id = tok->end_id();
    }
    g.name = r.run.name;
    models::save_gguf(*base, out, g);
    return fmt::format("wrote {} as a GGUF v3 file ({} {}{}{}) to {}", dir, r.model.type == "gpt" ? "gpt2" : "llama",
                       dtype_name(dtype), lora ? ", LoRA adapters merged" : "",
                       tok ? ", tokenizer included" : ", no tokenizer", out);
  }
  models::save_hf_directory(*base, out, dtype, extra);
  return fmt::format("wrote {} as a Hugging Face {} directory ({}{}) to {}", dir,
                     r.model.type == "gpt" ? "GPT2LMHeadModel" : "LlamaForCausalLM", dtype_name(dtype),
                     lora ? ", LoRA adapters merged" : "", out);
}

std::string attach_peft_adapter(nn::Module& model, const std::string& dir) {
  const ckpt::PeftAdapter a = ckpt::read_peft_adapter(dir);
  for (auto& [name, p] : model.named_parameters())
    BRIGADE_CHECK(name.find(".lora_") == std::string::npos, ConfigError,
                  "--adapter {}: the checkpoint's model has LoRA adapters already ({}); name a checkpoint without "
                  "them (its base), or generate from this one without --adapter",
                  dir, name);
  nn::LoraOptions o;
  o.r = a.config.r;
  o.alpha = a.config.lora_alpha;
  o.rslora = a.config.use_rslora;
  o.target_modules = a.config.target_modules;
  Generator unused(0);  // A is overwritten by the folder's tensors
  const std::vector<std::string> adapted = nn::apply_lora(model, o, unused);
  BRIGADE_CHECK(nn::lora_fan_in_fan_out(model) == a.config.fan_in_fan_out, ConfigError,
                "--adapter {}: adapter_config.json says fan_in_fan_out = {}, but the targeted layers are {}; the "
                "adapter was trained on another architecture",
                dir, a.config.fan_in_fan_out, a.config.fan_in_fan_out ? "torch Linear layers" : "HF Conv1D layers");
  std::map<std::string, Tensor> params;
  for (auto& [name, p] : nn::lora_parameters(model)) params.emplace(name, p);
  std::string layers;
  for (const std::string& l : adapted) layers += (layers.empty() ? "" : ", ") + l;
  for (auto& [name, t] : a.tensors) {
    auto it = params.find(name);
    BRIGADE_CHECK(it != params.end(), ConfigError,
                  "--adapter {}: tensor {} is not an adapter of this model (its target layers: {})", dir, name, layers);
    BRIGADE_CHECK(t.shape() == it->second.shape(), ConfigError, "--adapter {}: {} has shape {}, this model's is {}",
                  dir, name, shape_str(t.shape()), shape_str(it->second.shape()));
    it->second.copy_(t);
    params.erase(it);
  }
  BRIGADE_CHECK(params.empty(), ConfigError, "--adapter {}: no tensor for {} in adapter_model.safetensors", dir,
                params.empty() ? "" : params.begin()->first);
  return fmt::format("adapter {}: LoRA r {} on {} layers", dir, o.r, adapted.size());
}

TextEval evaluate_on_file(const std::string& ckpt, const std::string& file) {
  const std::string dir = open_checkpoint(ckpt);
  const Recipe r = checkpoint_recipe(dir);
  BRIGADE_CHECK(r.model.type == "gpt" || r.model.type == "llama", ConfigError,
                "--data: a model.type = \"{}\" checkpoint is not a language model; --data evaluates gpt and llama "
                "(evaluate this one on its own data: brigade eval --ckpt {})",
                r.model.type, ckpt);
  std::error_code ec;
  BRIGADE_CHECK(fs::is_regular_file(file, ec), ConfigError, "--data {}: no such file", file);
  const std::unique_ptr<Task> task = make_task(r, /*init_weights=*/false);
  load_state((fs::path(dir) / "model.safetensors").string(), task->state_dict());
  auto& lm = dynamic_cast<models::CausalLM&>(task->model());
  lm.train(false);
  std::vector<int64_t> ids;
  if (fs::path(file).extension() == ".bin") {
    const data::TokenDataset ds(file);
    BRIGADE_CHECK(ds.vocab_size() == r.model.vocab_size, ConfigError,
                  "--data {}: a token file of vocabulary {}, the model's is {}; use a file prepared with the "
                  "checkpoint's tokenizer, or give text",
                  file, ds.vocab_size(), r.model.vocab_size);
    ids.resize(size_t(ds.size()));
    ds.read(0, ds.size(), ids.data());
  } else {
    // the text as one document: LLaMA's BOS first, as transformers' tokenizer(text) gives
    const std::unique_ptr<data::TextTokenizer> tok = data::load_text_tokenizer(dir);
    std::ifstream in(file, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    for (int id : tok->document_prefix()) ids.push_back(id);
    for (int id : tok->encode(text)) ids.push_back(id);
  }
  const int64_t T = r.train.seq_len, B = r.train.batch_size;
  BRIGADE_CHECK(ids.size() >= 2, ConfigError, "--data {}: fewer than 2 tokens; nothing to score", file);
  // windows [k T, k T + T + 1): inputs ids[k T ..], targets shifted by one
  std::vector<std::pair<int64_t, int64_t>> windows;  // (start, length of inputs)
  for (int64_t s = 0; s + 1 < int64_t(ids.size()); s += T)
    windows.emplace_back(s, std::min(T, int64_t(ids.size()) - 1 - s));
  autograd::NoGradGuard ng;
  const amp::Policy policy = precision_policy(r.precision);
  double loss_sum = 0;  // summed over scored tokens
  int64_t scored = 0;
  for (size_t w = 0; w < windows.size();) {
    // a batch of full windows, or the last short one alone
    const int64_t len = windows[w].second;
    size_t n = 0;
    while (w + n < windows.size() && n < size_t(B) && windows[w + n].second == len) ++n;
    Tensor x = Tensor::empty({int64_t(n), len}, DType::I64), y = Tensor::empty({int64_t(n), len}, DType::I64);
    for (size_t i = 0; i < n; ++i)
      for (int64_t t = 0; t < len; ++t) {
        x.data<int64_t>()[int64_t(i) * len + t] = ids[size_t(windows[w + i].first + t)];
        y.data<int64_t>()[int64_t(i) * len + t] = ids[size_t(windows[w + i].first + t + 1)];
      }
    amp::AutocastScope autocast(policy);
    loss_sum += lm.loss(x, y).item() * double(int64_t(n) * len);
    scored += int64_t(n) * len;
    w += n;
  }
  TextEval e;
  e.tokens = scored;
  e.windows = int64_t(windows.size());
  e.loss = loss_sum / double(scored);
  e.perplexity = std::exp(e.loss);
  return e;
}

}  // namespace brigade::train
