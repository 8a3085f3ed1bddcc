// StoreFeed: feeds one ResourceCache in process from a KvStore.
//
// The feed lists the resource prefix from one published store view at
// revision R (paged Ranges at R), Resets the cache to it, then watches the
// prefix through the store's WatchHub from R+1 and applies each response
// (events, or a progress notification's revision) to the cache. When the
// hub cancels the watch because its start was compacted (or for any other
// reason), the feed lists again. Consistent reads make the feed ask the hub
// for a progress notification, so the cache learns the store's revision
// even when the resource did not change.
//
// Thread safety: Start and Stop from one thread; the feed runs on its own.

#ifndef CAPSTAN_WATCHCACHE_STORE_FEED_H_
#define CAPSTAN_WATCHCACHE_STORE_FEED_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"
#include "util/mutex.h"
#include "watchcache/resource_cache.h"

namespace capstan::watchcache {

class StoreFeed {
 public:
  // store, hub and cache must outlive the feed.
  StoreFeed(ResourceCache* cache, mvcc::KvStore* store, mvcc::WatchHub* hub, bool prev_kv);
  ~StoreFeed();
  StoreFeed(const StoreFeed&) = delete;
  StoreFeed& operator=(const StoreFeed&) = delete;

  void Start();
  // Stops the feed thread and closes its hub stream. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Lists (re-lists) done so far, for tests and metrics.
  uint64_t lists() const { return lists_.load(); }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Lists the prefix at the store's current revision into the cache.
  absl::Status Load(int64_t* rev);
  // Watches from rev+1 until the watch ends (returns) or the feed stops.
  void Follow(int64_t rev) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies one WatchResponse; false when the watch was canceled.
  bool Process(const std::string& message);
  void RequestProgress() ABSL_LOCKS_EXCLUDED(mu_);

  ResourceCache* const cache_;
  mvcc::KvStore* const store_;
  mvcc::WatchHub* const hub_;
  const bool prev_kv_;

  // Lock order: a leaf, taken by the hub's deliver function under the
  // hub's and the stream's locks; never held while calling into the hub.
  util::Mutex mu_;
  std::deque<std::string> inbox_ ABSL_GUARDED_BY(mu_);  // messages the hub delivered
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set and reset by the feed thread.
  std::shared_ptr<mvcc::WatchStream> stream_ ABSL_GUARDED_BY(mu_);

  std::atomic<int64_t> last_progress_request_ns_{0};
  std::atomic<uint64_t> lists_{0};
  std::thread thread_;
};

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_STORE_FEED_H_
