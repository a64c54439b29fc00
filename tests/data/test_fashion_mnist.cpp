// Fashion-MNIST reader (src/brigade/data/image/fashion_mnist.h): tiny synthetic gzip'd IDX
// files written here (exact values and normalisation, bad magic, truncation, trailing bytes,
// mismatched counts, labels out of range), augmentation (crop offsets and flips against a
// hand computation, determinism from the seed), the shuffled sampler (a permutation per
// epoch, a pure function of (seed, epoch)), and, when Debian's dataset-fashion-mnist is
// installed (skipped otherwise), the real files: 60000 / 10000 items, 6000 train images per
// class, the first labels (read once with python's gzip module).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/data/image/fashion_mnist.h"

using namespace brigade;
namespace fs = std::filesystem;

namespace {

class FashionMnistFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("brigade_fmnist_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A gzip'd file: big-endian u32 words, then raw bytes.
  std::string write(const std::string& name, const std::vector<uint32_t>& words, const std::vector<uint8_t>& bytes) {
    const std::string p = (dir_ / name).string();
    gzFile f = gzopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    for (uint32_t w : words) {
      const unsigned char b[4] = {uint8_t(w >> 24), uint8_t(w >> 16), uint8_t(w >> 8), uint8_t(w)};
      gzwrite(f, b, 4);
    }
    if (!bytes.empty()) gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
    return p;
  }
  // n images whose pixel (y, x) of image k is (k * 7 + y * 3 + x) % 256; labels k % 10.
  std::vector<uint8_t> pixels(int n) const {
    std::vector<uint8_t> v(size_t(n) * 784);
    for (int k = 0; k < n; ++k)
      for (int y = 0; y < 28; ++y)
        for (int x = 0; x < 28; ++x) v[size_t(k * 784 + y * 28 + x)] = uint8_t((k * 7 + y * 3 + x) % 256);
    return v;
  }
  std::pair<std::string, std::string> good(int n) {
    std::vector<uint8_t> lab(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) lab[size_t(k)] = uint8_t(k % 10);
    return {write("im.gz", {0x803, uint32_t(n), 28, 28}, pixels(n)), write("lb.gz", {0x801, uint32_t(n)}, lab)};
  }
  fs::path dir_;
};

// the reader's formula, (x / 255 - mean) / std as one fma of float constants (one rounding)
float norm(int v) { return std::fma(float(v), float(1.0 / (255.0 * 0.3530)), -float(0.2860 / 0.3530)); }

template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(FashionMnistFiles, ReadsExactValuesNormalised) {
  auto [im, lb] = good(3);
  data::FashionMnist ds(im, lb);
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.label(2), 2);
  const auto b = ds.batch({2, 0});
  ASSERT_EQ(b.images.shape(), Shape({2, 1, 28, 28}));
  ASSERT_EQ(b.labels.dtype(), DType::I64);
  EXPECT_EQ(b.labels.to_vector_i64(), (std::vector<int64_t>{2, 0}));
  const std::vector<float> v = b.images.to_vector();
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x) {
      EXPECT_EQ(v[size_t(y * 28 + x)], norm((14 + y * 3 + x) % 256));
      EXPECT_EQ(v[size_t(784 + y * 28 + x)], norm((y * 3 + x) % 256));
    }
  EXPECT_NEAR(norm(0), -0.2860 / 0.3530, 1e-6);
  EXPECT_NEAR(norm(255), (1 - 0.2860) / 0.3530, 1e-6);
  EXPECT_EQ(data::fashion_mnist_classes()[0], "T-shirt/top");
  EXPECT_EQ(data::fashion_mnist_classes()[9], "Ankle boot");
  expect_error<ValueError>([&] { ds.batch({3}); }, {"index 3"});
}

