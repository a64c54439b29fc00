// Fashion-MNIST as the image tasks read it (image classification, contrastive): the two splits
// of data.dir (or Debian's folder), the step's global batch, epochs, the test set's evaluation
// chunks and synthetic images of the right shape. Internal to train/tasks.
//
// Training: the step's global batch (train.batch_size x accumulation x dp rows) is batch
// (s mod E) of epoch s / E of a shuffled permutation (E = training images / global batch, the
// last partial batch dropped), augmented (data.augment: crop + flip) from a generator seeded by
// (run.seed, step) over the global batch in order, so the images of a step do not depend on how
// it is split. Evaluation: the TEST split in chunks of 500, the periodic ones over its first
// eval_batches x global batch images, the final one over all.
#pragma once
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/rng.h"
#include "brigade/data/image/fashion_mnist.h"
#include "brigade/train/tasks.h"

namespace brigade::train {

class FashionMnistData {
 public:
  static constexpr int64_t kEvalChunk = 500;  // independent of the batch and split: `brigade eval` reproduces a run

  explicit FashionMnistData(const Recipe& r) : r_(r) {}
  // Opens both splits; ConfigError when the recipe's global batch is outside [min_global, images];
  // `why_min` says why the lower bound (empty for 1).
  void open(int64_t min_global, const char* why_min) {
    const std::string dir = fashion_mnist_dir(r_);
    train_.emplace(dir, data::FashionMnist::Split::Train);
    test_.emplace(dir, data::FashionMnist::Split::Test);
    BRIGADE_CHECK(global() >= min_global && global() <= train_->size(), ConfigError,
                  "recipe {}: the global batch (train.batch_size x accumulation x dp = {}) must be {} to {} (the "
                  "training images in {}){}; change train.batch_size",
                  r_.path, global(), min_global, train_->size(), dir, why_min);
  }
  int64_t global() const { return r_.train.batch_size * r_.train.accumulation * r_.parallel.dp; }
  int64_t epoch(int64_t step) const {  // of step index `step` (0-based)
    return step / std::max<int64_t>(1, (train_ ? train_->size() : 60000) / global());
  }
  std::string summary(const char* items) const {
    return fmt::format("Fashion-MNIST {} train / {} test images, {:.2f} epochs of {} {}{}", train_->size(),
                       test_->size(), double(r_.train.steps * global()) / double(train_->size()), global(), items,
                       r_.data.augment ? ", augmented" : "");
  }
  // The step's global batch of G rows, drawn once per step.
  const data::FashionMnist::Batch& global_batch(int64_t step, int64_t G) {
    if (step != cached_step_ || G != cached_rows_) {
      const data::ShuffledBatchSampler sampler(train_->size(), G, r_.run.seed, /*drop_last=*/true);
      const int64_t per_epoch = sampler.batches_per_epoch();
      Generator aug(r_.run.seed * 1000003ull + uint64_t(step) + 7);
      cached_ = train_->batch(sampler.batch(step / per_epoch, step % per_epoch), r_.data.augment ? &aug : nullptr);
      cached_step_ = step, cached_rows_ = G;
    }
    return cached_;
  }
  // The test images an evaluation covers, and test images [lo, hi).
  int64_t eval_images(bool final) const {
    return std::min(final ? test_->size() : r_.train.eval_batches * global(), test_->size());
  }
  data::FashionMnist::Batch test(int64_t lo, int64_t hi) const {
    std::vector<int64_t> idx(size_t(hi - lo));
    for (int64_t i = lo; i < hi; ++i) idx[size_t(i - lo)] = i;
    return test_->batch(idx);
  }
  // Training images at `idx`, not augmented (Flamingo's demonstration chunks), and the split's size.
  data::FashionMnist::Batch train_images(const std::vector<int64_t>& idx) const { return train_->batch(idx); }
  int64_t train_size() const { return train_ ? train_->size() : 60000; }
  data::FashionMnist::Batch test_images(const std::vector<int64_t>& idx) const { return test_->batch(idx); }
  // `rows` random images (rows, channels, side, side) in [-1, 1) and labels in [0, classes), from
  // `g` (Fashion-MNIST's shape by default).
  static Tensor synthetic_images(Generator& g, int64_t rows, std::vector<int64_t>& labels, int64_t channels = 1,
                                 int64_t side = 28, int64_t classes = 10) {
    Tensor images = Tensor::empty({rows, channels, side, side}, DType::F32);
    float* p = images.data<float>();
    for (int64_t i = 0; i < images.numel(); ++i) p[i] = float(g.uniform_double() * 2.0 - 1.0);
    labels.assign(size_t(rows), 0);
    for (auto& y : labels) y = std::min<int64_t>(int64_t(g.uniform_double() * double(classes)), classes - 1);
    return images;
  }

 private:
  Recipe r_;
  std::optional<data::FashionMnist> train_, test_;
  int64_t cached_step_ = -1, cached_rows_ = 0;
  data::FashionMnist::Batch cached_;
};

}  // namespace brigade::train
