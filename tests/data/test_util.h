// Helpers for the data tests: a scratch folder per test and a small generated corpus.
// Not shared with other modules' tests.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "brigade/data/sampler.h"

namespace brigade::data::testing {

// A fresh folder under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() / ("brigade_data_" + std::string(info->test_suite_name()) + "_" +
                                                      info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `lines` pseudo-random sentences over a fixed word list (deterministic, ASCII only).
inline std::string make_corpus(int lines, uint64_t seed = 1) {
  static const char* words[] = {"the",  "lord",   "said",     "unto",   "moses",    "and",    "all",  "people",
                                "of",   "israel", "went",     "into",   "land",     "which",  "he",   "gave",
                                "them", "light",  "darkness", "waters", "earth",    "heaven", "day",  "night",
                                "king", "house",  "city",     "river",  "mountain", "bread",  "wine", "seven"};
  constexpr int kWords = sizeof(words) / sizeof(words[0]);
  std::string out;
  uint64_t s = seed;
  for (int i = 0; i < lines; ++i) {
    int n = 4 + int(splitmix64(s++) % 10);
    for (int w = 0; w < n; ++w) {
      if (w) out += ' ';
      std::string word = words[splitmix64(s++) % kWords];
      if (w == 0) word[0] = char(std::toupper(word[0]));
      out += word;
    }
    out += (i % 3 == 0) ? ", and 12 more.\n" : ".\n";
  }
  return out;
}

}  // namespace brigade::data::testing
