// safetensors writer and validating reader; see safetensors.h for the format and API.
// Every way a file can be malformed is a CheckpointError naming the file, the tensor
// or key, and what to do; never a crash or a silently wrong tensor.
// Assumes a little-endian host (the format is little-endian; checked at compile time).
#include "brigade/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/core/error.h"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace brigade::ckpt {

namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr const char* kMetadataKey = "__metadata__";

struct SpecDType {
  const char* name;
  size_t size;
  std::optional<DType> dtype;
};
constexpr SpecDType kSpecDTypes[] = {
    {"F32", 4, DType::F32},    {"BF16", 2, DType::BF16},     {"F16", 2, DType::F16},       {"I32", 4, DType::I32},
    {"I64", 8, DType::I64},    {"F64", 8, std::nullopt},     {"I8", 1, std::nullopt},      {"U8", 1, std::nullopt},
    {"I16", 2, std::nullopt},  {"U16", 2, std::nullopt},     {"U32", 4, std::nullopt},     {"U64", 8, std::nullopt},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

std::string errno_str() { return std::strerror(errno); }

// Checked a*b for sizes taken from an untrusted header.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

struct Layout {
  std::string header;                            // JSON + space padding, length % 8 == 0
  std::vector<std::pair<size_t, Tensor>> items;  // (index into input, contiguous tensor) in data order
  uint64_t data_bytes = 0;
};

Layout make_layout(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    BRIGADE_CHECK(!name.empty(), ValueError, "save_safetensors: tensor #{} has an empty name; give every tensor a name",
                  i);
    BRIGADE_CHECK(name != kMetadataKey, ValueError,
                  "save_safetensors: '{}' is reserved for metadata and cannot name a tensor", name);
    BRIGADE_CHECK(seen.insert(name).second, ValueError,
                  "save_safetensors: tensor name '{}' appears twice; names must be unique", name);
    BRIGADE_CHECK(t.defined(), ValueError, "save_safetensors: tensor '{}' is undefined", name);
  }
  Layout L;
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].second.element_size() > tensors[b].second.element_size();
  });
  nlohmann::ordered_json js = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    js[kMetadataKey] = std::move(m);
  }
  uint64_t off = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    Tensor c = t.contiguous();
    const uint64_t n = c.nbytes();
    js[name] = {
        {"dtype", std::string(safetensors_dtype(t.dtype()))}, {"shape", t.shape()}, {"data_offsets", {off, off + n}}};
    off += n;
    L.items.emplace_back(i, std::move(c));
  }
  L.data_bytes = off;
  std::string header;
  try {
    header = js.dump();
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(
        fmt::format("save_safetensors: a tensor name or metadata string is not valid UTF-8 ({})", e.what()));
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  L.header = std::move(header);
  return L;
}

std::string le_u64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    BRIGADE_CHECK(w > 0, IoError, "could not write {}: {}; check free disk space and permissions", path, errno_str());
    p += w;
    n -= size_t(w);
  }
}

std::string err_prefix(const std::string& path) { return fmt::format("safetensors file {}", path); }

}  // namespace

std::string_view safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& d : kSpecDTypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

size_t safetensors_dtype_size(std::string_view name) {
  for (const auto& d : kSpecDTypes)
    if (name == d.name) return d.size;
  return 0;
}

// ---------------------------------------------------------------- writing

uint64_t safetensors_file_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  const Layout L = make_layout(tensors, metadata);
  return 8 + L.header.size() + L.data_bytes;
}

