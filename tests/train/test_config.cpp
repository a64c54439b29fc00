// Recipe parsing: defaults, the shipped recipe, every error kind (syntax, unknown
// section/key with suggestions, wrong types, ranges, combinations, missing file),
// overrides, and the recipe_to_toml round trip.
#include <gtest/gtest.h>

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "brigade/core/error.h"
#include "brigade/train/config.h"

namespace brigade::train {
namespace {

// Expects parse_recipe(text) to throw ConfigError whose message contains every needle.
void expect_error(const std::string& text, std::vector<std::string> needles,
                  const std::vector<std::string>& overrides = {}) {
  try {
    parse_recipe(text, "r.toml", overrides);
    ADD_FAILURE() << "expected ConfigError for:\n" << text;
  } catch (const ConfigError& e) {
    std::string m = e.what();
    for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "missing '" << n << "' in: " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "message should be one line: " << m;
  }
}

TEST(Recipe, EmptyTextGivesDefaults) {
  Recipe r = parse_recipe("", "empty.toml");
  Recipe d;
  d.path = "empty.toml";
  EXPECT_EQ(r, d);
  EXPECT_EQ(r.model.vocab_size, 4096);
  EXPECT_EQ(r.optim.name, "adamw");
  EXPECT_NO_THROW(validate_recipe(Recipe{}, ""));
}

TEST(Recipe, ParsesValuesAndAcceptsIntegersForFloats) {
  Recipe r = parse_recipe(R"(
[run]
name = "x"
seed = 7
threads = 2
[model]
n_layer = 2
n_embd = 64
n_head = 8
dropout = 0      # integer where a float is expected: fine
[optim]
lr = 3e-4
name = "sgd"
[schedule]
name = "constant"
warmup_steps = 0
min_lr = 1
[train]
steps = 10
)",
                          "r.toml");
  EXPECT_EQ(r.run.name, "x");
  EXPECT_EQ(r.run.seed, 7u);
  EXPECT_EQ(r.run.threads, 2);
  EXPECT_EQ(r.model.n_layer, 2);
  EXPECT_EQ(r.model.dropout, 0.0);
  EXPECT_DOUBLE_EQ(r.optim.lr, 3e-4);
  EXPECT_EQ(r.optim.name, "sgd");
  EXPECT_EQ(r.schedule.min_lr, 1.0);  // constant schedule: min_lr > lr is allowed
  EXPECT_EQ(r.train.steps, 10);
  EXPECT_EQ(r.train.batch_size, 8);  // untouched keys keep their defaults
  // Dotted keys and inline tables are plain TOML too.
  EXPECT_EQ(parse_recipe("train.steps = 5\nschedule = { warmup_steps = 2 }", "r.toml").train.steps, 5);
}

TEST(Recipe, ShippedRecipeLoads) {
  const std::string path = std::string(BRIGADE_SOURCE_DIR) + "/recipes/gpt-kjv.toml";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  Recipe r = load_recipe(path);
  EXPECT_EQ(r.path, path);
  EXPECT_EQ(r.data.corpus, "kjv");
}

TEST(Recipe, EveryShippedRecipeLoads) {
  // every recipes/*.toml parses and validates, with the model type its name says
  const std::filesystem::path dir = std::filesystem::path(BRIGADE_SOURCE_DIR) / "recipes";
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    SCOPED_TRACE(e.path().string());
    Recipe r;
    // A fine-tuning recipe starts from the default recipe's model, exported to runs/gpt-kjv/hf:
    // its config.json as `brigade export` writes it stands in, in a scratch working directory.
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    if (text.find("type = \"flamingo\"") != std::string::npos) {
      // its towers are the checkpoints of two other shipped recipes' runs, not present here; its
      // validation (which opens them) is tested in tests/train/test_flamingo_train.cpp
      EXPECT_NE(text.find("vision_from = \"runs/clip-fashion/checkpoint\""), std::string::npos);
      EXPECT_NE(text.find("lm_from = \"runs/gpt-kjv/checkpoint\""), std::string::npos);
      EXPECT_EQ(e.path().stem().string().rfind("flamingo", 0), 0u);
      continue;
    }
    const Recipe raw = parse_recipe(text, e.path().string(), {}, /*resolve=*/false);
    const std::filesystem::path cwd = std::filesystem::current_path();
    std::filesystem::path scratch;
    if (!raw.model.init_from.empty()) {
      ASSERT_EQ(raw.model.init_from, "runs/gpt-kjv/hf");
      scratch = std::filesystem::temp_directory_path() / ("brigade_recipe_" + std::to_string(::getpid()));
      std::filesystem::create_directories(scratch / raw.model.init_from);
      std::ofstream(scratch / raw.model.init_from / "config.json")
          << R"({"model_type": "gpt2", "vocab_size": 4096, "n_positions": 128, "n_layer": 4, "n_head": 4,
                 "n_embd": 256, "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new",
                 "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "tie_word_embeddings": true})";
      std::filesystem::current_path(scratch);
    }
    ASSERT_NO_THROW(r = load_recipe(e.path().string()));
    if (!scratch.empty()) {
      std::filesystem::current_path(cwd);
      std::filesystem::remove_all(scratch);
      EXPECT_EQ(r.model.n_embd, 256);  // the shape read from the directory
    }
    const std::string stem = e.path().stem().string();
    EXPECT_EQ(stem.rfind(r.model.type, 0), 0u) << "recipe " << stem << " has model.type " << r.model.type;
    EXPECT_EQ(r.run.name, stem);
  }
  EXPECT_GE(n, 4u);
}

