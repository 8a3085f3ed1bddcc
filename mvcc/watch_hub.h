// WatchHub: etcd's watchable store. Delivers committed changes to watchers in
// revision order without ever making a writer or another stream wait.
//
// The committer hands each group's changes to Notify, which only queues
// them: the hub's dispatcher thread fans them out to synced watchers, so a
// write never waits for delivery. A dispatcher that is behind takes several
// revisions at once and sends each watcher one response holding all of them
// (etcd's unsynced watchers are batched the same way); a stream whose
// writer is busy merges a watcher's new events into that watcher's response
// still in its queue. If the dispatcher falls more than
// dispatch_queue_bytes behind, the queued changes are dropped and every
// synced watcher is parked (below), so memory stays bounded.
//
// Watchers are synced (caught up: the dispatcher hands them new events
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
// Storage is never read under the hub's lock: previous values the write
// path did not attach are read by the syncer with no hub lock held (a
// watcher that needs one is caught up from storage, like a parked one).
//
// Thread safety: all public methods are thread-safe. Locks (each declared
// with its order below): a WatchHub's inline_dispatch_mu_, then its mu_,
// then one WatchStream's mu_; the hub's pending_mu_ and test_mu_ are
// leaves. The only call out under them is a stream's deliver function
// (WatchStream::SetDeliver), which must not block.

#ifndef CAPSTAN_MVCC_WATCH_HUB_H_
#define CAPSTAN_MVCC_WATCH_HUB_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "etcdserverpb/rpc.pb.h"
#include "util/mutex.h"

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

  // The event as field 11 of a WatchResponse, without and with prev_kv;
  // encoded once, on first use, by the one thread delivering the event.
  mutable std::string field, field_with_prev;
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
  // After a batch that queued more than this many responses, the
  // dispatcher waits dispatch_pause before taking the next one, so that a
  // wide fan-out sends each watcher fewer, larger responses instead of
  // one per revision.
  size_t dispatch_wide_fanout = 256;
  absl::Duration dispatch_pause = absl::Milliseconds(25);
  // Revisions read from storage per catch-up batch.
  int64_t catch_up_batch_revs = 1000;
  // How often the syncer looks at unsynced watchers when nothing wakes it.
  absl::Duration sync_interval = absl::Milliseconds(100);
  // The least time from the start of a syncer pass that caught watchers
  // up to the start of the next: a watcher that arrives while the syncer
  // is idle is caught up at once, while a burst of them (10,000 watchers
  // created from a past revision) is caught up in passes of many instead
  // of a pass for every few (etcd syncs every 100 ms).
  absl::Duration sync_gap = absl::Milliseconds(20);
  // Committed changes (bytes of encoded key-values) the dispatcher may be
  // behind by; beyond it they are dropped and synced watchers parked.
  size_t dispatch_queue_bytes = 64 << 20;
};

class WatchStream;
struct HubWatcher;

class WatchHub {
 public:
  // store must outlive the hub's syncer: call Stop() before the store is
  // destroyed.
  WatchHub(KvStore* store, WatchHubOptions options);
  ~WatchHub();

  // Stops the syncer thread (unsynced watchers stop catching up) and the
  // dispatcher once it has delivered what is queued. Idempotent. Notify
  // keeps working: it then delivers on the caller's thread.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, pending_mu_);

  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // A new stream; header holds the cluster_id, member_id and raft_term its
  // responses carry. An internal stream (the watch cache's feed) is left out
  // of the client-facing counts of GetStats.
  enum class StreamUse { kClient, kInternal };
  std::shared_ptr<WatchStream> OpenStream(const etcdserverpb::ResponseHeader& header,
                                          StreamUse use = StreamUse::kClient)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Called by the committer, in revision order, once the changes up to rev
  // are durable and published. Queues them for the dispatcher; never waits
  // for a watcher or for storage. A group that reaches few watchers while
  // the dispatcher is idle is delivered here at once, sparing the thread
  // hand-off.
  void Notify(int64_t rev, std::vector<WatchEvent> events)
      ABSL_LOCKS_EXCLUDED(mu_, pending_mu_, inline_dispatch_mu_);

