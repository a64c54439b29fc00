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
#include <vector>

namespace brigade::fuzz {

// A safetensors file: the header (length, JSON, dtypes, shapes, offsets) and every tensor read.
int safetensors(const uint8_t* data, size_t size);
// A recipe: TOML text, then optionally a line "--set" and one "section.key=value" override per
// line; parsed and validated as `brigade train` does (without reading model.init_from).
int recipe(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // the corpus folder and the fuzz_<name> executable
  int (*run)(const uint8_t*, size_t);
};
const std::vector<Target>& targets();

}  // namespace brigade::fuzz
