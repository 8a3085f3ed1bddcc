// Replicator: a member's write log in a Raft group (a cluster, or a single
// member as a group of one). It orders the writes the
// services submit through etcd's Raft (a RaftEngine), keeps the log durable
// (RaftLog), exchanges messages with the peers (Transport) and hands every
// committed entry to the KV store's committer in log order, on every member.
//
//   service -> KvStore::Submit -> Replicator::Submit (a group of writes
//   becomes one proposal of etcd InternalRaftRequests, each with etcd's
//   request ID) -> raft loop: Ready -> peers get messages, the log one
//   synced write -> committed entries -> KvStore::SubmitCommitted (with
//   the entry's index) -> the member that took the write answers it.
//
// Every member applies the same entries in the same order, each decoded
// from the log (never from the submitter's objects), so their stores hold
// the same data at the same index. The submitter's response object and
// completion are matched to its entry by request ID.
//
// Linearizable reads (ReadBarrier) use ReadIndex, batched as etcd's
// linearizableReadLoop batches them: one ReadIndex in flight, retried every
// 500 ms; requests arriving meanwhile wait for the next. A barrier passes
// once the store has applied the read index. A member that is the group's
// only voter (a single member) reads at its commit index without the round.
//
// A sole voter's log: raft commits a sole voter's entries as it appends
// them, so once they are durable they are applied. Such a member writes no
// log entry at all: the store applies each committed entry in a group
// written with its WAL and fsynced (KvStore::SetSelfDurable), with the
// entry's index and term, and the log answers as if compacted at that
// index (RaftLog::HoldInStore). A single member then costs one synced
// write per group, as without Raft. Readies that raft does not commit at
// once (a second voter, a new term or vote) go back to the log: the raft
// loop first waits until the store has applied what it holds, and the log's
// next write records it as the log's snapshot. Going the other way, the
// store first flushes what it applied without its WAL, so that its WAL
// never replays over a hole. After a crash the log ends below the store's
// applied index and restarts from it (StartLogAtStore).
//
// A sole voter's writes (options.direct_writes): raft has nothing to decide
// for a member that is the only voter and leads, so once its log is held by
// the store and nothing else waits to be appended, the raft loop lets the
// store commit client writes itself (KvStore::StartDirectWrites), each
// taking the next index as a store without a log counts them, on the
// thread that submitted it. Before raft appends anything again (a write
// the log must carry, a membership change, a leadership transfer, a peer's
// message) and every options.direct_catch_up writes, the loop turns them
// off, waits until each is applied (KvStore::StopDirectWrites) and appends
// empty entries up to the store's applied index, committed and skipped at
// once, so that raft's log goes on from where the store is. Reads and
// Status see the store's applied index as committed.
//
// Thread safety: Submit, ReadBarrier and every RaftView method may be
// called from any thread. One thread (the raft loop, hosted by the engine
// factory) makes every engine and RaftLog call.

#ifndef CAPSTAN_REPLICATION_REPLICATOR_H_
#define CAPSTAN_REPLICATION_REPLICATOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcdserverpb/raft_internal.pb.h"
#include "membership/member.h"
#include "membership/member_table.h"
#include "mvcc/kv_store.h"
#include "mvcc/write_request.h"
#include "replication/raft_engine.h"
#include "replication/raft_log.h"
#include "replication/transport.h"
#include "util/mutex.h"
#include "util/work_queue.h"

