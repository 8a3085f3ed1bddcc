// RaftEngine: one member's Raft state machine (etcd's RawNode), seen from C++.
//
// Capstan does not implement consensus. The engine behind this interface is
// etcd's own Raft library (go.etcd.io/etcd/raft, replication/goraft/), linked
// into the `capstan` binary only; libcapstan never links it. Everything
// around the engine is C++: the log's storage (RaftStorage, replication/
// raft_log.h), the transport, apply, snapshots.
//
// The types below carry etcd's raftpb values: an entry's data is exactly what
// etcd's log holds (a marshaled InternalRaftRequest, or a marshaled
// ConfChange for a configuration entry) and a message is a marshaled
// raftpb.Message, so that members, tools and tests can read them with etcd's
// own protobufs.
//
// Thread safety: an engine is not thread-safe. Every call, and every
// RaftStorage callback it makes, happens inside the loop that
// RaftEngineFactory::RunLoop or RunSteps runs (the member's raft loop).

#ifndef CAPSTAN_REPLICATION_RAFT_ENGINE_H_
#define CAPSTAN_REPLICATION_RAFT_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace capstan::replication {

// raftpb.EntryType.
enum class EntryType : uint32_t { kNormal = 0, kConfChange = 1, kConfChangeV2 = 2 };

struct RaftEntry {
  uint64_t index = 0;
  uint64_t term = 0;
  EntryType type = EntryType::kNormal;
  std::string data;  // empty for the entry a new leader appends
};

// raftpb.HardState: what must be durable before any message of the same
// Ready leaves the member.
struct HardState {
  uint64_t term = 0;
  uint64_t vote = 0;
  uint64_t commit = 0;
  bool operator==(const HardState& o) const {
    return term == o.term && vote == o.vote && commit == o.commit;
  }
};

// raftpb.ConfState: the voters and learners of a configuration.
struct ConfState {
  std::vector<uint64_t> voters;
  std::vector<uint64_t> learners;
  std::vector<uint64_t> voters_outgoing;  // joint consensus only
  std::vector<uint64_t> learners_next;    // joint consensus only
  bool auto_leave = false;
};

// raftpb.SnapshotMetadata. A Capstan snapshot's data (the store) never passes
// through the engine: it is streamed beside the message (replication/
// snapshot_*), and the raftpb.Snapshot the engine sees carries only this.
struct SnapshotMeta {
  uint64_t index = 0;
  uint64_t term = 0;
  ConfState conf_state;
};

// raftpb.MessageType values the member acts on itself.
enum class MessageType : uint32_t { kSnapshot = 7, kHeartbeat = 8 };

// An outgoing raftpb.Message.
struct RaftMessage {
  uint64_t to = 0;
  uint32_t type = 0;  // raftpb.MessageType
  std::string bytes;  // the marshaled raftpb.Message
};

// A ReadIndex answer: once the member has applied `index`, a read issued
// with `context` is linearizable.
struct ReadState {
  uint64_t index = 0;
  std::string context;
};

// raft.StateType.
enum class RaftRole : uint32_t { kFollower = 0, kCandidate = 1, kLeader = 2, kPreCandidate = 3 };

struct SoftState {
  uint64_t lead = 0;  // 0: no leader known
  RaftRole role = RaftRole::kFollower;
};

// What the engine asks of the member, in etcd's order: persist hard state,
// entries and snapshot (one synced write when must_sync), send messages,
// apply committed entries, then Advance.
struct Ready {
  std::optional<SoftState> soft_state;   // set when it changed
  std::optional<HardState> hard_state;   // set when it changed
  std::optional<SnapshotMeta> snapshot;  // a snapshot to install (a follower behind the log)
  std::vector<RaftEntry> entries;        // to append; may replace a conflicting tail
  std::vector<RaftEntry> committed;      // to apply, in log order
  std::vector<RaftMessage> messages;     // to send once entries and hard state are durable
  std::vector<ReadState> read_states;
  bool must_sync = false;
};

// Progress of one peer as the leader sees it (tracker.Progress).
struct PeerProgress {
  uint64_t id = 0;
  uint64_t match = 0;
  uint64_t next = 0;
  uint32_t state = 0;  // tracker.StateType: 0 probe, 1 replicate, 2 snapshot
  bool learner = false;
  bool recent_active = false;
};

// raft.Status.
struct RaftStatus {
  uint64_t id = 0;
  HardState hard_state;
  SoftState soft_state;
  uint64_t applied = 0;
  uint64_t lead_transferee = 0;
  std::vector<PeerProgress> progress;  // the leader's only
};

// Errors of RaftStorage, raft's storage errors.
enum class LogError {
  kOk = 0,
  kCompacted = 1,                       // raft.ErrCompacted
  kUnavailable = 2,                     // raft.ErrUnavailable
  kSnapshotTemporarilyUnavailable = 3,  // raft.ErrSnapshotTemporarilyUnavailable
  kFailed = 4,                          // an I/O error: raft panics, the member stops
};

