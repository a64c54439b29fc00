// PEFT LoRA adapter files; see peft.h.
#include "brigade/ckpt/peft.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/ckpt/checkpoint_dir.h"
#include "brigade/core/error.h"

namespace brigade::ckpt {

namespace fs = std::filesystem;

namespace {

bool is_lora_name(const std::string& n) { return n.ends_with(".lora_A.weight") || n.ends_with(".lora_B.weight"); }

}  // namespace

void save_peft_adapter(const std::string& dir, const NamedTensors& adapters, const PeftLoraConfig& c) {
  NamedTensors out;
  for (auto& [name, t] : adapters) {
    BRIGADE_CHECK(is_lora_name(name), ValueError,
                  "save_peft_adapter: {} is not a LoRA parameter (<layer>.lora_A.weight or <layer>.lora_B.weight)",
                  name);
    out.emplace_back(kPeftPrefix + name, t);
  }
  // The fields PEFT's LoraConfig writes (its published adapter_config.json), ours filled in.
  nlohmann::ordered_json j;
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = c.base_model_name_or_path;
  j["bias"] = "none";
  j["fan_in_fan_out"] = c.fan_in_fan_out;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["lora_alpha"] = c.lora_alpha;
  j["lora_dropout"] = c.lora_dropout;
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = c.r;
  j["revision"] = nullptr;
  j["target_modules"] = c.target_modules;
  j["task_type"] = c.task_type;
  j["use_rslora"] = c.use_rslora;
  const std::string tmp = begin_checkpoint(dir);
  save_safetensors((fs::path(tmp) / "adapter_model.safetensors").string(), out,
                   {{"format", "pt"}});  // as PEFT's save_pretrained tags it
  {
    std::ofstream f(fs::path(tmp) / "adapter_config.json");
    f << j.dump(2) << '\n';
    BRIGADE_CHECK(f.good(), IoError, "cannot write {}/adapter_config.json", tmp);
  }
  commit_checkpoint(dir);
}

PeftAdapter read_peft_adapter(const std::string& dir) {
  const fs::path cfg_path = fs::path(dir) / "adapter_config.json";
  const std::string text = read_checkpoint_file(cfg_path);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  BRIGADE_CHECK(!j.is_discarded() && j.is_object(), CheckpointError, "{}: not a JSON object", cfg_path.string());
  auto field = [&](const char* key) -> const nlohmann::json& {
    BRIGADE_CHECK(j.contains(key), CheckpointError, "{}: no \"{}\" field (a PEFT LoRA adapter has one)",
                  cfg_path.string(), key);
    return j.at(key);
  };
  PeftAdapter a;
  PeftLoraConfig& c = a.config;
  try {
    const std::string type = field("peft_type").get<std::string>();
    BRIGADE_CHECK(type == "LORA", CheckpointError, "{}: peft_type is \"{}\"; only \"LORA\" adapters load here",
                  cfg_path.string(), type);
    c.r = field("r").get<int64_t>();
    c.lora_alpha = field("lora_alpha").get<double>();
    c.lora_dropout = j.value("lora_dropout", 0.0);
    const nlohmann::json& t = field("target_modules");
    BRIGADE_CHECK(t.is_array(), CheckpointError,
                  "{}: target_modules must be a list of module names (a regular expression is not supported)",
                  cfg_path.string());
    c.target_modules = t.get<std::vector<std::string>>();
    c.fan_in_fan_out = j.value("fan_in_fan_out", false);
    c.use_rslora = j.value("use_rslora", false);
    if (j.contains("task_type") && j.at("task_type").is_string()) c.task_type = j.at("task_type");
    if (j.contains("base_model_name_or_path") && j.at("base_model_name_or_path").is_string())
      c.base_model_name_or_path = j.at("base_model_name_or_path");
    const std::string bias = j.value("bias", std::string("none"));
    BRIGADE_CHECK(bias == "none", CheckpointError, "{}: bias is \"{}\"; only \"none\" is supported", cfg_path.string(),
                  bias);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: a field has the wrong type ({})", cfg_path.string(), e.what()));
  }
  const fs::path st = fs::path(dir) / "adapter_model.safetensors";
  BRIGADE_CHECK(fs::exists(st), CheckpointError,
                "{}: missing (an adapter directory holds adapter_config.json and "
                "adapter_model.safetensors)",
                st.string());
  SafetensorsReader r(st.string());
  const std::string prefix = kPeftPrefix;
  for (const std::string& key : r.names()) {
    BRIGADE_CHECK(key.rfind(prefix, 0) == 0 && is_lora_name(key.substr(prefix.size())), CheckpointError,
                  "{}: tensor \"{}\" is not a LoRA adapter weight (base_model.model.<layer>.lora_A.weight or "
                  ".lora_B.weight)",
                  st.string(), key);
    a.tensors.emplace_back(key.substr(prefix.size()), r.get(key));
  }
  return a;
}

}  // namespace brigade::ckpt