namespace capstan::replication {

struct ReplicatorOptions {
  uint64_t member_id = 0;
  uint64_t cluster_id = 0;
  // The cluster's members at bootstrap (--initial-cluster), this one
  // included. A brand-new log starts with their ConfChange entries.
  std::vector<membership::ClusterMember> initial_members;
  // This member's name and client URLs, published through the log once it
  // runs (etcd's ClusterMemberAttrSetRequest).
  std::string name;
  std::vector<std::string> client_urls;
  // The cluster version a leader records when the cluster has none yet
  // (etcd's ClusterVersionSetRequest, "major.minor.0"; empty: none is).
  std::string cluster_version;
  // One tick (--heartbeat-interval); an election takes election_ticks
  // (--election-timeout / --heartbeat-interval).
  absl::Duration tick = absl::Milliseconds(100);
  int election_ticks = 10;
  bool pre_vote = true;
  // The most request bytes one proposal carries (--max-request-bytes): a
  // group of writes is cut into proposals no larger, but always at least
  // one write each.
  int64_t max_proposal_bytes = 1572864;
  // A write or a read not done by then is answered etcd's "request timed
  // out" (etcd: 5 s + 2 election timeouts).
  absl::Duration request_timeout = absl::Seconds(7);
  // Writes are refused with "too many requests" while the store is this
  // many entries behind the commit index (etcd's
  // maxGapBetweenApplyAndCommitIndex).
  uint64_t max_apply_lag = 5000;
  // Tests only: a deliberately broken member that applies and answers its
  // own writes when it proposes them, before a quorum has them
  // (CAPSTAN_FAILPOINTS=answer-before-commit). The history checker must
  // catch it.
  bool failpoint_answer_before_commit = false;
  // Tests only: this many of the cluster version proposals this member
  // makes as leader are lost before they reach raft, as raft drops a
  // proposal during a leadership transfer.
  int failpoint_lose_version_proposals = 0;
  // Log compaction (--snapshot-count, etcd's semantics): once this many
  // entries were applied since the last compaction, the store's data is
  // flushed (made durable through its applied index) and the log is
  // compacted up to snapshot_catchup_entries below that index (etcd's
  // snapshotCatchUpEntriesN), so that a follower slightly behind still
  // catches up from the log. 0: never.
  uint64_t snapshot_count = 100000;
  uint64_t snapshot_catchup_entries = 5000;
  // The member's data directory: a snapshot sent to a follower is a
  // checkpoint in <data_dir>/snap.send.<peer>, one received is written into
  // <data_dir>/snap.tmp and installed from <data_dir>/snap.recv.<n>. Empty:
  // snapshots are neither sent nor accepted.
  std::string data_dir;
  // The pace of a snapshot stream, bytes per second (0: unlimited).
  int64_t snapshot_rate_bytes = 0;
  // Runs on the store's committer after a snapshot replaced the store's
  // data (the auth store reloads). Optional.
  std::function<absl::Status()> on_restored;
  // Membership (etcd's --experimental-max-learners, --strict-reconfig-check).
  int max_learners = 1;
  bool strict_reconfig_check = true;
  // The member joins a running cluster (--initial-cluster-state existing):
  // its new log is not bootstrapped; the leader sends it a snapshot or the
  // log, and initial_members are the cluster's members as a peer listed
  // them (shown until the member's own table has them).
  bool join_existing = false;
  // A sole voter's direct writes (see "A sole voter's writes" above): while
  // this member is the only voter, leads, holds its log in the store and
  // has nothing else to append, the store commits client writes itself
  // (KvStore::StartDirectWrites) instead of handing them to the raft loop.
  bool direct_writes = false;
  // Direct writes are turned off and raft's log brought up to the store
  // once they are this many ahead of it (the empty entries appended then).
  uint64_t direct_catch_up = 65536;
  // --force-new-cluster: a member with a log restarts as the only member of
  // its cluster (etcd's restartAsStandaloneNode). Entries past the commit
  // index are dropped, and entries that remove every other member (and add
  // this one if it is missing) are appended and committed at once; applying
  // them leaves raft one voter and the member table this member alone. The
  // data stays. For recovering after a permanent loss of quorum only.
  bool force_new_cluster = false;
  // Called once when this member learns it was removed from the cluster
  // (it applied its removal); on any thread; must not block.
  std::function<void()> on_removed;
};

// Turns a committed entry that is not a client write (an auth change) back
// into the write that applies it, taking *done as its completion. Returns
// nullopt, leaving *done alone, for an entry its owner does not know.
using EntryDecoder = std::function<std::optional<mvcc::WriteRequest>(
    std::shared_ptr<const etcdserverpb::InternalRaftRequest> request,
    absl::AnyInvocable<void(absl::Status)>* done)>;

class Replicator final : public mvcc::WriteLog, public membership::RaftView {
 public:
  // Makes the member's write log and becomes the store's (SetWriteLog):
  // writes queue until Run. The store, transport and factory must outlive
  // the replicator. Then: start the transport with handler(), then Run.
  static std::unique_ptr<Replicator> Create(const ReplicatorOptions& options,
                                            RaftEngineFactory* factory,
                                            std::unique_ptr<RaftLog> log, mvcc::KvStore* store,
                                            Transport* transport, EntryDecoder decode_other);

  // Starts the raft loop on the factory's thread: replays the committed
  // entries the store has not applied, then joins (or, with a new log,
  // bootstraps) the cluster. Fails if the engine cannot be made. Once.
  absl::Status Run();

