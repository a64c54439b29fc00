// The fuzz targets; see targets.h.
#include "fuzz/targets.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "brigade/amp/loss_scaler.h"
#include "brigade/ckpt/checkpoint_dir.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/core/rng.h"
#include "brigade/data/image/fashion_mnist.h"
#include "brigade/data/text/sft.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/data/text/token_file.h"
#include "brigade/models/hf/hf_dir.h"
#include "brigade/train/accumulation.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/config.h"
#include "brigade/train/early_stop.h"
#include "brigade/train/step_guard.h"

namespace brigade::fuzz {

namespace {

namespace fs = std::filesystem;

// This process's scratch folder (<tmp>/brigade_fuzz_<pid>), removed when the process ends.
struct Scratch {
  fs::path root = fs::temp_directory_path() / ("brigade_fuzz_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(root); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};
const fs::path& scratch() {
  static Scratch s;
  return s.root;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// <scratch>/<name>, emptied.
fs::path fresh_dir(const std::string& name) {
  const fs::path d = scratch() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The input as a file (the reader maps a path), one per process, rewritten per input.
std::string as_file(const uint8_t* data, size_t size) {
  const fs::path path = scratch() / "input.bin";
  write_bytes(path, std::string(reinterpret_cast<const char*>(data), size));
  return path.string();
}

std::string bytes_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace

int safetensors(const uint8_t* data, size_t size) {
  try {
    ckpt::SafetensorsReader r(as_file(data, size));
    for (const std::string& name : r.names()) {
      (void)r.info(name);
      (void)r.get(name);
    }
    for (const auto& [key, value] : r.metadata()) (void)key, (void)value;
  } catch (const Error&) {
    // refused with a clear error: what a bad file must give
  }
  return 0;
}

int recipe(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string toml = text;
  std::vector<std::string> overrides;
  const size_t at = text.find("\n--set\n");
  if (at != std::string::npos) {
    toml = text.substr(0, at);
    size_t pos = at + 7;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      overrides.push_back(text.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  try {
    (void)train::parse_recipe(toml, "fuzz.toml", overrides, /*resolve=*/false);
  } catch (const Error&) {
  }
  return 0;
}

std::vector<std::pair<std::string, std::string>> split_bundle(const std::string& bytes, const std::string& name) {
  if (bytes.rfind("@@ ", 0) != 0) return {{name, bytes}};
  std::vector<std::pair<std::string, std::string>> parts;
  size_t pos = 0;
  while (pos < bytes.size()) {  // at "@@ "
    const size_t eol = bytes.find('\n', pos);
    if (eol == std::string::npos) {
      parts.emplace_back(bytes.substr(pos + 3), "");
      break;
    }
    const size_t next = bytes.find("\n@@ ", eol);
    const size_t end = next == std::string::npos ? bytes.size() : next;
    parts.emplace_back(bytes.substr(pos + 3, eol - pos - 3), bytes.substr(eol + 1, end > eol ? end - eol - 1 : 0));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return parts;
}

int token_file(const uint8_t* data, size_t size) {
  const std::string path = as_file(data, size);
  for (bool verify : {true, false}) {
    try {
      data::TokenDataset ds(path, verify);
      std::vector<int64_t> out(size_t(ds.size()));
      ds.read(0, ds.size(), out.data());
      int64_t sum = 0;
      for (int64_t i = 0; i < ds.size(); ++i) sum += ds[i];
      (void)sum;
      ds.read(ds.size(), 1, out.data());  // past the end: a ValueError
    } catch (const Error&) {
    }
  }
  return 0;
}

int fashion_idx(const uint8_t* data, size_t size) {
  const std::vector<std::pair<std::string, std::string>> parts = split_bundle(bytes_of(data, size), "idx");
  if (parts.size() == 1) {
    const std::string path = as_file(data, size);
    for (int ndim : {1, 3}) {
      try {
        (void)data::read_idx_gz(path, ndim);
      } catch (const Error&) {
      }
    }
    return 0;
  }
  const fs::path dir = fresh_dir("fashion");
  std::string images, labels;
  for (const auto& [name, bytes] : parts) {
    if (name != "images" && name != "labels") continue;
    write_bytes(dir / name, bytes);
    (name == "images" ? images : labels) = (dir / name).string();
  }
  if (images.empty() || labels.empty()) return 0;
  try {
    const data::FashionMnist ds(images, labels);
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < std::min<int64_t>(ds.size(), 16); ++i) idx.push_back(i);
    Generator gen(7);
    (void)ds.batch(idx, &gen);
    (void)ds.batch({ds.size()});  // past the end: a ValueError
  } catch (const Error&) {
  }
  return 0;
}

int checkpoint_state(const uint8_t* data, size_t size) {
  const fs::path dir = scratch() / "checkpoint";
  if (!fs::exists(dir / "recipe.toml")) {
    fs::create_directories(dir);
    write_bytes(dir / "recipe.toml", "");  // open_checkpoint() needs it; checkpoint_state() does not read it
  }
  write_bytes(dir / "state.json", bytes_of(data, size));
  train::TrainState s;
  try {
    s = train::checkpoint_state(dir.string());
  } catch (const Error&) {
    return 0;
  }
  // What a resume does with the states it carries (trainer.cpp), each refused with its own error.
  train::TrainConfig tc;
  tc.accumulation = 2;
  tc.accumulation_mode = "noise_scale";
  tc.accumulation_max = 8;
  tc.nonfinite = "skip";
  tc.spike_zscore = 3.0;
  tc.spike_window = 4;
  try {
    Generator g;
    if (!s.rng_state.empty()) g.set_state(s.rng_state);
    (void)g.random();
  } catch (const Error&) {
  }
  try {
    train::AccumulationPolicy acc(tc, 4);
    acc.set_state(s.accumulation_state);
    (void)acc.noise_scale();
  } catch (const Error&) {
  }
  try {
    amp::LossScalerOptions o;
    o.mode = amp::ScaleMode::Dynamic;
    amp::LossScaler scaler(o);
    scaler.set_state(s.scaler_state);
  } catch (const Error&) {
  }
  try {
    train::StepGuard guard(tc);
    guard.set_state(s.guard_state);
    for (int64_t step = 1; step <= 3; ++step) {  // (steps after s.step in a resume; s.step may be INT64_MAX)
      (void)guard.check_loss(step, 2.0);
      (void)guard.check_update(step, 2.0, 1.0);
    }
    (void)guard.state();
  } catch (const Error&) {
  }
  try {
    train::EarlyStopper stop(3, 0.0, s.early_stop);
    (void)stop.observe(1, 1.5);
    (void)stop.exhausted();
  } catch (const Error&) {
  }
  return 0;
}

int optimizer_index(const uint8_t* data, size_t size) {
  // Two parameters, w (6 elements at 0) and b (2 at 6), in two shards [0, 4) and [4, 8) of two
  // states, written once by the real shard writer.
  static const std::vector<ckpt::FlatLayoutEntry> layout{{"w", 0, 6}, {"b", 6, 2}};
  const fs::path dir = scratch() / "zero";
  if (!fs::exists(dir / "recipe.toml")) {
    fs::create_directories(dir);
    for (int r = 0; r < 2; ++r) {
      std::vector<float> a(4), b(4);
      for (int i = 0; i < 4; ++i) a[size_t(i)] = float(r * 4 + i), b[size_t(i)] = float(100 + r * 4 + i);
      ckpt::write_optimizer_shard(
          dir.string(), r, 2, r * 4, r * 4 + 4,
          {{"exp_avg", Tensor::from_vector(a, {4})}, {"exp_avg_sq", Tensor::from_vector(b, {4})}});
    }
    write_bytes(dir / "recipe.toml", "");
  }
  write_bytes(dir / "optimizer.index.json", bytes_of(data, size));
  for (const auto& [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, 8}, {3, 5}, {6, 8}}) {
    try {
      for (const auto& [name, t] : ckpt::read_optimizer_flat(dir.string(), layout, lo, hi)) (void)t.to_vector();
    } catch (const Error&) {
    }
  }
  return 0;
}

int hf_config(const uint8_t* data, size_t size) {
  const fs::path dir = scratch() / "hf_config";
  fs::create_directories(dir);
  write_bytes(dir / "config.json", bytes_of(data, size));
  try {
    const models::HfConfig c = models::read_hf_config(dir.string());
    // Build the model when it is small (a config of a large model is valid; allocating it is not this test).
    double params = 0;
    if (c.model_type == "gpt2") {
      const models::GPTConfig& g = c.gpt;
      params = double(g.vocab_size + g.block_size) * double(g.n_embd) + 12.0 * double(g.n_layer) * g.n_embd * g.n_embd;
    } else {
      const models::LLaMAConfig& l = c.llama;
      params = 2.0 * double(l.vocab_size) * double(l.hidden_size) +
               double(l.n_layer) * (4.0 * l.hidden_size * l.hidden_size + 3.0 * l.hidden_size * l.intermediate_size);
    }
    if (params <= double(1 << 20)) (void)models::make_hf_model(c);
  } catch (const Error&) {
  }
  return 0;
}

int hf_index(const uint8_t* data, size_t size) {
  static const fs::path src = fs::path(BRIGADE_SOURCE_DIR) / "tests/fixtures/hf/llama_sharded";
  const fs::path dir = scratch() / "hf_sharded";
  static std::unique_ptr<models::CausalLM> model;
  if (!model) {
    fs::create_directories(dir);
    for (const char* f : {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
      fs::copy_file(src / f, dir / f, fs::copy_options::overwrite_existing);
    model = models::make_hf_model(models::read_hf_config(dir.string()));
  }
  write_bytes(dir / "model.safetensors.index.json", bytes_of(data, size));
  try {
    (void)models::load_hf_weights(dir.string(), "llama", *model);
  } catch (const Error&) {
  }
  return 0;
}

int tokenizer(const uint8_t* data, size_t size) {
  static const std::set<std::string> names{"tokenizer.json",        "vocab.json",      "merges.txt",
                                           "tokenizer_config.json", "tokenizer.model", data::kTokenizerMarker};
  const fs::path dir = fresh_dir("tokenizer");
  for (const auto& [name, bytes] : split_bundle(bytes_of(data, size), "tokenizer.json"))
    if (names.count(name)) write_bytes(dir / name, bytes);
  try {
    (void)data::detect_tokenizer(dir.string());
    const std::unique_ptr<data::TextTokenizer> tok = data::load_text_tokenizer(dir.string());
    const std::string text = "Hello world, it's 2024!\n  <|endoftext|> caf\xc3\xa9 \xff\xfe <s> x";
    const std::vector<int> ids = tok->encode(text);
    (void)tok->decode(ids);
    (void)tok->document_prefix();
    (void)tok->document_suffix();
    (void)tok->end_id();
    (void)tok->begin_id();
    (void)tok->files();
    try {
      (void)tok->encode_strict(text, "fuzz text");
    } catch (const Error&) {
    }
    std::vector<int> all;
    for (int64_t i = 0; i < std::min<int64_t>(tok->vocab_size(), 600); ++i) all.push_back(int(i));
    try {
      (void)tok->decode(all);
    } catch (const Error&) {  // an id that names no token
    }
    (void)tok->decode(std::vector<int>{int(tok->vocab_size())});  // past the end: a ValueError
  } catch (const Error&) {
  }
  return 0;
}

int sft_jsonl(const uint8_t* data, size_t size) {
  // Two toy byte-level tokenizers from the tokenizer corpus (GPT-2's layout, and LLaMA-3's, which
  // adds a BOS document prefix), loaded once: the input is the JSONL file, encoded by each tokenizer
  // with every chat template.
  static const std::vector<std::unique_ptr<data::TextTokenizer>> toks = [] {
    std::vector<std::unique_ptr<data::TextTokenizer>> t;
    for (const char* seed : {"seed_tokenizer_gpt2_layout.json", "seed_tokenizer_llama3_layout.json"}) {
      const fs::path dir = fresh_dir(std::string("sft_") + seed);
      fs::copy_file(fs::path(BRIGADE_SOURCE_DIR) / "tests/fuzz/corpus/tokenizer" / seed, dir / "tokenizer.json");
      t.push_back(data::load_text_tokenizer(dir.string()));
    }
    return t;
  }();
  const std::string path = as_file(data, size);
  for (const auto& tok : toks)
    for (const char* chat : {"chatml", "llama-2", "llama-3"}) {
      try {
        const data::SftData d = data::read_sft_jsonl(path, *tok, {chat, /*loss_on_all=*/size % 2 == 1});
        for (const data::SftSample& s : d.samples)
          if (s.ids.size() != s.trained.size()) throw std::logic_error("a sample's ids and flags differ in length");
      } catch (const Error&) {
      }
    }
  return 0;
}

const std::vector<Target>& targets() {
  static const std::vector<Target> t{{"safetensors", safetensors},
                                     {"recipe", recipe},
                                     {"token_file", token_file},
                                     {"fashion_idx", fashion_idx},
                                     {"checkpoint_state", checkpoint_state},
                                     {"optimizer_index", optimizer_index},
                                     {"hf_config", hf_config},
                                     {"hf_index", hf_index},
                                     {"tokenizer", tokenizer},
                                     {"sft_jsonl", sft_jsonl}};
  return t;
}

}  // namespace brigade::fuzz
