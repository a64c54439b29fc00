// CLIP contrastive training through the one trainer (the contrastive task, train/tasks.h): the recipe -> CLIPConfig
// mapping (text tower defaults, tokenizer vocabulary and context), a tiny CLIP trained for a few dozen steps on real
// Fashion-MNIST image-caption pairs learns (loss falls, zero-shot accuracy on the 10000 held-out test images well above
// the 10% of chance), writes metrics.jsonl, loss.svg and a checkpoint under Hugging Face names, and evaluate_checkpoint
// on that checkpoint reproduces the run's final zero-shot accuracy and test loss exactly; the same seed gives the same
// run; bad inputs fail with one clear error. Tests that need the data skip when Debian's Fashion-MNIST files are not
// installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/data/image/captions.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/config.h"
#include "brigade/train/model_configs.h"
#include "brigade/train/trainer.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

const char* kData = "/usr/share/datasets/fashion-mnist";

bool have_data() {
  return fs::exists(fs::path(kData) / "train-images-idx3-ubyte.gz") &&
         fs::exists(fs::path(kData) / "t10k-images-idx3-ubyte.gz");
}

// A tiny CLIP: 7x7 patches, 2 image layers of width 32, 1 text layer of width 32.
const char* kTiny = R"(
[run]
name = "clip-tiny"
out_dir = "OUT"
seed = 5
threads = 1
[model]
type = "clip"
patch_size = 7
n_layer = 2
n_head = 2
n_embd = 32
intermediate_size = 64
text_layers = 1
text_heads = 2
text_width = 32
projection_dim = 32
[data]
corpus = "fashion-mnist"
dir = "/usr/share/datasets/fashion-mnist"
[train]
steps = 40
batch_size = 64
eval_every = 20
eval_batches = 2
log_every = 5
grad_clip = 1.0
[optim]
lr = 4e-3
weight_decay = 0.05
beta2 = 0.98
[schedule]
warmup_steps = 5
min_lr = 1e-4
)";

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = fs::temp_directory_path() / ("brigade_clip_" + tag + "_" + std::to_string(getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

train::Recipe tiny_recipe(const fs::path& out, const std::vector<std::string>& overrides = {}) {
  std::string text = kTiny;
  text.replace(text.find("OUT"), 3, out.string());
  return train::parse_recipe(text, "clip-tiny.toml", overrides);
}

train::TrainOptions quiet() {
  train::TrainOptions o;
  o.quiet = true;
  return o;
}

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream f(p);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The message of the brigade::Error `f` throws ("" when it throws none).
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ClipTrain, ConfigFromRecipe) {
  const data::CaptionTokenizer tok;
  TempDir tmp("config");
  // text tower left at 0: the image tower's layers, heads and width; projection = n_embd
  const train::Recipe r = tiny_recipe(tmp.path(), {"model.text_layers=0", "model.text_heads=0", "model.text_width=0",
                                                   "model.projection_dim=0", "model.n_embd=48", "model.n_layer=3"});
  const models::CLIPConfig c = train::clip_config(r.model, tok);
  EXPECT_EQ(c.vision.hidden_size, 48);
  EXPECT_EQ(c.vision.num_hidden_layers, 3);
  EXPECT_EQ(c.vision.patch_size, 7);
  EXPECT_EQ(c.vision.image_size, 28);
  EXPECT_EQ(c.vision.num_channels, 1);
  EXPECT_EQ(c.vision.intermediate_size, 64);
  EXPECT_EQ(c.text.hidden_size, 48);
  EXPECT_EQ(c.text.num_hidden_layers, 3);
  EXPECT_EQ(c.text.num_attention_heads, 2);
  EXPECT_EQ(c.text.intermediate_size, 4 * 48);
  EXPECT_EQ(c.projection_dim, 48);
  EXPECT_EQ(c.text.vocab_size, tok.vocab_size());
  EXPECT_EQ(c.text.max_position_embeddings, tok.max_length());
  EXPECT_EQ(c.hidden_act, "quick_gelu");
  // explicit text tower and projection
  const models::CLIPConfig d = train::clip_config(tiny_recipe(tmp.path(), {"model.intermediate_size=0"}).model, tok);
  EXPECT_EQ(d.vision.intermediate_size, 4 * 32);
  EXPECT_EQ(d.text.num_hidden_layers, 1);
  EXPECT_EQ(d.text.hidden_size, 32);
  EXPECT_EQ(d.projection_dim, 32);
}

TEST(ClipTrain, RefusesWhatItCannotRun) {
  TempDir tmp("refuse");
  train::TrainOptions resume = quiet();
  resume.resume = true;
  EXPECT_NE(
      error_of<CheckpointError>([&] { train::train(tiny_recipe(tmp.path()), resume); }).find("--resume: no checkpoint"),
      std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] { tiny_recipe(tmp.path(), {"data.corpus=kjv"}); }).find("fashion-mnist"),
            std::string::npos);
  train::Recipe nodata = tiny_recipe(tmp.path());
  nodata.data.dir = (tmp.path() / "no-such-folder").string();
  EXPECT_NE(error_of<DataError>([&] { train::train(nodata, quiet()); }).find("no-such-folder"), std::string::npos);
  // config validation: CLIP has no dropout
  EXPECT_NE(error_of<ConfigError>([&] { tiny_recipe(tmp.path(), {"model.dropout=0.1"}); }).find("dropout"),
            std::string::npos);
  // a missing checkpoint: one line that says what to pass
  const std::string m = error_of<CheckpointError>([&] { train::evaluate_checkpoint((tmp.path() / "none").string()); });
  EXPECT_NE(m.find("no such checkpoint directory"), std::string::npos);
  EXPECT_EQ(m.find('\n'), std::string::npos);
}

