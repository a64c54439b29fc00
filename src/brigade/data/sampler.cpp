// BatchSampler: deterministic training and evaluation windows (see sampler.h).
#include "brigade/data/sampler.h"

#include <vector>

#include "brigade/core/error.h"

namespace brigade::data {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

BatchSampler::BatchSampler(const TokenDataset& ds, int64_t B, int64_t T, uint64_t seed, int rank, int world)
    : ds_(&ds), B_(B), T_(T), seed_(seed), rank_(rank), world_(world) {
  BRIGADE_CHECK(ds.is_open(), ValueError, "BatchSampler: the token dataset is not open");
  BRIGADE_CHECK(B > 0 && T > 0, ValueError, "BatchSampler: batch size {} and sequence length {} must be positive", B,
                T);
  BRIGADE_CHECK(world > 0 && rank >= 0 && rank < world, ValueError, "BatchSampler: rank {} is not in [0, {})", rank,
                world);
  BRIGADE_CHECK(ds.size() >= T + 1, DataError,
                "token file '{}' holds {} tokens, fewer than seq_len + 1 = {}; lower train.seq_len, raise "
                "data.val_fraction or use a larger corpus, then re-run `brigade prepare`",
                ds.path(), ds.size(), T + 1);
}

int64_t BatchSampler::offset(int64_t step, int64_t row) const {
  const uint64_t range = uint64_t(ds_->size() - T_);  // offsets 0 .. N-T-1 (the target needs one more token)
  // Three rounds of mixing: seed, then step, then row, so nearby (step, row) pairs decorrelate.
  uint64_t h = splitmix64(seed_ ^ 0x6272696761646501ull);
  h = splitmix64(h ^ uint64_t(step));
  h = splitmix64(h ^ uint64_t(row));
  // Lemire's multiply-shift maps h to [0, range) with negligible bias for range << 2^64.
  return int64_t((static_cast<unsigned __int128>(h) * range) >> 64);
}

int64_t BatchSampler::eval_offset(int64_t index, int64_t num_batches, int64_t row) const {
  const int64_t last = ds_->size() - T_ - 1;
  const int64_t k = index * world_ * B_ + row;  // window number
  const int64_t K = num_batches * world_ * B_;  // windows in one full eval
  if (K <= 1) return 0;
  return int64_t((static_cast<__int128>(k) * last) / (K - 1));
}

void BatchSampler::fill(const int64_t* offsets, Tensor& x, Tensor& y) const {
  for (Tensor* t : {&x, &y}) {
    if (!t->defined()) {
      *t = Tensor::empty({B_, T_}, DType::I64);  // (B, T)
    } else {
      BRIGADE_CHECK(
          t->dtype() == DType::I64 && t->dim() == 2 && t->size(0) == B_ && t->size(1) == T_ && t->is_contiguous(),
          ShapeError, "BatchSampler: batch tensor is {}, expected a contiguous i64({}, {})", t->str(), B_, T_);
    }
  }
  int64_t* xp = x.data<int64_t>();
  int64_t* yp = y.data<int64_t>();
  std::vector<int64_t> window(static_cast<size_t>(T_ + 1));
  for (int64_t b = 0; b < B_; ++b) {
    ds_->read(offsets[b], T_ + 1, window.data());
    for (int64_t t = 0; t < T_; ++t) {
      xp[b * T_ + t] = window[size_t(t)];
      yp[b * T_ + t] = window[size_t(t + 1)];
    }
  }
}

void BatchSampler::get_batch(int64_t step, Tensor& x, Tensor& y) const {
  BRIGADE_CHECK(step >= 0, ValueError, "BatchSampler: step {} must be >= 0", step);
  std::vector<int64_t> offs(static_cast<size_t>(B_));
  for (int64_t b = 0; b < B_; ++b) offs[size_t(b)] = offset(step, int64_t(rank_) * B_ + b);
  fill(offs.data(), x, y);
}

void BatchSampler::get_eval_batch(int64_t index, int64_t num_batches, Tensor& x, Tensor& y) const {
  BRIGADE_CHECK(num_batches > 0 && index >= 0 && index < num_batches, ValueError,
                "BatchSampler: eval batch {} is not in [0, {})", index, num_batches);
  std::vector<int64_t> offs(static_cast<size_t>(B_));
  for (int64_t b = 0; b < B_; ++b) offs[size_t(b)] = eval_offset(index, num_batches, int64_t(rank_) * B_ + b);
  fill(offs.data(), x, y);
}

}  // namespace brigade::data