  // Waits until the store has applied every entry the log had committed
  // when the replicator was made (the replay after a restart): a member
  // serves no state older than what it acknowledged before. After Run.
  absl::Status AwaitReplay() ABSL_LOCKS_EXCLUDED(reads_mu_);
  // The index AwaitReplay waits for: what the log had committed at start.
  uint64_t ReplayThrough() const { return replay_through_; }

  // Stops the raft loop; writes and reads still waiting are answered
  // "server stopped", and so is every later Submit and ReadBarrier (the
  // store keeps this as its write log, so that nothing is applied on this
  // member alone). What the store was handed it still answers. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(inbox_mu_, reads_mu_);

  // REQUIRES: the store is destroyed (it calls the replicator as its write
  // log and from its committer) and the transport stopped.
  ~Replicator() override;

  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // What the transport calls with what peers send (set before Start).
  TransportHandler handler();

  // --- mvcc::WriteLog
  void Submit(mvcc::WriteRequest w) override ABSL_LOCKS_EXCLUDED(inbox_mu_);
  bool Leads() const override;
  uint64_t LeaderTerm() const override { return Leads() ? Term() : 0; }
  void ReadBarrier(absl::AnyInvocable<void(absl::Status)> ready) override
      ABSL_LOCKS_EXCLUDED(inbox_mu_);
  // Releases the read barriers the store's applied index satisfies.
  void Applied(uint64_t applied) override ABSL_LOCKS_EXCLUDED(reads_mu_);

  // --- membership::RaftView
  uint64_t Leader() const override { return lead_.load(std::memory_order_acquire); }
  uint64_t LeaderChanges() const override {
    return leader_changes_.load(std::memory_order_relaxed);
  }
  int64_t ProposalsPending() const override {
    return proposals_pending_.load(std::memory_order_relaxed);
  }
  uint64_t SlowReadIndexes() const override {
    return slow_read_indexes_.load(std::memory_order_relaxed);
  }
  uint64_t ReadIndexesFailed() const override {
    return read_indexes_failed_.load(std::memory_order_relaxed);
  }
  uint64_t HeartbeatSendFailures() const override {
    return heartbeat_send_failures_.load(std::memory_order_relaxed);
  }
  uint64_t ProposalsFailed() const override {
    return proposals_failed_.load(std::memory_order_relaxed);
  }
  Promotions LearnerPromotions() const override ABSL_LOCKS_EXCLUDED(promotions_mu_);
  // The synced Saves of Ready, once there are any and while this member is
  // not a sole voter: a sole voter's entries are made durable by the store's
  // synced group commit (its log holds them in the store), which the
  // metrics report as the WAL's fsyncs instead.
  const util::LatencyHistogram* LogSyncLatency() const override {
    return log_sync_latency_.Count() > 0 && !sole_voter_.load(std::memory_order_acquire)
               ? &log_sync_latency_
               : nullptr;
  }
  uint64_t Term() const override { return term_.load(std::memory_order_acquire); }
  uint64_t CommittedIndex() const override { return commit_.load(std::memory_order_acquire); }
  uint64_t AppliedIndex() const override { return applied_.load(std::memory_order_acquire); }
  std::vector<membership::ClusterMember> Members() const override ABSL_LOCKS_EXCLUDED(members_mu_);
  std::string ClusterVersion() const override ABSL_LOCKS_EXCLUDED(members_mu_);
  // Hands the request to the raft loop, which asks raft for the transfer
  // and then looks, at least once a tick (etcd's MoveLeader polls once a
  // tick), whether this member's leader is `to` or the deadline passed. The
  // deadline is at most the request timeout away, as etcd bounds it.
  void TransferLeadership(uint64_t to, absl::Time deadline,
                          absl::AnyInvocable<void(absl::Status)> done) override
      ABSL_LOCKS_EXCLUDED(inbox_mu_);
  // Hands the change to the raft loop. There, the leader checks what etcd
  // checks before it proposes (a promotion: the learner is in sync; with
  // strict_reconfig_check: enough started members), the change is proposed
  // as etcd's ConfChange entry, and every member validates it when it
  // applies it (etcd's ValidateConfigurationChange): an accepted change
  // edits the member table, raft's configuration and the transport's peers,
  // and is written to the store with its index; a refused one is recorded
  // as refused. A promotion asked of a follower goes to the leader.
  void ChangeMembership(const membership::MemberChange& change, absl::Time deadline,
                        MembersDone done) override ABSL_LOCKS_EXCLUDED(inbox_mu_);
  bool IsLearner() const override { return learner_.load(std::memory_order_acquire); }

