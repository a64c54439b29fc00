// BatchSampler: (x, y) batches of token windows from a TokenDataset, y = x shifted
// by one. Training batches are pseudo-random windows whose offsets depend only on
// (seed, step, row), so resuming at step s replays exactly the batches of an
// uninterrupted run, and data-parallel ranks draw disjoint rows of one global
// batch (rank r of W takes rows [r*B, (r+1)*B) of a W*B-row batch, so the tokens
// per step equal a single-process run with batch W*B). Evaluation batches are
// evenly spaced windows, the same at every eval. Uses its own splitmix64, not
// core/rng (the torch-compatible generator), so model init never shifts the data.
#pragma once
#include <cstdint>

#include "brigade/core/tensor.h"
#include "brigade/data/text/token_file.h"

namespace brigade::data {

// splitmix64 (Steele, Lea, Flood 2014): a stateless mix of a 64-bit counter.
uint64_t splitmix64(uint64_t x);

class BatchSampler {
 public:
  // B rows of T tokens per rank. The dataset must outlive the sampler and hold at
  // least T + 1 tokens (DataError naming the file and what to lower otherwise).
  BatchSampler(const TokenDataset& ds, int64_t B, int64_t T, uint64_t seed, int rank = 0, int world = 1);

  int64_t batch_size() const { return B_; }
  int64_t seq_len() const { return T_; }

  // Training batch for `step`: row b starts at offset(step, rank*B + b), a uniform
  // draw from [0, N - T - 1] (N = tokens). x[b, t] = tok[o + t], y[b, t] = tok[o + t + 1].
  // x and y: if undefined they are allocated as (B, T) I64; otherwise they must be
  // contiguous (B, T) I64 tensors (ShapeError) and are filled in place.
  void get_batch(int64_t step, Tensor& x, Tensor& y) const;
  // The window start used for global row `row` at `step` (exposed for tests/tools).
  int64_t offset(int64_t step, int64_t row) const;

  // Evaluation batch `index` of `num_batches`: the num_batches*W*B windows are spread
  // evenly over [0, N - T - 1] (first at 0, last at N - T - 1), row-major by
  // (index, rank, b). Independent of the seed; identical at every eval.
  void get_eval_batch(int64_t index, int64_t num_batches, Tensor& x, Tensor& y) const;
  int64_t eval_offset(int64_t index, int64_t num_batches, int64_t row) const;

 private:
  void fill(const int64_t* offsets, Tensor& x, Tensor& y) const;
  const TokenDataset* ds_;
  int64_t B_, T_;
  uint64_t seed_;
  int rank_, world_;
};

}  // namespace brigade::data
