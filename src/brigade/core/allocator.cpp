// Caching allocator; see allocator.h.
#include "brigade/core/allocator.h"

#include <cstdlib>
#include <new>

#include "brigade/core/error.h"

namespace brigade {

namespace {
thread_local MemTag g_tag = MemTag::Activations;
}

std::string_view mem_tag_name(MemTag t) {
  switch (t) {
    case MemTag::Params: return "params";
    case MemTag::Grads: return "grads";
    case MemTag::Optimizer: return "optimizer";
    case MemTag::Activations: return "activations";
    case MemTag::Workspace: return "workspace";
    case MemTag::Other: return "other";
  }
  return "?";
}

Allocator& Allocator::instance() {
  static Allocator* a = new Allocator();  // never destroyed: tensors may outlive statics
  return *a;
}

size_t Allocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= 4096) return (bytes + 63) & ~size_t(63);
  if (bytes <= (size_t(1) << 20)) return (bytes + 4095) & ~size_t(4095);
  return (bytes + 65535) & ~size_t(65535);
}

void* Allocator::allocate(size_t bytes, MemTag tag) {
  const size_t n = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.find(n);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      stats_.cached -= int64_t(n);
    }
  }
  if (!p) {
    p = std::aligned_alloc(64, n);
    if (!p) {
      empty_cache();
      p = std::aligned_alloc(64, n);
    }
    if (!p)
      throw Error(
          fmt::format("out of memory: could not allocate {} bytes for {}; reduce batch size, "
                      "sequence length or model size",
                      n, mem_tag_name(tag)));
    std::lock_guard<std::mutex> lk(mu_);
    stats_.os_allocs++;
  }
  std::lock_guard<std::mutex> lk(mu_);
  const int i = int(tag);
  stats_.live[i] += int64_t(n);
  if (stats_.live[i] > stats_.peak[i]) stats_.peak[i] = stats_.live[i];
  stats_.live_total += int64_t(n);
  if (stats_.live_total > stats_.peak_total) stats_.peak_total = stats_.live_total;
  return p;
}

void Allocator::deallocate(void* p, size_t bytes, MemTag tag) {
  if (!p) return;
  const size_t n = round_size(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.live[int(tag)] -= int64_t(n);
  stats_.live_total -= int64_t(n);
  stats_.cached += int64_t(n);
  free_[n].push_back(p);
}

MemStats Allocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.peak = stats_.live;
  stats_.peak_total = stats_.live_total;
}

void Allocator::empty_cache() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [n, v] : free_)
    for (void* p : v) std::free(p);
  free_.clear();
  stats_.cached = 0;
}

MemTagScope::MemTagScope(MemTag t) : prev_(g_tag) { g_tag = t; }
MemTagScope::~MemTagScope() { g_tag = prev_; }
MemTag MemTagScope::current() { return g_tag; }

}  // namespace brigade