// Dims whose product overflows int64 (three u32 dims) or that promise far more than the file
// holds are DataErrors before any memory for them is taken: the product is checked before each
// multiplication, and the data is read in chunks (found writing its fuzz target: a 28-byte
// file could make the reader multiply past int64 or allocate 2^36 bytes).
TEST_F(FashionMnistFiles, HugeOrOverflowingDimsAreDataErrorsWithoutAllocatingThem) {
  const std::string huge = write("huge.gz", {0x803, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {});
  expect_error<DataError>([&] { data::read_idx_gz(huge, 3); }, {"huge.gz", "announce more than 2^36 bytes"});
  // 2^11 x 2^12 x 2^12 = 32 GiB announced, 100 bytes present
  const std::string big = write("big.gz", {0x803, 1u << 11, 1u << 12, 1u << 12}, std::vector<uint8_t>(100, 7));
  expect_error<DataError>([&] { data::read_idx_gz(big, 3); }, {"big.gz", "truncated", "34359738368 bytes"});
  // more than one 64 MiB chunk, all present: read whole
  const std::string chunks = write("chunks.gz", {0x801, (64u << 20) + 3}, std::vector<uint8_t>((64u << 20) + 3, 5));
  const data::IdxArray a = data::read_idx_gz(chunks, 1);
  ASSERT_EQ(a.data.size(), (size_t(64) << 20) + 3);
  EXPECT_EQ(a.data.back(), 5);
}

TEST_F(FashionMnistFiles, BadMagicTruncationAndMismatchesAreDataErrorsNamingTheFile) {
  auto [im, lb] = good(2);
  const std::string bad = write("bad.gz", {0x802, 2, 28, 28}, pixels(2));
  expect_error<DataError>([&] { data::FashionMnist(bad, lb); }, {"bad.gz", "magic"});
  const std::string badtype = write("badtype.gz", {0x0D03, 2, 28, 28}, pixels(2));  // 0x0D: float
  expect_error<DataError>([&] { data::FashionMnist(badtype, lb); }, {"badtype.gz", "magic"});
  std::vector<uint8_t> short_px = pixels(2);
  short_px.resize(784 + 100);
  const std::string trunc = write("trunc.gz", {0x803, 2, 28, 28}, short_px);
  expect_error<DataError>([&] { data::FashionMnist(trunc, lb); }, {"trunc.gz", "truncated"});
  const std::string hdr = write("hdr.gz", {0x803, 2}, {});
  expect_error<DataError>([&] { data::FashionMnist(hdr, lb); }, {"hdr.gz", "truncated"});
  std::vector<uint8_t> long_px = pixels(2);
  long_px.push_back(1);
  const std::string trail = write("trail.gz", {0x803, 2, 28, 28}, long_px);
  expect_error<DataError>([&] { data::FashionMnist(trail, lb); }, {"trail.gz", "trailing"});
  const std::string lb3 = write("lb3.gz", {0x801, 3}, {0, 1, 2});
  expect_error<DataError>([&] { data::FashionMnist(im, lb3); }, {"lb3.gz", "labels"});
  const std::string lbbad = write("lbbad.gz", {0x801, 2}, {0, 10});
  expect_error<DataError>([&] { data::FashionMnist(im, lbbad); }, {"lbbad.gz", "label 10"});
  expect_error<DataError>([&] { data::FashionMnist((dir_ / "missing.gz").string(), lb); },
                          {"missing.gz", "dataset-fashion-mnist"});
}

TEST_F(FashionMnistFiles, AugmentationIsASeededCropAndFlip) {
  auto [im, lb] = good(4);
  data::FashionMnist ds(im, lb);
  const std::vector<int64_t> idx{0, 1, 2, 3};
  Generator g1(5), g2(5);
  const auto a = ds.batch(idx, &g1), b = ds.batch(idx, &g2);
  EXPECT_EQ(a.images.to_vector(), b.images.to_vector());  // same seed, same batch
  // Recompute the draws: per image dy, dx in [0, 4] then a flip bit.
  Generator g3(5);
  const std::vector<float> v = a.images.to_vector();
  std::set<std::pair<int, int>> offsets;
  int flips = 0;
  for (int k = 0; k < 4; ++k) {
    const int dy = int(g3.random() % 5), dx = int(g3.random() % 5);
    const bool flip = (g3.random() & 1u) != 0;
    offsets.insert({dy, dx});
    flips += flip;
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x) {
        const int sy = y + dy - 2, sx = (flip ? 27 - x : x) + dx - 2;
        const int raw = (sy >= 0 && sy < 28 && sx >= 0 && sx < 28) ? (k * 7 + sy * 3 + sx) % 256 : 0;
        ASSERT_EQ(v[size_t(k * 784 + y * 28 + x)], norm(raw)) << k << " " << y << " " << x;
      }
  }
  EXPECT_GT(offsets.size(), 1u);  // the draws vary
  Generator g4(6);
  EXPECT_NE(ds.batch(idx, &g4).images.to_vector(), v);
  EXPECT_EQ(a.labels.to_vector_i64(), (std::vector<int64_t>{0, 1, 2, 3}));  // labels untouched
}

TEST(ShuffledBatchSampler, PermutationPerEpochFromSeedAndEpochOnly) {
  data::ShuffledBatchSampler s(103, 10, 42);
  EXPECT_EQ(s.batches_per_epoch(), 10);
  const auto p0 = s.permutation(0), p1 = s.permutation(1);
  std::vector<int64_t> sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(sorted[size_t(i)], i);
  EXPECT_NE(p0, p1);
  EXPECT_EQ(data::ShuffledBatchSampler(103, 10, 42).permutation(1), p1);  // resume = same order
  EXPECT_NE(data::ShuffledBatchSampler(103, 10, 43).permutation(0), p0);
  std::set<int64_t> seen;
  for (int64_t b = 0; b < s.batches_per_epoch(); ++b) {
    const auto ids = s.batch(0, b);
    EXPECT_EQ(ids.size(), 10u);
    for (int64_t i : ids) EXPECT_TRUE(seen.insert(i).second);
    EXPECT_EQ(ids, std::vector<int64_t>(p0.begin() + b * 10, p0.begin() + b * 10 + 10));
  }
  EXPECT_EQ(data::ShuffledBatchSampler(103, 10, 42, false).batches_per_epoch(), 11);
  EXPECT_EQ(data::ShuffledBatchSampler(103, 10, 42, false).batch(0, 10).size(), 3u);
  EXPECT_THROW(s.batch(0, 10), ValueError);
  EXPECT_THROW(data::ShuffledBatchSampler(5, 10, 1), ConfigError);
}

TEST(FashionMnistReal, CountsHistogramAndFirstLabels) {
  const std::string dir = data::kFashionMnistDir;
  if (!fs::exists(dir + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "Debian package dataset-fashion-mnist is not installed";
  data::FashionMnist train(dir, data::FashionMnist::Split::Train), test(dir, data::FashionMnist::Split::Test);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  std::vector<int64_t> hist(10, 0);
  for (int64_t i = 0; i < train.size(); ++i) ++hist[size_t(train.label(i))];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(hist[size_t(c)], 6000) << data::fashion_mnist_classes()[size_t(c)];
  const std::vector<int64_t> want_train{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, want_test{9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(train.label(i), want_train[size_t(i)]) << i;
    EXPECT_EQ(test.label(i), want_test[size_t(i)]) << i;
  }
  int sum = 0;  // pixel sum of the first training image, also read with python
  for (int i = 0; i < 784; ++i) sum += train.pixels(0)[i];
  EXPECT_EQ(sum, 76247);
}

}  // namespace