  // Called by the committer after the store's data was replaced (a Raft
  // snapshot restored): every watcher catches up from storage, from
  // from_rev (or the first revision queued and not yet delivered) on, as
  // after a dropped queue; a watcher whose revision was compacted away is
  // cancelled as compacted. to_rev is the new store's revision.
  void Resync(int64_t from_rev, int64_t to_rev) ABSL_LOCKS_EXCLUDED(pending_mu_);

  // Whether some watcher wants previous values, so the write path should
  // attach them to events.
  bool WantsPrevKv() const { return prev_kv_watchers_.load(std::memory_order_relaxed) > 0; }

  // Holds the dispatcher (committed changes queue up, and are dropped past
  // dispatch_queue_bytes) until called with false.
  void TEST_PauseDispatcher(bool paused) ABSL_LOCKS_EXCLUDED(pending_mu_);
  // Calls hook(point), on the thread that gets there, at each named point
  // (null: none). Points: "WatchHub::LookupPrev" (before each storage read
  // of a previous value), "WatchHub::Notify:BeforeDispatchLock" (Notify is
  // about to take mu_ to deliver on the committer's thread),
  // "WatchStream::Create:AfterStoreRev" (Create has read the store's
  // revision and is about to take mu_). The hook may block; it runs with
  // none of the hub's locks held.
  void TEST_SetSyncPoint(std::function<void(std::string_view point)> hook)
      ABSL_LOCKS_EXCLUDED(test_mu_);

  // The clients' streams and watchers (internal streams left out): synced
  // and unsynced watchers, streams, events sent; and the hub's slow-stream
  // counts.
  struct Stats {
    size_t synced = 0, unsynced = 0, streams = 0;
    uint64_t events_sent = 0, parked = 0, dropped = 0;
    uint64_t sync_passes = 0;  // syncer passes that caught watchers up
  };
  Stats GetStats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class WatchStream;
  using Watcher = HubWatcher;
  class IntervalIndex;

  // One group of changes from the committer.
  struct Pending {
    int64_t rev = 0;
    std::vector<WatchEvent> events;
  };

  // A stream's watchers and its progress request, as the hub sees them.
  struct StreamWatchers {
    absl::flat_hash_map<int64_t, Watcher*> by_id;
    int64_t next_watch_id = 0;
    // A progress request of a synced stream waits for the hub to reach
    // progress_rev.
    bool progress_deferred = false;
    int64_t progress_rev = 0;
  };

