#include "server/member.h"

#include <random>
#include <string_view>

#include "mvcc/revision_key.h"

namespace capstan::server {
namespace {

constexpr std::string_view kClusterIdKey = "capstan/clusterID";
constexpr std::string_view kMemberIdKey = "capstan/memberID";
constexpr std::string_view kTermKey = "capstan/raftTerm";

uint64_t RandomId(std::mt19937_64& rng) {
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

absl::StatusOr<uint64_t> ReadU64(storage::Backend* backend, std::string_view key) {
  std::string value;
  auto s = backend->Get(storage::Cf::kMeta, key, &value);
  if (absl::IsNotFound(s)) return 0;
  if (!s.ok()) return s;
  if (value.size() != 8) return absl::DataLossError("member record has a bad size");
  return mvcc::ReadBigEndian64(value.data());
}

std::string U64Bytes(uint64_t v) {
  std::string out;
  mvcc::AppendBigEndian64(v, &out);
  return out;
}

}  // namespace

absl::StatusOr<MemberInfo> LoadOrCreateMember(storage::Backend* backend, const std::string& name,
                                              std::vector<std::string> peer_urls,
                                              std::vector<std::string> client_urls) {
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
  std::random_device seed;
  std::mt19937_64 rng((static_cast<uint64_t>(seed()) << 32) ^ seed());
  m.cluster_id = *cluster != 0 ? *cluster : RandomId(rng);
  m.member_id = *member != 0 ? *member : RandomId(rng);
  m.raft_term = *term == 0 ? 2 : *term + 1;
  storage::WriteBatch batch;
  batch.Put(storage::Cf::kMeta, kClusterIdKey, U64Bytes(m.cluster_id));
  batch.Put(storage::Cf::kMeta, kMemberIdKey, U64Bytes(m.member_id));
  batch.Put(storage::Cf::kMeta, kTermKey, U64Bytes(m.raft_term));
  if (auto s = backend->Write(&batch); !s.ok()) return s;
  return m;
}

void FillHeader(const MemberInfo& member, etcdserverpb::ResponseHeader* header) {
  header->set_cluster_id(member.cluster_id);
  header->set_member_id(member.member_id);
  header->set_raft_term(member.raft_term);
}

}  // namespace capstan::server