TEST(Recipe, InvalidTomlNamesFileLineAndColumn) {
  expect_error("[train]\nsteps = 10\nlr = = 3\n", {"recipe r.toml:3:", "invalid TOML"});
  expect_error("[train\n", {"r.toml:1:", "invalid TOML"});
  expect_error("[train]\nsteps = 1\nsteps = 2\n", {"r.toml:3:", "invalid TOML"});  // duplicate key
}

TEST(Recipe, UnknownKeysAndSectionsSuggestTheClosest) {
  expect_error("[train]\nstepz = 10\n",
               {"recipe r.toml:2:", "unknown key 'train.stepz'", "(did you mean 'train.steps'?)"});
  expect_error("[trian]\nsteps = 10\n", {"unknown section '[trian]'", "(did you mean 'train'?)"});
  expect_error("[model]\nseq_len = 64\n", {"unknown key 'model.seq_len'", "did you mean 'train.seq_len'?"});
  expect_error("steps = 10\n", {"unknown top-level key 'steps'", "did you mean 'train.steps'?"});
  expect_error("[train]\nzzzzzzzz = 1\n", {"unknown key 'train.zzzzzzzz'"});
  expect_error("[train.extra]\nx = 1\n", {"unknown key 'train.extra'"});
  expect_error("train = 3\n", {"'train' must be a table"});
}

TEST(Recipe, WrongTypesNameKeyExpectedAndActual) {
  expect_error("[model]\nn_layer = \"four\"\n",
               {"recipe r.toml:2:", "key 'model.n_layer'", "must be an integer", "got a string", "\"four\""});
  expect_error("[train]\nsteps = 10.0\n", {"key 'train.steps'", "must be an integer", "got a float"});
  expect_error("[optim]\nlr = \"fast\"\n", {"key 'optim.lr'", "must be a number", "got a string"});
  expect_error("[run]\nname = 3\n", {"key 'run.name'", "must be a string", "got an integer"});
  expect_error("[run]\nname = true\n", {"got a boolean"});
  expect_error("[train]\nsteps = [1, 2]\n", {"got an array"});
  expect_error("[run]\nseed = -1\n", {"run.seed", ">= 0"});
  expect_error("[run]\nthreads = 99999999999\n", {"run.threads", "32-bit"});
}

TEST(Recipe, RangeAndCombinationChecksSayWhatToChange) {
  expect_error("[model]\nn_embd = 100\nn_head = 3\n", {"recipe r.toml:", "n_embd = 100", "n_head = 3", "multiple"});
  expect_error("[train]\nseq_len = 256\n", {"train.seq_len = 256", "model.block_size = 128", "lower"});
  expect_error("[model]\ndropout = 1.0\n", {"model.dropout", "[0, 1)"});
  expect_error("[model]\ndropout = -0.1\n", {"model.dropout"});
  expect_error("[optim]\nlr = 0\n", {"optim.lr = 0", "> 0"});
  expect_error("[optim]\nname = \"adam\"\n", {"optim.name = \"adam\"", "\"adamw\" or \"sgd\"", "did you mean 'adamw'"});
  expect_error("[schedule]\nname = \"exponential\"\n", {"schedule.name = \"exponential\"", "\"cosine\"", "\"wsd\""});
  expect_error("[train]\nsteps = 50\n", {"schedule.warmup_steps = 100", "train.steps = 50"});
  expect_error("[model]\nvocab_size = 3\n", {"model.vocab_size = 3"});
  expect_error("[train]\nbatch_size = 0\n", {"train.batch_size = 0", "> 0"});
  expect_error("[model]\nn_layer = -1\n", {"model.n_layer"});
  expect_error("[data]\nval_fraction = 0\n", {"data.val_fraction"});
  expect_error("[model]\ntype = \"bart\"\n", {"model.type"});
  expect_error("[optim]\nlr = nan\n", {"optim.lr", "finite"});
  expect_error("[schedule]\nmin_lr = 0.1\n", {"schedule.min_lr = 0.1", "optim.lr"});
  expect_error("[sample]\ntemperature = 0\n", {"sample.temperature"});
  expect_error("[sample]\ntop_k = 5000\n", {"sample.top_k = 5000", "model.vocab_size"});
  expect_error("[train]\neval_every = -1\n", {"train.eval_every"});
  expect_error("[run]\nname = \"\"\n", {"run.name"});
}

