// Allocators for cached object bytes.
//
// Every CachedObject (object_ref.h) lives in one block from an
// ObjectAllocator. SlabAllocator is the default: segregated free lists per
// size class (8 classes per power of two, so a block wastes at most 12.5%
// and ~6% on average), blocks carved from large chunks, freed blocks reused
// by the next object of the same class. Blocks above kMaxSlabBlock go to
// malloc.
//
// Objects are allocated by one thread (a cache's feed), but freed by
// whichever thread drops the last reference: a List response, a watcher's
// queue, a snapshot released by a reader. The free list can therefore be a
// mutex-protected list or a lock-free stack (boost::lockfree::stack); both
// are kept so the benchmark can compare them (docs/WATCHCACHE.md has the
// figures and the choice).
//
// Chunks are never returned to the operating system: the footprint is the
// high-water mark of the live bytes per class. (A cache's working set is
// stable: the current objects plus a bounded history.)
//
// Thread safety: every method may be called from any thread.

#ifndef CAPSTAN_WATCHCACHE_SLAB_ALLOCATOR_H_
#define CAPSTAN_WATCHCACHE_SLAB_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace capstan::watchcache {

class ObjectAllocator {
 public:
  virtual ~ObjectAllocator() = default;

  // A block of at least n bytes, aligned to 16. Never null (aborts when out
  // of memory, like operator new).
  virtual void* Allocate(size_t n) = 0;
  // REQUIRES: p came from Allocate(n) of this allocator, with the same n.
  virtual void Free(void* p, size_t n) = 0;

  struct Stats {
    uint64_t live_blocks = 0;
    uint64_t live_bytes = 0;       // sum of the n of live blocks
    uint64_t footprint_bytes = 0;  // memory taken from the system for blocks
  };
  virtual Stats GetStats() const = 0;
  virtual const char* name() const = 0;
};

enum class FreeListKind {
  kMutex,     // a mutex (util::Mutex) per size class
  kLockFree,  // boost::lockfree::stack per size class
};

// Largest block served from slabs; larger ones come from malloc.
inline constexpr size_t kMaxSlabBlock = 256 * 1024;

// The size class of an n-byte request (n <= kMaxSlabBlock) and its size.
int SizeClassOf(size_t n);
size_t SizeOfClass(int size_class);
int NumSizeClasses();

std::unique_ptr<ObjectAllocator> NewSlabAllocator(FreeListKind kind = FreeListKind::kMutex);
// malloc/free (jemalloc when the binary links it), for comparison.
std::unique_ptr<ObjectAllocator> NewMallocAllocator();

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_SLAB_ALLOCATOR_H_
