// HubWatcher: one watcher of a WatchHub. Internal to watch_hub*.cc.

#ifndef CAPSTAN_MVCC_WATCH_HUB_WATCHER_H_
#define CAPSTAN_MVCC_WATCH_HUB_WATCHER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace capstan::mvcc {

class WatchStream;

// Owned by a WatchHub. The fields down to `serial` are set before the
// watcher is added to the hub (serial by AddWatcherLocked) and never change
// after; the others are guarded by the hub's mu_. (They are not
// ABSL_GUARDED_BY: a watcher reaches the hub's mutex only by a path,
// stream->hub_->mu_, that the analysis cannot equate with the mu_ that
// WatchHub's *Locked methods hold. Only those methods, and WatchStream's
// under the hub's mu_, touch them.)
struct HubWatcher {
  int64_t id = 0;
  WatchStream* stream = nullptr;
  std::string key;
  std::string end;  // with !single: empty means +infinity
  bool single = true;
  bool prev_kv = false, no_put = false, no_delete = false, progress = false, fragment = false;
  uint64_t serial = 0;  // unique per hub: tells a watcher from a later one at the same address

  // Guarded by the hub's mu_.
  int64_t min_rev = 0;  // the next revision this watcher needs
  bool synced = false;
  // Canceled for compaction: in neither set, but its id stays taken until
  // the client cancels it, as in etcd.
  bool compacted = false;
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
