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
  // Committed changes (bytes of encoded key-values) the dispatcher may be
  // behind by; beyond it they are dropped and synced watchers parked.
  size_t dispatch_queue_bytes = 64 << 20;
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
  // A WatchProgressRequest: answered, as etcd 3.5 answers it, with a
  // progress notification once every watcher of the stream is synced and
  // every write acknowledged before the request was delivered; a stream
  // without watchers gets no answer.
  void RequestProgress();

  // Takes the next encoded WatchResponse. Returns false if none is queued;
  // the next message is then handed to the deliver function instead.
  // more (optional) says whether others are queued behind it.
  bool Pop(std::string* message, bool* more = nullptr);
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
  WatchStream(WatchHub* hub, const etcdserverpb::ResponseHeader& header);

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
  // REQUIRES: mu_ held.
  void PushControlLocked(const ControlFields& f, int64_t rev);
  // Queues events (fields of one or more whole revisions, in order) for a
  // watcher, under header revision rev: appended to the watcher's events
  // response still queued when the result stays under max_bytes, else a
  // new response; a watcher that asked for fragments gets responses of at
  // most max_bytes (each at least one event) marked as etcd marks them.
  // REQUIRES: mu_ held.
  void PushEventsLocked(int64_t watch_id, int64_t rev, const std::vector<const std::string*>& fields,
                        bool fragment, size_t max_bytes);
  // Queues an entry, or hands it encoded to the waiting reader.
  void PushLocked(Queued q);
  // REQUIRES: mu_ held, queue_ not empty.
  void PopLocked(std::string* message);
  std::string EncodeLocked(const Queued& q) const;
  std::string EncodeHeader(int64_t rev) const;
  bool HasRoomLocked() const;

  WatchHub* const hub_;
  // The response header's fields other than the revision, encoded:
  // cluster_id (1) and member_id (2) before it, raft_term (4) after it.
  std::string header_prefix_, header_suffix_;

  mutable std::mutex mu_;
  std::deque<Queued> queue_;
  uint64_t popped_ = 0;  // entries ever popped: queue_[i] is entry popped_ + i
  // Watch id -> number of its events entry that may still take events.
  absl::flat_hash_map<int64_t, uint64_t> open_events_;
  size_t queued_bytes_ = 0;
  bool waiting_ = true;  // the reader found the queue empty: deliver the next message
  bool closed_ = false;
  std::function<void(std::string)> deliver_;
  int64_t next_watch_id_ = 0;  // guarded by the hub's mu_, like by_id_
  // This stream's watchers by id. Guarded by the hub's mu_.
  absl::flat_hash_map<int64_t, HubWatcher*> by_id_;
  // A progress request waits; guarded by the hub's mu_.
  bool progress_deferred_ = false;
  // The revision its answer must cover; guarded by the hub's mu_.
  int64_t progress_rev_ = 0;
};

class WatchHub {
 public:
  // store must outlive the hub's syncer: call Stop() before the store is
  // destroyed.
  WatchHub(KvStore* store, WatchHubOptions options);
  ~WatchHub();

  // Stops the syncer thread (unsynced watchers stop catching up) and the
  // dispatcher once it has delivered what is queued. Idempotent. Notify
  // keeps working: it then delivers on the caller's thread.
  void Stop();

  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // A new stream; header holds the cluster_id, member_id and raft_term its
  // responses carry.
  std::shared_ptr<WatchStream> OpenStream(const etcdserverpb::ResponseHeader& header);

  // Called by the committer, in revision order, once the changes up to rev
  // are durable and published. Queues them for the dispatcher; never waits
  // for a watcher. A group that reaches few watchers while the dispatcher
  // is idle is delivered here at once, sparing the thread hand-off.
  void Notify(int64_t rev, std::vector<WatchEvent> events);

  // Whether some watcher wants previous values, so the write path should
  // attach them to events.
  bool WantsPrevKv() const { return prev_kv_watchers_.load(std::memory_order_relaxed) > 0; }

  // Holds the dispatcher (committed changes queue up, and are dropped past
  // dispatch_queue_bytes) until called with false.
  void TEST_PauseDispatcher(bool paused);

  struct Stats {
    size_t synced = 0, unsynced = 0, streams = 0;
    uint64_t events_sent = 0, parked = 0, dropped = 0;
  };
  Stats GetStats() const;

 private:
  friend class WatchStream;
  using Watcher = HubWatcher;
  class IntervalIndex;

  // One group of changes from the committer.
  struct Pending {
    int64_t rev = 0;
    std::vector<WatchEvent> events;
  };

  void AddWatcherLocked(std::unique_ptr<Watcher> w);
  void RemoveWatcherLocked(Watcher* w);
  void MakeSyncedLocked(Watcher* w);
  void MakeUnsyncedLocked(Watcher* w, int64_t min_rev);
  void DispatchLoop();
  // Delivers groups to synced watchers; dropped_to > 0 first parks every
  // synced watcher at dropped_from (the changes up to dropped_to were
  // dropped). REQUIRES: called by one thread at a time, in revision order.
  // Returns the number of responses it queued.
  size_t Dispatch(std::vector<Pending>& groups, int64_t dropped_from, int64_t dropped_to);
  // Delivers the groups if they reach at most max_watchers synced
  // watchers and, when max_backlog_bytes is set, none of their streams has
  // that many bytes queued; false (nothing done) otherwise. Adds the
  // responses queued to *delivered. REQUIRES: mu_ held, previous values
  // already attached.
  bool DispatchLocked(std::vector<Pending>& groups, size_t max_watchers, size_t* delivered,
                      size_t max_backlog_bytes = SIZE_MAX);
  void SyncLoop();
  // Reads missed revisions for unsynced watchers; returns true if work remains.
  bool SyncOnce();
  void SendProgressLocked();
  void AnswerDeferredProgressLocked();
  void Deliver(Watcher* w, const std::vector<const WatchEvent*>& evs, int64_t header_rev);
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
  uint64_t dispatch_round_ = 0;  // DispatchLocked calls so far
  bool stopping_ = false;
  absl::Time next_progress_;

  // The dispatcher's queue. pending_mu_ is a leaf: never held with mu_.
  std::mutex pending_mu_;
  std::condition_variable pending_cv_;
  std::deque<Pending> pending_;         // guarded by pending_mu_
  size_t pending_bytes_ = 0;            // guarded by pending_mu_
  int64_t dropped_from_ = 0;            // guarded by pending_mu_
  int64_t dropped_to_ = 0;              // guarded by pending_mu_ (0: nothing dropped)
  bool dispatch_stopping_ = false;      // guarded by pending_mu_
  bool dispatch_paused_ = false;        // guarded by pending_mu_
  bool dispatching_ = false;            // a batch is being delivered; guarded by pending_mu_
  bool dispatcher_exited_ = false;      // guarded by pending_mu_
  std::mutex inline_dispatch_mu_;       // orders Notify's own deliveries after Stop()
  std::thread dispatcher_;

  // The revision of the last group handed to Notify: every acknowledged
  // write is at or below it.
  std::atomic<int64_t> notified_rev_{0};
  std::atomic<int64_t> prev_kv_watchers_{0};
  std::atomic<uint64_t> events_sent_{0}, parked_{0}, dropped_{0};
  std::thread syncer_;
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_WATCH_HUB_H_
