// ResourceCache: the watch cache of one resource prefix (e.g. all pods).
//
// It holds:
//  - the current objects in key order (ObjectTree) and an O(1) snapshot of
//    the tree after every revision that changed the resource, for as far
//    back as the event history reaches: Exact and paginated Lists read
//    these snapshots;
//  - the event history (a ring sized by a time window, like kube-apiserver's
//    cacher, and bounded in bytes);
//  - secondary indexes: for each indexed field and for labels, value ->
//    current objects (for Lists), and value -> watchers (for dispatch: an
//    event reaches the watchers registered under the index values of its
//    old and new object, plus the watchers without an indexable selector,
//    so its cost grows with the watchers it concerns, not with all of
//    them).
//
// One feeder (the store feed, a proxy, or a test) calls Reset/Apply/
// AdvanceTo; readers call List and Watch from any thread. Readers wait on
// the cache's lock only while the feeder applies a batch or registers a
// watcher; they build their answers from snapshots outside it.
//
// Thread safety: all public methods are thread-safe; the feeder methods
// must not run concurrently with each other. Lock order: mu_ before any
// CacheWatcher::mu_; no callback runs under mu_.

#ifndef CAPSTAN_WATCHCACHE_RESOURCE_CACHE_H_
#define CAPSTAN_WATCHCACHE_RESOURCE_CACHE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "util/mutex.h"
#include "watchcache/cache_types.h"
#include "watchcache/cache_watcher.h"
#include "watchcache/index_extractor.h"
#include "watchcache/object_tree.h"
#include "watchcache/selector.h"

namespace capstan::watchcache {

// One change to feed: a put (object set) or a delete of key at rev.
struct FeedChange {
  int64_t rev = 0;
  std::string key;    // for deletes (puts use object->key())
  ObjectRef object;   // null: a delete
  // With CacheOptions::feed_prev_kv: the mod_revision of the previous value
  // the store reported (0: none); -1: not reported.
  int64_t prev_mod_rev = -1;
};

class ResourceCache {
 public:
  // alloc must outlive the cache and every ObjectRef it hands out.
  ResourceCache(const ResourceSpec& spec, const CacheOptions& options, ObjectAllocator* alloc);
  ~ResourceCache();
  ResourceCache(const ResourceCache&) = delete;
  ResourceCache& operator=(const ResourceCache&) = delete;

  const ResourceSpec& spec() const { return extractor_.spec(); }
  const IndexExtractor& extractor() const { return extractor_; }

  // ---- Feeder side ----

  // A cached object from a stored mvccpb.KeyValue record (extraction runs
  // here, on the caller's thread, without any lock). Null if the record is
  // not a KeyValue.
  ObjectRef MakeObject(std::string_view kv_record);

  // Replaces the state with `objects` (the whole prefix as listed at rev,
  // any order) and drops the history: the cache's state at rev. Watchers
  // that exist are cut off with CacheReinitialized (they must watch again,
  // as kube-apiserver's cacher makes them after a re-list).
  void Reset(int64_t rev, std::vector<ObjectRef> objects);
  // Applies changes in revision order and advances to header_rev.
  // REQUIRES: Reset was called; changes' revisions > rev() and
  // <= header_rev, non-decreasing.
  void Apply(std::vector<FeedChange> changes, int64_t header_rev);
  // Advances the revision without changes (the store moved on elsewhere).
  void AdvanceTo(int64_t rev);
  // For consistent reads: the store's current revision (an error fails the
  // read with it), and a request that makes the feeder AdvanceTo it soon (a
  // progress request). Unset: the cache's own revision counts as current.
  // REQUIRES: no reader has started (the feeds call it when constructed).
  void SetRevisionSource(std::function<absl::StatusOr<int64_t>()> current_rev,
                         std::function<void()> request_progress);

  // ---- Readers ----

  // REQUIRES: options.prefix starts with spec().prefix.
  absl::StatusOr<ListResult> List(const ListOptions& options);
  absl::StatusOr<std::unique_ptr<CacheWatch>> Watch(const WatchOptions& options);

  // The cache's state at exactly rev when it holds it (ready, and
  // oldest_rev <= rev <= rev()); else nullopt. *cache_rev (if not null)
  // gets rev(). The snapshot stays valid while held, whatever the feeder
  // does meanwhile.
  std::optional<TreeSnapshot> SnapshotAt(int64_t rev, int64_t* cache_rev = nullptr) const;

  // Sends due bookmarks and cuts off watchers behind for too long. Called
  // periodically by the Cache.
  void Tick(absl::Time now);
  // Ends every watcher (CacheStopped) and wakes every waiting reader;
  // List/Watch fail afterwards.
  void Stop();

  int64_t rev() const;
  bool ready() const;
  bool WaitReady(absl::Duration timeout) const;

  struct Stats {
    int64_t rev = 0, oldest_rev = 0;
    uint64_t objects = 0;
    uint64_t object_bytes = 0;  // blocks of the current objects
    uint64_t raw_bytes = 0;     // their encoded KeyValue records
    uint64_t undecoded = 0;     // objects cached without fields (not decodable)
    uint64_t ring_events = 0, ring_capacity = 0, ring_bytes = 0, snapshots = 0;
    uint64_t watchers = 0, watchers_behind = 0, watchers_cut_off = 0;
    uint64_t events_applied = 0, events_dispatched = 0, dispatch_candidates = 0;
    uint64_t index_bytes_estimate = 0;
    uint64_t feed_mismatches = 0;  // prev_kv disagreed with the cache's previous object
  };
  // estimate_indexes: also walk the secondary indexes for
  // index_bytes_estimate (proportional to their values; left 0 otherwise).
  Stats GetStats(bool estimate_indexes = true) const;

