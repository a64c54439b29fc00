// Checkpoint directories; see checkpoint.h.
#include "brigade/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <cstring>

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

std::string begin_checkpoint(const std::string& dir) {
  const fs::path tmp = dir + ".tmp";
  recover_checkpoint(dir);  // a previous save that died between its two renames
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  BRIGADE_CHECK(!ec, IoError, "could not create checkpoint directory {}: {}", tmp.string(), ec.message());
  return tmp.string();
}

void write_checkpoint_files(const std::string& tmp_dir, const nn::NamedTensors& params, const optim::Optimizer* opt,
                            const TrainState& state, const Recipe& recipe, const std::string& tokenizer_path) {
  const fs::path tmp(tmp_dir);
  const ModelConfig& mc = recipe.model;
  nlohmann::json cfg{{"type", mc.type},       {"vocab_size", mc.vocab_size}, {"block_size", mc.block_size},
                     {"n_layer", mc.n_layer}, {"n_head", mc.n_head},         {"n_embd", mc.n_embd},
                     {"layer_norm_eps", mc.layer_norm_eps}};
  std::map<std::string, std::string> meta{{"format", "pt"}, {"brigade.config", cfg.dump()}};
  ckpt::save_safetensors((tmp / "model.safetensors").string(), params, meta);
  if (opt) ckpt::save_safetensors((tmp / "optimizer.safetensors").string(), opt->state_tensors(), {});
  nlohmann::json js{{"version", kStateVersion},        {"step", state.step},
                    {"tokens_seen", state.tokens_seen}, {"rng_state", state.rng_state},
                    {"last_val_loss", state.last_val_loss}, {"accumulation", state.accumulation_state},
                    {"loss_scaler", state.scaler_state}, {"optimizer_steps", state.optimizer_steps}};
  if (state.early_stop.best_step > 0)
    js["early_stop"] = {{"best_step", state.early_stop.best_step},
                        {"best_val_loss", state.early_stop.best_val_loss},
                        {"evals_since_best", state.early_stop.evals_since_best}};
  data::write_file_atomic((tmp / "state.json").string(), js.dump(2) + "\n");
  data::write_file_atomic((tmp / "recipe.toml").string(), recipe_to_toml(recipe));
  if (!tokenizer_path.empty()) {
    std::ifstream in(tokenizer_path, std::ios::binary);
    BRIGADE_CHECK(in.good(), IoError, "could not read tokenizer {} to store it in the checkpoint", tokenizer_path);
    data::write_file_atomic((tmp / "tokenizer.model").string(),
                            std::string(std::istreambuf_iterator<char>(in), {}));
  }
}

void commit_checkpoint(const std::string& dir) {
  // Swap in: dir -> dir.old, tmp -> dir, drop dir.old. Every file is already fsynced;
  // a crash between the renames leaves dir.old, which recover_checkpoint() restores.
  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.string() + ".tmp";
  const fs::path old = final_dir.string() + ".old";
  const fs::path parent = final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path();
  std::error_code ec;
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

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer* opt,
                     const TrainState& state, const Recipe& recipe, const std::string& tokenizer_path) {
  const std::string tmp = begin_checkpoint(dir);
  write_checkpoint_files(tmp, model.named_parameters(), opt, state, recipe, tokenizer_path);
  commit_checkpoint(dir);
}

static std::string shard_file(int rank, int dp) { return fmt::format("optimizer-{:05}-of-{:05}.safetensors", rank, dp); }
static constexpr const char* kIndexFile = "optimizer.index.json";

void write_optimizer_shard(const std::string& tmp, int rank, int dp, int64_t lo, int64_t hi,
                           const std::map<std::string, Tensor>& flat_state) {
  nn::NamedTensors named(flat_state.begin(), flat_state.end());
  ckpt::save_safetensors((fs::path(tmp) / shard_file(rank, dp)).string(), named,
                         {{"lo", std::to_string(lo)}, {"hi", std::to_string(hi)}});
}

void write_optimizer_index(const std::string& tmp, int dp, int64_t numel, const std::vector<FlatLayoutEntry>& layout,
                           const std::vector<std::pair<int64_t, int64_t>>& shard_ranges,
                           const std::vector<std::string>& state_names) {
  nlohmann::json j;
  j["format"] = "brigade-flat-shards";
  j["version"] = 1;
  j["dp"] = dp;
  j["numel"] = numel;
  j["states"] = state_names;
  for (const auto& e : layout) j["layout"].push_back({{"name", e.name}, {"offset", e.offset}, {"numel", e.numel}});
  for (int r = 0; r < dp; ++r)
    j["shards"].push_back({{"file", shard_file(r, dp)},
                           {"lo", shard_ranges[size_t(r)].first},
                           {"hi", shard_ranges[size_t(r)].second}});
  data::write_file_atomic((fs::path(tmp) / kIndexFile).string(), j.dump(1) + "\n");
}

