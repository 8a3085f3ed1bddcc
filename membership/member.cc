#include "membership/member.h"

#include <algorithm>
#include <string_view>

#include "openssl/sha.h"

#include "util/coding.h"

namespace capstan::membership {
namespace {

constexpr std::string_view kClusterIdKey = "capstan/clusterID";
constexpr std::string_view kMemberIdKey = "capstan/memberID";
constexpr std::string_view kTermKey = "capstan/raftTerm";
constexpr std::string_view kJoinedMembersKey = "capstan/joinedMembers";

// The first 8 bytes of the SHA-1 of data, big-endian: how etcd turns what
// names a member or a cluster into its id.
uint64_t Sha1Id(std::string_view data) {
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return util::ReadBigEndian64(reinterpret_cast<const char*>(digest));
}

absl::StatusOr<uint64_t> ReadU64(storage::Backend* backend, std::string_view key) {
  std::string value;
  auto s = backend->Get(storage::Cf::kMeta, key, &value);
  if (absl::IsNotFound(s)) return 0;
  if (!s.ok()) return s;
  if (value.size() != 8) return absl::DataLossError("member record has a bad size");
  return util::ReadBigEndian64(value.data());
}

std::string U64Bytes(uint64_t v) {
  std::string out;
  util::AppendBigEndian64(v, &out);
  return out;
}

}  // namespace

uint64_t EtcdMemberId(std::vector<std::string> peer_urls, std::string_view cluster_token) {
  std::sort(peer_urls.begin(), peer_urls.end());
  std::string data;
  for (const auto& url : peer_urls) data += url;
  data += cluster_token;
  return Sha1Id(data);
}

uint64_t EtcdClusterId(std::vector<uint64_t> member_ids) {
  std::sort(member_ids.begin(), member_ids.end());
  std::string data;
  for (uint64_t id : member_ids) util::AppendBigEndian64(id, &data);
  return Sha1Id(data);
}

absl::StatusOr<MemberInfo> LoadOrCreateMember(storage::Backend* backend, const std::string& name,
                                              std::vector<std::string> peer_urls,
                                              std::vector<std::string> client_urls,
                                              std::string_view cluster_token,
                                              const std::vector<InitialMember>& initial_members) {
  MemberInfo m;
  m.name = name;
  m.peer_urls = std::move(peer_urls);
  m.client_urls = std::move(client_urls);
  auto cluster = ReadU64(backend, kClusterIdKey);
  if (!cluster.ok()) return cluster.status();
  auto member = ReadU64(backend, kMemberIdKey);
  if (!member.ok()) return member.status();
  auto term = ReadU64(backend, kTermKey);
  if (!term.ok()) return term.status();
  // A new member takes the ids etcd gives the same flags; a data dir keeps
  // the ids it was created with.
  m.member_id = *member != 0 ? *member : EtcdMemberId(m.peer_urls, cluster_token);
  std::vector<uint64_t> ids;
  for (const auto& im : initial_members) {
    ClusterMember cm;
    cm.id = EtcdMemberId(im.peer_urls, cluster_token);
    cm.name = im.name;
    cm.peer_urls = im.peer_urls;
    // Client URLs are known once each member publishes them through the
    // log, this one's too (etcd's publish).
    if (im.name == name && *member == 0) m.member_id = cm.id;
    ids.push_back(cm.id);
    m.initial_members.push_back(std::move(cm));
  }
  if (m.initial_members.size() <= 1) {
    m.initial_members.clear();
    ids = {m.member_id};
    m.initial_members.push_back({m.member_id, m.name, m.peer_urls, m.client_urls, false});
  }
  m.cluster_id = *cluster != 0 ? *cluster : EtcdClusterId(ids);
  m.created = *member == 0;
  m.raft_term = *term == 0 ? 2 : *term + 1;
  storage::WriteBatch batch;
  batch.Put(storage::Cf::kMeta, kClusterIdKey, U64Bytes(m.cluster_id));
  batch.Put(storage::Cf::kMeta, kMemberIdKey, U64Bytes(m.member_id));
  batch.Put(storage::Cf::kMeta, kTermKey, U64Bytes(m.raft_term));
  if (auto s = backend->Write(&batch); !s.ok()) return s;
  return m;
}

absl::Status StampIdentity(storage::Backend* backend, uint64_t cluster_id, uint64_t member_id) {
  storage::WriteBatch batch;
  batch.Put(storage::Cf::kMeta, kClusterIdKey, U64Bytes(cluster_id));
  batch.Put(storage::Cf::kMeta, kMemberIdKey, U64Bytes(member_id));
  return backend->Write(&batch);
}

absl::Status StoreJoinedMembers(storage::Backend* backend,
                                const std::vector<ClusterMember>& members) {
  etcdserverpb::MemberListResponse list;
  for (const ClusterMember& m : members) ToProto(m, list.add_members());
  storage::WriteBatch batch;
  batch.Put(storage::Cf::kMeta, kJoinedMembersKey, list.SerializeAsString());
  return backend->Write(&batch);
}

absl::StatusOr<std::vector<ClusterMember>> LoadJoinedMembers(storage::Backend* backend) {
  std::string value;
  auto s = backend->Get(storage::Cf::kMeta, kJoinedMembersKey, &value);
  if (absl::IsNotFound(s)) return std::vector<ClusterMember>{};
  if (!s.ok()) return s;
  etcdserverpb::MemberListResponse list;
  if (!list.ParseFromString(value)) return absl::DataLossError("the joined members record is corrupt");
  std::vector<ClusterMember> members;
  for (const auto& m : list.members()) members.push_back(FromProto(m));
  return members;
}

std::vector<ClusterMember> MembersOf(const MemberInfo& member) {
  if (member.raft != nullptr) return member.raft->Members();
  return {{member.member_id, member.name, member.peer_urls, member.client_urls, false}};
}

void ToProto(const ClusterMember& m, etcdserverpb::Member* out) {
  out->set_id(m.id);
  out->set_name(m.name);
  for (const auto& u : m.peer_urls) out->add_peerurls(u);
  for (const auto& u : m.client_urls) out->add_clienturls(u);
  out->set_islearner(m.is_learner);
}

ClusterMember FromProto(const etcdserverpb::Member& m) {
  ClusterMember out;
  out.id = m.id();
  out.name = m.name();
  out.peer_urls.assign(m.peerurls().begin(), m.peerurls().end());
  out.client_urls.assign(m.clienturls().begin(), m.clienturls().end());
  out.is_learner = m.islearner();
  return out;
}

void FillHeader(const MemberInfo& member, etcdserverpb::ResponseHeader* header) {
  header->set_cluster_id(member.cluster_id);
  header->set_member_id(member.member_id);
  header->set_raft_term(member.raft != nullptr ? member.raft->Term() : member.raft_term);
}

}  // namespace capstan::membership