std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  Layout L = make_layout(tensors, metadata);
  std::string out = le_u64(L.header.size()) + L.header;
  out.reserve(out.size() + L.data_bytes);
  for (const auto& [i, c] : L.items) out.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  Layout L = make_layout(tensors, metadata);
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmp = (dir / (target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(tmp.data());
  BRIGADE_CHECK(fd >= 0, IoError,
                "could not create a temporary file next to {}: {}; check that {} exists and is writable", path,
                errno_str(), dir.string());
  try {
    ::fchmod(fd, 0644);
    const std::string len = le_u64(L.header.size());
    write_all(fd, len.data(), len.size(), path);
    write_all(fd, L.header.data(), L.header.size(), path);
    for (const auto& [i, c] : L.items) write_all(fd, c.raw_data(), c.nbytes(), path);
    BRIGADE_CHECK(::fsync(fd) == 0, IoError, "could not flush {} to disk: {}", path, errno_str());
    BRIGADE_CHECK(::close(fd) == 0, IoError, "could not close {}: {}", path, errno_str());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_str();
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("could not move {} into place as {}: {}", tmp, path, why));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {  // persist the rename; best effort where directories cannot be opened
    ::fsync(dfd);
    ::close(dfd);
  }
}

// ---------------------------------------------------------------- reading

struct SafetensorsReader::File {
  int fd = -1;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

void SafetensorsReader::open(const std::string& path) {
  *this = SafetensorsReader();
  const std::string where = err_prefix(path);
  auto file = std::make_shared<File>();
  file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  BRIGADE_CHECK(file->fd >= 0, CheckpointError, "{}: cannot open ({}); check the path and permissions", where,
                errno_str());
  struct stat st {};
  BRIGADE_CHECK(::fstat(file->fd, &st) == 0, CheckpointError, "{}: cannot stat ({})", where, errno_str());
  BRIGADE_CHECK(S_ISREG(st.st_mode), CheckpointError, "{}: not a regular file; pass the path of a .safetensors file",
                where);
  path_ = path;
  file_ = std::move(file);
  file_size_ = uint64_t(st.st_size);

  BRIGADE_CHECK(file_size_ >= 8, CheckpointError,
                "{}: truncated: the file has {} bytes, fewer than the 8-byte header length; the write was "
                "interrupted or this is not a safetensors file; re-save or re-download it",
                where, file_size_);
  uint64_t n = 0;
  read_at(0, &n, 8, "the header length");
  BRIGADE_CHECK(n <= file_size_ - 8, CheckpointError,
                "{}: header length {} is beyond the file size ({} bytes after the length field); the file is "
                "truncated or not a safetensors file; re-save or re-download it",
                where, n, file_size_ - 8);
  BRIGADE_CHECK(n >= 2, CheckpointError, "{}: header length {} is too small for a JSON object; the file is corrupt",
                where, n);
  BRIGADE_CHECK(n <= kMaxHeaderBytes, CheckpointError,
                "{}: header length {} exceeds the {}-byte limit; the file is corrupt or not a safetensors file", where,
                n, kMaxHeaderBytes);
  header_len_ = n;
  std::string text(n, '\0');
  read_at(8, text.data(), n, "the header");
  BRIGADE_CHECK(text[0] == '{', CheckpointError,
                "{}: the header does not start with '{{' (a JSON object); the file is corrupt or not a safetensors "
                "file",
                where);

  // Parse, rejecting duplicate keys at any depth (nlohmann would keep the last silently).
  nlohmann::json js;
  std::vector<std::set<std::string>> keys;
  std::string dup_key;
  try {
    js = nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
      using E = nlohmann::json::parse_event_t;
      if (ev == E::object_start) keys.emplace_back();
      if (ev == E::object_end && !keys.empty()) keys.pop_back();
      if (ev == E::key && !keys.empty() && !keys.back().insert(v.get<std::string>()).second && dup_key.empty())
        dup_key = v.get<std::string>() + (depth > 1 ? " (inside an entry)" : "");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(
        fmt::format("{}: the header is not valid JSON ({}); the file is corrupt; re-save or "
                    "re-download it",
                    where, e.what()));
  }
  BRIGADE_CHECK(dup_key.empty(), CheckpointError,
                "{}: the header names '{}' more than once; the file is corrupt (each tensor name must be unique)",
                where, dup_key);
  BRIGADE_CHECK(js.is_object(), CheckpointError, "{}: the header is JSON but not an object; the file is corrupt",
                where);

  const uint64_t buffer = file_size_ - 8 - n;
  for (auto it = js.begin(); it != js.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKey) {
      BRIGADE_CHECK(v.is_object(), CheckpointError, "{}: \"__metadata__\" must be an object of strings", where);
      for (auto m = v.begin(); m != v.end(); ++m) {
        BRIGADE_CHECK(m.value().is_string(), CheckpointError,
                      "{}: metadata value for key '{}' is {}, not a string; safetensors metadata maps strings to "
                      "strings",
                      where, m.key(), m.value().type_name());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string at = fmt::format("{}: tensor '{}'", where, name);
    BRIGADE_CHECK(v.is_object(), CheckpointError, "{}: entry is {}, not an object with dtype/shape/data_offsets", at,
                  v.type_name());
    for (auto f = v.begin(); f != v.end(); ++f)
      BRIGADE_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets", CheckpointError,
                    "{}: unexpected field '{}' (expected dtype, shape, data_offsets); the file is corrupt", at,
                    f.key());
    BRIGADE_CHECK(v.contains("dtype") && v["dtype"].is_string(), CheckpointError, "{}: missing or non-string \"dtype\"",
                  at);
    BRIGADE_CHECK(v.contains("shape") && v["shape"].is_array(), CheckpointError, "{}: missing or non-array \"shape\"",
                  at);
    BRIGADE_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                  CheckpointError, "{}: \"data_offsets\" must be an array [begin, end]", at);
    TensorInfo ti;
    ti.dtype_name = v["dtype"].get<std::string>();
    const size_t esize = safetensors_dtype_size(ti.dtype_name);
    BRIGADE_CHECK(esize != 0, CheckpointError,
                  "{}: unknown dtype \"{}\" (the safetensors spec has F32, BF16, F16, I32, I64, F64, I8, U8, I16, "
                  "U16, U32, U64, BOOL, F8_E4M3, F8_E5M2); the file is corrupt or from a newer writer",
                  at, ti.dtype_name);
    ti.dtype = dtype_from_safetensors(ti.dtype_name);
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      BRIGADE_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), CheckpointError,
                    "{}: shape {} has an entry that is not a non-negative integer", at, v["shape"].dump());
      const uint64_t du = d.get<uint64_t>();
      BRIGADE_CHECK(du <= uint64_t(std::numeric_limits<int64_t>::max()) && !mul_overflows(numel, du, &numel),
                    CheckpointError, "{}: shape {} is too large", at, v["shape"].dump());
      ti.shape.push_back(int64_t(du));
    }
    for (const auto& o : v["data_offsets"])
      BRIGADE_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0), CheckpointError,
                    "{}: data_offsets {} must be non-negative integers", at, v["data_offsets"].dump());
    ti.begin = v["data_offsets"][0].get<uint64_t>();
    ti.end = v["data_offsets"][1].get<uint64_t>();
    BRIGADE_CHECK(ti.begin <= ti.end, CheckpointError, "{}: data_offsets [{}, {}] end before they begin", at, ti.begin,
                  ti.end);
    BRIGADE_CHECK(ti.end <= buffer, CheckpointError,
                  "{}: data_offsets [{}, {}] run past the data buffer ({} bytes); the file is truncated; re-save or "
                  "re-download it",
                  at, ti.begin, ti.end, buffer);
    uint64_t want = 0;
    BRIGADE_CHECK(!mul_overflows(numel, esize, &want) && want == ti.nbytes(), CheckpointError,
                  "{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}; the file is corrupt", at,
                  v["shape"].dump(), ti.dtype_name, want, ti.begin, ti.end, ti.nbytes());
    infos_.emplace(name, std::move(ti));
  }

  // The tensors must tile [0, buffer) exactly: sorted by offset, no overlap, no gap.
  std::vector<const std::pair<const std::string, TensorInfo>*> sorted;
  for (const auto& kv : infos_) sorted.push_back(&kv);
  std::stable_sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    return a->second.begin != b->second.begin ? a->second.begin < b->second.begin : a->second.end < b->second.end;
  });
  uint64_t pos = 0;
  std::string prev;
  for (auto* kv : sorted) {
    const TensorInfo& ti = kv->second;
    BRIGADE_CHECK(ti.begin >= pos, CheckpointError,
                  "{}: tensor '{}' (bytes [{}, {}]) overlaps tensor '{}' (ending at {}); the file is corrupt", where,
                  kv->first, ti.begin, ti.end, prev, pos);
    BRIGADE_CHECK(ti.begin == pos, CheckpointError,
                  "{}: bytes [{}, {}] of the data buffer belong to no tensor (gap before tensor '{}'); the file is "
                  "corrupt",
                  where, pos, ti.begin, kv->first);
    pos = ti.end;
    prev = kv->first;
    order_.push_back(kv->first);
  }
  BRIGADE_CHECK(pos == buffer, CheckpointError, "{}: the tensors cover {} bytes but the data buffer holds {}; {}",
                where, pos, buffer,
                pos < buffer ? "trailing bytes belong to no tensor (the file is corrupt)"
                             : "the file is truncated; re-save or re-download it");
}

