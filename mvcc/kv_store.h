// KvStore: etcd's multi-version key-value store on a Capstan backend.
//
// Writes (Put, DeleteRange, Txn, Compact) are applied by one committer thread
// in submission order. The committer assigns revisions, stages a group of
// writes into one backend batch (group commit), writes it durably, then
// publishes the new state to readers and only then completes each request.
// Nothing is visible to readers before it is durable.
//
// Reads take the published ReadView (an O(1) snapshot of the key index plus
// the revision it reflects) and read stored records by revision. They never
// wait for a commit, never take a lock that a writer holds while working, and
// never block writers.
//
// Thread safety: every public method may be called from any thread.

#ifndef CAPSTAN_MVCC_KV_STORE_H_
#define CAPSTAN_MVCC_KV_STORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcdserverpb/rpc.pb.h"
#include "index/tree_index.h"
#include "lease/lessor.h"
#include "mvcc/apply_timings.h"
#include "mvcc/kv_codec.h"
#include "mvcc/write_request.h"
#include "storage/backend.h"
#include "util/latency_histogram.h"
#include "util/mutex.h"

namespace capstan::mvcc {

using index::Revision;
class WatchHub;
struct WatchEvent;

struct KvStoreOptions {
  // The most write requests one group commit holds (--backend-batch-limit).
  int batch_limit = 10000;
  // How long the committer waits for a group to grow once it has a request
  // (--backend-batch-interval). Zero: commit whatever is queued at once;
  // requests arriving during a commit form the next group anyway.
  absl::Duration batch_interval = absl::ZeroDuration();
  // A write submitted with no write log between (a store without one, or a
  // sole voter's direct write: StartDirectWrites) is committed by the
  // submitting thread when no group is being committed: that thread takes
  // the committer's part, commits what is queued group by group until
  // nothing is, and answers each group itself, while writes submitted
  // meanwhile only queue (the leader and followers of RocksDB's write
  // groups). No thread is woken to commit a group or to answer it. A thread
  // that waits for its own write (Put, Txn and the other blocking
  // conveniences) commits only that write's group and leaves what was
  // queued meanwhile to the committer thread. A thread that commits submits
  // nothing while its group syncs, so a lone thread keeping many writes in
  // flight gets groups of one: leave it off for such a submitter
  // (capstan_mvcc_benchmark's BM_Put). Off, or with a
  // batch_interval: the committer thread commits every group. A write's
  // done must then not wait for another write of the store: it may run on
  // the thread that commits.
  bool inline_commit = false;
  // Most operations in one txn branch (--max-txn-ops).
  int max_txn_ops = 128;
  // Largest write request accepted, in encoded bytes (--max-request-bytes).
  int64_t max_request_bytes = 1572864;
  // Revisions deleted per backend batch by physical compaction and the pause
  // between batches (--experimental-compaction-batch-limit and
  // --experimental-compaction-sleep-interval).
  int compaction_batch_limit = 1000;
  absl::Duration compaction_sleep_interval = absl::Milliseconds(10);
  // An apply that takes longer is logged and counted as slow
  // (--warning-apply-duration; mvcc/apply_timings.h).
  absl::Duration warning_apply_duration = absl::Milliseconds(100);
  // Expired leases revoked per second at most (--lease-revoke-rate).
  int64_t lease_revoke_rate = 1000;
  // A lease granted a shorter TTL gets this one (etcd's minimum, derived
  // from --election-timeout and --heartbeat-interval).
  int64_t min_lease_ttl_seconds = lease::Lessor::kMinTtlSeconds;
  // How often expired leases are looked for.
  absl::Duration lease_check_interval = absl::Milliseconds(500);
  // The clock lease TTLs and deadlines are measured by (tests pass a
  // lease::ManualClock). Not owned; must outlive the store.
  const lease::Clock* lease_clock = lease::Clock::Monotonic();
  // The high 16 bits of lease ids the store picks (etcd uses its member id).
  uint16_t lease_id_prefix = 0;
  // Backend size above which writes that add data raise the NOSPACE alarm
  // and are refused (--quota-backend-bytes); 0: no quota.
  int64_t quota_bytes = 0;
  // The member raising alarms (the NOSPACE alarm names it).
  uint64_t member_id = 0;
  // A cluster member's store: every write is ordered by the write log
  // (SetWriteLog), and until there is one, Submit answers "no leader" and
  // leases do not expire, so that nothing is applied on this member alone.
  bool requires_write_log = false;
  // Tests only: every put this member applies stores its value with this
  // appended, so that its data differs from its peers'
  // (CAPSTAN_FAILPOINTS=corrupt-values). The corruption checks must catch it.
  std::string failpoint_value_suffix;
};

// What a reader sees: one published, durable state of the store.
struct ReadView {
  index::IndexSnapshot index;
  int64_t rev = 0;          // the store's revision
  int64_t compact_rev = 0;  // reads below this revision answer ErrCompacted
  // A compaction was ever scheduled (etcd's compactMainRev is no longer -1):
  // a store compacted at 0 refuses another compaction at 0.
  bool compacted = false;
  // Held by every reader of this view; physical compaction waits for the
  // readers of views published before it was scheduled to finish.
  std::shared_ptr<const void> epoch;
};

// Lets a big Range read its records on more than one thread. The records
// (of a Range that neither sorts nor filters, with more than part_records of
// them) are cut into parts of part_records; each part is written into its own
// sink from new_sink, and run(task) is called `helpers` times to offer the
// work to other threads. The calling thread reads every part that no helper
// has claimed, so a helper that starts late, or never, costs nothing; a task
// that starts after the Range is over returns at once. Both functions must
// be safe to call from any thread.
struct ParallelRead {
  std::function<std::unique_ptr<ByteSink>()> new_sink;
  std::function<void(std::function<void()> task)> run;
  int helpers = 1;
  size_t part_records = 8192;
};

// The result of a Range: stored records ready to be sent.
struct RangeResult {
  int64_t rev = 0;    // header revision: the store's current revision
  int64_t count = 0;  // keys in the range at the read revision (before filters)
  bool more = false;
  int num_kvs = 0;
  // The returned KeyValues, each encoded as field 2 of a RangeResponse
  // (length-delimited, in order): appending these bytes to an encoded
  // RangeResponse adds the kvs without decoding them.
  std::string kvs_wire;
  // When the caller sets it, the kvs go here instead of kvs_wire, in the
  // same encoding (a big read writes them into reusable blocks).
  ByteSink* kvs_sink = nullptr;
  // When the caller sets it and the Range is split into parts, the kvs are
  // in kvs_parts instead, in order (the bytes of kvs_sink, if any, first).
  const ParallelRead* parallel = nullptr;
  std::vector<std::unique_ptr<ByteSink>> kvs_parts;
};

// A write request's shape, checked as etcd's gRPC layer checks it before
// anything else, auth included (v3rpc's checkPutRequest, checkDeleteRequest,
// checkTxnRequest and checkIntervals): a key, no value with ignore_value,
// no lease with ignore_lease, the txn op limit, no key written twice in one
// txn. A service calls these first so that a malformed request gets its own
// error rather than an auth one, and marks the write validated; the committer
// checks every other write when it applies it. A compaction has nothing to
// check.
absl::Status ValidateWrite(const etcdserverpb::PutRequest& r, int max_txn_ops);
absl::Status ValidateWrite(const etcdserverpb::DeleteRangeRequest& r, int max_txn_ops);
absl::Status ValidateWrite(const etcdserverpb::TxnRequest& r, int max_txn_ops);
absl::Status ValidateWrite(const etcdserverpb::CompactionRequest& r, int max_txn_ops);

class KvStore : public WriteLog {
 public:
  // Opens the store on backend, rebuilding the key index from it and
  // resuming an interrupted compaction.
  static absl::StatusOr<std::unique_ptr<KvStore>> Open(const KvStoreOptions& options,
                                                       std::unique_ptr<storage::Backend> backend);

