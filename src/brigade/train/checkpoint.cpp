// Checkpoint directories of a training run; see checkpoint.h.
#include "brigade/train/checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/core/json_number.h"
#include "brigade/data/atomic_file.h"
#include "brigade/data/text/text_tokenizer.h"

namespace brigade::train {

namespace fs = std::filesystem;
constexpr int kStateVersion = 1;

void write_checkpoint_files(const std::string& tmp_dir, const nn::NamedTensors& params, const optim::Optimizer* opt,
                            const TrainState& state, const Recipe& recipe, const std::string& tokenizer_dir) {
  const fs::path tmp(tmp_dir);
  const ModelConfig& mc = recipe.model;
  nlohmann::json cfg{{"type", mc.type},
                     {"vocab_size", mc.vocab_size},
                     {"block_size", mc.block_size},
                     {"n_layer", mc.n_layer},
                     {"n_head", mc.n_head},
                     {"n_embd", mc.n_embd},
                     {"layer_norm_eps", mc.layer_norm_eps}};
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"brigade.config", cfg.dump()}};
  const nn::NamedTensors opt_state = opt ? opt->state_tensors() : nn::NamedTensors{};
  nlohmann::json js{{"version", kStateVersion},
                    {"step", state.step},
                    {"tokens_seen", state.tokens_seen},
                    {"rng_state", state.rng_state},
                    // null before the first evaluation (never a sentinel number)
                    {"last_val_loss", std::isfinite(state.last_val_loss) ? nlohmann::json(state.last_val_loss)
                                                                         : nlohmann::json(nullptr)},
                    {"accumulation", state.accumulation_state},
                    {"loss_scaler", state.scaler_state},
                    {"optimizer_steps", state.optimizer_steps}};
  if (!state.guard_state.empty()) js["step_guard"] = state.guard_state;
  if (state.early_stop.best_step > 0)
    js["early_stop"] = {{"best_step", state.early_stop.best_step},
                        {"best_val_loss", state.early_stop.best_val_loss},
                        {"evals_since_best", state.early_stop.evals_since_best}};
  const std::string state_text = js.dump(2) + "\n", recipe_text = recipe_to_toml(recipe);
  std::vector<std::pair<std::string, std::string>> tokenizer;  // (file name, bytes)
  if (!tokenizer_dir.empty()) tokenizer = data::tokenizer_contents(*data::load_text_tokenizer(tokenizer_dir));
  uint64_t tokenizer_bytes = 0;
  for (const auto& f : tokenizer) tokenizer_bytes += f.second.size();
  // Everything this call writes, and the checksum list of those files that commit_checkpoint adds,
  // for the error of a save that runs out of disk.
  std::vector<std::pair<std::string, uint64_t>> sizes{{"model.safetensors", ckpt::safetensors_file_bytes(params, meta)},
                                                      {"state.json", state_text.size()},
                                                      {"recipe.toml", recipe_text.size()}};
  if (opt) sizes.emplace_back("optimizer.safetensors", ckpt::safetensors_file_bytes(opt_state, {}));
  for (const auto& f : tokenizer) sizes.emplace_back(f.first, f.second.size());
  uint64_t needed = ckpt::checksums_file_bytes(sizes);
  for (const auto& f : sizes) needed += f.second;
  ckpt::guarded_write(tmp_dir, needed, [&] {
    const fs::path model_file = tmp / "model.safetensors";
    ckpt::save_safetensors(model_file.string(), params, meta);
    ckpt::fault_after_write(tmp, model_file);
    if (opt) {
      const fs::path f = tmp / "optimizer.safetensors";
      ckpt::save_safetensors(f.string(), opt_state, {});
      ckpt::fault_after_write(tmp, f);
    }
    data::write_file_atomic((tmp / "state.json").string(), state_text);
    ckpt::fault_after_write(tmp, tmp / "state.json");
    data::write_file_atomic((tmp / "recipe.toml").string(), recipe_text);
    ckpt::fault_after_write(tmp, tmp / "recipe.toml");
    for (const auto& [name, bytes] : tokenizer) {
      data::write_file_atomic((tmp / name).string(), bytes);
      ckpt::fault_after_write(tmp, tmp / name);
    }
  });
}

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer* opt,
                     const TrainState& state, const Recipe& recipe, const std::string& tokenizer_dir) {
  const std::string tmp = begin_checkpoint(dir);
  write_checkpoint_files(tmp, model.named_parameters(), opt, state, recipe, tokenizer_dir);
  commit_checkpoint(dir);
}

bool checkpoint_exists(const std::string& dir) {
  recover_checkpoint(dir);
  // Any of a checkpoint's own files makes it one: a checkpoint with a file missing is then an error
  // naming the file when it is opened, never "no checkpoint" (which --resume-if-any would take as
  // a fresh start, overwriting it).
  for (const char* f : {"state.json", "model.safetensors", "checksums.json"})
    if (fs::exists(fs::path(dir) / f)) return true;
  return false;
}

