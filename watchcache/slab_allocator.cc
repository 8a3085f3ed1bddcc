#include "watchcache/slab_allocator.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "boost/lockfree/stack.hpp"
#include "util/check.h"
#include "util/mutex.h"

namespace capstan::watchcache {
namespace {

constexpr int kSmallClasses = 8;  // 16, 32, ..., 128
constexpr int kClassesPerDoubling = 8;
constexpr int kFirstLog = 7;    // 128
constexpr int kLastLog = 17;    // 128 KiB .. 256 KiB is the last doubling
constexpr int kNumClasses = kSmallClasses + (kLastLog - kFirstLog + 1) * kClassesPerDoubling;
constexpr size_t kMinChunk = 256 * 1024;
// Blocks carved from a chunk at once when a lock-free class runs dry.
constexpr int kRefillBatch = 32;

int Log2Floor(size_t v) { return 63 - __builtin_clzll(v); }

}  // namespace

int NumSizeClasses() { return kNumClasses; }

int SizeClassOf(size_t n) {
  if (n == 0) n = 1;
  if (n <= 128) return static_cast<int>((n + 15) / 16) - 1;
  const int k = Log2Floor(n - 1);
  const size_t step = size_t{1} << (k - 3);
  const size_t j = (n - (size_t{1} << k) + step - 1) / step;  // 1..8
  return kSmallClasses + (k - kFirstLog) * kClassesPerDoubling + static_cast<int>(j) - 1;
}

size_t SizeOfClass(int c) {
  if (c < kSmallClasses) return static_cast<size_t>(c + 1) * 16;
  const int k = kFirstLog + (c - kSmallClasses) / kClassesPerDoubling;
  const int j = (c - kSmallClasses) % kClassesPerDoubling + 1;
  return (size_t{1} << k) + static_cast<size_t>(j) * (size_t{1} << (k - 3));
}

namespace {

struct alignas(64) SizeClass {
  // Guards the free list (kMutex) and the bump region (both kinds). Lock
  // order: before the allocator's chunks_mu_.
  util::Mutex mu;
  void* head ABSL_GUARDED_BY(mu) = nullptr;  // intrusive free list (kMutex)
  char* bump ABSL_GUARDED_BY(mu) = nullptr;  // unused part of the newest chunk
  char* bump_end ABSL_GUARDED_BY(mu) = nullptr;
  std::unique_ptr<boost::lockfree::stack<void*>> stack;  // kLockFree
};

class SlabAllocator final : public ObjectAllocator {
 public:
  explicit SlabAllocator(FreeListKind kind) : kind_(kind), classes_(kNumClasses) {
    if (kind_ == FreeListKind::kLockFree) {
      for (auto& c : classes_) c.stack = std::make_unique<boost::lockfree::stack<void*>>(64);
    }
  }

  ~SlabAllocator() override {
    for (void* chunk : chunks_) ::operator delete(chunk, std::align_val_t{64});
  }

  void* Allocate(size_t n) override {
    live_blocks_.fetch_add(1, std::memory_order_relaxed);
    live_bytes_.fetch_add(n, std::memory_order_relaxed);
    if (n > kMaxSlabBlock) {
      footprint_.fetch_add(n, std::memory_order_relaxed);
      void* p = std::aligned_alloc(16, (n + 15) & ~size_t{15});
      CHECK(p != nullptr);
      return p;
    }
    const int ci = SizeClassOf(n);
    SizeClass& c = classes_[ci];
    if (kind_ == FreeListKind::kLockFree) {
      void* p;
      if (c.stack->pop(p)) return p;
      return RefillLockFree(c, ci);
    }
    util::MutexLock l(&c.mu);
    if (c.head != nullptr) {
      void* p = c.head;
      c.head = *static_cast<void**>(p);
      return p;
    }
    return CarveLocked(c, ci);
  }

