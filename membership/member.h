// The identity of this single-member cluster: ids derived once, as etcd derives
// them, and kept in the data directory, and the raft-like counters etcd
// clients expect.

#ifndef CAPSTAN_MEMBERSHIP_MEMBER_H_
#define CAPSTAN_MEMBERSHIP_MEMBER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "util/latency_histogram.h"
#include "etcdserverpb/rpc.pb.h"
#include "storage/backend.h"

namespace capstan::membership {

// One member of the cluster as etcd's member list shows it.
struct ClusterMember {
  uint64_t id = 0;
  std::string name;
  std::vector<std::string> peer_urls;
  std::vector<std::string> client_urls;  // empty until the member published them
  bool is_learner = false;
};

// raftpb.ConfChangeType.
enum class ChangeType : int {
  kAddNode = 0,
  kRemoveNode = 1,
  kUpdateNode = 2,
  kAddLearnerNode = 3,
};

// One membership change as a ConfChange entry carries it: the type, the
// member's ID, and (except for a removal) the member record of its context.
struct MemberChange {
  ChangeType type = ChangeType::kAddNode;
  uint64_t id = 0;
  ClusterMember member;    // id, peer URLs and is_learner (add, update, promote)
  bool is_promote = false;  // kAddNode of a learner already in the table
};

// What this member exchanged with one peer, as etcd's rafthttp counts it
// (etcd_network_peer_*_bytes_total, _sent_failures_total,
// _round_trip_time_seconds and etcd_network_active_peers): the transport keeps it, the metrics read it.
struct PeerTraffic {
  uint64_t id = 0;
  bool active = false;  // the Raft stream to it is open
  uint64_t sent_bytes = 0;
  uint64_t sent_failures = 0;  // messages dropped from a full queue or a failed stream
  uint64_t received_bytes = 0;
  // The smoothed round trips observed by the prober
  // (etcd_network_peer_round_trip_time_seconds); null before it knows the
  // peer.
  std::shared_ptr<const util::LatencyHistogram> round_trips;
};

// What the services report of this member's Raft state (Status, headers),
// kept by the replication layer, and the one thing they ask of Raft (a
// leadership transfer). Thread safety: every method may be called from any
// thread.
class RaftView {
 public:
  virtual ~RaftView() = default;
  virtual uint64_t Leader() const = 0;  // 0: no leader known
  virtual uint64_t Term() const = 0;
  virtual uint64_t CommittedIndex() const = 0;
  virtual uint64_t AppliedIndex() const = 0;
  virtual bool IsLearner() const { return false; }
  // etcd's consensus counters (etcd_server_leader_changes_seen_total,
  // etcd_server_proposals_pending, etcd_server_proposals_failed_total): the
  // changes to a new known leader seen, the proposals waiting to be
  // applied, those that failed (refused or timed out).
  virtual uint64_t LeaderChanges() const { return 0; }
  virtual int64_t ProposalsPending() const { return 0; }
  virtual uint64_t ProposalsFailed() const { return 0; }
  // etcd's read and heartbeat counters (etcd_server_slow_read_indexes_total,
  // _read_indexes_failed_total, _heartbeat_send_failures_total): ReadIndex
  // answers that were not this member's latest round's, or rounds that timed
  // out; rounds failed by a leader change; heartbeats a leader sent to a
  // peer more than two heartbeat intervals after the last one.
  virtual uint64_t SlowReadIndexes() const { return 0; }
  virtual uint64_t ReadIndexesFailed() const { return 0; }
  virtual uint64_t HeartbeatSendFailures() const { return 0; }
  // etcd's etcd_server_learner_promote_successes and _failures{Reason}:
  // the promotions this member handled as leader, and why those it refused
  // or that failed did (each distinct error once, with its count).
  struct Promotions {
    uint64_t successes = 0;
    std::vector<std::pair<absl::Status, uint64_t>> failures;
  };
  virtual Promotions LearnerPromotions() const { return {}; }
  // The latencies of the synced writes of the Raft log (etcd's WAL fsync),
  // or null while the log has synced nothing (a sole voter's store makes
  // its groups durable itself).
  virtual const util::LatencyHistogram* LogSyncLatency() const { return nullptr; }
  // The members as this member's applied log knows them, with the client
  // URLs each published.
  virtual std::vector<ClusterMember> Members() const = 0;
  // The cluster version the applied log decided (etcd's ClusterVersion),
  // or empty while it has decided none: a new cluster's leader decides one
  // once it has committed an entry of its term.
  virtual std::string ClusterVersion() const { return {}; }
  // Asks Raft to hand the leadership to member `to` (etcd's MoveLeader:
  // raft's MsgTransferLeader) and calls done once this member sees `to`
  // lead: OK; or, if it does not by `deadline`, etcd's "leader transfer
  // took too long"; or "server stopped" when the member stops first. done
  // runs exactly once, on the raft loop's thread (or on the caller's, before
  // this returns, when the member has stopped) and must not block.
  virtual void TransferLeadership(uint64_t to, absl::Time deadline,
                                  absl::AnyInvocable<void(absl::Status)> done) = 0;
  // Makes a membership change through the log (etcd's AddMember,
  // RemoveMember, UpdateMember, PromoteMember) and calls done once this
  // member has applied it, with the members after it; or with etcd's error
  // (membership::Error, or "request timed out" by `deadline`). done runs
  // exactly once, on any thread, and must not block.
  using MembersDone = absl::AnyInvocable<void(absl::StatusOr<std::vector<ClusterMember>>)>;
  virtual void ChangeMembership(const MemberChange& change, absl::Time deadline,
                                MembersDone done) = 0;
};

struct MemberInfo {
  uint64_t cluster_id = 0;
  uint64_t member_id = 0;
  // etcd's raft term: a fresh single member elects itself at term 2 and each
  // restart starts a new term. Capstan keeps the same numbers.
  uint64_t raft_term = 0;
  std::string name;
  std::vector<std::string> peer_urls;
  std::vector<std::string> client_urls;
  // The members of the cluster this one was started in (--initial-cluster),
  // this one included; one entry for a single member.
  std::vector<ClusterMember> initial_members;
  // In a cluster, its Raft state (not owned; outlives the services); null
  // on a single member.
  RaftView* raft = nullptr;
  // The cluster version this member reports (/version, Status's
  // storageVersion, etcd_cluster_version): in a Raft group its log's, empty
  // while undecided; without Raft, `fixed`.
  std::string ClusterVersion(std::string_view fixed) const {
    return raft != nullptr ? raft->ClusterVersion() : std::string(fixed);
  }
  // The data's storage (schema) version as etcd 3.6 reports it (/version,
  // Status's storageVersion, each Snapshot message): `storage` once the
  // cluster has a version (ClusterVersion(fixed) is not empty), empty before.
  std::string StorageVersion(std::string_view fixed, std::string_view storage) const {
    return StorageVersionWith(ClusterVersion(fixed), storage);
  }
  // The same rule for a cluster version already read, so that an answer
  // carrying both reads it once and cannot pair an undecided cluster
  // version with a storage version.
  static std::string StorageVersionWith(std::string_view cluster_version,
                                        std::string_view storage) {
    return cluster_version.empty() ? std::string() : std::string(storage);
  }
  // The data directory had no identity yet: LoadOrCreateMember made it.
  bool created = false;
};

// A member of --initial-cluster: its name and peer URLs.
struct InitialMember {
  std::string name;
  std::vector<std::string> peer_urls;
};

// etcd's ids for a new cluster (membership.NewMember, RaftCluster.genID):
// a member's is the SHA-1 of its sorted peer URLs and the cluster token, a
// cluster's the SHA-1 of its members' sorted ids, each cut to 8 bytes. They
// are why every `etcd` started with default flags is member
// 8e9e05c52164694d of cluster cdf818194e3a8c32.
uint64_t EtcdMemberId(std::vector<std::string> peer_urls, std::string_view cluster_token);
uint64_t EtcdClusterId(std::vector<uint64_t> member_ids);

// Loads the identity from backend's meta family, creating it on first start
// with etcd's ids for peer_urls and cluster_token, and begins a new term.
// Call before the backend is handed to the KV store.
//
// With more than one initial member (a cluster) every member's id and the
// cluster's id come from initial_members, as etcd computes them from
// --initial-cluster and --initial-cluster-token; this member is the one
// named `name`.
absl::StatusOr<MemberInfo> LoadOrCreateMember(storage::Backend* backend, const std::string& name,
                                              std::vector<std::string> peer_urls,
                                              std::vector<std::string> client_urls,
                                              std::string_view cluster_token,
                                              const std::vector<InitialMember>& initial_members = {});

// Writes this member's identity into backend (its meta family), replacing
// what is there: a member that joins an existing cluster takes the IDs the
// cluster gave it, and a snapshot received from another member (a copy of
// that member's store) is made this member's before it is installed.
absl::Status StampIdentity(storage::Backend* backend, uint64_t cluster_id, uint64_t member_id);

// A member that joined a running cluster keeps the members the cluster
// listed when it joined: until it has applied the log's membership entries
// its own table is empty, and a restart before then must know its peers by
// the IDs the cluster gave them, not by IDs computed from --initial-cluster.
absl::Status StoreJoinedMembers(storage::Backend* backend,
                                const std::vector<ClusterMember>& members);
// The members StoreJoinedMembers kept; empty when it never ran.
absl::StatusOr<std::vector<ClusterMember>> LoadJoinedMembers(storage::Backend* backend);

// The members this member knows: its Raft view's, or itself alone.
std::vector<ClusterMember> MembersOf(const MemberInfo& member);

// A member as etcd's Cluster RPCs carry it, and back.
void ToProto(const ClusterMember& m, etcdserverpb::Member* out);
ClusterMember FromProto(const etcdserverpb::Member& m);

// Fills the member fields of a response header (cluster_id, member_id,
// raft_term: the Raft term in a cluster); the revision is the caller's.
void FillHeader(const MemberInfo& member, etcdserverpb::ResponseHeader* header);

}  // namespace capstan::membership

#endif  // CAPSTAN_MEMBERSHIP_MEMBER_H_