bool checkpoint_is_sharded(const std::string& dir) { return fs::exists(fs::path(dir) / kIndexFile); }

std::map<std::string, Tensor> read_optimizer_flat(const std::string& dir, const std::vector<FlatLayoutEntry>& layout,
                                                  int64_t lo, int64_t hi) {
  std::map<std::string, Tensor> out;
  const int64_t len = std::max<int64_t>(0, hi - lo);
  auto fresh = [&]() { return Tensor::zeros({len}, DType::F32); };  // (len) flat range [lo, hi)
  if (checkpoint_is_sharded(dir)) {
    const fs::path ip = fs::path(dir) / kIndexFile;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text(ip));
      BRIGADE_CHECK(j.at("format") == "brigade-flat-shards", CheckpointError, "{}: unknown index format", ip.string());
      // The saved layout must be this model's: same names, offsets and sizes.
      const auto& jl = j.at("layout");
      BRIGADE_CHECK(jl.size() == layout.size(), CheckpointError,
                    "{}: the checkpoint has {} parameters but this model has {}; use the recipe it was saved with",
                    ip.string(), jl.size(), layout.size());
      for (size_t i = 0; i < layout.size(); ++i)
        BRIGADE_CHECK(jl[i].at("name") == layout[i].name && jl[i].at("offset") == layout[i].offset &&
                          jl[i].at("numel") == layout[i].numel,
                      CheckpointError, "{}: parameter {} is '{}' ({} elements at {}) in the checkpoint but '{}' here",
                      ip.string(), i, jl[i].at("name").get<std::string>(), jl[i].at("numel").get<int64_t>(),
                      jl[i].at("offset").get<int64_t>(), layout[i].name);
      for (const auto& s : j.at("states")) out.emplace(s.get<std::string>(), fresh());
      for (const auto& sh : j.at("shards")) {
        const int64_t slo = sh.at("lo"), shi = sh.at("hi");
        const int64_t a = std::max(lo, slo), b = std::min(hi, shi);
        if (a >= b) continue;
        const std::string file = (fs::path(dir) / sh.at("file").get<std::string>()).string();
        ckpt::SafetensorsReader r(file);
        for (auto& [name, dst] : out) {
          BRIGADE_CHECK(r.contains(name), CheckpointError, "{}: state '{}' is missing", file, name);
          Tensor t = r.get(name);
          BRIGADE_CHECK(t.numel() == shi - slo, CheckpointError, "{}: state '{}' has {} elements, the index says {}",
                        file, name, t.numel(), shi - slo);
          std::memcpy(dst.data<float>() + (a - lo), t.data<float>() + (a - slo), size_t(b - a) * sizeof(float));
        }
      }
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(fmt::format("optimizer index {} is corrupted or incomplete ({})", ip.string(), e.what()));
    }
    return out;
  }
  const std::string path = (fs::path(dir) / "optimizer.safetensors").string();
  ckpt::SafetensorsReader r(path);
  std::map<std::string, const FlatLayoutEntry*> by_param;
  for (const auto& e : layout) by_param[e.name] = &e;
  for (const std::string& n : r.names()) {
    const size_t dot = n.find('.');
    BRIGADE_CHECK(dot != std::string::npos, CheckpointError, "{}: unexpected tensor '{}'", path, n);
    const std::string kind = n.substr(0, dot), pname = n.substr(dot + 1);
    auto it = by_param.find(pname);
    BRIGADE_CHECK(it != by_param.end(), CheckpointError, "{}: state '{}' is for a parameter this model lacks", path, n);
    const FlatLayoutEntry& e = *it->second;
    Tensor t = r.get(n);
    BRIGADE_CHECK(t.numel() == e.numel, CheckpointError, "{}: state '{}' has {} elements but the parameter has {}",
                  path, n, t.numel(), e.numel);
    if (!out.count(kind)) out.emplace(kind, fresh());
    const int64_t a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel);
    if (a < b)
      std::memcpy(out[kind].data<float>() + (a - lo), t.contiguous().data<float>() + (a - e.offset),
                  size_t(b - a) * sizeof(float));
  }
  return out;
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
    if (js.contains("early_stop")) {  // absent in older checkpoints and before the first evaluation
      const auto& es = js.at("early_stop");
      s.early_stop.best_step = es.at("best_step").get<int64_t>();
      s.early_stop.best_val_loss = es.at("best_val_loss").get<double>();
      s.early_stop.evals_since_best = es.at("evals_since_best").get<int64_t>();
    }
    s.accumulation_state = js.value("accumulation", std::string());  // absent in older checkpoints
    s.scaler_state = js.value("loss_scaler", std::string());         // absent in older checkpoints
    s.optimizer_steps = js.value("optimizer_steps", int64_t(-1));     // absent in older checkpoints
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