void SafetensorsReader::read_at(uint64_t offset, void* dst, uint64_t n, const std::string& what) const {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(file_->fd, p, std::min<uint64_t>(n, uint64_t(1) << 30), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    BRIGADE_CHECK(r >= 0, CheckpointError, "{}: read error in {} ({})", err_prefix(path_), what, errno_str());
    BRIGADE_CHECK(r > 0, CheckpointError,
                  "{}: unexpected end of file while reading {}; the file was truncated after it was opened",
                  err_prefix(path_), what);
    p += r;
    n -= uint64_t(r);
    offset += uint64_t(r);
  }
}

std::optional<std::string> SafetensorsReader::metadata(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> SafetensorsReader::names() const { return order_; }

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  BRIGADE_CHECK(file_ != nullptr, CheckpointError, "SafetensorsReader: no file is open; call open(path) first");
  auto it = infos_.find(name);
  if (it == infos_.end()) {
    std::string some;
    for (size_t i = 0; i < order_.size() && i < 5; ++i) some += (i ? ", " : "") + order_[i];
    throw CheckpointError(
        fmt::format("{}: has no tensor named '{}' ({} tensors{}{}); check the name and that the "
                    "checkpoint matches the model",
                    err_prefix(path_), name, order_.size(), order_.empty() ? "" : ", e.g. ", some));
  }
  return it->second;
}

