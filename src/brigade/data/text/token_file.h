// Token files (train.bin, val.bin): a flat array of token ids with a header,
// written atomically and read through mmap. Not a loader or a sampler (sampler.h).
//
// Format, all little-endian, version 1 (28-byte header, then the tokens):
//   offset  0  char[8]  magic "BRGTOKEN"
//   offset  8  u32      version = 1
//   offset 12  u32      dtype = bytes per token: 2 (u16, used when vocab <= 65536) or 4 (u32)
//   offset 16  u32      vocab size (every token is < vocab)
//   offset 20  u64      token count N
//   offset 28  N tokens of `dtype`; file length == 28 + N * dtype exactly
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace brigade::data {

inline constexpr char kTokenMagic[8] = {'B', 'R', 'G', 'T', 'O', 'K', 'E', 'N'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenHeaderBytes = 28;

// Bytes per token for a vocabulary: 2 when vocab_size <= 65536, else 4.
uint32_t token_bytes_for_vocab(int64_t vocab_size);

// Writes `tokens` to `path` atomically. Every token must be in [0, vocab_size)
// (ValueError otherwise); IoError when the file cannot be written.
void write_token_file(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size);

// Read-only, memory-mapped view of a token file. Opening validates magic, version,
// dtype, vocab and that the length matches the count, and (unless verify_tokens is
// false) scans every token for values >= vocab (a memory-bandwidth pass: ~ms per
// 10M tokens). Every failure is a DataError naming the file and saying to re-run
// `brigade prepare`. Movable, not copyable; unmaps on destruction.
class TokenDataset {
 public:
  TokenDataset() = default;
  explicit TokenDataset(const std::string& path, bool verify_tokens = true);
  ~TokenDataset();
  TokenDataset(TokenDataset&& o) noexcept;
  TokenDataset& operator=(TokenDataset&& o) noexcept;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  bool is_open() const { return base_ != nullptr; }
  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // number of tokens
  int64_t vocab_size() const { return vocab_; }
  uint32_t token_bytes() const { return token_bytes_; }  // 2 or 4

  int64_t operator[](int64_t i) const;  // unchecked beyond a debug assert
  // out[k] = token[start + k] for k < n; ValueError if [start, start + n) is out of range.
  void read(int64_t start, int64_t n, int64_t* out) const;

 private:
  void close();
  std::string path_;
  void* base_ = nullptr;  // mmap of the whole file
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  int64_t count_ = 0;
  int64_t vocab_ = 0;
  uint32_t token_bytes_ = 0;
};

}  // namespace brigade::data
