// Checkpoint directories and sharded optimizer state; see checkpoint_dir.h.
#include "brigade/ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/core/json_number.h"
#include "brigade/data/atomic_file.h"

namespace brigade::ckpt {

namespace fs = std::filesystem;

namespace {

void fsync_dir(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string strip_slash(std::string d) {
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

// The repair behind recover_checkpoint() and open_checkpoint(): when <dir> is missing
// and <dir>.old holds a checkpoint (a save died between its two renames), moves it back
// and removes that save's <dir>.tmp. Returns one line saying what it did ("" = nothing).
std::string repair_interrupted_save(const std::string& dir) {
  const fs::path final_dir(dir), old = dir + ".old", tmp = dir + ".tmp";
  std::error_code ec;
  if (fs::exists(final_dir, ec) || !fs::exists(old / "state.json", ec)) return "";
  fs::rename(old, final_dir, ec);
  if (ec) {
    if (fs::exists(final_dir / "state.json")) return "";  // another process restored it first
    throw IoError(fmt::format("could not restore the previous checkpoint {} to {}: {}; rename it by hand", old.string(),
                              dir, ec.message()));
  }
  std::string tmp_note;
  if (fs::exists(tmp, ec)) {
    fs::remove_all(tmp, ec);
    tmp_note =
        ec ? fmt::format(" (could not remove the unfinished {}: {}; remove it by hand)", tmp.string(), ec.message())
           : fmt::format(" and removed the unfinished {}", tmp.string());
  }
  fsync_dir(final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path());
  return fmt::format("{}: a save was interrupted; restored the previous checkpoint from {}{}", dir, old.string(),
                     tmp_note);
}

}  // namespace

void recover_checkpoint(const std::string& dir) { repair_interrupted_save(strip_slash(dir)); }

// ---- integrity: checksums.json

namespace {

// CRC-32 (zlib's) of a file's bytes, and its size.
std::pair<uint64_t, uint32_t> file_crc32(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  BRIGADE_CHECK(f.good(), CheckpointError, "checkpoint file {} is missing or unreadable", p.string());
  std::vector<char> buf(size_t(1) << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t n = 0;
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    const std::streamsize got = f.gcount();
    if (got <= 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), uInt(got));
    n += uint64_t(got);
  }
  BRIGADE_CHECK(f.eof(), CheckpointError, "checkpoint file {} could not be read to the end", p.string());
  return {n, uint32_t(crc)};
}

// Every regular file under `dir` but checksums.json, as paths relative to it, sorted.
std::vector<std::string> checkpoint_files(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string rel = fs::relative(it->path(), dir, ec).generic_string();
    if (rel != kChecksumFile) out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

namespace {
std::string checksums_text(const std::vector<std::pair<std::string, uint64_t>>& sizes,
                           const std::vector<uint32_t>& crcs) {
  nlohmann::json files = nlohmann::json::object();
  for (size_t i = 0; i < sizes.size(); ++i)
    files[sizes[i].first] = {{"bytes", sizes[i].second}, {"crc32", fmt::format("{:08x}", crcs[i])}};
  return nlohmann::json{{"algorithm", "crc32"}, {"files", files}}.dump(1) + "\n";
}
}  // namespace

uint64_t checksums_file_bytes(const std::vector<std::pair<std::string, uint64_t>>& files) {
  return checksums_text(files, std::vector<uint32_t>(files.size(), 0)).size();  // the CRCs are fixed-width
}

void write_checksums(const std::string& tmp) {
  std::vector<std::pair<std::string, uint64_t>> sizes;
  std::vector<uint32_t> crcs;
  for (const std::string& rel : checkpoint_files(tmp)) {
    const auto [bytes, crc] = file_crc32(fs::path(tmp) / rel);
    sizes.emplace_back(rel, bytes);
    crcs.push_back(crc);
  }
  const std::string text = checksums_text(sizes, crcs);
  guarded_write(tmp, text.size(), [&] {
    data::write_file_atomic((fs::path(tmp) / kChecksumFile).string(), text);
    fault_after_write(tmp, fs::path(tmp) / kChecksumFile);
  });
}

void verify_checkpoint(const std::string& dir_in) {
  const fs::path dir(strip_slash(dir_in)), sums = dir / kChecksumFile;
  std::error_code ec;
  if (!fs::exists(sums, ec)) return;  // written before checkpoints had checksums
  // once per process and checkpoint version (a save replaces checksums.json with a new inode)
  static std::mutex mu;
  static std::set<std::string> verified;
  struct stat st {};
  const std::string key =
      fs::weakly_canonical(dir, ec).string() + "|" +
      (::stat(sums.c_str(), &st) == 0 ? fmt::format("{}:{}:{}", st.st_ino, st.st_mtim.tv_sec, st.st_mtim.tv_nsec)
                                      : std::string());
  {
    std::lock_guard<std::mutex> lock(mu);
    if (verified.count(key)) return;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_checkpoint_file(sums));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(
        fmt::format("{}: {} is corrupted ({}); the checkpoint cannot be trusted: resume from "
                    "another one, or delete {} to read it unverified",
                    dir.string(), sums.string(), e.what(), kChecksumFile));
  }
  BRIGADE_CHECK(j.is_object() && j.value("algorithm", "") == "crc32" && j.contains("files") && j["files"].is_object(),
                CheckpointError,
                "{}: {} is not a checksum list this version reads; delete it to read the checkpoint "
                "unverified",
                dir.string(), sums.string());
  for (auto& [rel, want] : j["files"].items()) {
    const fs::path p = dir / rel;
    BRIGADE_CHECK(fs::is_regular_file(p, ec), CheckpointError,
                  "{}: {} is missing (checksums.json lists it); the checkpoint is incomplete: resume from another "
                  "one",
                  dir.string(), rel);
    const auto [bytes, crc] = file_crc32(p);
    const uint64_t want_bytes = want.value("bytes", uint64_t(0));
    BRIGADE_CHECK(bytes == want_bytes, CheckpointError,
                  "{}: {} has {} bytes, {} when it was saved; the file was cut or changed: resume from another "
                  "checkpoint",
                  dir.string(), rel, bytes, want_bytes);
    BRIGADE_CHECK(fmt::format("{:08x}", crc) == want.value("crc32", std::string()), CheckpointError,
                  "{}: {} does not match its checksum (CRC-32 {:08x}, saved as {}); its bytes changed on disk: "
                  "resume from another checkpoint",
                  dir.string(), rel, crc, want.value("crc32", std::string()));
  }
  std::lock_guard<std::mutex> lock(mu);
  verified.insert(key);
}

std::string open_checkpoint(const std::string& dir_in, const std::function<void(const std::string&)>& say) {
  BRIGADE_CHECK(!dir_in.empty(), CheckpointError,
                "no checkpoint directory given; pass the folder `brigade train` writes, e.g. runs/gpt-kjv/checkpoint");
  const std::string dir = strip_slash(dir_in);
  const std::string repaired = repair_interrupted_save(dir);
  if (!repaired.empty()) {
    if (say)
      say(repaired);
    else
      fmt::print(stderr, "{}\n", repaired);
  }
  const fs::path d(dir);
  std::error_code ec;
  if (!fs::is_directory(d, ec)) {
    BRIGADE_CHECK(!fs::exists(d, ec), CheckpointError,
                  "{} is a file, not a checkpoint directory; pass the folder written by `brigade train`, e.g. "
                  "runs/<name>/checkpoint",
                  dir);
    const std::string unfinished =
        fs::exists(dir + ".tmp", ec)
            ? fmt::format(" ({}.tmp is an unfinished save; no checkpoint was completed there)", dir)
            : "";
    throw CheckpointError(
        fmt::format("{}: no such checkpoint directory{}; pass the folder written by `brigade "
                    "train` (<run.out_dir>/checkpoint, e.g. runs/gpt-kjv/checkpoint)",
                    dir, unfinished));
  }
  if (!fs::exists(d / "recipe.toml", ec)) {
    const bool parent = fs::exists(d / "checkpoint" / "recipe.toml", ec) || fs::exists(d / "checkpoint.old", ec);
    throw CheckpointError(
        fmt::format("{} is not a Brigade checkpoint (no recipe.toml); {}pass the directory "
                    "written by `brigade train`, e.g. runs/<name>/checkpoint",
                    dir, parent ? fmt::format("did you mean {}/checkpoint? ", dir) : ""));
  }
  verify_checkpoint(dir);
  return dir;
}

std::string read_checkpoint_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  BRIGADE_CHECK(f.good(), CheckpointError, "checkpoint file {} is missing or unreadable", p.string());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// ---- failed saves: remove <dir>.tmp and say what the save needed and what was free

namespace {

std::string fmt_bytes(uint64_t b) {
  if (b < 1024) return fmt::format("{} bytes", b);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{} bytes ({:.1f} {})", b, v, units[u]);
}

// BRIGADE_CKPT_FAIL_AFTER_BYTES (checkpoint.h); -1 when unset.
int64_t fail_after_bytes() {
  const char* e = std::getenv("BRIGADE_CKPT_FAIL_AFTER_BYTES");
  if (!e || !*e) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(e, &end, 10);
  BRIGADE_CHECK(end && *end == '\0' && v >= 0, ValueError,
                "BRIGADE_CKPT_FAIL_AFTER_BYTES={} is not a byte count; set it to an integer >= 0 or unset it", e);
  return v;
}

uint64_t folder_bytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

}  // namespace

// The test hook: after `file` landed in `tmp`, fail as a full disk would once the folder
// holds more than the limit (cutting `file` so the folder holds exactly the limit).
void fault_after_write(const fs::path& tmp, const fs::path& file) {
  const int64_t limit = fail_after_bytes();
  if (limit < 0) return;
  const uint64_t total = folder_bytes(tmp);
  if (total <= uint64_t(limit)) return;
  const uint64_t size = fs::file_size(file), over = total - uint64_t(limit);
  fs::resize_file(file, size > over ? size - over : 0);
  throw IoError(
      fmt::format("could not write {}: No space left on device (simulated by "
                  "BRIGADE_CKPT_FAIL_AFTER_BYTES={})",
                  file.string(), limit));
}

namespace {

// Runs `write` (files into the save's folder `tmp` = "<dir>.tmp", `needed` bytes in all).
// On any failure the partial folder is removed; an I/O failure is rethrown as one
// IoError that adds the bytes needed, the bytes free, and that <dir> is untouched.
}  // namespace

void guarded_write(const std::string& tmp, uint64_t needed, const std::function<void()>& write) {
  auto cleanup = [&]() {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    return ec ? fmt::format("could not remove the partial {} ({}); remove it by hand", tmp, ec.message())
              : fmt::format("removed the partial {}", tmp);
  };
  auto explain = [&](const std::string& what) {
    const std::string removed = cleanup();
    const std::string dir =
        tmp.size() > 4 && tmp.compare(tmp.size() - 4, 4, ".tmp") == 0 ? tmp.substr(0, tmp.size() - 4) : tmp;
    const fs::path parent = fs::path(tmp).parent_path().empty() ? fs::path(".") : fs::path(tmp).parent_path();
    std::error_code ec;
    const fs::space_info sp = fs::space(parent, ec);
    const std::string free_s = ec ? fmt::format("an unknown amount ({})", ec.message()) : fmt_bytes(sp.available);
    const std::string prev = fs::exists(fs::path(dir) / "state.json", ec)
                                 ? fmt::format("the previous checkpoint in {} is intact", dir)
                                 : fmt::format("{} holds no previous checkpoint", dir);
    return fmt::format(
        "saving checkpoint {} failed: {}; the save needs {} and {} is free on {}; {}; {}; free "
        "disk space there or point run.out_dir at another disk",
        dir, what, fmt_bytes(needed), free_s, parent.string(), removed, prev);
  };
  try {
    write();
  } catch (const IoError& e) {
    throw IoError(explain(e.what()));
  } catch (const fs::filesystem_error& e) {
    throw IoError(explain(e.what()));
  } catch (...) {
    cleanup();
    throw;
  }
}

std::string begin_checkpoint(const std::string& dir) {
  const fs::path tmp = dir + ".tmp";
  recover_checkpoint(dir);  // a previous save that died between its two renames
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  BRIGADE_CHECK(!ec, IoError, "could not create checkpoint directory {}: {}", tmp.string(), ec.message());
  return tmp.string();
}

void commit_checkpoint(const std::string& dir) {
  // Swap in: dir -> dir.old, tmp -> dir, drop dir.old. Every file is already fsynced;
  // a crash between the renames leaves dir.old, which recover_checkpoint() restores.
  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.string() + ".tmp";
  std::error_code exists_ec;
  if (fs::exists(tmp / "recipe.toml", exists_ec)) write_checksums(tmp.string());  // a Brigade checkpoint
  const fs::path old = final_dir.string() + ".old";
  const fs::path parent = final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path();
  std::error_code ec;
  fs::remove_all(old, ec);
  if (fs::exists(final_dir)) {
    fs::rename(final_dir, old, ec);
    BRIGADE_CHECK(!ec, IoError, "could not move the previous checkpoint {} aside: {}", dir, ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  BRIGADE_CHECK(!ec, IoError, "could not move checkpoint {} into place: {}", final_dir.string(), ec.message());
  fsync_dir(parent);
  fs::remove_all(old, ec);
}

namespace {
std::string shard_file(int rank, int dp) { return fmt::format("optimizer-{:05}-of-{:05}.safetensors", rank, dp); }
constexpr const char* kIndexFile = "optimizer.index.json";
}  // namespace

void write_optimizer_shard(const std::string& tmp, int rank, int dp, int64_t lo, int64_t hi,
                           const std::map<std::string, Tensor>& flat_state) {
  NamedTensors named(flat_state.begin(), flat_state.end());
  const std::map<std::string, std::string> meta{{"lo", std::to_string(lo)}, {"hi", std::to_string(hi)}};
  const fs::path file = fs::path(tmp) / shard_file(rank, dp);
  guarded_write(tmp, safetensors_file_bytes(named, meta), [&] {
    save_safetensors(file.string(), named, meta);
    fault_after_write(tmp, file);
  });
}

void write_optimizer_index(const std::string& tmp, int dp, int64_t numel, const std::vector<FlatLayoutEntry>& layout,
                           const std::vector<std::pair<int64_t, int64_t>>& shard_ranges,
                           const std::vector<std::string>& state_names) {
  nlohmann::json j;
  j["format"] = "brigade-flat-shards";
  j["version"] = 1;
  j["dp"] = dp;
  j["numel"] = numel;
  j["states"] = state_names;
  for (const auto& e : layout) j["layout"].push_back({{"name", e.name}, {"offset", e.offset}, {"numel", e.numel}});
  for (int r = 0; r < dp; ++r)
    j["shards"].push_back(
        {{"file", shard_file(r, dp)}, {"lo", shard_ranges[size_t(r)].first}, {"hi", shard_ranges[size_t(r)].second}});
  const std::string text = j.dump(1) + "\n";
  const fs::path file = fs::path(tmp) / kIndexFile;
  guarded_write(tmp, text.size(), [&] {
    data::write_file_atomic(file.string(), text);
    fault_after_write(tmp, file);
  });
}

bool path_stays_inside(const std::string& name) {
  if (name.empty() || name.find('\0') != std::string::npos) return false;
  const fs::path p(name);
  if (p.has_root_name() || p.has_root_directory()) return false;
  for (const fs::path& part : p)
    if (part == ".." || part.string().size() > 255) return false;
  return true;
}

bool checkpoint_is_sharded(const std::string& dir) { return fs::exists(fs::path(dir) / kIndexFile); }

std::map<std::string, Tensor> read_optimizer_flat(const std::string& dir, const std::vector<FlatLayoutEntry>& layout,
                                                  int64_t lo, int64_t hi) {
  std::map<std::string, Tensor> out;
  const int64_t len = std::max<int64_t>(0, hi - lo);
  auto fresh = [&]() { return Tensor::zeros({len}, DType::F32); };  // (len) flat range [lo, hi)
  if (checkpoint_is_sharded(dir)) {
    const fs::path ip = fs::path(dir) / kIndexFile;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_checkpoint_file(ip));
      BRIGADE_CHECK(j.is_object() && j.value("format", nlohmann::json()) == "brigade-flat-shards", CheckpointError,
                    "{}: unknown index format (expected an object with \"format\": \"brigade-flat-shards\"); the "
                    "checkpoint is damaged or from another program",
                    ip.string());
      // A whole number >= 0 (get<int64_t> of a float such as 1e300 is undefined behaviour).
      auto whole = [&](const nlohmann::json& v, const std::string& field) {
        const std::optional<int64_t> n = json_int64(v);
        BRIGADE_CHECK(n && *n >= 0, CheckpointError,
                      "{}: {} = {} is not a whole number >= 0; the index is damaged: resume from another checkpoint",
                      ip.string(), field, v.dump());
        return *n;
      };
      // The saved layout must be this model's: same names, offsets and sizes.
      const auto& jl = j.at("layout");
      BRIGADE_CHECK(jl.is_array() && jl.size() == layout.size(), CheckpointError,
                    "{}: the checkpoint has {} parameters but this model has {}; use the recipe it was saved with",
                    ip.string(), jl.is_array() ? jl.size() : 0, layout.size());
      for (size_t i = 0; i < layout.size(); ++i)
        BRIGADE_CHECK(jl[i].at("name") == layout[i].name && jl[i].at("offset") == layout[i].offset &&
                          jl[i].at("numel") == layout[i].numel,
                      CheckpointError, "{}: parameter {} is {} ({} elements at {}) in the checkpoint but '{}' here",
                      ip.string(), i, jl[i].at("name").dump(), jl[i].at("numel").dump(), jl[i].at("offset").dump(),
                      layout[i].name);
      for (const auto& s : j.at("states")) out.emplace(s.get<std::string>(), fresh());
      for (const auto& sh : j.at("shards")) {
        const int64_t slo = whole(sh.at("lo"), "a shard's \"lo\""), shi = whole(sh.at("hi"), "a shard's \"hi\"");
        BRIGADE_CHECK(slo <= shi, CheckpointError,
                      "{}: a shard holds elements [{}, {}), a reversed range; the index is damaged", ip.string(), slo,
                      shi);
        const int64_t a = std::max(lo, slo), b = std::min(hi, shi);
        if (a >= b) continue;
        const std::string shard_name = sh.at("file").get<std::string>();
        BRIGADE_CHECK(path_stays_inside(shard_name), CheckpointError,
                      "{}: shard file {} is not a file of the checkpoint folder (an absolute path or one with "
                      "\"..\"); the index is damaged or was not written by Brigade",
                      ip.string(),
                      nlohmann::json(shard_name).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        const std::string file = (fs::path(dir) / shard_name).string();
        SafetensorsReader r(file);
        for (auto& [name, dst] : out) {
          BRIGADE_CHECK(r.contains(name), CheckpointError, "{}: state '{}' is missing", file, name);
          Tensor t = r.get(name);
          BRIGADE_CHECK(t.numel() == shi - slo, CheckpointError, "{}: state '{}' has {} elements, the index says {}",
                        file, name, t.numel(), shi - slo);
          std::memcpy(dst.data<float>() + (a - lo), t.data<float>() + (a - slo), size_t(b - a) * sizeof(float));
        }
      }
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(fmt::format("optimizer index {} is corrupted or incomplete ({})", ip.string(), e.what()));
    }
    return out;
  }
  const std::string path = (fs::path(dir) / "optimizer.safetensors").string();
  SafetensorsReader r(path);
  std::map<std::string, const FlatLayoutEntry*> by_param;
  for (const auto& e : layout) by_param[e.name] = &e;
  for (const std::string& n : r.names()) {
    const size_t dot = n.find('.');
    BRIGADE_CHECK(dot != std::string::npos, CheckpointError, "{}: unexpected tensor '{}'", path, n);
    const std::string kind = n.substr(0, dot), pname = n.substr(dot + 1);
    auto it = by_param.find(pname);
    BRIGADE_CHECK(it != by_param.end(), CheckpointError, "{}: state '{}' is for a parameter this model lacks", path, n);
    const FlatLayoutEntry& e = *it->second;
    Tensor t = r.get(n);
    BRIGADE_CHECK(t.numel() == e.numel, CheckpointError, "{}: state '{}' has {} elements but the parameter has {}",
                  path, n, t.numel(), e.numel);
    if (!out.count(kind)) out.emplace(kind, fresh());
    const int64_t a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel);
    if (a < b)
      std::memcpy(out[kind].data<float>() + (a - lo), t.contiguous().data<float>() + (a - e.offset),
                  size_t(b - a) * sizeof(float));
  }
  return out;
}

}  // namespace brigade::ckpt