TEST(ClipTrain, LearnsAboveChanceAndEvalReproducesTheCheckpoint) {
  if (!have_data())
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << kData << " (apt install dataset-fashion-mnist)";
  TempDir tmp("learn");
  const fs::path out = tmp.path() / "run";
  const train::Recipe r = tiny_recipe(out);
  const train::TrainResult res = train::train(r, quiet());
  EXPECT_FALSE(res.interrupted);
  EXPECT_EQ(res.steps, 40);
  // zero-shot over the 10 class prompts on all 10000 held-out test images: well above chance (10%)
  const int64_t total = res.eval_fields.at("test_images").get<int64_t>(),
                test_correct = int64_t(res.eval.get("correct"));
  const double zero_shot = res.eval_fields.at("zero_shot_accuracy").get<double>();
  EXPECT_EQ(total, 10000);
  EXPECT_GE(zero_shot, 0.35) << "zero-shot accuracy " << zero_shot;
  EXPECT_EQ(double(test_correct) / 10000.0, zero_shot);
  EXPECT_TRUE(std::isfinite(res.val_loss));

  // metrics: the training loss falls (mean of the first two logged vs the last two); evaluations
  // at steps 20 (a 128-image prefix) and 40 (all 10000)
  const std::vector<nlohmann::json> m = read_jsonl(out / "metrics.jsonl");
  std::vector<double> losses;
  std::vector<nlohmann::json> evals;
  for (const auto& j : m) {
    if (j.contains("loss")) {
      EXPECT_TRUE(j.contains("lr") && j.contains("pairs_per_s") && j.contains("logit_scale")) << j.dump();
      losses.push_back(j["loss"]);
    }
    if (j.contains("zero_shot_accuracy")) evals.push_back(j);
  }
  ASSERT_EQ(losses.size(), 8u);
  // logit_scale stays within CLIP's clamp [0, ln 100]
  for (const auto& j : m)
    if (j.contains("logit_scale")) {
      EXPECT_GE(j["logit_scale"].get<double>(), 0.0);
      EXPECT_LE(j["logit_scale"].get<double>(), std::log(100.0) + 1e-6);
    }
  EXPECT_LT((losses[6] + losses[7]) / 2, (losses[0] + losses[1]) / 2 - 0.1);
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals[0]["step"], 20);
  EXPECT_EQ(evals[0]["test_images"], 128);
  EXPECT_EQ(evals[1]["step"], 40);
  EXPECT_EQ(evals[1]["test_images"], 10000);
  EXPECT_EQ(evals[1]["zero_shot_accuracy"].get<double>(), zero_shot);
  EXPECT_EQ(evals[1]["val_loss"].get<double>(), res.val_loss);
  EXPECT_TRUE(fs::exists(out / "loss.svg"));

  // checkpoint: Hugging Face CLIPModel names; recipe, state, optimizer
  const fs::path ck = out / "checkpoint";
  ASSERT_EQ(res.checkpoint_dir, ck.string());
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json", "recipe.toml"})
    EXPECT_TRUE(fs::exists(ck / f)) << f;
  {
    ckpt::SafetensorsReader st((ck / "model.safetensors").string());
    for (const char* name :
         {"logit_scale", "visual_projection.weight", "text_projection.weight",
          "vision_model.embeddings.class_embedding", "vision_model.embeddings.patch_embedding.weight",
          "vision_model.pre_layrnorm.weight", "vision_model.post_layernorm.bias",
          "vision_model.encoder.layers.1.self_attn.q_proj.weight", "text_model.embeddings.token_embedding.weight",
          "text_model.final_layer_norm.weight", "text_model.encoder.layers.0.mlp.fc1.weight"})
      EXPECT_TRUE(st.contains(name)) << name;
    EXPECT_FALSE(st.contains("text_model.encoder.layers.1.mlp.fc1.weight"));
  }
  EXPECT_EQ(train::checkpoint_state(ck.string()).step, 40);

  // brigade eval's path reproduces the final numbers exactly
  const train::EvalReport ev = train::evaluate_checkpoint(ck.string(), 1);
  EXPECT_EQ(ev.fields.at("test_images").get<int64_t>(), 10000);
  EXPECT_EQ(int64_t(ev.metrics.get("correct")), test_correct);
  EXPECT_EQ(ev.fields.at("zero_shot_accuracy").get<double>(), zero_shot);
  EXPECT_EQ(ev.fields.at("val_loss").get<double>(), res.val_loss);

  // strict loading: a missing tensor and a wrong shape are clear errors naming the tensor
  const fs::path bad = tmp.path() / "bad";
  fs::copy(ck, bad);
  ckpt::NamedTensors kept;
  {
    ckpt::SafetensorsReader st((ck / "model.safetensors").string());
    for (const std::string& n : st.names())
      if (n != "text_projection.weight") kept.emplace_back(n, st.get(n));
  }
  ckpt::save_safetensors((bad / "model.safetensors").string(), kept);
  fs::remove(bad / ckpt::kChecksumFile);  // unverified, as an older checkpoint: the strict loader answers
  const std::string missing = error_of<CheckpointError>([&] { train::evaluate_checkpoint(bad.string(), 1); });
  EXPECT_NE(missing.find("text_projection.weight"), std::string::npos) << missing;
  EXPECT_NE(missing.find("missing"), std::string::npos) << missing;
  kept.emplace_back("text_projection.weight", Tensor::zeros({8, 32}));
  ckpt::save_safetensors((bad / "model.safetensors").string(), kept);
  const std::string shape = error_of<CheckpointError>([&] { train::evaluate_checkpoint(bad.string(), 1); });
  EXPECT_NE(shape.find("text_projection.weight"), std::string::npos) << shape;
  EXPECT_NE(shape.find("shape"), std::string::npos) << shape;
}

TEST(ClipTrain, SameSeedSameRun) {
  if (!have_data())
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << kData << " (apt install dataset-fashion-mnist)";
  TempDir tmp("seed");
  const std::vector<std::string> o{"train.steps=6", "train.eval_every=0", "train.log_every=1", "data.augment=true"};
  const train::TrainResult a = train::train(tiny_recipe(tmp.path() / "a", o), quiet());
  const train::TrainResult b = train::train(tiny_recipe(tmp.path() / "b", o), quiet());
  EXPECT_EQ(a.last_loss, b.last_loss);
  EXPECT_EQ(a.eval.get("correct"), b.eval.get("correct"));
  EXPECT_EQ(a.val_loss, b.val_loss);
  const train::TrainResult c = train::train(
      tiny_recipe(tmp.path() / "c",
                  {"train.steps=6", "train.eval_every=0", "train.log_every=1", "data.augment=true", "run.seed=6"}),
      quiet());
  EXPECT_NE(a.last_loss, c.last_loss);
}
