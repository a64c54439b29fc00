// Fashion-MNIST reader, augmentation and shuffled sampler; see image/fashion_mnist.h.
#include "brigade/data/image/fashion_mnist.h"

#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "brigade/core/error.h"
#include "brigade/data/sampler.h"

namespace brigade::data {

const std::array<std::string, 10>& fashion_mnist_classes() {
  static const std::array<std::string, 10> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// Reads up to n bytes (fewer only at the end of the file); a DataError naming the file and what was
// being read when zlib fails.
size_t read_upto(gzFile f, void* dst, size_t n, const std::string& path, const char* what) {
  size_t got = 0;
  while (got < n) {
    const unsigned chunk = unsigned(std::min<size_t>(n - got, size_t(1) << 30));
    const int r = gzread(f, static_cast<char*>(dst) + got, chunk);
    if (r < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      throw DataError(fmt::format("{}: cannot read the {} ({}); the file is corrupt, re-install it", path, what,
                                  msg ? msg : "zlib error"));
    }
    if (r == 0) break;
    got += size_t(r);
  }
  return got;
}

// Reads exactly n bytes or throws a DataError naming the file and what was being read.
void read_exact(gzFile f, void* dst, size_t n, const std::string& path, const char* what) {
  const size_t got = read_upto(f, dst, n, path, what);
  BRIGADE_CHECK(got == n, DataError, "{}: truncated: the {} needs {} bytes but only {} remain; re-download the file",
                path, what, n, got);
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

IdxArray read_idx_gz(const std::string& path, int expect_ndim) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  BRIGADE_CHECK(f != nullptr, DataError,
                "{}: cannot open the IDX file (missing? for Fashion-MNIST install the "
                "Debian package dataset-fashion-mnist)",
                path);
  unsigned char hdr[4];
  read_exact(f.get(), hdr, 4, path, "IDX magic");
  const uint32_t magic = be32(hdr);
  BRIGADE_CHECK(hdr[0] == 0 && hdr[1] == 0 && hdr[2] == 0x08 && hdr[3] == expect_ndim, DataError,
                "{}: bad IDX magic 0x{:08x}; expected 0x{:08x} (unsigned bytes, {} dims): not the IDX file expected "
                "here",
                path, magic, 0x0800u + unsigned(expect_ndim), expect_ndim);
  IdxArray a;
  constexpr int64_t kMaxBytes = int64_t(1) << 36;
  int64_t total = 1;
  for (int d = 0; d < expect_ndim; ++d) {
    unsigned char b[4];
    read_exact(f.get(), b, 4, path, "IDX dims");
    const int64_t dim = int64_t(be32(b));
    a.dims.push_back(dim);
    // checked before multiplying (the product of three u32 dims overflows int64)
    BRIGADE_CHECK(dim == 0 || total <= kMaxBytes / dim, DataError,
                  "{}: IDX dims {} announce more than 2^36 bytes; the file is not a valid IDX file, re-download it",
                  path, fmt::join(a.dims, " x "));
    total *= dim;
  }
  // Read in chunks, the buffer growing with the bytes that arrive: dims that promise more than the
  // file holds are refused as truncated before memory for them is taken.
  constexpr size_t kChunk = size_t(64) << 20;
  size_t got = 0;
  while (got < size_t(total)) {
    const size_t want = std::min(kChunk, size_t(total) - got);
    a.data.resize(got + want);
    const size_t n = read_upto(f.get(), a.data.data() + got, want, path, "IDX data");
    got += n;
    BRIGADE_CHECK(n == want, DataError,
                  "{}: truncated: the IDX dims {} need {} bytes of data but only {} remain; re-download the file", path,
                  fmt::join(a.dims, " x "), total, got);
  }
  char extra;
  BRIGADE_CHECK(gzread(f.get(), &extra, 1) == 0, DataError,
                "{}: trailing bytes after the {} bytes the IDX dims announce; the file is not a valid IDX file", path,
                total);
  return a;
}

FashionMnist::FashionMnist(const std::string& dir, Split split) {
  const std::string p = split == Split::Train ? "train" : "t10k";
  load(dir + "/" + p + "-images-idx3-ubyte.gz", dir + "/" + p + "-labels-idx1-ubyte.gz");
}

FashionMnist::FashionMnist(const std::string& images_path, const std::string& labels_path) {
  load(images_path, labels_path);
}

void FashionMnist::load(const std::string& images_path, const std::string& labels_path) {
  IdxArray im = read_idx_gz(images_path, 3);
  IdxArray lb = read_idx_gz(labels_path, 1);
  BRIGADE_CHECK(im.dims[1] == kFashionMnistSide && im.dims[2] == kFashionMnistSide, DataError,
                "{}: images are {}x{}, expected 28x28", images_path, im.dims[1], im.dims[2]);
  BRIGADE_CHECK(im.dims[0] == lb.dims[0], DataError, "{} holds {} images but {} holds {} labels; use matching files",
                images_path, im.dims[0], labels_path, lb.dims[0]);
  for (size_t i = 0; i < lb.data.size(); ++i)
    BRIGADE_CHECK(lb.data[i] < 10, DataError, "{}: label {} of item {} is not a class 0..9", labels_path,
                  int(lb.data[i]), i);
  n_ = im.dims[0];
  images_ = std::move(im.data);
  labels_ = std::move(lb.data);
}

int64_t FashionMnist::label(int64_t i) const {
  BRIGADE_CHECK(i >= 0 && i < n_, ValueError, "FashionMnist: index {} outside [0, {})", i, n_);
  return labels_[size_t(i)];
}

const uint8_t* FashionMnist::pixels(int64_t i) const {
  BRIGADE_CHECK(i >= 0 && i < n_, ValueError, "FashionMnist: index {} outside [0, {})", i, n_);
  return images_.data() + size_t(i) * size_t(kFashionMnistSide * kFashionMnistSide);
}

FashionMnist::Batch FashionMnist::batch(const std::vector<int64_t>& indices, Generator* augment) const {
  const int64_t B = int64_t(indices.size()), S = kFashionMnistSide, pad = 2;
  Batch b;
  b.images = Tensor::empty({B, 1, S, S});     // (B, 1, 28, 28)
  b.labels = Tensor::empty({B}, DType::I64);  // (B)
  float* out = b.images.data<float>();
  int64_t* lab = b.labels.data<int64_t>();
  const float scale = float(1.0 / (255.0 * kFashionMnistStd)), shift = float(kFashionMnistMean / kFashionMnistStd);
  for (int64_t k = 0; k < B; ++k) {
    const uint8_t* src = pixels(indices[size_t(k)]);
    lab[k] = labels_[size_t(indices[size_t(k)])];
    int64_t dy = pad, dx = pad;  // crop offset inside the padded (32, 32) image; pad = no shift
    bool flip = false;
    if (augment) {
      dy = int64_t(augment->random() % uint32_t(2 * pad + 1));
      dx = int64_t(augment->random() % uint32_t(2 * pad + 1));
      flip = (augment->random() & 1u) != 0;
    }
    float* dst = out + k * S * S;
    for (int64_t y = 0; y < S; ++y)
      for (int64_t x = 0; x < S; ++x) {
        // crop (offset dy, dx in the padded image), then mirror the cropped window
        const int64_t sy = y + dy - pad, cx = (flip ? S - 1 - x : x) + dx - pad;
        const uint8_t v = (sy >= 0 && sy < S && cx >= 0 && cx < S) ? src[sy * S + cx] : 0;
        // one rounding (an explicit fma), so the value does not depend on whether the compiler
        // contracts a * b - c for this build's flags
        dst[y * S + x] = std::fma(float(v), scale, -shift);
      }
  }
  return b;
}

ShuffledBatchSampler::ShuffledBatchSampler(int64_t n, int64_t batch_size, uint64_t seed, bool drop_last)
    : n_(n), batch_size_(batch_size), seed_(seed), drop_last_(drop_last) {
  BRIGADE_CHECK(n >= 1 && batch_size >= 1, ConfigError,
                "ShuffledBatchSampler: need n >= 1 items and batch_size >= 1, got n {} batch_size {}", n, batch_size);
  BRIGADE_CHECK(!drop_last || batch_size <= n, ConfigError,
                "ShuffledBatchSampler: batch_size {} exceeds the {} items and drop_last leaves no batch", batch_size,
                n);
}

int64_t ShuffledBatchSampler::batches_per_epoch() const {
  return drop_last_ ? n_ / batch_size_ : (n_ + batch_size_ - 1) / batch_size_;
}

std::vector<int64_t> ShuffledBatchSampler::permutation(int64_t epoch) const {
  std::vector<int64_t> p(static_cast<size_t>(n_));
  for (int64_t i = 0; i < n_; ++i) p[size_t(i)] = i;
  const uint64_t key = splitmix64(seed_ ^ splitmix64(uint64_t(epoch) * 0x9E3779B97F4A7C15ull + 1));
  for (int64_t i = n_ - 1; i > 0; --i) {
    const uint64_t j = splitmix64(key + uint64_t(i)) % uint64_t(i + 1);
    std::swap(p[size_t(i)], p[size_t(j)]);
  }
  return p;
}

std::vector<int64_t> ShuffledBatchSampler::batch(int64_t epoch, int64_t index) const {
  BRIGADE_CHECK(index >= 0 && index < batches_per_epoch(), ValueError,
                "ShuffledBatchSampler: batch {} outside the {} batches of an epoch", index, batches_per_epoch());
  const std::vector<int64_t> p = permutation(epoch);
  const int64_t begin = index * batch_size_, end = std::min(n_, begin + batch_size_);
  return std::vector<int64_t>(p.begin() + begin, p.begin() + end);
}

}  // namespace brigade::data
