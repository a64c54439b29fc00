// BatchSampler: determinism in (seed, step), y = x shifted by one, resume, ranks,
// evaluation windows, and the errors for small datasets and wrong tensors.
#include <gtest/gtest.h>

#include <set>

#include "brigade/core/error.h"
#include "brigade/data/sampler.h"
#include "test_util.h"

namespace brigade::data {
namespace {
using testing::TempDir;

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<int32_t> toks(5000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(splitmix64(i) % 1000);
    tokens_ = toks;
    write_token_file(dir_.file("t.bin"), toks, 1000);
    ds_ = TokenDataset(dir_.file("t.bin"));
  }
  TempDir dir_;
  std::vector<int32_t> tokens_;
  TokenDataset ds_;
};

TEST_F(SamplerTest, SameSeedAndStepGiveSameBatch) {
  BatchSampler a(ds_, 4, 16, 42), b(ds_, 4, 16, 42), c(ds_, 4, 16, 43);
  Tensor x1, y1, x2, y2, x3, y3;
  a.get_batch(7, x1, y1);
  b.get_batch(7, x2, y2);
  EXPECT_EQ(x1.shape(), (Shape{4, 16}));
  EXPECT_EQ(x1.dtype(), DType::I64);
  EXPECT_EQ(x1.to_vector_i64(), x2.to_vector_i64());
  EXPECT_EQ(y1.to_vector_i64(), y2.to_vector_i64());
  b.get_batch(8, x2, y2);  // reuses the tensors
  EXPECT_NE(x1.to_vector_i64(), x2.to_vector_i64());
  c.get_batch(7, x3, y3);
  EXPECT_NE(x1.to_vector_i64(), x3.to_vector_i64());
}

TEST_F(SamplerTest, TargetsAreInputsShiftedByOne) {
  BatchSampler s(ds_, 3, 10, 1);
  Tensor x, y;
  for (int64_t step : {0, 1, 1000}) {
    s.get_batch(step, x, y);
    auto xv = x.to_vector_i64(), yv = y.to_vector_i64();
    for (int64_t b = 0; b < 3; ++b) {
      int64_t o = s.offset(step, b);
      ASSERT_GE(o, 0);
      ASSERT_LE(o + 10, ds_.size() - 1);
      for (int64_t t = 0; t < 10; ++t) {
        EXPECT_EQ(xv[size_t(b * 10 + t)], tokens_[size_t(o + t)]);
        EXPECT_EQ(yv[size_t(b * 10 + t)], tokens_[size_t(o + t + 1)]);
      }
    }
  }
}

TEST_F(SamplerTest, ResumeReplaysTheSameBatches) {
  BatchSampler run(ds_, 2, 8, 5);
  std::vector<std::vector<int64_t>> seen;
  Tensor x, y;
  for (int64_t step = 0; step < 10; ++step) {
    run.get_batch(step, x, y);
    seen.push_back(x.to_vector_i64());
  }
  BatchSampler resumed(ds_, 2, 8, 5);  // a fresh process resuming at step 6
  for (int64_t step = 6; step < 10; ++step) {
    Tensor xr, yr;
    resumed.get_batch(step, xr, yr);
    EXPECT_EQ(xr.to_vector_i64(), seen[size_t(step)]);
  }
}

TEST_F(SamplerTest, OffsetsCoverTheDataset) {
  BatchSampler s(ds_, 8, 32, 9);
  std::set<int64_t> offs;
  int64_t lo = ds_.size(), hi = 0;
  for (int64_t step = 0; step < 500; ++step)
    for (int64_t b = 0; b < 8; ++b) {
      int64_t o = s.offset(step, b);
      offs.insert(o);
      lo = std::min(lo, o);
      hi = std::max(hi, o);
    }
  // 4000 uniform draws from 4968 values: expect 4968 * (1 - e^(-4000/4968)) ~= 2747 distinct.
  EXPECT_GT(offs.size(), 2650u);
  EXPECT_LT(offs.size(), 2850u);
  EXPECT_LT(lo, 50);
  EXPECT_GT(hi, ds_.size() - 32 - 50);
  EXPECT_LE(hi, ds_.size() - 33);
}

TEST_F(SamplerTest, RanksSplitOneGlobalBatch) {
  BatchSampler whole(ds_, 4, 8, 3);
  BatchSampler r0(ds_, 2, 8, 3, 0, 2), r1(ds_, 2, 8, 3, 1, 2);
  Tensor xw, yw, x0, y0, x1, y1;
  whole.get_batch(11, xw, yw);
  r0.get_batch(11, x0, y0);
  r1.get_batch(11, x1, y1);
  auto w = xw.to_vector_i64(), a = x0.to_vector_i64(), b = x1.to_vector_i64();
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(a, w);
}

TEST_F(SamplerTest, EvalBatchesAreFixedAndSpanTheData) {
  BatchSampler s(ds_, 4, 16, 1), other_seed(ds_, 4, 16, 999);
  Tensor x1, y1, x2, y2;
  s.get_eval_batch(2, 5, x1, y1);
  other_seed.get_eval_batch(2, 5, x2, y2);
  EXPECT_EQ(x1.to_vector_i64(), x2.to_vector_i64());
  EXPECT_EQ(s.eval_offset(0, 5, 0), 0);
  EXPECT_EQ(s.eval_offset(4, 5, 3), ds_.size() - 17);
  for (int64_t i = 0; i + 1 < 20; ++i) EXPECT_LT(s.eval_offset(0, 5, i), s.eval_offset(0, 5, i + 1));
  auto yv = y1.to_vector_i64();
  int64_t o = s.eval_offset(2, 5, 1);
  EXPECT_EQ(yv[16 + 15], tokens_[size_t(o + 16)]);
  EXPECT_THROW(s.get_eval_batch(5, 5, x1, y1), ValueError);
}

TEST_F(SamplerTest, Errors) {
  Tensor x = Tensor::zeros({4, 15}, DType::I64), y;
  BatchSampler s(ds_, 4, 16, 1);
  EXPECT_THROW(s.get_batch(0, x, y), ShapeError);
  Tensor xf = Tensor::zeros({4, 16}, DType::F32);
  EXPECT_THROW(s.get_batch(0, xf, y), ShapeError);
  EXPECT_THROW(s.get_batch(-1, x, y), ValueError);
  try {
    BatchSampler big(ds_, 1, 5000, 1);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("t.bin"), std::string::npos) << m;
    EXPECT_NE(m.find("seq_len"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(BatchSampler(ds_, 1, 4999, 1));
  EXPECT_THROW(BatchSampler(ds_, 1, 8, 1, 2, 2), ValueError);
}

}  // namespace
}  // namespace brigade::data
