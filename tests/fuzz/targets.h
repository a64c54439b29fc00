// Fuzz targets: one function per parser of outside input, each taking arbitrary bytes. A target
// returns 0 for every input its parser accepts or refuses with a brigade::Error (the clear
// one-line error a user sees); anything else escaping it (another exception type, a crash, a
// sanitizer report, a hang) is a finding. libFuzzer drives them through fuzz_main.cpp
// (scripts/fuzz.sh); the test command replays every file of tests/fuzz/corpus/<target>/ (seeds
// and every input that ever failed) through them (test_fuzz_corpus.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace brigade::fuzz {

// A safetensors file: the header (length, JSON, dtypes, shapes, offsets) and every tensor read.
int safetensors(const uint8_t* data, size_t size);
// A recipe: TOML text, then optionally a line "--set" and one "section.key=value" override per
// line; parsed and validated as `brigade train` does (without reading model.init_from).
int recipe(const uint8_t* data, size_t size);
// A token file (train.bin / val.bin): data::TokenDataset's header checks, the token scan and reads.
int token_file(const uint8_t* data, size_t size);
// A Fashion-MNIST IDX file (gzip'd or plain): data::read_idx_gz as labels (1 dim) and as images
// (3 dims). A bundle (see below) of "images" and "labels" loads data::FashionMnist and its batches.
int fashion_idx(const uint8_t* data, size_t size);
// A checkpoint's state.json: train::checkpoint_state, then the states it carries restored as a
// resume does (the RNG, adaptive accumulation, the loss scaler, the step guard, early stopping).
int checkpoint_state(const uint8_t* data, size_t size);
// A ZeRO checkpoint's optimizer.index.json beside two real shard files: ckpt::read_optimizer_flat.
int optimizer_index(const uint8_t* data, size_t size);
// A Hugging Face config.json: models::read_hf_config, and the model built when it is small.
int hf_config(const uint8_t* data, size_t size);
// A Hugging Face model.safetensors.index.json beside the shards of tests/fixtures/hf/llama_sharded:
// models::load_hf_weights into that LLaMA.
int hf_index(const uint8_t* data, size_t size);
// A tokenizer folder (a bundle of tokenizer.json, vocab.json, merges.txt, tokenizer_config.json,
// tokenizer.model, brigade_tokenizer.json; plain input = tokenizer.json): data::load_text_tokenizer, then encode
// and decode.
int tokenizer(const uint8_t* data, size_t size);
// A supervised fine-tuning JSONL file (data.format = "jsonl"): data::read_sft_jsonl with two toy
// tokenizers (one with a BOS prefix) and each chat template.
int sft_jsonl(const uint8_t* data, size_t size);

// The targets that read several files take a bundle: parts, each a line "@@ <name>" then its
// bytes up to the next "\n@@ " (that newline belongs to the separator). Input not starting with
// "@@ " is one part of the target's default name.
std::vector<std::pair<std::string, std::string>> split_bundle(const std::string& bytes, const std::string& name);

struct Target {
  const char* name;  // the corpus folder and the fuzz_<name> executable
  int (*run)(const uint8_t*, size_t);
};
const std::vector<Target>& targets();

}  // namespace brigade::fuzz
