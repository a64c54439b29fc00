// Guards against a code-generation bug of the toolchain this project is built
// with: GCC 12.2 with -march=native on AVX-512 machines turned constant vectors
// such as {1, 1, 0, 0} (int64 or double, built by the SLP vectorizer) into a
// broadcast {1, 1, 1, 1}. The top-level CMakeLists.txt disables SLP vectorization
// for GCC < 13; these cases fail without that flag on an AVX-512 machine.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace {

__attribute__((noinline)) std::vector<int64_t> int64_from_array() {
  int64_t a[4] = {1, 1, 0, 0};
  return std::vector<int64_t>(a, a + 4);
}
__attribute__((noinline)) std::vector<int64_t> int64_list() { return {2, 2, 0, 0, 0, 0, 0, 0}; }
__attribute__((noinline)) std::vector<double> double_list() { return {1.0, 1.0, 0.0, 0.0}; }
__attribute__((noinline)) std::vector<int32_t> int32_list() { return {1, 1, 0, 0, 1, 1, 0, 0}; }

}  // namespace

TEST(Toolchain, ConstantVectorsAreNotBroadcast) {
  EXPECT_EQ(int64_from_array(), (std::vector<int64_t>{1, 1, 0, 0}));
  const std::vector<int64_t> b = int64_list();
  ASSERT_EQ(b.size(), 8u);
  EXPECT_EQ(b[0], 2);
  EXPECT_EQ(b[1], 2);
  for (size_t i = 2; i < b.size(); ++i) EXPECT_EQ(b[i], 0) << "element " << i;
  const std::vector<double> d = double_list();
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[2], 0.0);
  EXPECT_EQ(d[3], 0.0);
  const std::vector<int32_t> e = int32_list();
  EXPECT_EQ(e[2], 0);
  EXPECT_EQ(e[7], 0);
}