std::string SafetensorsReader::raw_bytes(const std::string& name) const {
  const TensorInfo& ti = info(name);
  std::string out(ti.nbytes(), '\0');
  read_at(data_start() + ti.begin, out.data(), ti.nbytes(), fmt::format("tensor '{}'", name));
  return out;
}

Tensor SafetensorsReader::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  BRIGADE_CHECK(ti.dtype.has_value(), CheckpointError,
                "{}: tensor '{}' has dtype {}, which Brigade cannot hold (it has F32, BF16, F16, I32, I64); convert "
                "the file, e.g. in PyTorch with tensor.float() or .long()",
                err_prefix(path_), name, ti.dtype_name);
  Tensor t = Tensor::empty(ti.shape, *ti.dtype);  // stored shape, contiguous
  if (ti.nbytes() > 0) read_at(data_start() + ti.begin, t.raw_data(), ti.nbytes(), fmt::format("tensor '{}'", name));
  return t;
}

void SafetensorsReader::get_into(const std::string& name, const Tensor& dst) const {
  const TensorInfo& ti = info(name);
  BRIGADE_CHECK(dst.defined(), ValueError, "get_into('{}'): the destination tensor is undefined", name);
  BRIGADE_CHECK(ti.shape == dst.shape(), CheckpointError,
                "{}: tensor '{}' has shape {} but the destination has shape {}; the checkpoint was written for a "
                "different model configuration",
                err_prefix(path_), name, shape_str(ti.shape), shape_str(dst.shape()));
  BRIGADE_CHECK(
      ti.dtype.has_value() && (*ti.dtype == dst.dtype() || (is_floating(*ti.dtype) && is_floating(dst.dtype()))),
      CheckpointError,
      "{}: tensor '{}' is stored as {} and cannot be loaded into a {} tensor; load it with get() and "
      "convert explicitly",
      err_prefix(path_), name, ti.dtype_name, dtype_name(dst.dtype()));
  if (*ti.dtype == dst.dtype() && dst.is_contiguous()) {
    if (ti.nbytes() > 0)
      read_at(data_start() + ti.begin, dst.raw_data(), ti.nbytes(), fmt::format("tensor '{}'", name));
    return;
  }
  copy_strided(dst, get(name));
}

}  // namespace brigade::ckpt