  // The log's first index (its compaction point + 1) and the snapshots this
  // member installed. Any thread.
  uint64_t LogFirstIndex() const { return log_first_.load(std::memory_order_acquire); }
  uint64_t SnapshotsInstalled() const { return installed_.load(std::memory_order_acquire); }

  // Renews a lease where leases are kept alive: here on the leader, else on
  // the leader through the transport (a follower's LeaseKeepAlive). As
  // etcd's LeaseRenew, a renewal that fails for any reason but an unknown
  // lease (the leader stepped down or is unreachable, no leader is known)
  // is tried again, at whichever member then leads, until a request
  // timeout has passed: then "request timed out", or "no leader" when none
  // is known. Answers the TTL or etcd's lease errors.
  void RenewLease(int64_t id, absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) override;
  // The leader's renewal, as etcd's LeaseRenew with ensureLeadership: only
  // once a ReadIndex round confirms this member still leads (and has
  // applied what it committed). A leader that was paused or cut off may not
  // know it has been replaced: a renewal it answered would be one the new
  // leader never saw, and the lease would expire before the TTL the client
  // was given. Answers "not leader" when it no longer leads.
  // A round that began less than a tick ago (RecentlyConfirmedLeader)
  // confirms it as well as one of its own would.
  void RenewAsLeader(int64_t id, absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done);
  // One try of RenewLease: here if this member leads, else at the leader;
  // on a failure worth another try, RetryRenewal.
  void TryRenewal(int64_t id, absl::Time deadline,
                  absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done);
  // Hands a renewal to the raft loop, which tries it again once
  // kRenewalRetryPause has passed and a leader is known (RetryRenewals).
  // Any thread.
  void RetryRenewal(int64_t id, absl::Time deadline,
                    absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done)
      ABSL_LOCKS_EXCLUDED(inbox_mu_);
  // Whether a ReadIndex round confirmed, in this term, that this member
  // leads, and began less than a tick ago. Then no other member can lead
  // for an election timeout minus that tick: the quorum that answered the
  // round's heartbeats refuses votes (check-quorum) until it has not heard
  // from this leader for an election timeout. A leadership transfer this
  // member starts voids it. Any thread.
  bool RecentlyConfirmedLeader() const ABSL_LOCKS_EXCLUDED(confirmed_mu_);
  // The lease's TTLs here on the leader, else from the leader through the
  // transport (on a forwarding thread), as etcd forwards LeaseTimeToLive.
  void LeaseTimeToLive(const etcdserverpb::LeaseTimeToLiveRequest& request,
                       LeaseTimeToLiveDone done) override;

 private:
  Replicator(const ReplicatorOptions& options, RaftEngineFactory* factory,
             std::unique_ptr<RaftLog> log, mvcc::KvStore* store, Transport* transport,
             EntryDecoder decode_other);

  // A write proposed by this member, waiting for its entry to be applied.
  struct Waiter {
    mvcc::WriteOp op;  // for its response object
    absl::AnyInvocable<void(absl::Status)> done;
    absl::Time deadline;
  };
  struct PendingWrite {
    mvcc::WriteRequest w;
    absl::Time deadline;
  };
  // A batch of read barriers behind one ReadIndex request.
  struct ReadBatch {
    uint64_t context = 0;
    std::vector<absl::AnyInvocable<void(absl::Status)>> waiters;
    absl::Time sent;
    absl::Time deadline;
    // When its first ReadIndex went out (a retry does not move it).
    std::chrono::steady_clock::time_point first_sent;
  };
  // The newest ReadIndex round that confirmed this member's leadership
  // (RecentlyConfirmedLeader).
  struct LeadershipConfirmation {
    std::chrono::steady_clock::time_point began;
    uint64_t term = 0;  // 0: none
  };
  mutable util::Mutex confirmed_mu_;
  LeadershipConfirmation confirmed_ ABSL_GUARDED_BY(confirmed_mu_);
  // The raft loop's, when a ReadIndex round answers (or a transfer starts).
  void SetLeadershipConfirmation(LeadershipConfirmation c) ABSL_LOCKS_EXCLUDED(confirmed_mu_);
  // A membership change asked for (ChangeMembership).
  struct PendingConfChange {
    membership::MemberChange change;
    absl::Time deadline;
    MembersDone done;
    // A removal of the leader waits for a leadership transfer until this
    // time (HandOffBeforeRemovingLeader); then it is proposed as it is.
    absl::Time handoff_until = absl::InfinitePast();
  };
  // A proposed membership change, waiting for its entry to be applied.
  // raft gives no word when it drops a proposal: a follower's forwarded one
  // is dropped by a leader that transfers leadership, and a leader turns a
  // change into an empty entry while an earlier one is not applied. A
  // change whose entry is not in the log by `retry_at` is proposed again
  // (the same entry: a copy that commits after the first changes nothing,
  // as the member it names is already added, removed, promoted or updated).
  struct ConfWaiter {
    MembersDone done;
    absl::Time deadline;
    std::string entry;       // the marshaled raftpb.ConfChange
    absl::Time retry_at;
    uint64_t in_log_at = 0;  // the log's index of its entry, 0 while none
  };
  // A leadership transfer asked for (TransferLeadership).
  struct LeaderTransfer {
    uint64_t to = 0;
    absl::Time deadline;
    absl::Time asked;
    absl::AnyInvocable<void(absl::Status)> done;
  };
  // What other threads hand to the raft loop.
  // A lease renewal waiting to be tried again (RetryRenewal).
  struct RenewalRetry {
    int64_t id = 0;
    absl::Time deadline;    // its request timeout
    absl::Time not_before;  // kRenewalRetryPause after the failed try
    absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done;
  };
  // Between two tries of a renewal, as etcd's follower throttles its
  // forwarding loop.
  static constexpr absl::Duration kRenewalRetryPause = absl::Milliseconds(50);

