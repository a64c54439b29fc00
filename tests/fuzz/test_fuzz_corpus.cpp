// Replays every file of tests/fuzz/corpus/<target>/ (the seed inputs and every input a fuzzer
// ever found failing, kept so it stays fixed) through its fuzz target: each must be accepted or
// refused with a brigade::Error. A target that lets another exception escape fails here; one
// that crashes ends the test binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/targets.h"

namespace fs = std::filesystem;

namespace {

class FuzzCorpus : public ::testing::TestWithParam<brigade::fuzz::Target> {};

TEST_P(FuzzCorpus, EveryInputIsAcceptedOrRefusedWithAClearError) {
  const brigade::fuzz::Target& t = GetParam();
  const fs::path dir = fs::path(BRIGADE_SOURCE_DIR) / "tests/fuzz/corpus" / t.name;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NO_THROW(t.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())) << e.path();
    ++n;
  }
  EXPECT_GT(n, 0) << "no inputs in " << dir;
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpus, ::testing::ValuesIn(brigade::fuzz::targets()),
                         [](const ::testing::TestParamInfo<brigade::fuzz::Target>& p) { return p.param.name; });

}  // namespace
