// Caching host allocator with memory accounting by tag (params, grads, optimizer,
// activations, workspace). Freed blocks go to per-size free lists and are reused,
// so a steady-state training step allocates nothing from the OS.
// Not a device allocator: a CUDA one will implement the same interface.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace brigade {

enum class MemTag : uint8_t { Params, Grads, Optimizer, Activations, Workspace, Other };
constexpr int kNumMemTags = 6;
std::string_view mem_tag_name(MemTag t);

struct MemStats {
  std::array<int64_t, kNumMemTags> live{};  // bytes currently held by tensors, per tag
  std::array<int64_t, kNumMemTags> peak{};  // high-water mark of live, per tag
  int64_t live_total = 0;
  int64_t peak_total = 0;  // high-water mark of the sum over tags
  int64_t cached = 0;      // bytes in free lists, ready for reuse
  int64_t os_allocs = 0;   // blocks obtained from the OS so far
};

class Allocator {
 public:
  static Allocator& instance();
  // 64-byte aligned block of at least `bytes` bytes, accounted under `tag`.
  void* allocate(size_t bytes, MemTag tag);
  void deallocate(void* p, size_t bytes, MemTag tag);
  MemStats stats() const;
  void reset_peak();   // peak := live, per tag and in total
  void empty_cache();  // return cached blocks to the OS
  static size_t round_size(size_t bytes);

 private:
  Allocator() = default;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  MemStats stats_;
};

// Allocations made while a scope is alive are tagged with its tag (thread-local).
class MemTagScope {
 public:
  explicit MemTagScope(MemTag t);
  ~MemTagScope();
  MemTagScope(const MemTagScope&) = delete;
  MemTagScope& operator=(const MemTagScope&) = delete;
  static MemTag current();

 private:
  MemTag prev_;
};

}  // namespace brigade