  // Lists by scanning the snapshot only (no index), whatever the options;
  // for benchmarks and tests.
  void TEST_SetUseIndexes(bool on) { use_indexes_.store(on); }

 private:
  friend class CacheWatch;
  using ObjectSet = absl::flat_hash_set<const CachedObject*>;
  using ValueIndex = absl::flat_hash_map<std::string, ObjectSet>;
  using WatcherSet = absl::flat_hash_set<CacheWatcher*>;
  using WatcherIndex = absl::flat_hash_map<std::string, WatcherSet>;
  struct RevSnapshot {
    int64_t rev;
    TreeSnapshot snap;
  };
  using Notifications = std::vector<std::shared_ptr<CacheWatcher>>;

  // Index maintenance. REQUIRES: mu_ held exclusively.
  void IndexAddLocked(const CachedObject* o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IndexRemoveLocked(const CachedObject* o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DispatchLocked(const std::shared_ptr<const CacheEvent>& ev, Notifications* notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OfferLocked(CacheWatcher* w, const CacheEvent& ev, Notifications* notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterLocked(CacheWatcher* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnregisterLocked(CacheWatcher* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends w with status (its queue is dropped); it is unregistered at the
  // next exclusive section. REQUIRES: mu_ held (any mode), w->mu_ held.
  void EndLocked(CacheWatcher* w, absl::Status status, Notifications* notify)
      ABSL_SHARED_LOCKS_REQUIRED(mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_);
  void SweepEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t OldestRevLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The snapshot of the state at rev. REQUIRES: OldestRevLocked() <= rev <= rev_.
  const TreeSnapshot& SnapshotAtLocked(int64_t rev) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Waits (mu_ held in any mode) until rev_ >= rev; false on timeout or stop.
  bool AwaitRevLocked(int64_t rev, absl::Duration timeout) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Makes sure the cache has the store's current revision (consistent read).
  absl::Status WaitConsistent();
  // Objects of the current state that may match sel, from the indexes; false
  // if sel has no indexable requirement. REQUIRES: mu_ held.
  bool IndexCandidatesLocked(const Selector& sel, std::vector<ObjectRef>* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  size_t CatchUp(CacheWatcher* w, std::vector<WatchEvent>* out, size_t max_events);
  // A resourceVersion "N" (decimal, fits int64).
  static bool ParseRv(std::string_view s, int64_t* rev);
  void Remove(CacheWatcher* w);
  static void RunNotifications(Notifications* notify);

  const IndexExtractor extractor_;
  const CacheOptions options_;
  ObjectAllocator* const alloc_;
  std::atomic<bool> use_indexes_;
  std::atomic<uint64_t> undecoded_{0};

  // The cache's state. Lock order: before any CacheWatcher's mu_ (one at a
  // time), which is before ended_mu_; no callback runs under it. It also
  // guards each registered CacheWatcher's dispatch fields (stamp_,
  // registration_, ...: cache_watcher.h).
  mutable util::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int64_t rev_ ABSL_GUARDED_BY(mu_) = 0;
  ObjectTree tree_ ABSL_GUARDED_BY(mu_);
  uint64_t object_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t raw_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Snapshots after each revision with changes, oldest first. The first is
  // the base: the oldest state the cache can serve (history starts after it).
  std::deque<RevSnapshot> snapshots_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<const CacheEvent>> ring_ ABSL_GUARDED_BY(mu_);
  size_t ring_capacity_ ABSL_GUARDED_BY(mu_);
  uint64_t ring_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ValueIndex> field_index_ ABSL_GUARDED_BY(mu_);  // per field (indexed ones used)
  ValueIndex label_index_ ABSL_GUARDED_BY(mu_);               // "key=value"
  std::vector<WatcherIndex> field_watchers_ ABSL_GUARDED_BY(mu_);
  WatcherIndex label_watchers_ ABSL_GUARDED_BY(mu_);
  WatcherIndex namespace_watchers_ ABSL_GUARDED_BY(mu_);  // by key prefix "<prefix><ns>/"
  WatcherSet all_watchers_ ABSL_GUARDED_BY(mu_);          // no indexable selector
  size_t label_watcher_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> field_watcher_count_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<CacheWatcher*, std::shared_ptr<CacheWatcher>> watchers_ ABSL_GUARDED_BY(mu_);
  // Ended watchers still registered for dispatch (unregistered lazily, at
  // the next exclusive section). A leaf lock: watchers end under a shared
  // mu_ too.
  util::Mutex ended_mu_;
  std::vector<CacheWatcher*> ended_ ABSL_GUARDED_BY(ended_mu_);
  uint64_t stamp_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_watcher_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::string scratch_ ABSL_GUARDED_BY(mu_);

  // Set before any reader runs (SetRevisionSource), constant after.
  std::function<absl::StatusOr<int64_t>()> current_rev_;
  std::function<void()> request_progress_;

  std::atomic<uint64_t> events_applied_{0}, events_dispatched_{0}, dispatch_candidates_{0},
      watchers_cut_off_{0}, feed_mismatches_{0};
};

// The smallest key greater than every key with this prefix ("" if none).
std::string PrefixEnd(std::string_view prefix);

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_RESOURCE_CACHE_H_
