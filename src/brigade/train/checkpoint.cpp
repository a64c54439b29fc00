// Checkpoint directories; see checkpoint.h.
#include "brigade/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/ckpt/safetensors.h"
#include "brigade/data/atomic_file.h"
#include "brigade/core/error.h"

namespace brigade::train {

namespace fs = std::filesystem;
constexpr int kStateVersion = 1;

static void fsync_dir(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void recover_checkpoint(const std::string& dir) {
  const fs::path final_dir(dir), old = dir + ".old";
  std::error_code ec;
  if (!fs::exists(final_dir) && fs::exists(old / "state.json")) {
    fs::rename(old, final_dir, ec);
    BRIGADE_CHECK(!ec, IoError, "could not restore the previous checkpoint {} to {}: {}; rename it by hand",
                  old.string(), dir, ec.message());
    fsync_dir(final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path());
  }
}

static std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  BRIGADE_CHECK(f.good(), CheckpointError, "checkpoint file {} is missing or unreadable", p.string());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer* opt,
                     const TrainState& state, const Recipe& recipe, const std::string& tokenizer_path) {
  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.string() + ".tmp";
  const fs::path old = final_dir.string() + ".old";
  const fs::path parent = final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path();
  recover_checkpoint(dir);  // a previous save that died between its two renames
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  BRIGADE_CHECK(!ec, IoError, "could not create checkpoint directory {}: {}", tmp.string(), ec.message());

  const ModelConfig& mc = recipe.model;
  nlohmann::json cfg{{"type", mc.type},       {"vocab_size", mc.vocab_size}, {"block_size", mc.block_size},
                     {"n_layer", mc.n_layer}, {"n_head", mc.n_head},         {"n_embd", mc.n_embd},
                     {"layer_norm_eps", mc.layer_norm_eps}};
  std::map<std::string, std::string> meta{{"format", "pt"}, {"brigade.config", cfg.dump()}};
  ckpt::save_safetensors((tmp / "model.safetensors").string(), model.named_parameters(), meta);
  if (opt) ckpt::save_safetensors((tmp / "optimizer.safetensors").string(), opt->state_tensors(), {});
  nlohmann::json js{{"version", kStateVersion},        {"step", state.step},
                    {"tokens_seen", state.tokens_seen}, {"rng_state", state.rng_state},
                    {"last_val_loss", state.last_val_loss}};
  data::write_file_atomic((tmp / "state.json").string(), js.dump(2) + "\n");
  data::write_file_atomic((tmp / "recipe.toml").string(), recipe_to_toml(recipe));
  if (!tokenizer_path.empty()) {
    std::ifstream in(tokenizer_path, std::ios::binary);
    BRIGADE_CHECK(in.good(), IoError, "could not read tokenizer {} to store it in the checkpoint", tokenizer_path);
    data::write_file_atomic((tmp / "tokenizer.model").string(),
                            std::string(std::istreambuf_iterator<char>(in), {}));
  }
  // Swap in: dir -> dir.old, tmp -> dir, drop dir.old. Every file is already fsynced;
  // a crash between the renames leaves dir.old, which recover_checkpoint() restores.
  fs::remove_all(old, ec);
  if (fs::exists(final_dir)) {
    fs::rename(final_dir, old, ec);
    BRIGADE_CHECK(!ec, IoError, "could not move the previous checkpoint {} aside: {}", dir, ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  BRIGADE_CHECK(!ec, IoError, "could not move checkpoint {} into place: {}", final_dir.string(), ec.message());
  fsync_dir(parent);
  fs::remove_all(old, ec);
}

bool checkpoint_exists(const std::string& dir) {
  recover_checkpoint(dir);
  return fs::exists(fs::path(dir) / "state.json") && fs::exists(fs::path(dir) / "model.safetensors");
}

Recipe checkpoint_recipe(const std::string& dir) {
  recover_checkpoint(dir);
  const fs::path p = fs::path(dir) / "recipe.toml";
  BRIGADE_CHECK(fs::exists(p), CheckpointError,
                "{} is not a Brigade checkpoint (no recipe.toml); pass the directory written by `brigade train`, "
                "e.g. runs/<name>/checkpoint",
                dir);
  return parse_recipe(read_text(p), p.string());
}

TrainState checkpoint_state(const std::string& dir) {
  const fs::path p = fs::path(dir) / "state.json";
  nlohmann::json js;
  try {
    js = nlohmann::json::parse(read_text(p));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("checkpoint state {} is corrupted ({}); resume from another checkpoint or "
                                      "start without --resume",
                                      p.string(), e.what()));
  }
  TrainState s;
  try {
    BRIGADE_CHECK(js.at("version").get<int>() == kStateVersion, CheckpointError,
                  "{}: unsupported state version {}", p.string(), js.at("version").dump());
    s.step = js.at("step").get<int64_t>();
    s.tokens_seen = js.at("tokens_seen").get<int64_t>();
    s.rng_state = js.at("rng_state").get<std::string>();
    s.last_val_loss = js.at("last_val_loss").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("checkpoint state {} is missing a field ({})", p.string(), e.what()));
  }
  return s;
}

void load_model_weights(const std::string& path, const nn::Module& model) {
  ckpt::SafetensorsReader r(path);
  std::set<std::string> expected;
  for (auto& [name, p] : model.named_parameters()) {
    expected.insert(name);
    BRIGADE_CHECK(r.contains(name), CheckpointError,
                  "{}: parameter '{}' is missing; the checkpoint was written for a different model config", path,
                  name);
    Tensor t = r.get(name);
    BRIGADE_CHECK(t.shape() == p.shape(), CheckpointError,
                  "{}: parameter '{}' has shape {} but the model expects {}; check model.* in the recipe", path,
                  name, shape_str(t.shape()), shape_str(p.shape()));
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