TEST(Recipe, OverridesApplyInOrderAndParseAsToml) {
  Recipe r = parse_recipe("[train]\nsteps = 10\n[schedule]\nwarmup_steps = 0\n", "r.toml",
                          {"train.steps=20", "optim.lr = 5e-4", "run.name=my-run", "data.corpus=/tmp/my corpus.txt",
                           "run.out_dir=\"runs/x\"", "model.dropout=0", "train.steps=30", "run.name=2024-01-01"});
  EXPECT_EQ(r.train.steps, 30);
  EXPECT_DOUBLE_EQ(r.optim.lr, 5e-4);
  EXPECT_EQ(r.run.name, "2024-01-01");  // a TOML date, kept as the text typed for a string key
  EXPECT_EQ(r.data.corpus, "/tmp/my corpus.txt");
  EXPECT_EQ(r.run.out_dir, "runs/x");
  EXPECT_EQ(r.model.dropout, 0.0);
  // Overrides are validated like the file.
  expect_error("", {"train.seq_len = 512"}, {"train.seq_len=512"});
}

TEST(Recipe, BadOverridesNameTheOverride) {
  expect_error("", {"override 'train.stepz=5'", "unknown key 'train.stepz'", "did you mean 'train.steps'?"},
               {"train.stepz=5"});
  expect_error("", {"override 'steps=5'", "did you mean 'train.steps'?"}, {"steps=5"});
  expect_error("", {"override 'train.steps'", "section.key=value"}, {"train.steps"});
  expect_error("", {"override 'train.steps=abc'", "must be an integer", "got a string"}, {"train.steps=abc"});
  expect_error("", {"override 'train.steps=1.5'", "got a float"}, {"train.steps=1.5"});
  expect_error("", {"override '=3'"}, {"=3"});
}

TEST(Recipe, ToTomlRoundTripsEveryKey) {
  Recipe r;
  r.run.name = "quote \" and \\ backslash\ttab";
  r.run.seed = 123456789012345ull;
  r.run.threads = 3;
  r.model.n_embd = 96;
  r.model.n_head = 6;
  r.model.dropout = 0.1;
  r.model.layer_norm_eps = 1e-6;
  r.optim.lr = 1.0;  // prints as 1.0, not 1
  r.optim.momentum = 0.95;
  r.schedule.min_lr = 3.3333333333333335e-05;
  r.sample.prompt = "Unicode: caf\xc3\xa9 \xe2\x80\x94 line\nbreak";
  r.data.val_fraction = 0.1 + 0.2;  // 0.30000000000000004 must survive
  r.train.accumulation = 3;
  r.parallel.dp = 4;
  r.parallel.zero = 2;
  r.parallel.allreduce = "ring";
  r.parallel.bucket_mb = 0.5;
  r.parallel.overlap = false;  // a boolean key
  r.precision.level = "O2";
  r.precision.dtype = "fp16";
  r.precision.loss_scale = "adaptive";
  r.precision.hysteresis = 3;
  r.precision.init_scale = 1024;
  r.finetune.method = "lora";
  r.lora.r = 16;
  r.lora.alpha = 32.0;
  r.lora.target_modules = "c_attn,c_proj";
  r.lora.rslora = true;
  r.lora.base_dtype = "bf16";
  const std::string text = recipe_to_toml(r);
  for (const auto& key : recipe_keys()) {
    std::string k = key.substr(key.find('.') + 1);
    EXPECT_NE(text.find("\n" + k + " = "), std::string::npos) << key << " missing from:\n" << text;
  }
  EXPECT_NE(text.find("lr = 1.0\n"), std::string::npos) << text;
  Recipe back = parse_recipe(text, "saved.toml");
  r.path = "saved.toml";
  EXPECT_EQ(back, r);
  // Defaults round trip too, and the output is stable.
  Recipe d;
  EXPECT_EQ(recipe_to_toml(parse_recipe(recipe_to_toml(d), "")), recipe_to_toml(d));
  // 86 + model.{depths,window_size,mlp_ratio} (swin), model.{text_layers,text_heads,text_width,projection_dim}
  // (clip), data.mlm_probability (bert), parallel.sync_batchnorm, model.init_from, finetune.method,
  // lora.{r,alpha,dropout,target_modules,rslora,base_dtype}, data.{format,chat_template},
  // train.{loss_on,eval_at_start}, model.{rope_scaling,rope_scaling_factor,rope_low_freq_factor,
  // rope_high_freq_factor,rope_original_max_positions,tie_embeddings} (llama),
  // model.{stages,width_coefficient,depth_coefficient,depthwise_padding} (align),
  // model.{vision_from,lm_from,resampler_depth,resampler_heads,resampler_latents,cross_attn_every_n_layers} (flamingo),
  // train.{nonfinite,spike_zscore,spike_window}, parallel.timeout_s, parallel.{deterministic,atom_rows},
  // model.stem, model.memory_format (resnet)
  EXPECT_EQ(recipe_keys().size(), 131u);
}