  struct Inbox {
    std::vector<std::string> messages;
    std::vector<uint64_t> unreachable;
    std::vector<PendingWrite> writes;
    std::vector<absl::AnyInvocable<void(absl::Status)>> reads;
    // Received snapshots: the MsgSnap and the directory holding its data.
    std::vector<std::pair<std::string, std::string>> snapshots;
    // Finished snapshot streams: the peer and whether the stream failed.
    std::vector<std::pair<uint64_t, bool>> snapshot_reports;
    // The data flush of a log compaction is done: the applied index it made
    // durable, or the flush's error.
    std::optional<absl::StatusOr<uint64_t>> flushed;
    std::vector<LeaderTransfer> transfers;
    std::vector<PendingConfChange> conf_changes;
    std::vector<RenewalRetry> renewal_retries;
    // Holds nothing but reads (or nothing).
    bool OnlyReads() const {
      return messages.empty() && unreachable.empty() && writes.empty() && snapshots.empty() &&
             snapshot_reports.empty() && !flushed && transfers.empty() && conf_changes.empty() &&
             renewal_retries.empty();
    }
    bool empty() const { return OnlyReads() && reads.empty(); }
  };

  // The raft loop (on the factory's thread) and its steps.
  // One pass of the raft loop: waits for work or the next tick, then steps,
  // proposes and drains the engine. False once the member stops.
  bool LoopOnce();
  // Answers everything still held when the loop ends.
  void FinishLoop();
  void Propose();
  void SendReadIndex(absl::Time now);
  void ExpireWaiters(absl::Time now);
  // Tries again the renewals whose pause has passed, if a leader is known;
  // answers those whose request timeout has.
  void RetryRenewals(absl::Time now);
  void HandleReady(Ready rd);
  // Counts the heartbeats among a leader's messages that left late.
  void ObserveHeartbeats(const std::vector<RaftMessage>& messages, absl::Time now);
  // Handles every Ready raft has; a sole voter that does not lead
  // campaigns.
  void DrainReady();
  // Log compaction: starts the data flush once snapshot_count entries were
  // applied since the last one; compacts the log once it is done.
  void MaybeCompact();
  void CompactAfterFlush(absl::StatusOr<uint64_t> flushed);
  // Leadership transfers: asks raft for one (raft ignores a transfer to the
  // leader itself, and one to a transferee already under way); answers
  // those whose transferee leads, or whose deadline passed.
  void StartLeaderTransfer(LeaderTransfer t);
  void FinishLeaderTransfers(absl::Time now);
  // Leader: a MsgSnap to a follower behind the log; the checkpoint and the
  // stream run on the snapshot sender, the result comes back as a report.
  void SendSnapshot(RaftMessage m);
  // Follower: replaces the store's data with the received checkpoint.
  void InstallSnapshot(const SnapshotMeta& meta);
  void ApplyCommitted(const RaftEntry& entry);
  // Membership: proposes the changes asked for (once a leader is known;
  // until their deadline), applies a committed ConfChange entry, writes a
  // member's attributes, and keeps the readers' copy of the table and the
  // transport's peers in step with the table.
  void ProposeConfChanges(absl::Time now);
  // Before a change that removes the leader is proposed: starts a
  // leadership transfer away from it and answers true while the change
  // should wait for the transfer (at most one election timeout).
  bool HandOffBeforeRemovingLeader(PendingConfChange& p, absl::Time now);
  absl::Status CheckBeforeProposing(const membership::MemberChange& change) const;
  void ApplyConfEntry(const RaftEntry& entry);
  void ApplyAttributes(const RaftEntry& entry,
                       std::shared_ptr<etcdserverpb::InternalRaftRequest> request);
  void PublishMembers() ABSL_LOCKS_EXCLUDED(members_mu_);
  // A proposal of one of etcd's membership entries this member makes itself
  // (its attributes, the cluster version): nobody waits for it; a failure is
  // logged as "<what> failed".
  PendingWrite MembershipProposal(std::shared_ptr<etcdserverpb::InternalRaftRequest> request,
                                  std::string what) const;
  // Applies a ClusterVersionSet entry: the table records the version.
  void ApplyClusterVersion(const RaftEntry& entry,
                           std::shared_ptr<etcdserverpb::InternalRaftRequest> request);
  // Hands the store an applied entry that writes only the member table's
  // records (`write`), answering the member that proposed it.
  void SubmitTableRecord(const RaftEntry& entry, const etcdserverpb::InternalRaftRequest& request,
                         absl::AnyInvocable<absl::Status(storage::WriteBatch* batch)> write);
  void SyncPeers();
  // raft's configuration after entry `index` was applied: what a log
  // compaction at `index` records.
  ConfState ConfStateAt(uint64_t index) const;
  void RecordConfState(uint64_t index, ConfState conf_state);
  // What raft reads as its storage: the log, except that the snapshot it
  // sends a follower behind the log is at the store's applied index (whose
  // data the follower receives), with the configuration there, so that a
  // member added after the log's last compaction can take it.
  class SnapshotAtStore final : public RaftStorage {
   public:
    explicit SnapshotAtStore(Replicator* r) : r_(r) {}
    LogError InitialState(HardState* h, ConfState* c) override { return r_->log_->InitialState(h, c); }
    LogError Entries(uint64_t lo, uint64_t hi, uint64_t max_bytes,
                     std::vector<RaftEntry>* out) override {
      return r_->log_->Entries(lo, hi, max_bytes, out);
    }
    LogError Term(uint64_t i, uint64_t* term) override { return r_->log_->Term(i, term); }
    uint64_t FirstIndex() override { return r_->log_->FirstIndex(); }
    uint64_t LastIndex() override { return r_->log_->LastIndex(); }
    LogError Snapshot(SnapshotMeta* meta) override;

