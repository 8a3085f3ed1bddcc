// WatchHub: etcd's watchable store. Delivers committed changes to watchers in
// revision order without ever making a writer or another stream wait.
//
// Watchers are synced (caught up: the committer hands them new events
// directly), or unsynced (behind: the hub's syncer thread reads their missed
// revisions from storage in bounded batches until they catch up). A watcher
// whose stream cannot take more (its send queue is full) is parked: its
// pending events are dropped and it becomes unsynced from the first revision
// it did not get, so it costs O(1) memory and later catches up from storage.
//
// Single-key watchers are found by hash lookup and range watchers through an
// interval index, so the committer's cost per event is proportional to the
// watchers it reaches.
//
// Thread safety: all public methods are thread-safe. Lock order: a
// WatchHub's mu_ before any WatchStream's mu_; no callback runs under
// either.

#ifndef CAPSTAN_MVCC_WATCH_HUB_H_
#define CAPSTAN_MVCC_WATCH_HUB_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "etcdserverpb/rpc.pb.h"

namespace capstan::mvcc {

class KvStore;

// One change committed at one revision, as watchers see it.
struct WatchEvent {
  bool is_delete = false;
  int64_t rev = 0;      // main revision
  std::string key;
  std::string kv;       // encoded KeyValue (for a delete: key and mod_revision)
  std::string prev_kv;  // encoded KeyValue before the change, when has_prev
  bool has_prev = false;
  bool prev_known = false;  // prev_kv was looked up (has_prev says whether one exists)
};

struct WatchHubOptions {
  // Responses a stream may have queued before its watchers are parked.
  size_t stream_queue_messages = 1024;
  size_t stream_queue_bytes = 32 << 20;
  // Responses larger than this are split for watchers that asked for
  // fragments (--max-request-bytes).
  int64_t max_response_bytes = 1572864;
  // Progress notifications for watchers that asked for them
  // (--experimental-watch-progress-notify-interval).
  absl::Duration progress_interval = absl::Minutes(10);
  // Revisions read from storage per catch-up batch.
  int64_t catch_up_batch_revs = 1000;
  // How often the syncer looks at unsynced watchers when nothing wakes it.
  absl::Duration sync_interval = absl::Milliseconds(100);
};

class WatchHub;
struct HubWatcher;

// The server side of one Watch stream: its watchers and its send queue of
// encoded WatchResponse messages.
class WatchStream {
 public:
  ~WatchStream();

  // Handles a WatchCreateRequest: queues the Created response (canceled,
  // with a reason, if the watcher cannot be made) before any event of the
  // new watcher.
  void Create(const etcdserverpb::WatchCreateRequest& req);
  // Cancels a watcher; queues its canceled response. Unknown ids are
  // ignored, as etcd does.
  void Cancel(int64_t watch_id);
  // A WatchProgressRequest: answered with a progress notification once
  // every watcher of the stream is synced.
  void RequestProgress();

  // Takes the next encoded WatchResponse. Returns false if none is queued;
  // the next message is then handed to the deliver function instead.
  bool Pop(std::string* message);
  // Sets the function that receives the next message when the reader found
  // the queue empty (one write in flight at a time: after a message is
  // delivered, the reader calls Pop when it can send again). It runs on a
  // hub or committer thread with the stream's lock held: it must not block
  // and must not call back into the stream. After Close() it is never
  // called again.
  void SetDeliver(std::function<void(std::string)> deliver);

  // Removes every watcher of the stream. Idempotent; the stream queues
  // nothing afterwards.
  void Close();

  size_t num_watchers() const;

 private:
  friend class WatchHub;
  WatchStream(WatchHub* hub, etcdserverpb::ResponseHeader header);

  // Queues a message, or hands it to the waiting reader. REQUIRES: mu_ held.
  void PushLocked(std::string message);
  bool HasRoomLocked() const;

  WatchHub* const hub_;
  const etcdserverpb::ResponseHeader header_;  // cluster_id, member_id, raft_term

  mutable std::mutex mu_;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  bool waiting_ = true;  // the reader found the queue empty: deliver the next message
  bool closed_ = false;
  std::function<void(std::string)> deliver_;
  int64_t next_watch_id_ = 0;  // guarded by the hub's mu_, like by_id_
  // This stream's watchers by id. Guarded by the hub's mu_.
  absl::flat_hash_map<int64_t, HubWatcher*> by_id_;
  bool progress_deferred_ = false;
};

class WatchHub {
 public:
  // store must outlive the hub's syncer: call Stop() before the store is
  // destroyed.
  WatchHub(KvStore* store, WatchHubOptions options);
  ~WatchHub();

  // Stops the syncer thread (unsynced watchers stop catching up).
  // Idempotent. Notify keeps working.
  void Stop();

  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // A new stream; header holds the cluster_id, member_id and raft_term its
  // responses carry.
  std::shared_ptr<WatchStream> OpenStream(const etcdserverpb::ResponseHeader& header);

  // Called by the committer, in revision order, once the changes up to rev
  // are durable and published.
  void Notify(int64_t rev, std::vector<WatchEvent> events);

  // Whether some watcher wants previous values, so the write path should
  // attach them to events.
  bool WantsPrevKv() const { return prev_kv_watchers_.load(std::memory_order_relaxed) > 0; }

  struct Stats {
    size_t synced = 0, unsynced = 0, streams = 0;
    uint64_t events_sent = 0, parked = 0;
  };
  Stats GetStats() const;

 private:
  friend class WatchStream;
  using Watcher = HubWatcher;
  class IntervalIndex;

  void AddWatcherLocked(std::unique_ptr<Watcher> w);
  void RemoveWatcherLocked(Watcher* w);
  void SyncLoop();
  // Reads missed revisions for unsynced watchers; returns true if work remains.
  bool SyncOnce();
  void SendProgressLocked();
  void Deliver(Watcher* w, std::vector<const WatchEvent*>& evs, int64_t header_rev);
  std::vector<std::string> EncodeEvents(Watcher* w, std::vector<const WatchEvent*>& evs,
                                        int64_t header_rev);
  void LookupPrev(WatchEvent* ev);
  bool AllSyncedLocked(WatchStream* s) const;

  KvStore* const store_;
  const WatchHubOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::flat_hash_map<std::string, absl::flat_hash_set<Watcher*>> synced_keys_;
  std::unique_ptr<IntervalIndex> synced_ranges_;
  absl::flat_hash_set<Watcher*> unsynced_;
  absl::flat_hash_map<Watcher*, std::unique_ptr<Watcher>> watchers_;
  absl::flat_hash_set<WatchStream*> streams_;
  int64_t last_notified_rev_ = 0;
  uint64_t next_serial_ = 0;
  bool stopping_ = false;
  absl::Time next_progress_;

  std::atomic<int64_t> prev_kv_watchers_{0};
  std::atomic<uint64_t> events_sent_{0}, parked_{0};
  std::thread syncer_;
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_WATCH_HUB_H_
