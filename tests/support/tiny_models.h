// Every model type of the registry at a tiny size, for the end-to-end tests that run the
// `brigade` binary on each (tests/train/test_composition.cpp, tests/cli/test_every_model.cpp,
// tests/train/test_mp_models.cpp): the [model] keys, whether it reads images, whether it has
// BatchNorm, its rows per rank; a recipe writer; a small Fashion-MNIST subset so image runs (and
// their final evaluation over the whole test split) take a second, not a minute; and a run's
// loss curve from its metrics.jsonl, with the comparison the tests make between curves.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "brigade/data/image/fashion_mnist.h"
#include "support/test_support.h"

namespace brigade::test_support {

inline constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

struct TinyModel {
  std::string name;   // the test's name ("resnet" trains model.type = "resnet18")
  std::string model;  // the [model] section's keys
  bool images = false;
  bool batch_norm = false;
  int64_t batch = 4;  // rows per rank
};

// gtest prints a parameter with this (the test names carry it).
inline void PrintTo(const TinyModel& m, std::ostream* os) { *os << m.name; }

inline const std::vector<TinyModel>& tiny_models() {
  static const std::vector<TinyModel> c{
      {"gpt", "vocab_size = 128\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_embd = 32\n", false, false, 4},
      {"llama",
       "type = \"llama\"\nvocab_size = 128\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_kv_head = 1\nn_embd = 32\n"
       "intermediate_size = 64\n",
       false, false, 4},
      {"bert",
       "type = \"bert\"\nvocab_size = 128\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_embd = 32\n"
       "intermediate_size = 64\n",
       false, false, 8},
      {"vit", "type = \"vit\"\npatch_size = 7\nn_layer = 2\nn_head = 2\nn_embd = 32\nintermediate_size = 64\n", true,
       false, 8},
      {"resnet", "type = \"resnet18\"\nwidth = 4\n", true, true, 8},
      {"swin",
       "type = \"swin\"\npatch_size = 2\nn_embd = 16\nn_head = 1\ndepths = \"1,2\"\nwindow_size = 7\nmlp_ratio = 2.0\n",
       true, false, 8},
      {"clip",
       "type = \"clip\"\npatch_size = 7\nn_layer = 1\nn_head = 2\nn_embd = 32\nintermediate_size = 64\n"
       "text_layers = 1\ntext_heads = 2\ntext_width = 32\nprojection_dim = 16\n",
       true, false, 8},
      // two stages (the second expanding, stride 2), width 0.5: 16 stem channels, embedding 16
      {"align",
       "type = \"align\"\nn_layer = 1\nn_head = 2\nn_embd = 32\nintermediate_size = 64\nlayer_norm_eps = 1e-12\n"
       "stages = \"r1_k3_s1_e1_i32_o16, r2_k3_s2_e4_i16_o32\"\nwidth_coefficient = 0.5\n",
       true, true, 8},
  };
  return c;
}

// The tiny LLaMA with Llama 3.2's options: a tied head and llama3-scaled RoPE (head size 16:
// with original_max_positions 16 the first frequency pair is blended, the others divided).
inline constexpr const char* kTiedScaledLlama =
    "type = \"llama\"\nvocab_size = 128\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_kv_head = 1\nn_embd = 32\n"
    "intermediate_size = 64\ntie_embeddings = true\nrope_scaling = \"llama3\"\nrope_scaling_factor = 4.0\n"
    "rope_low_freq_factor = 1.0\nrope_high_freq_factor = 4.0\nrope_original_max_positions = 16\n";

inline bool have_fashion_mnist() {
  return std::filesystem::exists(std::filesystem::path(kFashionDir) / "t10k-images-idx3-ubyte.gz");
}

// Fashion-MNIST's first n train / m test images as IDX files (uncompressed: the reader takes
// plain files too) under `dir`.
inline void write_fashion_subset(const std::filesystem::path& dir, int64_t n, int64_t m) {
  std::filesystem::create_directories(dir);
  auto be32 = [](std::ofstream& f, uint32_t v) {
    const unsigned char b[4] = {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
    f.write(reinterpret_cast<const char*>(b), 4);
  };
  for (auto [split, prefix, count] : {std::tuple{data::FashionMnist::Split::Train, "train", n},
                                      std::tuple{data::FashionMnist::Split::Test, "t10k", m}}) {
    const data::FashionMnist set(kFashionDir, split);
    std::ofstream img(dir / (std::string(prefix) + "-images-idx3-ubyte.gz"), std::ios::binary);
    be32(img, 0x00000803);
    be32(img, uint32_t(count));
    be32(img, 28);
    be32(img, 28);
    std::ofstream lab(dir / (std::string(prefix) + "-labels-idx1-ubyte.gz"), std::ios::binary);
    be32(lab, 0x00000801);
    be32(lab, uint32_t(count));
    for (int64_t i = 0; i < count; ++i) {
      img.write(reinterpret_cast<const char*>(set.pixels(i)), 28 * 28);
      const char y = char(set.label(i));
      lab.write(&y, 1);
    }
  }
}

// Writes `dir`/r.toml for the model (run.out_dir "run", one thread, 10 steps of `rows` rows,
// evaluation every 5) and its data: the tiny corpus, or a Fashion-MNIST subset of 512 training and
// `test_images` test images (512 by default: a whole evaluation chunk of 500 images, as the real
// test split, so memory peaks compare).
inline void write_tiny_recipe(const std::filesystem::path& dir, const TinyModel& c, int64_t rows,
                              int64_t test_images = 512) {
  std::string data;
  if (c.images) {
    write_fashion_subset(dir / "fashion", 512, test_images);
    data = "corpus = \"fashion-mnist\"\ndir = \"fashion\"\n";
  } else {
    write_tiny_corpus(dir / "corpus.txt");
    data = "corpus = \"corpus.txt\"\ndir = \"data\"\nval_fraction = 0.1\n";
  }
  std::ofstream(dir / "r.toml") << "[run]\nname = \"tiny\"\nout_dir = \"run\"\nseed = 5\nthreads = 1\n[model]\n"
                                << c.model << "[data]\n"
                                << data << "[train]\nsteps = 10\nbatch_size = " << rows
                                << "\nseq_len = 16\neval_every = 5\neval_batches = 1\nlog_every = 1\n"
                                   "grad_clip = 1.0\n[optim]\nlr = 3e-3\nweight_decay = 0.01\n"
                                   "[schedule]\nwarmup_steps = 2\nmin_lr = 3e-4\n";
}

// A run's curve from its metrics.jsonl: train losses, val losses (as numbers and as printed, for
// bitwise comparisons) and each train record; early-stopping records left out.
struct Curve {
  std::map<int64_t, double> loss, val_loss;
  std::map<int64_t, std::string> loss_text, val_text;
  std::map<int64_t, nlohmann::json> records;
};
inline Curve read_curve(const std::filesystem::path& metrics_jsonl) {
  Curve c;
  std::ifstream f(metrics_jsonl);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    const int64_t step = j.at("step");
    if (j.contains("early_stop")) continue;
    if (j.contains("val_loss")) {
      c.val_loss[step] = j["val_loss"];
      c.val_text[step] = j["val_loss"].dump();
    } else if (j.contains("loss") && j["loss"].is_number()) {  // (a skipped non-finite step logs null)
      c.loss[step] = j["loss"];
      c.loss_text[step] = j["loss"].dump();
      c.records[step] = j;
    }
  }
  return c;
}

// `got` has exactly the steps of `want`, each finite and within `tol` relative.
inline void expect_close(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want,
                         const std::string& what, double tol = 1e-5) {
  ASSERT_FALSE(want.empty()) << what;
  EXPECT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, w] : want) {
    auto it = got.find(step);
    if (it == got.end()) {
      ADD_FAILURE() << what << ": no record for step " << step;
      continue;
    }
    EXPECT_TRUE(std::isfinite(it->second)) << what << " step " << step;
    EXPECT_LE(std::abs(it->second - w), tol * std::abs(w))
        << what << " step " << step << ": " << it->second << " vs " << w;
  }
}

}  // namespace brigade::test_support
