// data::mask_tokens (BERT's MLM masking): exact properties on small batches with fixed seeds
// (every non-chosen label is -100, chosen labels are the originals, special ids are never
// chosen, unchosen inputs are untouched, same seed -> same batch), and the proportions on a
// large batch within 5 standard deviations of the binomial expectation: 15% of the maskable
// positions chosen; of those, [MASK] with probability 0.8 + 0.1/V (a random draw can hit it),
// the original with 0.1 + 0.1/V, another token with 0.1 (1 - 2/V).
#include <gtest/gtest.h>

#include <cmath>

#include "brigade/core/error.h"
#include "brigade/data/text/mlm.h"

using namespace brigade;

namespace {

constexpr int64_t kV = 100, kMask = 4;
const std::vector<int64_t> kSpecial = {0, 1, 2, 3, 4};  // pad, cls, sep, unk, mask

std::vector<int64_t> make_ids(int64_t n, uint64_t seed, bool with_special) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ids[size_t(i)] = 5 + int64_t((s >> 33) % uint64_t(kV - 5));
    if (with_special && i % 7 == 0) ids[size_t(i)] = i % 2 ? 0 : 2;  // pads and separators
  }
  return ids;
}

TEST(MaskTokens, SmallBatchesExact) {
  for (uint64_t seed : {1ull, 2ull, 3ull, 42ull}) {
    const std::vector<int64_t> ids = make_ids(4 * 16, seed, true);
    for (DType dt : {DType::I64, DType::I32}) {
      Generator g(seed);
      const data::MlmBatch b =
          data::mask_tokens(Tensor::from_vector_i64(ids, {4, 16}, dt), kV, kMask, kSpecial, 0.15, g);
      ASSERT_EQ(b.inputs.shape(), Shape({4, 16}));
      ASSERT_EQ(b.labels.shape(), Shape({4, 16}));
      EXPECT_EQ(b.inputs.dtype(), dt);
      EXPECT_EQ(b.labels.dtype(), dt);
      const std::vector<int64_t> in = b.inputs.to_vector_i64(), lab = b.labels.to_vector_i64();
      int chosen = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        const bool special = ids[i] < 5;
        if (special) {
          EXPECT_EQ(lab[i], -100) << "special id " << ids[i] << " chosen at " << i;
        }
        if (lab[i] == -100) {
          EXPECT_EQ(in[i], ids[i]) << "an unchosen position changed at " << i;
        } else {
          ++chosen;
          EXPECT_EQ(lab[i], ids[i]) << "label is not the original at " << i;
          EXPECT_TRUE(in[i] >= 0 && in[i] < kV);
        }
      }
      EXPECT_GT(chosen, 0) << "seed " << seed;
      // deterministic: the same seed gives the same batch
      Generator g2(seed);
      const data::MlmBatch c =
          data::mask_tokens(Tensor::from_vector_i64(ids, {4, 16}, dt), kV, kMask, kSpecial, 0.15, g2);
      EXPECT_EQ(c.inputs.to_vector_i64(), in);
      EXPECT_EQ(c.labels.to_vector_i64(), lab);
    }
  }
  // probability 0 chooses nothing; 1 chooses every maskable position
  const std::vector<int64_t> ids = make_ids(40, 9, true);
  Generator g(5);
  const data::MlmBatch none = data::mask_tokens(Tensor::from_vector_i64(ids, {40}), kV, kMask, kSpecial, 0.0, g);
  for (int64_t l : none.labels.to_vector_i64()) EXPECT_EQ(l, -100);
  EXPECT_EQ(none.inputs.to_vector_i64(), ids);
  const data::MlmBatch all = data::mask_tokens(Tensor::from_vector_i64(ids, {40}), kV, kMask, kSpecial, 1.0, g);
  const std::vector<int64_t> lab = all.labels.to_vector_i64();
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(lab[i], ids[i] < 5 ? -100 : ids[i]);
}

TEST(MaskTokens, ProportionsOnALargeBatch) {
  const int64_t B = 64, T = 512;
  const std::vector<int64_t> ids = make_ids(B * T, 123, true);
  Generator g(2024);
  const data::MlmBatch b = data::mask_tokens(Tensor::from_vector_i64(ids, {B, T}), kV, kMask, kSpecial, 0.15, g);
  const std::vector<int64_t> in = b.inputs.to_vector_i64(), lab = b.labels.to_vector_i64();
  int64_t maskable = 0, chosen = 0, masked = 0, kept = 0, other = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 5) ++maskable;
    if (lab[i] == -100) continue;
    ++chosen;
    if (in[i] == kMask)
      ++masked;
    else if (in[i] == ids[i])
      ++kept;
    else
      ++other;
  }
  // |count - n p| <= 5 sqrt(n p (1 - p)) for a Binomial(n, p) count
  auto within = [](int64_t count, int64_t n, double p, const char* what) {
    const double mean = double(n) * p, sd = std::sqrt(double(n) * p * (1 - p));
    EXPECT_LE(std::abs(double(count) - mean), 5 * sd)
        << what << ": " << count << " of " << n << ", expected " << mean << " +- " << sd;
  };
  within(chosen, maskable, 0.15, "chosen");
  const double V = double(kV);
  within(masked, chosen, 0.8 + 0.1 / V, "[MASK]");
  within(kept, chosen, 0.1 + 0.1 / V, "unchanged");
  within(other, chosen, 0.1 * (1 - 2 / V), "random token");
  EXPECT_GT(maskable, 25000);
}

TEST(MaskTokens, BadArgumentsAreClearErrors) {
  Generator g(1);
  const Tensor ids = Tensor::from_vector_i64({5, 6, 7}, {3});
  EXPECT_THROW(data::mask_tokens(Tensor::zeros({3}), kV, kMask, kSpecial, 0.15, g), ShapeError);
  EXPECT_THROW(data::mask_tokens(ids, kV, kV, kSpecial, 0.15, g), ValueError);
  EXPECT_THROW(data::mask_tokens(ids, kV, kMask, kSpecial, 1.5, g), ValueError);
  try {
    data::mask_tokens(Tensor::from_vector_i64({5, 100, 7}, {3}), kV, kMask, kSpecial, 0.15, g);
    ADD_FAILURE() << "no error for an id outside the vocabulary";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("id 100"), std::string::npos) << e.what();
  }
}

}  // namespace
