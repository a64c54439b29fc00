// AtomicFile: temp file + fsync + rename (see atomic_file.h).
#include "brigade/data/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "brigade/core/error.h"

namespace brigade::data {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  BRIGADE_CHECK(fd_ >= 0, IoError, "cannot create '{}': {}; check that the folder exists and is writable", tmp_path_,
                std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  BRIGADE_ASSERT(fd_ >= 0 && !committed_, "write after commit of {}", path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    BRIGADE_CHECK(n > 0, IoError, "cannot write '{}': {}; check free disk space", tmp_path_, std::strerror(errno));
    p += n;
    bytes -= size_t(n);
  }
}

void AtomicFile::commit() {
  BRIGADE_ASSERT(fd_ >= 0 && !committed_, "double commit of {}", path_);
  BRIGADE_CHECK(::fsync(fd_) == 0, IoError, "cannot fsync '{}': {}; check the disk", tmp_path_, std::strerror(errno));
  int rc = ::close(fd_);
  fd_ = -1;
  BRIGADE_CHECK(rc == 0, IoError, "cannot close '{}': {}; check free disk space", tmp_path_, std::strerror(errno));
  BRIGADE_CHECK(::rename(tmp_path_.c_str(), path_.c_str()) == 0, IoError, "cannot rename '{}' to '{}': {}", tmp_path_,
                path_, std::strerror(errno));
  committed_ = true;
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // best effort: the rename is already visible
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

}  // namespace brigade::data