   private:
    Replicator* const r_;
  };
  // Records the group's configuration (conf_state_, sole_voter_).
  void SetConfState(ConfState conf_state);
  // Starts the log (a new one, or one that ends below the store) with a
  // snapshot at the store's applied index and term (term 1 when the store
  // knows none).
  absl::Status StartLogAtStore();
  // options.force_new_cluster on a log that is not new (above). On the raft
  // loop before the engine exists.
  absl::Status ForceNewCluster();
  // A sole voter's log: whether this Ready's entries can be held by the
  // store alone (all committed, no change of term or vote), and the two
  // switches between the modes (see "A sole voter's log" above).
  bool StoreCanHold(const Ready& rd) const;
  // A sole voter's direct writes: turned on at the end of a pass when
  // nothing else is in flight; turned off (raft's log brought up to the
  // store's applied index) before raft appends anything.
  void MaybeStartDirectWrites();
  void EndDirectWrites();
  // Moves commit_ up to index, never down (any thread).
  void RaiseCommit(uint64_t index);
  void StartHoldingInStore();
  void StopHoldingInStore();
  // Blocks the calling thread until the store has applied index (OK), or
  // the member stops ("server stopped"). Not from the committer.
  absl::Status AwaitApplied(uint64_t index) ABSL_LOCKS_EXCLUDED(reads_mu_);
  // The write that applies a committed client or auth entry.
  mvcc::WriteRequest DecodeEntry(std::shared_ptr<etcdserverpb::InternalRaftRequest> request);

