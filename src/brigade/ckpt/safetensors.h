// safetensors files (https://github.com/huggingface/safetensors, "Format"): an 8-byte
// little-endian u64 header length N, N bytes of UTF-8 JSON {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {str: str}} padded with spaces, then
// the byte buffer the offsets point into. The base of every Brigade checkpoint.
// Not sharding (an index over several of these files) and not train-state layout:
// those build on this in train/checkpoint and later ckpt/sharded.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ckpt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Spec dtype names for Brigade dtypes: F32 BF16 F16 I32 I64.
std::string_view safetensors_dtype(DType t);
// Brigade dtype for a spec dtype name; nullopt for the ones Brigade cannot hold
// (F64, I8, U8, BOOL, ...) and for names that are not in the spec.
std::optional<DType> dtype_from_safetensors(std::string_view name);
// Bytes per element of any spec dtype (F64 -> 8, BOOL -> 1, F8_E4M3 -> 1, ...); 0 if unknown.
size_t safetensors_dtype_size(std::string_view name);

// Writes `tensors` (any layout; non-contiguous ones are copied) and string metadata
// to `path` atomically: a temporary file in the same directory is written, fsynced and
// renamed over `path`, then the directory is fsynced, so readers see the old file or
// the complete new one. Tensors are laid out by element size (largest first, stable),
// so each one is naturally aligned; the header lists them in that order with
// "__metadata__" first, and is padded with spaces to a multiple of 8 bytes. The bytes
// depend only on the inputs (no timestamps), so equal inputs give identical files.
// Throws ValueError for duplicate/empty/reserved names or undefined tensors, IoError
// (naming the path) when the file cannot be written.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The size in bytes of the file save_safetensors would write (8 + header + data), without
// writing it; a checkpoint save uses it to say how much space it needed.
uint64_t safetensors_file_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

// The whole file as bytes, as save_safetensors would write it (for tests and in-memory use).
std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

struct TensorInfo {
  std::string dtype_name;      // as in the file: "F32", "BF16", ..., possibly one Brigade cannot load
  std::optional<DType> dtype;  // nullopt when Brigade has no such dtype (get() then throws)
  Shape shape;                 // {} for a 0-d tensor
  uint64_t begin = 0;          // byte offsets into the data buffer (after the header)
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const { return shape_numel(shape); }
};

// Reads one safetensors file. open() reads and validates the whole header against the
// file size (truncation, JSON, dtypes, shapes vs byte sizes, offsets that must tile the
// data buffer exactly with no gap or overlap, duplicate keys) and throws CheckpointError
// naming the file, the tensor and what to do. Tensor data is read on demand (pread),
// so opening a large checkpoint is cheap. Copies share the open file; const methods are
// safe to call from several threads.
class SafetensorsReader {
 public:
  SafetensorsReader() = default;
  explicit SafetensorsReader(const std::string& path) { open(path); }
  void open(const std::string& path);
  bool is_open() const { return file_ != nullptr; }

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::optional<std::string> metadata(const std::string& key) const;
  std::vector<std::string> names() const;  // in data order (as written)
  size_t size() const { return order_.size(); }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;   // CheckpointError if absent
  uint64_t data_start() const { return 8 + header_len_; }  // file offset of the data buffer

  // An owned contiguous copy of tensor `name` in its stored dtype.
  Tensor get(const std::string& name) const;
  // Reads tensor `name` into `dst` (any layout). Shapes must match exactly; dtypes must
  // match or both be floating (converted with round-to-nearest-even). Throws
  // CheckpointError naming the file and tensor otherwise.
  void get_into(const std::string& name, const Tensor& dst) const;
  // Raw bytes of tensor `name`, little-endian, as stored.
  std::string raw_bytes(const std::string& name) const;

 private:
  struct File;
  void read_at(uint64_t offset, void* dst, uint64_t n, const std::string& what) const;

  std::string path_;
  std::shared_ptr<File> file_;
  uint64_t header_len_ = 0;
  uint64_t file_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorInfo> infos_;
  std::vector<std::string> order_;
};

}  // namespace brigade::ckpt