  void Free(void* p, size_t n) override {
    live_blocks_.fetch_sub(1, std::memory_order_relaxed);
    live_bytes_.fetch_sub(n, std::memory_order_relaxed);
    if (n > kMaxSlabBlock) {
      footprint_.fetch_sub(n, std::memory_order_relaxed);
      std::free(p);
      return;
    }
    SizeClass& c = classes_[SizeClassOf(n)];
    if (kind_ == FreeListKind::kLockFree) {
      c.stack->push(p);
      return;
    }
    util::MutexLock l(&c.mu);
    *static_cast<void**>(p) = c.head;
    c.head = p;
  }

  Stats GetStats() const override {
    Stats s;
    s.live_blocks = live_blocks_.load(std::memory_order_relaxed);
    s.live_bytes = live_bytes_.load(std::memory_order_relaxed);
    s.footprint_bytes = footprint_.load(std::memory_order_relaxed);
    return s;
  }

  const char* name() const override {
    return kind_ == FreeListKind::kLockFree ? "slab-lockfree" : "slab-mutex";
  }

 private:
  // One block from the bump region, opening a new chunk when it is used up.
  void* CarveLocked(SizeClass& c, int ci) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c.mu) {
    const size_t size = SizeOfClass(ci);
    if (c.bump == nullptr || c.bump + size > c.bump_end) {
      // Chunks hold at least 8 blocks; the tail of the previous chunk that
      // no block fits in is lost (< one block).
      const size_t chunk = std::max(kMinChunk, size * 8);
      char* mem = static_cast<char*>(::operator new(chunk, std::align_val_t{64}));
      {
        util::MutexLock l(&chunks_mu_);
        chunks_.push_back(mem);
      }
      footprint_.fetch_add(chunk, std::memory_order_relaxed);
      c.bump = mem;
      c.bump_end = mem + chunk;
    }
    void* p = c.bump;
    c.bump += size;
    return p;
  }

  void* RefillLockFree(SizeClass& c, int ci) ABSL_LOCKS_EXCLUDED(c.mu) {
    util::MutexLock l(&c.mu);
    void* p;
    if (c.stack->pop(p)) return p;  // another thread refilled meanwhile
    void* first = CarveLocked(c, ci);
    for (int i = 1; i < kRefillBatch; ++i) {
      if (c.bump + SizeOfClass(ci) > c.bump_end) break;  // do not open a chunk for spares
      c.stack->push(CarveLocked(c, ci));
    }
    return first;
  }

  const FreeListKind kind_;
  std::vector<SizeClass> classes_;
  // Every chunk, freed with the allocator. A leaf.
  util::Mutex chunks_mu_;
  std::vector<void*> chunks_ ABSL_GUARDED_BY(chunks_mu_);
  std::atomic<uint64_t> live_blocks_{0}, live_bytes_{0}, footprint_{0};
};

class MallocAllocator final : public ObjectAllocator {
 public:
  void* Allocate(size_t n) override {
    void* p = std::malloc(n);
    CHECK(p != nullptr);
    live_blocks_.fetch_add(1, std::memory_order_relaxed);
    live_bytes_.fetch_add(n, std::memory_order_relaxed);
    footprint_.fetch_add(malloc_usable_size(p), std::memory_order_relaxed);
    return p;
  }
  void Free(void* p, size_t n) override {
    live_blocks_.fetch_sub(1, std::memory_order_relaxed);
    live_bytes_.fetch_sub(n, std::memory_order_relaxed);
    footprint_.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
    std::free(p);
  }
  Stats GetStats() const override {
    Stats s;
    s.live_blocks = live_blocks_.load(std::memory_order_relaxed);
    s.live_bytes = live_bytes_.load(std::memory_order_relaxed);
    // Usable sizes: the allocator's own size-class rounding, not its page
    // level fragmentation (the benchmark asks jemalloc for that).
    s.footprint_bytes = footprint_.load(std::memory_order_relaxed);
    return s;
  }
  const char* name() const override { return "malloc"; }

 private:
  std::atomic<uint64_t> live_blocks_{0}, live_bytes_{0}, footprint_{0};
};

}  // namespace

std::unique_ptr<ObjectAllocator> NewSlabAllocator(FreeListKind kind) {
  return std::make_unique<SlabAllocator>(kind);
}

std::unique_ptr<ObjectAllocator> NewMallocAllocator() { return std::make_unique<MallocAllocator>(); }

}  // namespace capstan::watchcache
