// Caching allocator: live/peak accounting per tag, reuse of freed blocks (a
// repeated allocation pattern reaches the OS only once), tag scopes.
#include <gtest/gtest.h>

#include "brigade/core/allocator.h"
#include "brigade/core/tensor.h"

using namespace brigade;

TEST(Allocator, LiveAndPeakBytesPerTag) {
  Allocator& a = Allocator::instance();
  a.reset_peak();
  const MemStats s0 = a.stats();
  const int g = int(MemTag::Grads), p = int(MemTag::Params);
  {
    Tensor x = Tensor::empty({1000}, DType::F32, MemTag::Grads);        // 4000 B -> 4032 (64-byte classes)
    Tensor y = Tensor::empty({256, 1024}, DType::F32, MemTag::Params);  // 1 MiB
    const MemStats s1 = a.stats();
    EXPECT_EQ(s1.live[g] - s0.live[g], int64_t(Allocator::round_size(4000)));
    EXPECT_EQ(s1.live[p] - s0.live[p], int64_t(Allocator::round_size(1 << 20)));
    EXPECT_EQ(s1.live_total - s0.live_total, s1.live[g] - s0.live[g] + s1.live[p] - s0.live[p]);
  }
  const MemStats s2 = a.stats();
  EXPECT_EQ(s2.live[g], s0.live[g]);
  EXPECT_EQ(s2.live[p], s0.live[p]);
  EXPECT_GE(s2.peak[p] - s0.live[p], int64_t(1 << 20));  // the peak remembers
  a.reset_peak();
  EXPECT_EQ(a.stats().peak[p], a.stats().live[p]);
}

TEST(Allocator, SteadyStateReusesCachedBlocks) {
  Allocator& a = Allocator::instance();
  auto step = [] {
    Tensor x = Tensor::empty({123, 77});
    Tensor y = Tensor::empty({4096});
    Tensor z = Tensor::empty({3, 1000, 100});
  };
  step();
  const int64_t os_before = a.stats().os_allocs;
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(a.stats().os_allocs, os_before);
  EXPECT_GT(a.stats().cached, 0);
}

TEST(Allocator, TagScopeTagsAllocations) {
  EXPECT_EQ(MemTagScope::current(), MemTag::Activations);
  {
    MemTagScope w(MemTag::Workspace);
    EXPECT_EQ(Tensor::empty({4}).tag(), MemTag::Workspace);
    {
      MemTagScope o(MemTag::Optimizer);
      EXPECT_EQ(Tensor::empty({4}).tag(), MemTag::Optimizer);
    }
    EXPECT_EQ(MemTagScope::current(), MemTag::Workspace);
  }
  EXPECT_EQ(Tensor::empty({4}).tag(), MemTag::Activations);
}
