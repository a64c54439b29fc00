// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017): 28x28 grey images of 10 clothing classes,
// 60000 train / 10000 test, in LeCun's IDX format, gzip'd. Debian's dataset-fashion-mnist
// installs them under /usr/share/datasets/fashion-mnist as {train,t10k}-{images-idx3,
// labels-idx1}-ubyte.gz.
// IDX: a big-endian u32 magic 0x0000TTNN (TT = 0x08 unsigned bytes, NN = number of dims),
// NN big-endian u32 dims, then the bytes in row-major order. read_idx_gz reads one through
// zlib's gzread (plain, uncompressed files are read too) and validates magic, dims, length
// and trailing bytes; every problem is a DataError naming the file.
// Batches: images f32 (B, 1, 28, 28) normalised (x / 255 - 0.2860) / 0.3530 (the train
// set's mean and std), labels i64 (B). Augmentation (optional, per image, drawn from a
// seeded Generator in batch order: crop offsets then the flip): a random 28x28 crop of the
// image zero-padded by 2 pixels (raw value 0, normalised like any pixel, as torchvision's
// RandomCrop(28, padding=2) before Normalize) and a horizontal flip with probability 1/2.
// Shuffling: ShuffledBatchSampler's order is a pure function of (seed, epoch), so a resumed
// run needs only the epoch and the batch index.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/core/tensor.h"

namespace brigade::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr double kFashionMnistMean = 0.2860, kFashionMnistStd = 0.3530;
inline constexpr int64_t kFashionMnistSide = 28;
// "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot".
const std::array<std::string, 10>& fashion_mnist_classes();

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // prod(dims) bytes, row-major
};
// Reads a (gzip'd) IDX file of unsigned bytes with `expect_ndim` dims.
IdxArray read_idx_gz(const std::string& path, int expect_ndim);

class FashionMnist {
 public:
  enum class Split { Train, Test };
  // The split's two files under `dir` (train-* or t10k-*).
  FashionMnist(const std::string& dir, Split split);
  // Explicit files: images (N, 28, 28) idx3, labels (N) idx1 with values 0..9.
  FashionMnist(const std::string& images_path, const std::string& labels_path);

  int64_t size() const { return n_; }
  int64_t label(int64_t i) const;          // 0..9
  const uint8_t* pixels(int64_t i) const;  // 28 * 28 raw bytes of image i

  struct Batch {
    Tensor images;  // (B, 1, 28, 28) f32, normalised
    Tensor labels;  // (B) i64
  };
  // The images at `indices`; augmented (random crop + flip, see above) when `augment` is
  // given. ValueError for an index outside [0, size()).
  Batch batch(const std::vector<int64_t>& indices, Generator* augment = nullptr) const;

 private:
  void load(const std::string& images_path, const std::string& labels_path);
  int64_t n_ = 0;
  std::vector<uint8_t> images_, labels_;
};

// Mini-batches of a shuffled permutation of [0, n), a new permutation each epoch
// (Fisher-Yates driven by splitmix64 of (seed, epoch, i)); the last partial batch is
// dropped when drop_last, else it is shorter.
class ShuffledBatchSampler {
 public:
  ShuffledBatchSampler(int64_t n, int64_t batch_size, uint64_t seed, bool drop_last = true);
  int64_t batches_per_epoch() const;
  std::vector<int64_t> permutation(int64_t epoch) const;
  std::vector<int64_t> batch(int64_t epoch, int64_t index) const;  // ValueError when index is out of range

 private:
  int64_t n_, batch_size_;
  uint64_t seed_;
  bool drop_last_;
};

}  // namespace brigade::data