  void ReleaseReads(uint64_t index, std::vector<absl::AnyInvocable<void(absl::Status)>> waiters)
      ABSL_LOCKS_EXCLUDED(reads_mu_);
  // Runs `done` on the calling thread if the store has applied `index`,
  // else on the read queue once it has (or with the error that stops the
  // member).
  void WhenApplied(uint64_t index, absl::AnyInvocable<void(absl::Status)> done)
      ABSL_LOCKS_EXCLUDED(reads_mu_);
  // Runs released barriers on the read queue, in order.
  void RunReads(std::vector<absl::AnyInvocable<void(absl::Status)>> ready);
  // Work for the loop. Reads that arrive while a ReadIndex round is in
  // flight wait for the next round, which starts when the loop takes the
  // round's answer: they do not wake the loop.
  bool InboxReadyLocked() const ABSL_SHARED_LOCKS_REQUIRED(inbox_mu_) {
    return stopping_ || !inbox_.OnlyReads() || (!inbox_.reads.empty() && !read_round_open_);
  }
  // The request ID of an entry: etcd's header.id, or the older top-level id.
  static uint64_t RequestIdOf(const etcdserverpb::InternalRaftRequest& r);
  // etcd's idutil.Generator: the member id's low 16 bits, then 40 bits of
  // the start time in ms, then a counter.
  uint64_t NextRequestId() { return id_prefix_ | ((id_suffix_.fetch_add(1) + 1) & ((1ULL << 48) - 1)); }

  const ReplicatorOptions options_;
  RaftEngineFactory* const factory_;
  const std::unique_ptr<RaftLog> log_;
  mvcc::KvStore* const store_;
  Transport* const transport_;
  const EntryDecoder decode_other_;
  const uint64_t id_prefix_;
  std::atomic<uint64_t> id_suffix_;

  std::atomic<uint64_t> lead_{0}, term_{0}, commit_{0}, applied_{0};
  std::atomic<bool> leader_{false};
  // For the metrics (RaftView): written by the raft loop only.
  std::atomic<uint64_t> leader_changes_{0}, proposals_failed_{0};
  std::atomic<uint64_t> slow_read_indexes_{0}, read_indexes_failed_{0},
      heartbeat_send_failures_{0};
  // The promotions handled as leader, counted as they end (any thread).
  mutable util::Mutex promotions_mu_;
  Promotions promotions_ ABSL_GUARDED_BY(promotions_mu_);
  void CountPromotion(const absl::Status& s) ABSL_LOCKS_EXCLUDED(promotions_mu_);
  // The raft loop's: when the leader last sent each peer a heartbeat
  // (etcd's timeout detector), cleared when it becomes leader.
  std::map<uint64_t, absl::Time> heartbeat_sent_;
  std::atomic<int64_t> proposals_pending_{0};
  util::LatencyHistogram log_sync_latency_;  // the synced Saves of Ready
  // This member is a learner in its applied member table.
  std::atomic<bool> learner_{false};
  // This member is the group's only voter (a single member): reads need no
  // ReadIndex round.
  std::atomic<bool> sole_voter_{false};
  std::atomic<uint64_t> log_first_{1}, installed_{0};
  // The log's commit index when the replicator was made (AwaitReplay).
  uint64_t replay_through_ = 0;

