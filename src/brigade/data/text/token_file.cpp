// Token file writer and mmap reader (format in token_file.h).
// Endianness: the format is little-endian; this code assumes a little-endian host
// (checked at compile time) and reads/writes the integers directly.
#include "brigade/data/text/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/data/atomic_file.h"

namespace brigade::data {

static_assert(std::endian::native == std::endian::little, "token files are little-endian; port the reader");

namespace {

constexpr const char* kFix = "re-run `brigade prepare` (delete the folder to force a rebuild)";

template <typename T>
T load_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
int64_t find_bad_token(const unsigned char* base, int64_t n, int64_t vocab) {
  const T* p = reinterpret_cast<const T*>(base);
  T mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = p[i] > mx ? p[i] : mx;  // vectorises; find the index only if needed
  if (int64_t(mx) < vocab) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (int64_t(p[i]) >= vocab) return i;
  return -1;
}

}  // namespace

uint32_t token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2u : 4u; }

void write_token_file(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size) {
  BRIGADE_CHECK(vocab_size > 0 && vocab_size <= int64_t(UINT32_MAX), ValueError,
                "token file '{}': vocab size {} is out of range (1..2^32-1)", path, vocab_size);
  const uint32_t tb = token_bytes_for_vocab(vocab_size);
  unsigned char header[kTokenHeaderBytes];
  std::memcpy(header, kTokenMagic, 8);
  uint32_t version = kTokenFileVersion, vocab = uint32_t(vocab_size);
  uint64_t count = tokens.size();
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &tb, 4);
  std::memcpy(header + 16, &vocab, 4);
  std::memcpy(header + 20, &count, 8);

  AtomicFile f(path);
  f.write(header, sizeof header);
  constexpr size_t kChunk = 1 << 16;
  std::vector<unsigned char> buf(kChunk * tb);
  for (size_t start = 0; start < tokens.size(); start += kChunk) {
    size_t n = std::min(kChunk, tokens.size() - start);
    for (size_t i = 0; i < n; ++i) {
      int32_t t = tokens[start + i];
      BRIGADE_CHECK(t >= 0 && int64_t(t) < vocab_size, ValueError,
                    "token file '{}': token {} at index {} is outside the vocabulary [0, {})", path, t, start + i,
                    vocab_size);
      if (tb == 2) {
        uint16_t v = uint16_t(t);
        std::memcpy(buf.data() + i * 2, &v, 2);
      } else {
        uint32_t v = uint32_t(t);
        std::memcpy(buf.data() + i * 4, &v, 4);
      }
    }
    f.write(buf.data(), n * tb);
  }
  f.commit();
}

TokenDataset::TokenDataset(const std::string& path, bool verify_tokens) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  BRIGADE_CHECK(fd >= 0, DataError, "token file '{}' cannot be opened ({}); {}", path, std::strerror(errno), kFix);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw DataError(fmt::format("token file '{}' cannot be inspected ({}); {}", path, std::strerror(e), kFix));
  }
  const size_t len = size_t(st.st_size);
  if (len < kTokenHeaderBytes) {
    ::close(fd);
    throw DataError(fmt::format("token file '{}' is truncated: {} bytes, shorter than the {}-byte header; {}", path,
                                len, kTokenHeaderBytes, kFix));
  }
  void* base = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  BRIGADE_CHECK(base != MAP_FAILED, DataError, "token file '{}' cannot be memory-mapped ({}); {}", path,
                std::strerror(map_errno), kFix);
  base_ = base;
  map_bytes_ = len;
  const auto* p = static_cast<const unsigned char*>(base);
  try {
    BRIGADE_CHECK(std::memcmp(p, kTokenMagic, 8) == 0, DataError,
                  "token file '{}' is not a Brigade token file (bad magic, expected \"BRGTOKEN\"); {}", path, kFix);
    uint32_t version = load_le<uint32_t>(p + 8);
    BRIGADE_CHECK(version == kTokenFileVersion, DataError,
                  "token file '{}' has format version {}, this Brigade reads version {}; {}", path, version,
                  kTokenFileVersion, kFix);
    token_bytes_ = load_le<uint32_t>(p + 12);
    BRIGADE_CHECK(token_bytes_ == 2 || token_bytes_ == 4, DataError,
                  "token file '{}' has an invalid dtype {} (expected 2 for u16 or 4 for u32); {}", path, token_bytes_,
                  kFix);
    vocab_ = load_le<uint32_t>(p + 16);
    BRIGADE_CHECK(vocab_ > 0, DataError, "token file '{}' has vocab size 0; {}", path, kFix);
    BRIGADE_CHECK(token_bytes_ == token_bytes_for_vocab(vocab_), DataError,
                  "token file '{}' stores {}-byte tokens but its vocab size {} calls for {}-byte tokens; {}", path,
                  token_bytes_, vocab_, token_bytes_for_vocab(vocab_), kFix);
    uint64_t count = load_le<uint64_t>(p + 20);
    const uint64_t payload = len - kTokenHeaderBytes;
    BRIGADE_CHECK(count <= payload / token_bytes_ && count * token_bytes_ == payload, DataError,
                  "token file '{}' is {} bytes but its header promises {} tokens ({} bytes); the file is truncated "
                  "or corrupt; {}",
                  path, len, count, kTokenHeaderBytes + count * token_bytes_, kFix);
    count_ = int64_t(count);
    tokens_ = p + kTokenHeaderBytes;
    if (verify_tokens) {
      int64_t bad = token_bytes_ == 2 ? find_bad_token<uint16_t>(tokens_, count_, vocab_)
                                      : find_bad_token<uint32_t>(tokens_, count_, vocab_);
      BRIGADE_CHECK(bad < 0, DataError, "token file '{}': token {} at index {} is >= the vocab size {}; {}", path,
                    (*this)[bad], bad, vocab_, kFix);
    }
  } catch (...) {
    close();
    throw;
  }
}

TokenDataset::~TokenDataset() { close(); }

TokenDataset::TokenDataset(TokenDataset&& o) noexcept { *this = std::move(o); }

TokenDataset& TokenDataset::operator=(TokenDataset&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    count_ = std::exchange(o.count_, 0);
    vocab_ = std::exchange(o.vocab_, 0);
    token_bytes_ = std::exchange(o.token_bytes_, 0);
  }
  return *this;
}

void TokenDataset::close() {
  if (base_) ::munmap(base_, map_bytes_);
  base_ = nullptr;
  tokens_ = nullptr;
  map_bytes_ = 0;
}

int64_t TokenDataset::operator[](int64_t i) const {
  assert(i >= 0 && i < count_);
  return token_bytes_ == 2 ? int64_t(load_le<uint16_t>(tokens_ + size_t(i) * 2))
                           : int64_t(load_le<uint32_t>(tokens_ + size_t(i) * 4));
}

void TokenDataset::read(int64_t start, int64_t n, int64_t* out) const {
  BRIGADE_CHECK(start >= 0 && n >= 0 && start + n <= count_, ValueError,
                "token file '{}': window [{}, {}) is outside its {} tokens", path_, start, start + n, count_);
  if (token_bytes_ == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(tokens_) + start;
    for (int64_t k = 0; k < n; ++k) out[k] = p[k];
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(tokens_) + start;
    for (int64_t k = 0; k < n; ++k) out[k] = p[k];
  }
}

}  // namespace brigade::data
