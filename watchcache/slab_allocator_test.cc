#include "watchcache/slab_allocator.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace capstan::watchcache {
namespace {

TEST(SlabAllocator, SizeClassesCoverEverySizeWithBoundedWaste) {
  int prev = -1;
  for (size_t n = 1; n <= kMaxSlabBlock; n += (n < 4096 ? 1 : 61)) {
    const int c = SizeClassOf(n);
    ASSERT_GE(c, prev);
    ASSERT_LT(c, NumSizeClasses());
    prev = c;
    const size_t size = SizeOfClass(c);
    ASSERT_GE(size, n);
    if (n > 128) ASSERT_LE(size, n + n / 8 + 16) << n;
    if (c > 0) ASSERT_LT(SizeOfClass(c - 1), n) << n;  // the smallest class that fits
  }
  EXPECT_EQ(SizeOfClass(SizeClassOf(kMaxSlabBlock)), kMaxSlabBlock);
}

class SlabAllocatorTest : public ::testing::TestWithParam<FreeListKind> {};

TEST_P(SlabAllocatorTest, ReusesFreedBlocksAndCounts) {
  auto a = NewSlabAllocator(GetParam());
  std::vector<void*> blocks;
  for (int i = 0; i < 1000; ++i) {
    void* p = a->Allocate(5000);
    std::memset(p, i & 0xff, 5000);
    blocks.push_back(p);
  }
  EXPECT_EQ(a->GetStats().live_blocks, 1000u);
  EXPECT_EQ(a->GetStats().live_bytes, 5000u * 1000);
  const uint64_t footprint = a->GetStats().footprint_bytes;
  EXPECT_LE(footprint, 1000u * 5000 * 115 / 100);
  for (void* p : blocks) a->Free(p, 5000);
  EXPECT_EQ(a->GetStats().live_blocks, 0u);
  for (int i = 0; i < 1000; ++i) blocks[i] = a->Allocate(4900);  // same class
  EXPECT_EQ(a->GetStats().footprint_bytes, footprint) << "freed blocks are reused";
  for (void* p : blocks) a->Free(p, 4900);
  void* big = a->Allocate(kMaxSlabBlock + 1);
  a->Free(big, kMaxSlabBlock + 1);
}

TEST_P(SlabAllocatorTest, ConcurrentFreesFromOtherThreads) {
  auto a = NewSlabAllocator(GetParam());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<void*, size_t>> mine;
      for (int i = 0; i < 20000; ++i) {
        size_t n = 64 + rng() % 8000;
        void* p = a->Allocate(n);
        static_cast<char*>(p)[0] = 1;
        static_cast<char*>(p)[n - 1] = 2;
        mine.emplace_back(p, n);
        if (mine.size() > 100) {
          a->Free(mine.front().first, mine.front().second);
          mine.erase(mine.begin());
        }
      }
      for (auto [p, n] : mine) a->Free(p, n);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(a->GetStats().live_blocks, 0u);
  EXPECT_EQ(a->GetStats().live_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, SlabAllocatorTest,
                         ::testing::Values(FreeListKind::kMutex, FreeListKind::kLockFree));

}  // namespace
}  // namespace capstan::watchcache