  // Raft loop state: touched by the loop thread only.
  std::unique_ptr<RaftEngine> engine_;
  SnapshotAtStore storage_{this};
  std::deque<PendingWrite> pending_;
  absl::flat_hash_map<uint64_t, Waiter> waiters_;
  std::vector<absl::AnyInvocable<void(absl::Status)>> pending_reads_;
  std::optional<ReadBatch> read_in_flight_;
  std::vector<LeaderTransfer> transfers_;
  std::vector<RenewalRetry> renewal_retries_;
  // Request ids the answer-before-commit failpoint applied at proposal.
  absl::flat_hash_set<uint64_t> applied_early_;
  bool published_ = false;  // this member's attributes are proposed
  // Whether the cluster has a version is due to be looked at: this member
  // committed an entry of its term, or a version check came (every
  // kVersionCheckInterval). A leader whose cluster has none proposes one
  // (etcd's monitorClusterVersions); within a term, again only once its last
  // proposal had its request timeout to commit.
  bool version_due_ = false;
  absl::Time next_version_check_ = absl::InfinitePast();
  absl::Time version_proposed_ = absl::InfinitePast();
  uint64_t version_term_ = 0;  // the term of version_proposed_
  int version_proposals_lost_ = 0;  // failpoint_lose_version_proposals'
  // The configuration of the last applied ConfChange (or of the log's
  // snapshot), and each configuration since the log's snapshot by the
  // index of its entry (ConfStateAt).
  ConfState conf_state_;
  std::map<uint64_t, ConfState> conf_history_;
  // The member table as of the last entry handed to the store (in log
  // order): what a ConfChange entry is validated against.
  membership::MemberTable table_;
  std::deque<PendingConfChange> pending_conf_;
  absl::flat_hash_map<uint64_t, ConfWaiter> conf_waiters_;
  // raft's pendingConfIndex, as the leader's raft keeps it: the last index
  // when it began to lead, then its last ConfChange entry. raft turns a
  // change proposed before the member applied that far into an empty entry,
  // so the leader holds its changes until then (ProposeConfEntry).
  uint64_t conf_pending_index_ = 0;
  // Hands raft a marshaled ConfChange; false if not taken (a leader whose
  // raft would turn it into an empty entry holds it back; raft refused it).
  bool ProposeConfEntry(const std::string& entry);
  // Marks the waiters whose entries a Ready appends (and unmarks those whose
  // entries it replaces).
  void NoteConfEntries(const std::vector<RaftEntry>& entries);
  // Proposes again the changes whose entries are not in the log by their
  // retry_at (ConfWaiter).
  void ProposeConfAgain(absl::Time now);
  absl::Duration ElectionTimeout() const { return options_.tick * options_.election_ticks; }
  // The applied index at the last compaction, and whether a flush runs.
  uint64_t compacted_at_ = 0;
  bool compacting_ = false;
  // Committed entries at or below this index are already in the store (a
  // snapshot installed a store ahead of the snapshot index; etcd's
  // consistent-index check): they are not applied again.
  uint64_t skip_through_ = 0;
  // The last committed entry handed to the store.
  uint64_t handed_through_ = 0;
  // The store holds this sole voter's entries (the log keeps none).
  bool store_holds_ = false;
  // The store commits client writes without the log (direct writes).
  bool direct_ = false;
  absl::Time next_tick_;          // the raft loop's
  absl::Time next_waiter_walk_;  // ExpireWaiters'
  // The data of the last snapshot message stepped, until its Ready.
  std::string incoming_snapshot_dir_;
  // Peers a snapshot is being streamed to.
  std::set<uint64_t> snapshots_out_;
  std::atomic<uint64_t> received_snapshots_{0};
  RaftRole role_ = RaftRole::kFollower;

  // Lock order: each lock below is a leaf; nothing blocks or calls out
  // under one.
  util::Mutex inbox_mu_;
  Inbox inbox_ ABSL_GUARDED_BY(inbox_mu_);
  bool stopping_ ABSL_GUARDED_BY(inbox_mu_) = false;
  // The loop waits with a ReadIndex round in flight (read_in_flight_).
  bool read_round_open_ ABSL_GUARDED_BY(inbox_mu_) = false;

  // Barriers waiting for the store to apply their read index.
  util::Mutex reads_mu_;
  std::multimap<uint64_t, absl::AnyInvocable<void(absl::Status)>> apply_waiters_
      ABSL_GUARDED_BY(reads_mu_);

  mutable util::Mutex members_mu_;
  std::vector<membership::ClusterMember> members_ ABSL_GUARDED_BY(members_mu_);
  std::string cluster_version_ ABSL_GUARDED_BY(members_mu_);

  // Runs released read barriers off the committer and the raft loop.
  std::unique_ptr<util::WorkQueue> read_queue_;
  // Forwards a follower's LeaseTimeToLive and member promotions to the
  // leader (each waits for it).
  std::unique_ptr<util::WorkQueue> forward_queue_;
  // Keep-alives forwarded to the leader and not yet answered: the
  // destructor waits for them, as for the forwarding queue.
  struct ForwardedRenewals {
    util::Mutex mu;
    int pending ABSL_GUARDED_BY(mu) = 0;
    bool None() const ABSL_SHARED_LOCKS_REQUIRED(mu) { return pending == 0; }
  };
  std::shared_ptr<ForwardedRenewals> forwarded_renewals_ = std::make_shared<ForwardedRenewals>();
  // Log compaction flushes and snapshot streams, off the raft loop.
  std::unique_ptr<util::WorkQueue> snapshot_queue_;
  // Hashes peers ask for (TransportHandler::on_hash_kv); it lives until the
  // destructor, after the transport stopped, as the forwarding queue does.
  std::unique_ptr<util::WorkQueue> hash_queue_;
  std::thread loop_thread_;
  bool stopped_ = false;  // Stop ran (Stop's caller only)
};

}  // namespace capstan::replication

#endif  // CAPSTAN_REPLICATION_REPLICATOR_H_