Recipe checkpoint_recipe(const std::string& dir) {
  const fs::path p = fs::path(open_checkpoint(dir)) / "recipe.toml";
  return parse_recipe(ckpt::read_checkpoint_file(p), p.string(), {}, /*resolve=*/false);
}

TrainState checkpoint_state(const std::string& dir) {
  const fs::path p = fs::path(open_checkpoint(dir)) / "state.json";
  nlohmann::json js;
  try {
    js = nlohmann::json::parse(ckpt::read_checkpoint_file(p));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(
        fmt::format("checkpoint state {} is corrupted ({}); resume from another checkpoint or "
                    "start without --resume",
                    p.string(), e.what()));
  }
  BRIGADE_CHECK(js.is_object(), CheckpointError,
                "checkpoint state {} is not a JSON object; resume from another checkpoint or start without --resume",
                p.string());
  // A whole-number field (nlohmann's get<int64_t> would convert a float such as 1e300 with undefined behaviour)
  // at least `min`; `where` is the field's path, e.g. "early_stop.best_step".
  auto whole = [&](const nlohmann::json& j, const std::string& where, int64_t min) {
    const std::optional<int64_t> v = json_int64(j);
    BRIGADE_CHECK(v && *v >= min, CheckpointError,
                  "checkpoint state {}: \"{}\" = {} is not a whole number >= {}; the file is damaged: resume from "
                  "another checkpoint or start without --resume",
                  p.string(), where, j.dump(), min);
    return *v;
  };
  TrainState s;
  try {
    BRIGADE_CHECK(json_int64(js.at("version")) == kStateVersion, CheckpointError, "{}: unsupported state version {}",
                  p.string(), js.at("version").dump());
    s.step = whole(js.at("step"), "step", 0);
    s.tokens_seen = whole(js.at("tokens_seen"), "tokens_seen", 0);
    s.rng_state = js.at("rng_state").get<std::string>();
    // null: no evaluation yet (older checkpoints wrote -1 for that)
    const auto& lv = js.at("last_val_loss");
    s.last_val_loss =
        lv.is_null() || lv.get<double>() < 0 ? std::numeric_limits<double>::quiet_NaN() : lv.get<double>();
    if (js.contains("early_stop")) {  // absent in older checkpoints and before the first evaluation
      const auto& es = js.at("early_stop");
      BRIGADE_CHECK(es.is_object(), CheckpointError, "checkpoint state {}: \"early_stop\" = {} is not an object",
                    p.string(), es.dump());
      s.early_stop.best_step = whole(es.at("best_step"), "early_stop.best_step", 0);
      s.early_stop.best_val_loss = es.at("best_val_loss").get<double>();
      s.early_stop.evals_since_best = whole(es.at("evals_since_best"), "early_stop.evals_since_best", 0);
    }
    s.accumulation_state = js.value("accumulation", std::string());  // absent in older checkpoints
    s.scaler_state = js.value("loss_scaler", std::string());         // absent in older checkpoints
    if (js.contains("optimizer_steps"))                              // absent in older checkpoints: -1
      s.optimizer_steps = whole(js.at("optimizer_steps"), "optimizer_steps", -1);
    s.guard_state = js.value("step_guard", std::string());  // absent: nothing to keep
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(
        fmt::format("checkpoint state {} is missing a field or has one of the wrong type ({}); the "
                    "file is damaged: resume from another checkpoint or start without --resume",
                    p.string(), e.what()));
  }
  return s;
}

void load_model_weights(const std::string& path, const nn::Module& model) {
  ckpt::SafetensorsReader r(path);
  std::set<std::string> expected;
  for (auto& [name, p] : model.named_parameters()) {
    expected.insert(name);
    BRIGADE_CHECK(r.contains(name), CheckpointError,
                  "{}: parameter '{}' is missing; the checkpoint was written for a different model config", path, name);
    Tensor t = r.get(name);
    BRIGADE_CHECK(t.shape() == p.shape(), CheckpointError,
                  "{}: parameter '{}' has shape {} but the model expects {}; check model.* in the recipe", path, name,
                  shape_str(t.shape()), shape_str(p.shape()));
    p.copy_(t);
  }
  for (const std::string& name : r.names())
    BRIGADE_CHECK(expected.count(name) || name == "lm_head.weight", CheckpointError,
                  "{}: unexpected tensor '{}' (not a parameter of this model)", path, name);
}

void load_optimizer_state(const std::string& dir, optim::Optimizer& opt, int64_t steps) {
  const std::string path = (fs::path(dir) / "optimizer.safetensors").string();
  ckpt::SafetensorsReader r(path);
  std::map<std::string, Tensor> tensors;
  for (const std::string& n : r.names()) tensors.emplace(n, r.get(n));
  opt.load_state(tensors, steps);
}

}  // namespace brigade::train
