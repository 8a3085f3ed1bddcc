// The requests, results and options of the watch cache's C++ API
// (watchcache/cache.h).

#ifndef CAPSTAN_WATCHCACHE_CACHE_TYPES_H_
#define CAPSTAN_WATCHCACHE_CACHE_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "watchcache/cached_object.h"
#include "watchcache/index_extractor.h"
#include "watchcache/slab_allocator.h"

namespace capstan::watchcache {

// Kubernetes' resourceVersionMatch.
enum class ResourceVersionMatch {
  kUnset,         // with resourceVersion "N": as NotOlderThan
  kNotOlderThan,  // any state at or after resourceVersion
  kExact,         // exactly the state at resourceVersion
};

struct ListOptions {
  // A key prefix within one cached resource prefix: the resource prefix
  // itself (all objects) or a narrower one (e.g. one namespace,
  // "/registry/pods/default/").
  std::string prefix;
  std::string label_selector;
  std::string field_selector;
  // "": the latest state of the store (consistent read: waits until the
  // cache has the store's current revision); "0": any state the cache has;
  // "N": as `match` says.
  std::string resource_version;
  ResourceVersionMatch match = ResourceVersionMatch::kUnset;
  int64_t limit = 0;  // 0: no limit
  // From a previous ListResult; lists the next page at that list's
  // revision. resource_version must be "" with it.
  std::string continue_token;
};

struct ListResult {
  int64_t revision = 0;  // the resourceVersion of the state listed
  std::vector<ObjectRef> objects;  // in key order
  std::string continue_token;      // set when more objects follow
  // Objects after this page, when limited and without a selector (as
  // kube-apiserver's remainingItemCount).
  std::optional<int64_t> remaining_item_count;
};

enum class EventType { kAdded, kModified, kDeleted, kBookmark };

struct WatchEvent {
  EventType type = EventType::kBookmark;
  // The revision of the change (for a deletion: of the delete); for a
  // bookmark, the revision the watcher has seen everything up to.
  int64_t revision = 0;
  // The object after the change; for kDeleted, its last state before it
  // (as Kubernetes sends it); null for bookmarks.
  ObjectRef object;
  // For kModified, the previous state.
  ObjectRef prev_object;
  // The bookmark that ends the initial events of a send_initial_events
  // watch (Kubernetes' "k8s.io/initial-events-end" annotation).
  bool initial_events_end = false;
};

struct WatchOptions {
  std::string prefix;
  std::string label_selector;
  std::string field_selector;
  // "" or "0": start with ADDED events for the current objects, then
  // changes; "N": changes after revision N ("too old resource version" when
  // the cache's history no longer reaches back to N).
  std::string resource_version;
  bool allow_bookmarks = false;
  // Start with ADDED events for the objects (at the latest state, or at one
  // not older than resource_version), then a bookmark marked
  // initial_events_end.
  bool send_initial_events = false;
};

enum class AllocatorKind { kSlab, kMalloc };

struct CacheOptions {
  // The cached resources. Prefixes must not overlap.
  std::vector<ResourceSpec> resources = DefaultResources();

  // Event history, sized like kube-apiserver's cacher: capacity doubles
  // (up to the max) while the ring is full and its oldest event is younger
  // than event_window, and halves (down to the min) when the newest quarter
  // is older than the window. ring_max_bytes bounds what the history alone
  // keeps alive (superseded object versions and snapshot nodes).
  absl::Duration event_window = absl::Seconds(75);
  size_t ring_min_capacity = 100;
  size_t ring_max_capacity = 100 * 1024;
  uint64_t ring_max_bytes = uint64_t{512} << 20;

  // How long List and Watch wait for the cache to reach a requested
  // revision before "Too large resource version".
  absl::Duration wait_timeout = absl::Seconds(3);

  // Watchers: events queued per watcher before it falls back to catching up
  // from the event history; a watcher behind for longer than
  // slow_watcher_budget (or whose next event left the history) is cut off.
  size_t watcher_queue_events = 1024;
  absl::Duration slow_watcher_budget = absl::Seconds(10);
  absl::Duration bookmark_interval = absl::Minutes(1);
  // How often bookmarks and slow watchers are looked at.
  absl::Duration tick_interval = absl::Milliseconds(250);

  // Serve selective Lists from the secondary indexes (off: scan; for
  // benchmarks).
  bool use_indexes = true;

  // Ask the store's watch hub for previous values (prev_kv) and check them
  // against the cache's own previous objects (mismatches are counted in
  // Stats::feed_mismatches). Off by default: the cache already holds every
  // previous object, and a prev_kv watcher makes the store's committer read
  // the previous record of every write, cached prefix or not.
  bool feed_prev_kv = false;

  AllocatorKind allocator = AllocatorKind::kSlab;
  FreeListKind free_list = FreeListKind::kMutex;
};

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_CACHE_TYPES_H_