  void AddWatcherLocked(std::unique_ptr<Watcher> w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWatcherLocked(Watcher* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MakeSyncedLocked(Watcher* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MakeUnsyncedLocked(Watcher* w, int64_t min_rev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DispatchLoop() ABSL_LOCKS_EXCLUDED(mu_, pending_mu_);
  // Delivers groups to synced watchers; dropped_to > 0 first parks every
  // synced watcher at dropped_from (the changes up to dropped_to were
  // dropped). REQUIRES: called by one thread at a time, in revision order
  // (the dispatcher, or Notify under inline_dispatch_mu_ after Stop()).
  // Returns the number of responses it queued.
  size_t Dispatch(std::vector<Pending>& groups, int64_t dropped_from, int64_t dropped_to)
      ABSL_LOCKS_EXCLUDED(mu_, pending_mu_);
  // Delivers the groups if they reach at most max_watchers synced
  // watchers and, when max_backlog_bytes is set, none of their streams has
  // that many bytes queued; false (nothing done) otherwise. Adds the
  // responses queued to *delivered. A watcher that wants a previous value
  // the write path did not attach is made unsynced at its first event in
  // the groups instead: the syncer reads the value, outside mu_.
  bool DispatchLocked(std::vector<Pending>& groups, size_t max_watchers, size_t* delivered,
                      size_t max_backlog_bytes = SIZE_MAX) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads missed revisions for unsynced watchers; returns true if the pass
  // was cut short by catch_up_batch_revs and work remains. Sets
  // *caught_up when it read revisions for some watcher.
  bool SyncOnce(bool* caught_up) ABSL_LOCKS_EXCLUDED(mu_);
  void SendProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AnswerDeferredProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues evs for w. REQUIRES: previous values known, if w wants them.
  void DeliverLocked(Watcher* w, const std::vector<const WatchEvent*>& evs, int64_t header_rev)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads ev's previous value from storage. Never under mu_: a read may
  // wait on the disk, and nothing else of the hub would move meanwhile.
  void LookupPrev(WatchEvent* ev) ABSL_LOCKS_EXCLUDED(mu_);
  bool AllSyncedLocked(WatchStream* s) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The stream's watchers; null once the stream is closed.
  StreamWatchers* StreamWatchersLocked(WatchStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TestSyncPoint(std::string_view point) ABSL_LOCKS_EXCLUDED(test_mu_);

  KvStore* const store_;
  const WatchHubOptions options_;

  // Serializes Notify's own deliveries once the dispatcher has exited
  // (after Stop()). Lock order: before mu_.
  util::Mutex inline_dispatch_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  // The watchers and streams. Lock order: before any WatchStream's mu_ (at
  // most one at a time). Storage is never read under it (LookupPrev).
  // It also guards every HubWatcher's mutable fields (watch_hub_watcher.h),
  // which the analysis cannot tie to it.
  mutable util::Mutex mu_;
  absl::flat_hash_map<std::string, absl::flat_hash_set<Watcher*>> synced_keys_
      ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<IntervalIndex> synced_ranges_ ABSL_PT_GUARDED_BY(mu_);
  absl::flat_hash_set<Watcher*> unsynced_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Watcher*, std::unique_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<WatchStream*, StreamWatchers> streams_ ABSL_GUARDED_BY(mu_);
  int64_t last_notified_rev_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dispatch_round_ ABSL_GUARDED_BY(mu_) = 0;  // DispatchLocked calls so far
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Wakes the syncer: unsynced watchers may be able to catch up.
  bool sync_wanted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time next_progress_ ABSL_GUARDED_BY(mu_);

  // The dispatcher's queue. A leaf: never held with another lock.
  util::Mutex pending_mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(pending_mu_);
  size_t pending_bytes_ ABSL_GUARDED_BY(pending_mu_) = 0;
  int64_t dropped_from_ ABSL_GUARDED_BY(pending_mu_) = 0;
  int64_t dropped_to_ ABSL_GUARDED_BY(pending_mu_) = 0;  // 0: nothing dropped
  bool dispatch_stopping_ ABSL_GUARDED_BY(pending_mu_) = false;
  bool dispatch_paused_ ABSL_GUARDED_BY(pending_mu_) = false;
  // A batch is being delivered (by the dispatcher or inline by Notify).
  bool dispatching_ ABSL_GUARDED_BY(pending_mu_) = false;
  bool dispatcher_exited_ ABSL_GUARDED_BY(pending_mu_) = false;
  std::thread dispatcher_;

  // TEST_SetSyncPoint's hook. A leaf: the hook is called with it released.
  util::Mutex test_mu_;
  std::function<void(std::string_view)> test_sync_point_ ABSL_GUARDED_BY(test_mu_);
  std::atomic<bool> has_test_sync_point_{false};

  // The revision of the last group handed to Notify: every acknowledged
  // write is at or below it.
  std::atomic<int64_t> notified_rev_{0};
  std::atomic<int64_t> prev_kv_watchers_{0};
  std::atomic<uint64_t> events_sent_{0}, parked_{0}, dropped_{0}, sync_passes_{0};
  std::thread syncer_;
};

// The server side of one Watch stream: its watchers and its send queue of
// encoded WatchResponse messages.
class WatchStream {
 public:
  ~WatchStream();

  // Handles a WatchCreateRequest: queues the Created response (canceled,
  // with a reason, if the watcher cannot be made) before any event of the
  // new watcher.
  void Create(const etcdserverpb::WatchCreateRequest& req) ABSL_LOCKS_EXCLUDED(hub_->mu_, mu_);
  // Cancels a watcher; queues its canceled response. Unknown ids are
  // ignored, as etcd does.
  void Cancel(int64_t watch_id) ABSL_LOCKS_EXCLUDED(hub_->mu_, mu_);
  // A WatchProgressRequest, as etcd 3.5.16 takes it: dropped unless every
  // watcher of the stream is synced (none catching up, parked, or canceled
  // for compaction but not by the client); else answered with a progress
  // notification once the hub has every write acknowledged before the
  // request was delivered (and dropped if a watcher fell behind meanwhile).
  // A stream without watchers gets no answer.
  void RequestProgress() ABSL_LOCKS_EXCLUDED(hub_->mu_, mu_);

  // Takes the next encoded WatchResponse. Returns false if none is queued;
  // the next message is then handed to the deliver function instead.
  // more (optional) says whether others are queued behind it.
  bool Pop(std::string* message, bool* more = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets the function that receives the next message when the reader found
  // the queue empty (one write in flight at a time: after a message is
  // delivered, the reader calls Pop when it can send again). It runs on a
  // hub or committer thread with the stream's lock (and possibly the hub's)
  // held: it must not block, must not take a lock that may be held while
  // calling into the stream or the hub, and must not call back into the
  // stream. After Close() it is never called again.
  void SetDeliver(std::function<void(std::string)> deliver) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes every watcher of the stream. Idempotent; the stream queues
  // nothing afterwards.
  void Close() ABSL_LOCKS_EXCLUDED(hub_->mu_, mu_);

  size_t num_watchers() const ABSL_LOCKS_EXCLUDED(hub_->mu_);

 private:
  friend class WatchHub;
  WatchStream(WatchHub* hub, const etcdserverpb::ResponseHeader& header, bool internal);

  // A response other than events: Created, canceled, progress.
  struct ControlFields {
    int64_t watch_id = 0;
    bool created = false, canceled = false;
    int64_t compact_revision = 0;
    std::string cancel_reason;
  };
  // An entry of the send queue: an encoded response, or the event fields of
  // one watcher's events response, encoded when popped so that later events
  // of that watcher can still be appended.
  struct Queued {
    std::string bytes;
    int64_t watch_id = 0;
    int64_t header_rev = 0;
    bool events = false;
  };

  // Queues a control response for header revision rev. It closes the
  // watcher's queued events response: later events go after it.
  void PushControlLocked(const ControlFields& f, int64_t rev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues events (fields of one or more whole revisions, in order) for a
  // watcher, under header revision rev: appended to the watcher's events
  // response still queued when the result stays under max_bytes, else a
  // new response; a watcher that asked for fragments gets responses of at
  // most max_bytes (each at least one event) marked as etcd marks them.
  void PushEventsLocked(int64_t watch_id, int64_t rev, const std::vector<const std::string*>& fields,
                        bool fragment, size_t max_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues an entry, or hands it encoded to the waiting reader.
  void PushLocked(Queued q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: queue_ not empty.
  void PopLocked(std::string* message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Encode(const Queued& q) const;
  std::string EncodeHeader(int64_t rev) const;
  bool HasRoomLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  WatchHub* const hub_;
  const bool internal_;  // OpenStream's StreamUse::kInternal
  // The response header's fields other than the revision, encoded:
  // cluster_id (1) and member_id (2) before it, raft_term (4) after it.
  std::string header_prefix_, header_suffix_;

  // The send queue. Lock order: after the hub's mu_; a leaf otherwise (the
  // deliver function runs under it). The stream's watchers are the hub's,
  // under the hub's mu_ (WatchHub::streams_).
  mutable util::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  // Entries ever popped: queue_[i] is entry popped_ + i.
  uint64_t popped_ ABSL_GUARDED_BY(mu_) = 0;
  // Watch id -> number of its events entry that may still take events.
  absl::flat_hash_map<int64_t, uint64_t> open_events_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The reader found the queue empty: deliver the next message.
  bool waiting_ ABSL_GUARDED_BY(mu_) = true;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(std::string)> deliver_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_WATCH_HUB_H_
