// A contiguous scratch buffer from the caching allocator, for the CPU kernels: uninitialised
// and reused across steps (no zero-fill and no page faults in the steady state), accounted
// under MemTag::Workspace and returned on destruction.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "brigade/core/allocator.h"

namespace brigade::ops::cpu {

template <typename T>
class Workspace {
 public:
  Workspace() = default;
  explicit Workspace(int64_t n)
      : bytes_(size_t(std::max<int64_t>(n, 1)) * sizeof(T)),
        p_(static_cast<T*>(Allocator::instance().allocate(bytes_, MemTag::Workspace))) {}
  Workspace(Workspace&& o) noexcept : bytes_(o.bytes_), p_(o.p_) { o.p_ = nullptr; }
  Workspace& operator=(Workspace&& o) noexcept {
    std::swap(bytes_, o.bytes_);
    std::swap(p_, o.p_);
    return *this;
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    if (p_) Allocator::instance().deallocate(p_, bytes_, MemTag::Workspace);
  }
  T* data() const { return p_; }
  bool empty() const { return p_ == nullptr; }

 private:
  size_t bytes_ = 0;
  T* p_ = nullptr;
};

// The same in bytes, where a size of 0 is no buffer (get() null): oneDNN scratchpads and
// reordered weights, which are often empty.
class WorkspaceBuffer {
 public:
  explicit WorkspaceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_) p_ = Allocator::instance().allocate(bytes_, MemTag::Workspace);
  }
  ~WorkspaceBuffer() {
    if (p_) Allocator::instance().deallocate(p_, bytes_, MemTag::Workspace);
  }
  WorkspaceBuffer(const WorkspaceBuffer&) = delete;
  WorkspaceBuffer& operator=(const WorkspaceBuffer&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  size_t bytes_;
  void* p_ = nullptr;
};

}  // namespace brigade::ops::cpu