namespace {
std::string parse_error(const char* text, const std::vector<std::string>& sets) {
  try {
    parse_recipe(text, "p.toml", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Recipe, AlignStagesAreParsedOrRefusedNamingTheKey) {
  const char* base = "[model]\ntype = \"align\"\nn_embd = 32\nn_head = 2\n[data]\ncorpus = \"fashion-mnist\"\n";
  EXPECT_EQ(parse_error(base, {}), "");
  EXPECT_EQ(parse_error(base, {"model.stages=r2_k3_s22_e4_i32_o24_se0.25, r1_k5_s1_e6_i24_o40"}), "");
  const std::vector<std::pair<std::string, std::string>> bad{
      {"model.stages=r1_k3_s3_e1_i32_o16", "strides[0] = 3"},
      {"model.stages=r1_k3_x1_e1_i32_o16", "\"x1\" in block"},
      {"model.stages=r1_k3_e1_i32_o16", "lacks s<...>"},
      {"model.stages=r1.5_k3_s1_e1_i32_o16", "r must be a whole number"},
      {"model.stages=r1_k3_s1_e1_i32_o16_se0.5", "one squeeze_expansion_ratio"},
      {"model.stages=r1_k3_s1_e1_i32_o16,,r1_k3_s1_e1_i16_o16", "an empty block"},
      {"model.stages=r1_k3_s1_e1_i32_o16, r1_k3_s1_e1_i24_o16", "in_channels[1] = 24"},
      {"model.depthwise_padding=x", "model.depthwise_padding"},
      {"model.projection_dim=50", "projection_dim 50"},
      {"model.width_coefficient=0", "width_coefficient"},
  };
  for (const auto& [set, needle] : bad) {
    const std::string e = parse_error(base, {set});
    EXPECT_NE(e.find(needle), std::string::npos) << set << " -> " << e;
    EXPECT_NE(e.find("p.toml"), std::string::npos) << e;  // names the recipe
  }
  // a key only ALIGN reads is refused on another model
  EXPECT_NE(parse_error("[model]\ntype = \"clip\"\n[data]\ncorpus = \"fashion-mnist\"\n",
                        {"model.stages=r1_k3_s1_e1_i32_o16"})
                .find("model.stages"),
            std::string::npos);
}

TEST(Recipe, VisionKeysAreValidated) {
  const char* base = "[train]\nsteps = 10\n[schedule]\nwarmup_steps = 1\n";
  const std::vector<std::string> fm = {"data.corpus=fashion-mnist"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.begin(), fm.begin(), fm.end());
    return parse_error(base, sets);
  };
  // the valid combinations
  EXPECT_EQ(with({"model.type=vit", "model.patch_size=4", "model.n_embd=64", "data.augment=true"}), "");
  EXPECT_EQ(with({"model.type=resnet18", "model.width=16"}), "");
  EXPECT_EQ(with({"model.type=resnet50"}), "");
  Recipe v = parse_recipe(base, "p.toml", {"data.corpus=fashion-mnist", "model.type=vit", "model.patch_size=14"});
  EXPECT_EQ(v.model.patch_size, 14);
  EXPECT_EQ(v.model.image_size, 28);
  EXPECT_EQ(v.model.num_classes, 10);
  EXPECT_EQ(v.model.in_channels, 1);
  EXPECT_FALSE(v.data.augment);
  // a vision model with a text corpus, and image data with a language model
  EXPECT_NE(parse_error(base, {"model.type=vit"}).find("data.corpus = \"fashion-mnist\""), std::string::npos)
      << parse_error(base, {"model.type=vit"});
  EXPECT_NE(parse_error(base, fm).find(
                "trains on text; use an image model (vit, resnet18, resnet50, swin, clip, align, flamingo)"),
            std::string::npos)
      << parse_error(base, fm);
  EXPECT_NE(parse_error(base, {"data.augment=true"}).find("data.augment"), std::string::npos);
  // synthetic images: any shape for the image classifiers, refused for the others
  for (const char* type : {"model.type=vit", "model.type=resnet18", "model.type=resnet50", "model.type=swin"})
    EXPECT_EQ(parse_error(base, {"data.corpus=synthetic", type, "model.in_channels=3", "model.num_classes=1000"}), "")
        << type;
  const Recipe s = parse_recipe(base, "p.toml",
                                {"data.corpus=synthetic", "model.type=resnet50", "model.stem=imagenet",
                                 "model.image_size=224", "model.in_channels=3", "model.num_classes=1000"});
  EXPECT_EQ(s.model.image_size, 224);
  EXPECT_EQ(s.model.stem, "imagenet");
  for (const char* type : {"model.type=gpt", "model.type=clip", "model.type=bert"}) {
    const std::string e = parse_error(base, {"data.corpus=synthetic", type});
    EXPECT_NE(e.find("data.corpus = \"synthetic\" (random images for `brigade bench`) is for the image classifiers "
                     "(vit, resnet18, resnet50, swin)"),
              std::string::npos)
        << e;
  }
  EXPECT_NE(
      parse_error(base, {"data.corpus=synthetic", "model.type=vit", "model.num_classes=1"}).find("model.num_classes"),
      std::string::npos);
  // the type name
  EXPECT_NE(parse_error(base, {"model.type=resnet19"}).find("did you mean 'resnet18'"), std::string::npos)
      << parse_error(base, {"model.type=resnet19"});
  // shapes
  EXPECT_NE(with({"model.type=vit", "model.patch_size=5"}).find("must divide model.image_size = 28"),
            std::string::npos);
  EXPECT_NE(with({"model.type=vit", "model.patch_size=0"}).find("model.patch_size"), std::string::npos);
  EXPECT_NE(with({"model.type=vit", "model.image_size=32"}).find("28x28"), std::string::npos);
  EXPECT_NE(with({"model.type=vit", "model.in_channels=3"}).find("one channel"), std::string::npos);
  EXPECT_NE(with({"model.type=vit", "model.num_classes=100"}).find("10 classes"), std::string::npos);
  EXPECT_NE(with({"model.type=vit", "model.n_embd=30", "model.n_head=4"}).find("not divisible"), std::string::npos);
  EXPECT_NE(with({"model.type=resnet18", "model.width=0"}).find("model.width"), std::string::npos);
  EXPECT_EQ(with({"model.type=resnet50", "model.stem=imagenet"}), "");
  EXPECT_NE(with({"model.type=resnet50", "model.stem=big"}).find("model.stem = \"big\" must be \"small\""),
            std::string::npos)
      << with({"model.type=resnet50", "model.stem=big"});
  EXPECT_NE(with({"model.type=vit", "model.stem=imagenet"}).find("applies to model.type = \"resnet18\", \"resnet50\""),
            std::string::npos)
      << with({"model.type=vit", "model.stem=imagenet"});
  EXPECT_EQ(with({"model.type=resnet18", "model.memory_format=channels_last"}), "");
  EXPECT_EQ(parse_recipe(base, "p.toml",
                         {"data.corpus=synthetic", "model.type=resnet50", "model.memory_format=channels_last"})
                .model.memory_format,
            "channels_last");
  EXPECT_NE(with({"model.type=resnet50", "model.memory_format=nhwc"})
                .find("model.memory_format = \"nhwc\" must be \"nchw\" (the default) or \"channels_last\""),
            std::string::npos)
      << with({"model.type=resnet50", "model.memory_format=nhwc"});
  EXPECT_NE(with({"model.type=vit", "model.memory_format=channels_last"})
                .find("applies to model.type = \"resnet18\", \"resnet50\""),
            std::string::npos)
      << with({"model.type=vit", "model.memory_format=channels_last"});
  EXPECT_NE(with({"model.type=resnet18", "model.dropout=0.1"}).find("no dropout"), std::string::npos);
  // what the model registry's rows say a model cannot do: one generic message naming the model,
  // the feature and the models that have it
  const std::string tp = with({"model.type=resnet18", "parallel.tp=2"});
  EXPECT_NE(tp.find("model.type = \"resnet18\" has no tensor-parallel plan; tensor parallelism is built for gpt, "
                    "llama, bert, vit"),
            std::string::npos)
      << tp;
  const std::string pp = with({"model.type=swin", "parallel.pp=2"});
  EXPECT_NE(pp.find("model.type = \"swin\" is not cut into pipeline stages; pipeline parallelism is built for gpt, "
                    "llama, bert, vit"),
            std::string::npos)
      << pp;
  EXPECT_EQ(with({"model.type=vit", "parallel.tp=2", "parallel.pp=2"}), "");  // ViT has a plan and stages
  EXPECT_NE(with({"model.type=resnet18", "memory.recompute=budget", "memory.budget_mb=10"}).find("activation estimate"),
            std::string::npos);
  EXPECT_NE(parse_error(base, {"parallel.sync_batchnorm=true"})
                .find("no BatchNorm (models with BatchNorm: resnet18, "
                      "resnet50, custom, align)"),
            std::string::npos);
  // and what every model now composes with: accumulation, recompute, precision, data parallelism
  EXPECT_EQ(with({"model.type=vit", "train.accumulation=2", "memory.recompute=full", "parallel.zero=3"}), "");
  EXPECT_EQ(with({"model.type=resnet18", "precision.level=O2", "parallel.dp=2", "parallel.sync_batchnorm=true"}), "");
  // keys a model does not read are refused by name, naming the models that read them
  const std::string patch = parse_error(base, {"model.patch_size=4"});
  EXPECT_NE(patch.find("model.patch_size = 4 applies to model.type = \"vit\", \"swin\", \"clip\", not \"gpt\""),
            std::string::npos)
      << patch;
  // swin, clip and bert keys
  EXPECT_EQ(with({"model.type=swin", "model.patch_size=2", "model.depths=2,2", "model.window_size=7"}), "");
  EXPECT_EQ(with({"model.type=swin", "model.patch_size=2", "model.depths=2,6", "model.window_size=14"}), "");
  EXPECT_EQ(with({"model.type=clip", "model.patch_size=4", "model.text_width=32", "model.text_heads=2"}), "");
  EXPECT_EQ(parse_error(base, {"model.type=bert", "data.mlm_probability=0.2"}), "");
  const std::string bad_list = with({"model.type=swin", "model.patch_size=2", "model.depths=2,x"});
  EXPECT_NE(bad_list.find("model.depths = \"2,x\": \"x\" is not a count"), std::string::npos) << bad_list;
  const std::string bad_window = with({"model.type=swin", "model.patch_size=2", "model.window_size=5"});
  EXPECT_NE(bad_window.find("does not divide stage 0's 14x14 grid"), std::string::npos) << bad_window;
  const std::string odd_grid = with({"model.type=swin", "model.patch_size=4", "model.depths=2,2"});
  EXPECT_NE(odd_grid.find("patch merging cannot halve"), std::string::npos) << odd_grid;
  EXPECT_NE(with({"model.type=swin", "model.patch_size=2", "model.depths=0,2"}).find("at least 1"), std::string::npos);
  EXPECT_NE(with({"model.type=vit", "model.window_size=5"}).find("applies to model.type = \"swin\""),
            std::string::npos);
  EXPECT_NE(with({"model.type=vit", "model.text_width=32"}).find("applies to model.type = \"clip\""),
            std::string::npos);
  EXPECT_NE(with({"model.type=clip", "model.text_width=30", "model.text_heads=4"}).find("not divisible"),
            std::string::npos);
  EXPECT_NE(with({"model.type=swin", "model.width=16"}).find("applies to model.type = \"resnet18\", \"resnet50\""),
            std::string::npos);
  EXPECT_NE(parse_error(base, {"data.mlm_probability=0.2"}).find("applies to model.type = \"bert\""),
            std::string::npos);
  EXPECT_NE(parse_error(base, {"model.type=bert", "data.mlm_probability=1"}).find("must be in (0, 1)"),
            std::string::npos);
  EXPECT_EQ(parse_error(base, {"model.type=bert", "parallel.dp=2"}), "");
  // every message is one line
  for (const std::string& m : {with({"model.type=vit", "model.patch_size=5"}), parse_error(base, {"model.type=vit"})})
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

TEST(Recipe, ParallelKeysAreValidated) {
  const char* base = "[train]\nsteps = 10\n[schedule]\nwarmup_steps = 1\n";
  auto msg = [&](const std::string& set) -> std::string {
    try {
      parse_recipe(base, "p.toml", {set});
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg("parallel.zero=4").find("ZeRO stage"), std::string::npos);
  EXPECT_NE(msg("parallel.dp=0").find("parallel.dp"), std::string::npos);
  EXPECT_NE(msg("parallel.allreduce=rign").find("did you mean"), std::string::npos) << msg("parallel.allreduce=rign");
  EXPECT_NE(msg("parallel.bucket_mb=0").find("parallel.bucket_mb"), std::string::npos);
  EXPECT_NE(msg("parallel.overlap=1").find("true or false"), std::string::npos) << msg("parallel.overlap=1");
  EXPECT_NE(msg("train.accumulation=0").find("train.accumulation"), std::string::npos);
  // model types
  EXPECT_NE(msg("model.type=lama").find("did you mean"), std::string::npos) << msg("model.type=lama");
  EXPECT_NE(parse_error(base, {"model.type=llama", "model.n_kv_head=3"}).find("must divide model.n_head"),
            std::string::npos);
  EXPECT_NE(parse_error(base, {"model.type=llama", "model.dropout=0.1"}).find("no dropout"), std::string::npos);
  EXPECT_EQ(parse_error(base, {"model.type=llama", "model.n_kv_head=2", "parallel.tp=2"}), "");  // LLaMA's plan
  EXPECT_EQ(parse_error(base, {"model.type=llama", "model.n_kv_head=2"}), "");
  // model parallelism
  EXPECT_NE(msg("parallel.tp=0").find("parallel.tp"), std::string::npos);
  EXPECT_NE(msg("parallel.schedule=1fb1").find("did you mean"), std::string::npos) << msg("parallel.schedule=1fb1");
  EXPECT_NE(msg("parallel.microbatches=3").find("must divide train.batch_size"), std::string::npos);
  EXPECT_NE(msg("parallel.virtual_stages=2").find("interleaved"), std::string::npos);
  EXPECT_NE(msg("parallel.max_in_flight=-1").find("parallel.max_in_flight"), std::string::npos);
  EXPECT_NE(parse_error(base, {"parallel.pp=2", "parallel.zero=2"}).find("ZeRO-0 or ZeRO-1"), std::string::npos);
  EXPECT_NE(parse_error(base, {"parallel.tp=2", "optim.name=lamb"}).find("LAMB"), std::string::npos);
  EXPECT_NE(parse_error(base, {"parallel.pp=2", "parallel.schedule=interleaved", "parallel.microbatches=3",
                               "train.batch_size=6"})
                .find("multiple of it"),
            std::string::npos);
  Recipe ok = parse_recipe(base, "p.toml", {"parallel.overlap=false", "parallel.zero=3", "train.accumulation=2"});
  EXPECT_FALSE(ok.parallel.overlap);
  EXPECT_EQ(ok.parallel.zero, 3);
  EXPECT_EQ(ok.train.accumulation, 2);
}

TEST(Recipe, RopeScalingAndTiedHeadKeysAreChecked) {
  const char* base = "";
  auto err = [&](std::vector<std::string> sets) {
    sets.insert(sets.begin(), "model.type=llama");
    return parse_error(base, sets);
  };
  auto has = [](const std::string& m, const std::string& n) {
    EXPECT_NE(m.find(n), std::string::npos) << "missing '" << n << "' in: " << m;
  };
  const std::vector<std::string> l3{"model.rope_scaling=llama3", "model.rope_scaling_factor=32.0",
                                    "model.rope_low_freq_factor=1.0", "model.rope_high_freq_factor=4.0",
                                    "model.rope_original_max_positions=8192"};
  EXPECT_EQ(err(l3), "");  // Llama 3.2's values
  {
    Recipe r;
    r.model.type = "llama";
    r.model.rope_scaling = "llama3";
    r.model.rope_scaling_factor = 32.0;
    r.model.rope_low_freq_factor = 1.0;
    r.model.rope_high_freq_factor = 4.0;
    r.model.rope_original_max_positions = 8192;
    r.model.tie_embeddings = true;
    Recipe back = parse_recipe(recipe_to_toml(r), "saved.toml");
    r.path = "saved.toml";
    EXPECT_EQ(back, r);
  }
  EXPECT_EQ(err({"model.rope_scaling=linear", "model.rope_scaling_factor=2.0", "model.tie_embeddings=true"}), "");
  EXPECT_EQ(err({"model.tie_embeddings=true", "model.n_kv_head=2", "parallel.tp=2"}), "");  // the tied plan
  has(err({"model.rope_scaling=linear"}),
      "model.rope_scaling_factor = 0 must be > 0 with model.rope_scaling = \"linear\"");
  has(err({"model.rope_scaling=linear", "model.rope_scaling_factor=-2.0"}),
      "model.rope_scaling_factor = -2 must be > 0");
  has(err({"model.rope_scaling_factor=8.0"}),
      "model.rope_scaling_factor = 8 has no effect with model.rope_scaling = \"none\"");
  has(err({"model.rope_scaling=linear", "model.rope_scaling_factor=2.0", "model.rope_low_freq_factor=1.0"}),
      "model.rope_low_freq_factor = 1 has no effect with model.rope_scaling = \"linear\"");
  has(err({"model.rope_original_max_positions=8192"}), "model.rope_original_max_positions = 8192 has no effect");
  has(err({"model.rope_scaling=llama3", "model.rope_scaling_factor=8.0"}),
      "model.rope_low_freq_factor = 0 must be > 0");
  std::vector<std::string> bad = l3;
  bad[3] = "model.rope_high_freq_factor=1.0";  // == low
  has(err(bad), "model.rope_high_freq_factor = 1 must be > model.rope_low_freq_factor = 1");
  has(err({"model.rope_scaling=yarn"}), "model.rope_scaling = \"yarn\" is not implemented");
  has(err({"model.rope_scaling=dynamic"}), "model.rope_scaling = \"dynamic\" is not implemented");
  has(err({"model.rope_scaling=lineer"}), "model.rope_scaling = \"lineer\" is not a RoPE scaling");
  // llama keys on another model
  has(parse_error(base, {"model.tie_embeddings=true"}),
      "model.tie_embeddings = true applies to model.type = \"llama\"");
  has(parse_error(base, {"model.rope_scaling=linear"}),
      "model.rope_scaling = \"linear\" applies to model.type = \"llama\"");
}

TEST(Recipe, PrecisionKeysAreValidated) {
  const char* base = "[train]\nsteps = 10\n[schedule]\nwarmup_steps = 1\n";
  auto msg = [&](std::vector<std::string> sets) -> std::string {
    try {
      parse_recipe(base, "p.toml", sets);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg({"precision.level=O4"}).find("not an AMP level"), std::string::npos);
  EXPECT_NE(msg({"precision.level=o2"}).find("did you mean 'O2'"), std::string::npos) << msg({"precision.level=o2"});
  EXPECT_NE(msg({"precision.dtype=f16"}).find("\"bf16\" or \"fp16\""), std::string::npos);
  EXPECT_NE(msg({"precision.loss_scale=dynamc"}).find("did you mean 'dynamic'"), std::string::npos);
  EXPECT_NE(msg({"precision.level=O2", "precision.init_scale=0"}).find("min_scale <= init_scale"), std::string::npos);
  EXPECT_NE(msg({"precision.level=O2", "precision.max_scale=100"}).find("init_scale <= max_scale"), std::string::npos);
  EXPECT_NE(msg({"precision.growth=1"}).find("precision.growth = 1"), std::string::npos);
  EXPECT_NE(msg({"precision.backoff=1.5"}).find("precision.backoff"), std::string::npos);
  EXPECT_NE(msg({"precision.hysteresis=0"}).find("precision.hysteresis"), std::string::npos);
  EXPECT_NE(msg({"precision.growth_interval=0"}).find("precision.growth_interval"), std::string::npos);
  // loss scaling at O0 (fp32 everywhere) is a mistake, not a no-op to ignore
  EXPECT_NE(msg({"precision.loss_scale=dynamic"}).find("fp32 gradients need no loss scaling"), std::string::npos);
  Recipe ok = parse_recipe(base, "p.toml", {"precision.level=O2", "precision.dtype=fp16"});
  EXPECT_EQ(ok.precision.level, "O2");
  EXPECT_EQ(ok.precision.loss_scale, "auto");
  EXPECT_EQ(parse_recipe("", "d.toml").precision.level, "O0");  // the default is fp32
}

TEST(Recipe, MissingFileIsConfigErrorNamingThePath) {
  try {
    load_recipe("/nonexistent/dir/recipe.toml");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/recipe.toml"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_recipe(std::filesystem::temp_directory_path().string()), ConfigError);
}

TEST(Recipe, LoadAppliesOverrides) {
  auto path = std::filesystem::temp_directory_path() / ("brigade_recipe_" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream out(path);
    out << "[train]\nsteps = 200\n";
  }
  Recipe r = load_recipe(path.string(), {"train.batch_size=4"});
  EXPECT_EQ(r.train.steps, 200);
  EXPECT_EQ(r.train.batch_size, 4);
  EXPECT_EQ(r.path, path.string());
  std::filesystem::remove(path);
}

// run.threads = 0 is this process's share of the node: every core alone, cores / local ranks
// under mpirun (two ranks with every core each would contend for the same cores),
// OMP_NUM_THREADS where the user set it; a positive value as given.
TEST(Threads, ZeroIsThisProcesssShareOfTheCores) {
  const char* keep_omp = std::getenv("OMP_NUM_THREADS");
  const char* keep_local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string omp_saved = keep_omp ? keep_omp : "", local_saved = keep_local ? keep_local : "";
  ::unsetenv("OMP_NUM_THREADS");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  ::unsetenv("MPI_LOCALNRANKS");
  const int cores = omp_get_num_procs();
  EXPECT_EQ(resolve_threads(0), cores);
  EXPECT_EQ(resolve_threads(3), 3);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  EXPECT_EQ(resolve_threads(0), std::max(1, cores / 2));
  EXPECT_EQ(resolve_threads(5), 5);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1000000", 1);
  EXPECT_EQ(resolve_threads(0), 1);  // never below one thread
  ::setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(resolve_threads(0), 3);
  set_threads(0);
  EXPECT_EQ(omp_get_max_threads(), 3);
  if (keep_omp)
    ::setenv("OMP_NUM_THREADS", omp_saved.c_str(), 1);
  else
    ::unsetenv("OMP_NUM_THREADS");
  if (keep_local)
    ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", local_saved.c_str(), 1);
  else
    ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  omp_set_num_threads(cores);
}

}  // namespace
}  // namespace brigade::train