// The log as the engine reads it: etcd's raft.Storage. Called on the raft
// loop's thread only, synchronously from inside engine calls; an
// implementation must not call the engine back and must not throw.
class RaftStorage {
 public:
  virtual ~RaftStorage() = default;
  virtual LogError InitialState(HardState* hard_state, ConfState* conf_state) = 0;
  // Entries [lo, hi), at most max_bytes of them in data size, but always at
  // least one when any is available. kCompacted when lo <= the snapshot
  // index; kUnavailable when hi > LastIndex() + 1.
  virtual LogError Entries(uint64_t lo, uint64_t hi, uint64_t max_bytes,
                           std::vector<RaftEntry>* out) = 0;
  // The term of entry i, which may be the snapshot index (its term).
  virtual LogError Term(uint64_t i, uint64_t* term) = 0;
  // The first index that Entries may return (the snapshot index + 1).
  virtual uint64_t FirstIndex() = 0;
  virtual uint64_t LastIndex() = 0;
  virtual LogError Snapshot(SnapshotMeta* meta) = 0;
};

struct RaftConfig {
  uint64_t id = 0;
  // The voters of a brand-new cluster (etcd's StartNode peers): the engine
  // appends their ConfChange entries at indexes 1..n. Empty when the log
  // already exists (RestartNode).
  std::vector<uint64_t> bootstrap_voters;
  // The context of each bootstrap voter's entry (etcd's member JSON), in
  // the same order; empty: none.
  std::vector<std::string> bootstrap_contexts;
  int election_tick = 10;
  int heartbeat_tick = 1;
  bool pre_vote = true;
  bool check_quorum = true;
  // The index the store has applied (etcd's consistent index): committed
  // entries at or below it are not handed out again.
  uint64_t applied = 0;
  uint64_t max_size_per_msg = 1 << 20;
  uint64_t max_committed_size_per_ready = 1 << 20;
  uint64_t max_uncommitted_entries_size = 1 << 30;
  int max_inflight_msgs = 512;
  // Not owned; must outlive the engine.
  RaftStorage* storage = nullptr;
  // Where the library's log lines go (level: 0 debug, 1 info, 2 warning,
  // 3 error). Called on the loop thread.
  std::function<void(int level, std::string_view line)> log;
};

class RaftEngine {
 public:
  virtual ~RaftEngine() = default;

  virtual void Tick() = 0;
  virtual absl::Status Campaign() = 0;
  // Proposes the entries as one MsgProp (one proposal of a group of
  // requests). kUnavailable when raft dropped it (no leader, a leader
  // transfer in progress, the uncommitted log full).
  virtual absl::Status Propose(const std::vector<std::string_view>& entries) = 0;
  // Proposes a marshaled raftpb.ConfChange (v2: ConfChangeV2).
  virtual absl::Status ProposeConfChange(bool v2, std::string_view conf_change) = 0;
  // Applies a committed configuration entry; returns the new configuration.
  virtual ConfState ApplyConfChange(EntryType type, std::string_view data) = 0;
  // Steps a marshaled raftpb.Message received from a peer. InvalidArgument
  // when it cannot be decoded; errors of raft itself (a message from an
  // unknown peer, a local message) as FailedPrecondition.
  virtual absl::Status Step(std::string_view message) = 0;
  virtual void ReadIndex(std::string_view context) = 0;
  virtual void TransferLeader(uint64_t to) = 0;
  virtual void ReportUnreachable(uint64_t id) = 0;
  virtual void ReportSnapshot(uint64_t id, bool failure) = 0;
  virtual bool HasReady() = 0;
  // REQUIRES: HasReady(). The Ready stays the engine's until Advance.
  virtual Ready GetReady() = 0;
  // REQUIRES: the last Ready was handled (persisted, sent, applied).
  virtual void Advance() = 0;
  virtual RaftStatus Status() = 0;
};

// Makes engines and hosts the thread they run on.
class RaftEngineFactory {
 public:
  virtual ~RaftEngineFactory() = default;
  // Runs loop on a thread on which engine calls are cheap and returns when
  // loop returns. Engines are made, used and destroyed inside loop only.
  virtual void RunLoop(absl::AnyInvocable<void()> loop) = 0;
  // Calls step again and again, as RunLoop runs a loop, until it returns
  // false, and returns then. Between two calls the engine's runtime gets
  // the thread back for a moment: a member's loop runs this way (one pass
  // per call), since a loop that never returns to Go's scheduler looks to
  // Go like a goroutine that runs too long, whose processor Go's monitor
  // takes away every 10 ms, each time waking threads (docs/REPLICATION.md,
  // "The raft loop and Go's scheduler"). Consecutive calls may run on
  // different threads, never at the same time; engines made in one call
  // are used in later ones.
  virtual void RunSteps(absl::AnyInvocable<bool()> step) = 0;
  // REQUIRES: called inside RunLoop.
  virtual absl::StatusOr<std::unique_ptr<RaftEngine>> NewEngine(const RaftConfig& config) = 0;
};

}  // namespace capstan::replication

#endif  // CAPSTAN_REPLICATION_RAFT_ENGINE_H_
