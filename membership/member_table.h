// The cluster's member table, as etcd's RaftCluster keeps it: who the
// members are (voters and learners, with their peer URLs, and the name and
// client URLs each published), which IDs were removed, and the rules a
// membership change must pass.
//
// Changes come through the Raft log as etcd's raftpb.ConfChange entries,
// whose context is etcd's member JSON (membership.Member, or
// ConfigChangeContext for a promotion), so every member validates and
// applies the same changes in the same order and holds the same table. The
// table is kept in the store's meta family beside the data (etcd's
// "members" and "members_removed" buckets: one record per member, its ID in
// hex), written in the batch that applies the change, and so is the cluster
// version (etcd's "cluster" bucket).
//
// Thread safety: a MemberTable is a value; its owner serializes access.

#ifndef CAPSTAN_MEMBERSHIP_MEMBER_TABLE_H_
#define CAPSTAN_MEMBERSHIP_MEMBER_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "membership/member.h"
#include "storage/backend.h"

namespace capstan::membership {

// etcd's membership and reconfiguration errors (server/etcdserver/api/
// membership/errors.go, etcdserver/errors.go), as clients see them through
// v3rpc: each becomes its rpctypes error in server/api/errors.cc.
enum class Error {
  kIdRemoved,          // membership: ID removed -> etcdserver: member not found
  kIdNotFound,         // membership: ID not found -> etcdserver: member not found
  kIdExists,           // membership: ID exists -> etcdserver: member ID already exist
  kPeerUrlExists,      // membership: peerURL exists -> etcdserver: Peer URLs already exists
  kMemberNotLearner,   // membership: can only promote a learner member
  kTooManyLearners,    // membership: too many learner members in cluster
  kLearnerNotReady,    // etcdserver: can only promote a learner member which is in sync with leader
  kNotEnoughStarted,   // etcdserver: re-configuration failed due to not enough started members
  kUnhealthy,          // etcdserver: unhealthy cluster
  kBadUrls,            // etcdserver: given member URLs are invalid
  kNotSupportedForLearner,  // etcdserver: rpc not supported for learner
  kMemberRemoved,      // the member has been permanently removed from the cluster
};

absl::Status MakeError(Error e);
std::optional<Error> ErrorOf(const absl::Status& s);
// The error whose text is `message` (an error that crossed a process
// boundary as text), if any.
std::optional<Error> ErrorOfText(std::string_view message);

// etcd's member JSON (membership.Member: {"id":..,"peerURLs":[..],
// "isLearner":true,"name":..,"clientURLs":[..]}, empty optional fields left
// out): a record of the store and the context of an added or updated
// member's entry. A promotion's context is etcd's ConfigChangeContext
// ({"id":..,"peerURLs":null,"isPromote":true}); a removal has none.
std::string MemberJson(const ClusterMember& m);
absl::StatusOr<ClusterMember> ParseMemberJson(std::string_view json);
std::string ChangeContextJson(const MemberChange& change);
// The change a ConfChange entry carries (its type, node ID and context).
absl::StatusOr<MemberChange> ParseChange(int type, uint64_t node_id, std::string_view context);

class MemberTable {
 public:
  MemberTable() = default;

  // The members in ID order.
  std::vector<ClusterMember> Members() const;
  const ClusterMember* Find(uint64_t id) const;
  bool IsRemoved(uint64_t id) const { return removed_.count(id) > 0; }
  bool empty() const { return members_.empty(); }
  size_t VoterCount() const;
  size_t LearnerCount() const;

  // etcd's ValidateConfigurationChange against this table, with at most
  // max_learners learners (--experimental-max-learners).
  absl::Status Validate(const MemberChange& change, int max_learners) const;
  // Applies a validated change.
  void Apply(const MemberChange& change);
  // etcd's ClusterMemberAttrSetRequest: a member's name and client URLs. A
  // member not in the table is left alone (as etcd ignores a removed one).
  void SetAttributes(uint64_t id, const std::string& name,
                     const std::vector<std::string>& client_urls);
  // The cluster version the cluster decided (etcd's ClusterVersionSetRequest,
  // "3.6.0"; empty until its first leader proposed one).
  const std::string& cluster_version() const { return cluster_version_; }
  void SetClusterVersion(std::string version) { cluster_version_ = std::move(version); }
  // Stages the record of the cluster version (etcd's "cluster" bucket's
  // "clusterVersion").
  static void WriteClusterVersion(const std::string& version, storage::WriteBatch* batch);

  // Adds a member outright (the initial members of a store that predates
  // the table, a bootstrap entry without context).
  void Put(ClusterMember m) { members_[m.id] = std::move(m); }

  // The store's records (etcd's "members" and "members_removed" buckets,
  // as prefixes of the meta family): WriteRecord stages the record of
  // member `changed` as the table now holds it (written; or deleted and
  // marked removed); Load reads every record back.
  void WriteRecord(uint64_t changed, storage::WriteBatch* batch) const;
  // Conf-change entries that failed validation, by log index: a member
  // that replays entries its store already holds (after a restart or a
  // snapshot) applies to Raft exactly those that were accepted, without the
  // table they were validated against.
  bool WasRejected(uint64_t index) const { return rejected_.count(index) > 0; }
  void MarkRejected(uint64_t index) { rejected_.insert(index); }
  static void WriteRejection(uint64_t index, storage::WriteBatch* batch);
  static absl::StatusOr<MemberTable> Load(storage::Backend* backend);
  // Replaces every record in backend with a table of `members` and no
  // cluster version (a restored snapshot that starts a new cluster).
  static absl::Status Reset(storage::Backend* backend,
                            const std::vector<ClusterMember>& members);

 private:
  std::map<uint64_t, ClusterMember> members_;
  std::set<uint64_t> removed_;
  std::set<uint64_t> rejected_;
  std::string cluster_version_;
};

}  // namespace capstan::membership

#endif  // CAPSTAN_MEMBERSHIP_MEMBER_TABLE_H_
