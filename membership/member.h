// The identity of this single-member cluster: ids derived once, as etcd derives
// them, and kept in the data directory, and the raft-like counters etcd
// clients expect.

#ifndef CAPSTAN_MEMBERSHIP_MEMBER_H_
#define CAPSTAN_MEMBERSHIP_MEMBER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "etcdserverpb/rpc.pb.h"
#include "storage/backend.h"

namespace capstan::membership {

struct MemberInfo {
  uint64_t cluster_id = 0;
  uint64_t member_id = 0;
  // etcd's raft term: a fresh single member elects itself at term 2 and each
  // restart starts a new term. Capstan keeps the same numbers.
  uint64_t raft_term = 0;
  std::string name;
  std::vector<std::string> peer_urls;
  std::vector<std::string> client_urls;
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
absl::StatusOr<MemberInfo> LoadOrCreateMember(storage::Backend* backend, const std::string& name,
                                              std::vector<std::string> peer_urls,
                                              std::vector<std::string> client_urls,
                                              std::string_view cluster_token);

// Fills the member fields of a response header (cluster_id, member_id,
// raft_term); the revision is the caller's.
void FillHeader(const MemberInfo& member, etcdserverpb::ResponseHeader* header);

}  // namespace capstan::membership

#endif  // CAPSTAN_MEMBERSHIP_MEMBER_H_
