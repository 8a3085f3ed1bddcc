// Cache: Capstan's Kubernetes watch cache (the C++ API).
//
// One ResourceCache per configured resource prefix (by default the
// Kubernetes registry prefixes /registry/pods/, /registry/minions/,
// /registry/leases/), each holding the current objects, a time-windowed
// event history with per-revision snapshots, and secondary indexes
// (metadata.namespace, spec.nodeName, status.phase, labels for pods).
//
//   auto cache = Cache::Start(CacheOptions{}, store, hub);   // fed in process
//   ListOptions l;
//   l.prefix = "/registry/pods/";
//   l.field_selector = "spec.nodeName=node-17";
//   auto pods = (*cache)->List(l);            // an index lookup, not a scan
//
// List and Watch follow kube-apiserver's semantics (resourceVersion "" is a
// consistent read, "0" any, "N" with NotOlderThan/Exact; limit/continue;
// 410-style "too old resource version"; bookmarks; sendInitialEvents).
// Errors are CacheError statuses (watchcache/errors.h).
//
// Thread safety: List and Watch may be called from any thread. Every
// CacheWatch and every ObjectRef handed out must be released before the
// Cache is destroyed.

#ifndef CAPSTAN_WATCHCACHE_CACHE_H_
#define CAPSTAN_WATCHCACHE_CACHE_H_

#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "util/mutex.h"
#include "watchcache/cache_types.h"
#include "watchcache/cache_watcher.h"
#include "watchcache/resource_cache.h"
#include "watchcache/slab_allocator.h"

namespace capstan::mvcc {
class KvStore;
class WatchHub;
}  // namespace capstan::mvcc

namespace capstan::watchcache {

class StoreFeed;

class Cache {
 public:
  // A cache nobody feeds: the caller feeds each resource() (Reset, Apply);
  // for tests, benchmarks and proxies. InvalidArgument if prefixes overlap.
  static absl::StatusOr<std::unique_ptr<Cache>> Create(CacheOptions options);

  // A cache fed in process: each resource is listed from a published view
  // of store and then followed through hub (see store_feed.h). Returns at
  // once; the resources become ready as their initial lists finish
  // (WaitReady). store and hub must outlive the cache; destroy the cache
  // (or Stop it) before the hub is stopped.
  static absl::StatusOr<std::unique_ptr<Cache>> Start(CacheOptions options, mvcc::KvStore* store,
                                                      mvcc::WatchHub* hub);

  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // Stops the feeds and the ticker and ends every watcher (CacheStopped).
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // NotCached when options.prefix is not within a cached resource prefix.
  absl::StatusOr<ListResult> List(const ListOptions& options);
  absl::StatusOr<std::unique_ptr<CacheWatch>> Watch(const WatchOptions& options);

  // Waits until every resource has its initial list.
  bool WaitReady(absl::Duration timeout);

  // The resource cache whose prefix contains prefix, or null.
  ResourceCache* ResourceFor(std::string_view prefix) const;
  const std::vector<std::unique_ptr<ResourceCache>>& resources() const { return resources_; }
  ObjectAllocator* allocator() const { return alloc_.get(); }
  const CacheOptions& options() const { return options_; }

 private:
  explicit Cache(CacheOptions options);
  void TickLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const CacheOptions options_;
  std::unique_ptr<ObjectAllocator> alloc_;
  std::vector<std::unique_ptr<ResourceCache>> resources_;
  std::vector<std::unique_ptr<StoreFeed>> feeds_;

  // The ticker's stop flag. A leaf: not held while ticking.
  util::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
};

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_CACHE_H_