  // Stops the committer after the requests already queued are done; later
  // submissions fail with Error::kStopped.
  ~KvStore();

  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // The latest published view. Cheap; never blocks on the committer.
  std::shared_ptr<const ReadView> View() const;

  // Serves a Range with etcd's semantics from the latest published view.
  absl::Status Range(const etcdserverpb::RangeRequest& req, RangeResult* result) const;

  // Queues a write for the committer (mvcc/write_request.h has the
  // contract), or commits it on the calling thread (inline_commit). A write
  // submitted after the store began to stop is answered Error::kStopped at
  // once.
  // With a write log set (SetWriteLog) a write from a service goes to it
  // to be ordered, and comes back through SubmitCommitted once committed.
  void Submit(WriteRequest write) override ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Queues a write the write log committed (or one of the store's own
  // steps) for the committer, in the order of calls.
  void SubmitCommitted(WriteRequest write) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Calls ready once a read served afterwards is linearizable (the write
  // log's ReadBarrier; at once without one).
  void ReadBarrier(absl::AnyInvocable<void(absl::Status)> ready) override;
  // Renews the lease here, or through the write log where it keeps leases
  // alive (a cluster's leader).
  void RenewLease(int64_t id, absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) override;
  // The lease's TTLs from this store's lessor, or through the write log
  // from the member that keeps leases alive (a cluster's leader).
  void LeaseTimeToLive(const etcdserverpb::LeaseTimeToLiveRequest& request,
                       LeaseTimeToLiveDone done) override;
  // Whether this member does the leader-only work: its write log's answer;
  // without one, true unless the store requires a log.
  bool Leads() const override;

  // Where the store's own writes go (the revocations of expired leases),
  // and whether this member expires leases at all (WriteLog::Leads): in a
  // cluster the Raft log, so that every member revokes the same leases at
  // the same index and only the leader decides to. The log hears of every
  // applied index (WriteLog::Applied). Null (the default): the store
  // itself. The log must outlive the store or be reset to null. With
  // KvStoreOptions::requires_write_log, writes submitted before a log is
  // set are refused and no lease expires.
  void SetWriteLog(WriteLog* log) { write_log_.store(log, std::memory_order_release); }

  // Blocking conveniences over Submit, for tests and tools.
  absl::StatusOr<etcdserverpb::PutResponse> Put(const etcdserverpb::PutRequest& req);
  absl::StatusOr<etcdserverpb::DeleteRangeResponse> DeleteRange(
      const etcdserverpb::DeleteRangeRequest& req);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& req);
  absl::StatusOr<etcdserverpb::CompactionResponse> Compact(
      const etcdserverpb::CompactionRequest& req);
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(
      const etcdserverpb::LeaseGrantRequest& req);
  absl::StatusOr<etcdserverpb::LeaseRevokeResponse> LeaseRevoke(
      const etcdserverpb::LeaseRevokeRequest& req);
  absl::StatusOr<etcdserverpb::AlarmResponse> Alarm(const etcdserverpb::AlarmRequest& req);

  // etcd 3.5.16's HashKV (hashStorage.HashByRev): the hash a compaction at
  // exactly rev stored, if one of the last ten did; else CRC-32C of the key
  // family's records up to rev (0: the current revision), skipping revisions
  // at or below the compaction revision that compaction no longer keeps and
  // a tombstone at the compaction revision; kCompacted only below the
  // compaction revision. Equal data and history give equal hashes (and equal
  // to etcd's for byte-identical records).
  absl::Status HashKV(int64_t rev, uint32_t* hash, int64_t* compact_rev, int64_t* hash_rev) const;
  // CRC-32C of every record of every column family (Maintenance.Hash).
  absl::StatusOr<uint32_t> Hash() const;
  // The active alarms.
  std::vector<etcdserverpb::AlarmMember> Alarms() const;
  bool NoSpace() const;
  // Whether a CORRUPT alarm (of any member) is active.
  bool Corrupt() const;
  // OK while the store accepts writes. After the backend failed a write (an
  // I/O error, a failed fsync, a full disk) the error that stopped it, for
  // good: every later write is refused (fail-stop) and reads go on serving
  // the last durable state. A full disk also raises the NOSPACE alarm (held
  // in memory only: it cannot be written). Restarting the process recovers.
  absl::Status StorageFailure() const;
  // Compacts the backend fully, reclaiming the space of deleted data, while
  // reads and writes go on (Maintenance.Defragment).
  absl::Status Defragment();

  // The leases; keep-alives and reads go to it directly.
  lease::Lessor* lessor() { return &lessor_; }

  // Sends every committed change to hub from now on, in revision order,
  // after it is durable and published. Pass null to stop. The hub must stay
  // alive until it is detached or the store is destroyed.
  void SetWatchHub(WatchHub* hub) { hub_.store(hub, std::memory_order_release); }

  // Re-checks each write as it is applied (WriteGuard). Pass null to stop.
  // The guard must stay alive until it is detached or the store destroyed.
  void SetWriteGuard(WriteGuard* guard) { guard_.store(guard, std::memory_order_release); }

  // The Raft index of the write the committer is applying (0: one not from
  // a log). REQUIRES: called on the committer thread, from a CustomOp.
  uint64_t ApplyingIndex() const { return applying_index_; }

  // Blocks until the compaction scheduled most recently has deleted its
  // revisions from the backend.
  void WaitCompactionDone() ABSL_LOCKS_EXCLUDED(compact_mu_);

  // Test hook: runs on the committer, with the queue's lock held, each time
  // it begins to wait for a group to fill (--backend-batch-interval). It
  // must not call into the store.
  void TEST_SetGroupWaitHook(std::function<void()> hook) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Test hook: runs on the committer, with no lock held, before it applies
  // each group it took (null: none). It may block, holding back this
  // store's apply while the rest of the member goes on.
  void TEST_SetBeforeApplyHook(std::function<void()> hook) ABSL_LOCKS_EXCLUDED(queue_mu_);

  // Test hook: calls hook(point) on the compactor thread at each named point
  // (null: none): "KvStore::RunCompaction:Start" (a compaction begins,
  // before it reads the index), "KvStore::RunCompaction:AfterIndexBatch" (a
  // batch of the index step is done, or was refused because the store is
  // stopping), "KvStore::CompactionLoop:Exit" (the compactor thread is about
  // to end). The hook may block; it runs with none of the store's locks held.
  void TEST_SetCompactionSyncPoint(std::function<void(std::string_view point)> hook)
      ABSL_LOCKS_EXCLUDED(test_mu_);

  // Replaces the store's data with source's (a checkpoint of another
  // member's store, received with a Raft snapshot): every column family of
  // the backend is made equal to source's, durably, between two groups on
  // the committer; then the key index, current and compaction revisions,
  // leases, alarms and applied index are rebuilt from it and the new view is
  // published. Watchers resynchronise from the new data (those below its
  // compaction revision are cancelled as compacted). Waits for a running
  // physical compaction first. The caller must submit nothing meanwhile
  // (the raft loop calls it). `after`, when set, runs on the committer once
  // the new view is published (stores layered on this one reload: auth).
  // On error the store has failed (fail-stop).
  absl::Status Restore(std::unique_ptr<storage::Backend> source,
                       std::function<absl::Status()> after = nullptr);

  // The applied index, kept durable with each group: in a cluster the
  // index of the last Raft entry applied (WriteRequest::raft_index), on a
  // single member the number of write requests applied over the store's
  // life. The member's raft index and applied index in Status.
  uint64_t AppliedIndex() const { return applied_index_.load(std::memory_order_acquire); }
  // The Raft term of the entry at AppliedIndex() (0: not known, as for a
  // store that never ran Raft). Any thread.
  uint64_t AppliedTerm() const { return applied_term_.load(std::memory_order_acquire); }

  // Whether the store makes its writes durable itself (its WAL, and an
  // fsync per group) although a write log orders them. A store with
  // requires_write_log writes without a WAL, relying on the log's replay
  // after a crash; a one-voter group that keeps no log of the entries it
  // applies (replication/) turns this on, after flushing what it wrote
  // without a WAL. Any thread; takes effect from the next group.
  void SetSelfDurable(bool on) { self_durable_.store(on, std::memory_order_release); }
  bool SelfDurable() const {
    return !options_.requires_write_log || self_durable_.load(std::memory_order_acquire);
  }

  // A sole voter's direct writes (docs/REPLICATION.md, "A sole voter's
  // writes"): while on, a write that Submit would hand to the write log
  // (a client's, or a lease's revocation; not one the log carries for
  // another owner) is committed by the store as if it had no log, taking
  // the next applied index, with inline_commit on the submitting thread.
  // The log's owner turns them on only while nothing else is in its log,
  // and off before it appends anything: StopDirectWrites returns once each
  // direct write taken is applied, with the applied index then, from which
  // the log goes on. Any thread (StopDirectWrites: not one committing).
  void StartDirectWrites() ABSL_LOCKS_EXCLUDED(queue_mu_);
  uint64_t StopDirectWrites() ABSL_LOCKS_EXCLUDED(queue_mu_);
  bool DirectWrites() const { return direct_hint_.load(std::memory_order_acquire); }

  int64_t Rev() const { return View()->rev; }
  int64_t CompactRev() const { return View()->compact_rev; }
  storage::Backend* backend() const { return backend_.get(); }
  const KvStoreOptions& options() const { return options_; }

  // Statistics for metrics.
  struct Stats {
    uint64_t puts = 0, deletes = 0, txns = 0, ranges = 0, groups = 0, group_writes = 0;
    uint64_t lease_grants = 0;  // leases granted since the store opened
    uint64_t lease_revokes = 0;  // leases revoked (by a client or expired), applied
    uint64_t lease_renewals = 0;  // keep-alives that extended a lease (the leader's)
    uint64_t leases_expired = 0;  // expired leases this member revoked as leader
    uint64_t keys = 0;  // alive at the current revision (etcd's keys gauge)
  };
  Stats GetStats() const;
  // Durations of the group commits' synced backend writes.
  const util::LatencyHistogram& commit_latency() const { return commit_latency_; }
  // The TTLs of the leases granted, in seconds (etcd's
  // etcd_debugging_lease_ttl_total buckets: 1 doubling to 8192).
  const util::LatencyHistogram& lease_ttls() const { return lease_ttls_; }
  // How long maintenance took, recorded as etcd records it (the metrics'
  // names are etcd's; buckets as etcd's): each compaction's key index pass
  // (etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds), each
  // full backend batch it deleted (_db_compaction_pause_duration_milliseconds)
  // and the backend's whole part (_db_compaction_total_duration_milliseconds), in whole
  // milliseconds as etcd truncates them; the revisions it deleted
  // (_db_compaction_keys_total) and when the last ended (_db_compaction_last,
  // Unix seconds, 0 until one ran); defragmentations
  // (etcd_disk_backend_defrag_duration_seconds, etcd_disk_defrag_inflight);
  // Hash and a computed HashKV (etcd_mvcc_hash_duration_seconds,
  // _hash_rev_duration_seconds); and snapshots sent to clients and to
  // members, from the checkpoint to the end of the sending
  // (etcd_disk_backend_snapshot_duration_seconds, RecordSnapshot).
  struct MaintenanceTimings {
    util::LatencyHistogram index_compaction_pause_ms{0.5, 14};
    util::LatencyHistogram db_compaction_pause_ms{1, 13};
    util::LatencyHistogram db_compaction_total_ms{100, 14};
    std::atomic<uint64_t> db_compaction_keys{0};
    std::atomic<int64_t> db_compaction_last{0};
    util::LatencyHistogram defrag_seconds{0.1, 13};
    std::atomic<int> defrags_running{0};
    util::LatencyHistogram hash_seconds{0.01, 15};
    util::LatencyHistogram hash_rev_seconds{0.01, 15};
    util::LatencyHistogram snapshot_seconds{0.01, 17};
  };
  const MaintenanceTimings& maintenance_timings() const { return maintenance_timings_; }
  // How long each write took to apply, by etcd's op (apply_timings.h).
  const ApplyTimings& apply_timings() const { return apply_timings_; }
  // A read-only request slower than the warning duration, which etcd
  // counts with the slow applies (etcd_server_slow_apply_total).
  void CountSlowApply() { apply_timings_.CountSlow(); }
  // A snapshot sent (to a client, or to a member catching up), from its
  // checkpoint to the end of its sending, failed or not, as etcd observes
  // it when the snapshot is closed.
  void RecordSnapshot(absl::Duration took) {
    maintenance_timings_.snapshot_seconds.Record(absl::ToDoubleSeconds(took));
  }

 private:
  class Applier;  // applies one write request inside a group (kv_store_apply.cc)
  // A committed write's done and its result.
  struct Answer {
    absl::AnyInvocable<void(absl::Status)> done;
    absl::Status status;
  };

  // Submit, then wait for the answer (the blocking conveniences).
  template <typename Op>
  absl::StatusOr<std::remove_const_t<std::remove_pointer_t<decltype(Op::response)>>> SubmitAndWait(
      const std::remove_pointer_t<decltype(Op::request)>& req);

  KvStore(const KvStoreOptions& options, std::unique_ptr<storage::Backend> backend);

  absl::Status Recover();
  // Restore's work on the committer.
  absl::Status RestoreOnCommitter(std::unique_ptr<storage::Backend> source);
  void CommitLoop();
  // Committer thread: takes the committer's part and the next group from
  // the queue, waiting for a group no other thread is committing (and, with
  // batch_interval, for it to grow). False once stopping with nothing
  // queued and no other thread committing.
  bool NextGroup(std::vector<WriteRequest>* group) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Whether the committer thread has work no other thread is committing, or
  // should stop (queue_mu_'s waits).
  bool CommitterMayTakeLocked() const ABSL_SHARED_LOCKS_REQUIRED(queue_mu_);
  // Moves the next group (up to batch_limit writes) out of the queue.
  void TakeGroupLocked(std::vector<WriteRequest>* group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);
  // Queues write for the committer; with inline_commit (and no
  // batch_interval), unless a group is being committed, commits groups on
  // this thread until none is queued (CommitHere). A direct write is not
  // taken (false, write untouched) once direct writes are off.
  bool Enqueue(WriteRequest& write, bool direct, bool caller_waits) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Commits group, then (unless the caller waits for its write: the
  // blocking conveniences) every group queued meanwhile, answering each
  // here. REQUIRES: this thread took the committer's part.
  void CommitHere(std::vector<WriteRequest> group, bool caller_waits)
      ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Submit's work; caller_waits: the calling thread waits for the answer
  // (SubmitAndWait), so it commits no more than its own write's group.
  void Route(WriteRequest write, bool caller_waits) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Whether a write may skip the log while direct writes are on.
  static bool DirectEligible(const WriteRequest& w);
  // Nothing is queued and nobody commits (StopDirectWrites' wait).
  bool QueueIdleLocked() const ABSL_SHARED_LOCKS_REQUIRED(queue_mu_);
  // Commits one group taken from the queue (after the before-apply hook).
  // Its answers go to *answers when given, else to DeliverAnswers.
  // REQUIRES: this thread holds the committer's part (committing_).
  void RunGroup(std::vector<WriteRequest>* group, std::vector<Answer>* answers);
  bool GroupFullLocked() const ABSL_SHARED_LOCKS_REQUIRED(queue_mu_);
  bool StoppingLocked() const ABSL_SHARED_LOCKS_REQUIRED(queue_mu_) { return stopping_; }

  // One group commit, in phases (kv_store_apply.cc), all on the committer:
  //   admit:   refuse what may not be applied (failed store, CORRUPT alarm,
  //            quota, size), before anything changes;
  //   apply:   each admitted write changes the live index and stages its
  //            records into batch_;
  //   commit:  one synced backend write of the batch with the applied index;
  //   publish: the new view to readers, the group's events to the watch
  //            hub, a scheduled compaction to the compactor;
  //   answer:  each write's done, in order (physical compactions once their
  //            compaction is done).
  struct Group;
  void CommitGroup(std::vector<WriteRequest>* writes, std::vector<Answer>* answers);
  // The error that refuses w before it is applied, or OK.
  // Records how long w took to apply, and warns of a slow apply.
  void TimeApply(const WriteRequest& w, const absl::Status& result,
                 std::chrono::steady_clock::duration took);
  absl::Status Admit(const WriteRequest& w, int64_t backend_size, int64_t* group_cost,
                     Group* group);
  // Applies an admitted write; sets group->changed when it changed state.
  absl::Status Apply(WriteRequest& w, size_t i, Group* group);
  void CommitBatch(Group* group);
  void PublishGroup(Group* group);
  void AnswerGroup(Group* group, std::vector<Answer>* answers);
  void Publish() ABSL_LOCKS_EXCLUDED(view_mu_);
  // Committer thread: hands a committed group's answers on, in order.
  void DeliverAnswers(std::vector<Answer>* answers);
  // Answer thread: runs the answers handed to it until the store stops.
  void AnswerLoop();

  // Physical compaction, on its own thread (kv_store_compaction.cc).
  void CompactionLoop();
  // Waits for the next scheduled compaction and for the readers it must
  // outlast, then runs it. False once the store is stopping: the compactor
  // exits.
  bool RunNextCompaction() ABSL_LOCKS_EXCLUDED(compact_mu_);
  // Compacts the index and the backend at rev. False when the store began to
  // stop before it was done: the next Open resumes it from the stored data.
  // True when it is done, or failed (then no compaction runs any more).
  bool RunCompaction(int64_t rev) ABSL_LOCKS_EXCLUDED(compact_mu_, queue_mu_);
  // Calls the hook of TEST_SetCompactionSyncPoint, if any.
  void TestSyncPoint(std::string_view point) ABSL_LOCKS_EXCLUDED(test_mu_);
  // Answers every caller waiting for a physical compaction with status;
  // with stop, no compaction runs any more.
  void FailCompactionWaiters(const absl::Status& status, bool stop) ABSL_LOCKS_EXCLUDED(compact_mu_);
  absl::Status ApplyCompact(const etcdserverpb::CompactionRequest& req,
                            etcdserverpb::CompactionResponse* resp);
  // Runs fn on the committer thread between groups and waits for it.
  void RunOnCommitter(absl::AnyInvocable<void()> fn) ABSL_LOCKS_EXCLUDED(queue_mu_);
  bool LeaseExists(int64_t id) const { return lessor_.Exists(id); }
  absl::Status ApplyAlarm(const etcdserverpb::AlarmRequest& req, etcdserverpb::AlarmResponse* resp);
  // Refuses a write that adds data while NOSPACE is raised or when it would
  // take the backend over the quota (raising NOSPACE). *group_cost carries
  // the bytes the group has added so far.
  absl::Status CheckQuota(const WriteRequest& w, int64_t backend_size, int64_t* group_cost);
  // Before a write goes to the write log: if it would take the backend over
  // the quota, raises NOSPACE through the log, answers the write and
  // returns true.
  bool RefusedOverQuota(WriteRequest* w, WriteLog* log);
  // Whether w is refused while a CORRUPT alarm is active.
  static bool RefusedWhileCorrupt(const WriteOp& op);
  absl::Status LoadAlarms();
  // Committer thread: enters the failed state after `what` failed with
  // cause (the first cause is kept) and logs why.
  void FailStop(const absl::Status& cause, std::string_view what);
  // The answer to a write refused after a failure: ErrNoSpace when the disk
  // is full, else Error::kStorageFailed.
  absl::Status FailedWriteError() const;
  absl::Status ApplyLeaseGrant(const etcdserverpb::LeaseGrantRequest& req,
                               etcdserverpb::LeaseGrantResponse* resp);
  // Revokes expired leases at the configured rate (own thread).
  void LeaseExpiryLoop();

  // Readers hold the Epoch current when their view was published. Scheduling
  // a compaction starts a new epoch; an old epoch keeps every newer one
  // alive, so once the epoch replaced by a compaction has expired, no reader
  // of a view older than that compaction remains.
  struct Epoch {
    std::shared_ptr<Epoch> next;
  };

  // Reads the stored records at revs, in order; records written in the
  // group being committed are served from pending_ (committer thread only).
  // Through VisitRecords.
  absl::Status ReadRecords(const std::vector<Revision>& revs, std::vector<std::string>* out,
                           bool include_pending) const;
  // Hands the committed record at revs[i] to visit(i, record), in order,
  // without copying it into a string; the record is valid during the call
  // only. Revisions lying close together are read by one walk through the
  // key family (Backend::ScanVisit), others by one MultiGet. Any thread.
  absl::Status VisitRecords(const std::vector<Revision>& revs,
                            absl::FunctionRef<void(size_t i, std::string_view record)> visit) const;

  const KvStoreOptions options_;
  const std::unique_ptr<storage::Backend> backend_;

  // Committer state: touched only by the thread that holds the committer's
  // part (committing_: the committer thread, or with inline_commit the
  // thread committing a group it submitted), and by Open before the
  // threads start. Taking and handing back the part under queue_mu_ orders
  // one holder's changes before the next's.
  // Replaced as a whole by Restore.
  std::unique_ptr<index::TreeIndex> index_ = std::make_unique<index::TreeIndex>();
  int64_t current_rev_ = 1;  // a new store starts at revision 1, as etcd does
  int64_t compact_rev_ = 0;
  // A compaction was ever scheduled, at 0 included (ReadView::compacted):
  // until then etcd's compaction revision is -1 and a compaction at 0 is
  // taken once.
  bool compacted_ = false;
  std::shared_ptr<Epoch> epoch_;
  // The epoch replaced by the compaction scheduled in the current group.
  std::shared_ptr<Epoch> compaction_barrier_;
  storage::WriteBatch batch_;
  // Records staged in batch_, by revision, until the batch is durable.
  absl::flat_hash_map<Revision, std::string> pending_;
  bool failed_ = false;
  absl::Status storage_error_;
  // Changes of the group being committed, for the watch hub.
  std::vector<WatchEvent> group_events_;
  std::atomic<WatchHub*> hub_{nullptr};
  std::atomic<WriteGuard*> guard_{nullptr};
  // The raft_index of the write being applied: committer thread only.
  uint64_t applying_index_ = 0;
  std::atomic<WriteLog*> write_log_{nullptr};
  std::atomic<uint64_t> applied_index_{0};
  std::atomic<uint64_t> applied_term_{0};
  std::atomic<bool> self_durable_{false};
  // The backend's size as last measured (by the committer), for the quota.
  std::atomic<int64_t> backend_size_{0};
  absl::Time backend_size_at_ = absl::InfinitePast();

  // Locks. Each is a leaf: no other lock of the store is taken while one is
  // held, and nothing blocks, does I/O or calls out under one. Waits use
  // absl::Mutex's conditions (the waiter's condition is checked on every
  // unlock), so no write to a guarded member can miss its waiter.

  // The published view.
  mutable util::Mutex view_mu_;
  std::shared_ptr<const ReadView> view_ ABSL_GUARDED_BY(view_mu_);

  // The request queue; the committer and the lease expiry thread wait on it.
  util::Mutex queue_mu_;
  std::deque<WriteRequest> queue_ ABSL_GUARDED_BY(queue_mu_);
  // A thread holds the committer's part: it commits groups from the queue
  // until it hands the part back. The committer thread takes it only when
  // no other thread holds it.
  bool committing_ ABSL_GUARDED_BY(queue_mu_) = false;
  // Direct writes are on (StartDirectWrites); direct_hint_ lets Submit look
  // without the lock, and direct_ decides under it.
  bool direct_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::atomic<bool> direct_hint_{false};
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::function<void()> group_wait_hook_ ABSL_GUARDED_BY(queue_mu_);
  std::function<void()> before_apply_hook_ ABSL_GUARDED_BY(queue_mu_);
  std::atomic<bool> has_before_apply_hook_{false};  // the committer looks without the lock

  // Physical compaction requests, handed from the committer.
  mutable util::Mutex compact_mu_;
  // Newest scheduled and newest finished compaction revisions (-1: none; a
  // store never compacted may take one at 0).
  int64_t compact_requested_ ABSL_GUARDED_BY(compact_mu_) = -1;
  int64_t compact_finished_ ABSL_GUARDED_BY(compact_mu_) = -1;
  bool compact_exit_ ABSL_GUARDED_BY(compact_mu_) = false;  // tells the compactor to exit
  // The compaction an Open found interrupted and resumes (-1: none).
  int64_t compact_resumed_ ABSL_GUARDED_BY(compact_mu_) = -1;
  // The readers the newest compaction waits for.
  std::weak_ptr<Epoch> compact_epoch_ ABSL_GUARDED_BY(compact_mu_);
  bool compact_stopped_ ABSL_GUARDED_BY(compact_mu_) = false;  // a compaction failed: no more run
  std::vector<std::pair<int64_t, absl::AnyInvocable<void(absl::Status)>>> compact_waiters_
      ABSL_GUARDED_BY(compact_mu_);
  // One scheduled compaction, as the committer saw it when it applied it:
  // the compactor runs each in revision order (etcd's FIFO scheduler).
  struct CompactionJob {
    int64_t prev_rev = -1;    // the compaction revision before it (-1: none)
    bool store_hash = false;  // the compaction before it was not an interrupted one
  };
  std::map<int64_t, CompactionJob> compact_jobs_ ABSL_GUARDED_BY(compact_mu_);
  // etcd's hash storage: the hash each of the newest compactions took of the
  // history it compacted (etcd's kvHasher over [0, rev] from prev_rev on);
  // HashKV at exactly such a revision answers it. In memory only, ordered by
  // revision, at most kStoredCompactionHashes.
  struct CompactionHash {
    uint32_t hash = 0;
    int64_t compact_rev = -1;  // the job's prev_rev
    int64_t rev = 0;
  };
  static constexpr size_t kStoredCompactionHashes = 10;
  std::vector<CompactionHash> compaction_hashes_ ABSL_GUARDED_BY(compact_mu_);
  void StoreCompactionHashLocked(const CompactionHash& hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compact_mu_);
  bool CompactionWorkLocked() const ABSL_SHARED_LOCKS_REQUIRED(compact_mu_);
  bool CompactionDoneLocked() const ABSL_SHARED_LOCKS_REQUIRED(compact_mu_);

  // TEST_SetCompactionSyncPoint's hook. A leaf: the hook is called with it
  // released.
  util::Mutex test_mu_;
  std::function<void(std::string_view)> test_sync_point_ ABSL_GUARDED_BY(test_mu_);
  std::atomic<bool> has_test_sync_point_{false};

  util::LatencyHistogram commit_latency_;
  mutable std::atomic<uint64_t> stat_puts_{0}, stat_deletes_{0}, stat_txns_{0}, stat_ranges_{0},
      stat_groups_{0}, stat_group_writes_{0}, stat_lease_grants_{0}, stat_lease_revokes_{0},
      stat_leases_expired_{0};
  util::LatencyHistogram lease_ttls_{1, 14};
  mutable MaintenanceTimings maintenance_timings_;
  ApplyTimings apply_timings_;  // recorded by the committer

  lease::Lessor lessor_;
  int64_t next_lease_id_ = 0;  // committer only

  // Active alarms and the storage failure: changed by the committer, read by
  // anyone.
  mutable util::Mutex alarm_mu_;
  std::vector<etcdserverpb::AlarmMember> alarms_ ABSL_GUARDED_BY(alarm_mu_);
  absl::Status storage_failure_ ABSL_GUARDED_BY(alarm_mu_);
  // Whether alarms_ holds a NOSPACE / a CORRUPT alarm, kept by
  // AlarmsChangedLocked so that the committer's checks of every write take
  // no lock.
  std::atomic<bool> no_space_alarm_{false}, corrupt_alarm_{false};
  // Called after every change of alarms_.
  void AlarmsChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(alarm_mu_);

  // Answers of committed groups, run off the committer so that the next
  // group's write overlaps sending them (answering a group of gRPC calls
  // costs about as much as its fsync).
  util::Mutex answer_mu_;
  std::vector<Answer> answers_ ABSL_GUARDED_BY(answer_mu_);
  // The answer thread is running a batch.
  bool answering_ ABSL_GUARDED_BY(answer_mu_) = false;
  bool answers_closed_ ABSL_GUARDED_BY(answer_mu_) = false;
  bool AnswersReadyLocked() const ABSL_SHARED_LOCKS_REQUIRED(answer_mu_) {
    return answers_closed_ || !answers_.empty();
  }

  std::thread committer_;
  std::thread answerer_;
  std::thread compactor_;
  std::thread lease_expiry_;
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_KV_STORE_H_
