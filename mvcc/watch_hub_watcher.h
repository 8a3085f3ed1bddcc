// HubWatcher: one watcher of a WatchHub. Internal to watch_hub*.cc.

#ifndef CAPSTAN_MVCC_WATCH_HUB_WATCHER_H_
#define CAPSTAN_MVCC_WATCH_HUB_WATCHER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace capstan::mvcc {

class WatchStream;

// Guarded by the hub's mu_.
struct HubWatcher {
  int64_t id = 0;
  WatchStream* stream = nullptr;
  std::string key;
  std::string end;  // with !single: empty means +infinity
  bool single = true;
  int64_t min_rev = 0;  // the next revision this watcher needs
  uint64_t serial = 0;  // unique per hub: tells a watcher from a later one at the same address
  bool synced = false;
  // Canceled for compaction: in neither set, but its id stays taken until
  // the client cancels it, as in etcd.
  bool compacted = false;
  bool prev_kv = false, no_put = false, no_delete = false, progress = false, fragment = false;
  // Events were queued since the last periodic progress tick: etcd skips
  // the watcher's next notification.
  bool events_since_progress = false;
  // Where the dispatch under way collects this watcher's events: its slot,
  // valid while dispatch_round is the hub's current round.
  uint64_t dispatch_round = 0;
  size_t dispatch_slot = 0;

  bool Matches(std::string_view k) const {
    if (single) return k == key;
    return k >= key && (end.empty() || k < end);
  }
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_WATCH_HUB_WATCHER_H_
