#include "membership/member_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "util/go_text.h"
#include "util/status_payload.h"

namespace capstan::membership {
namespace {

constexpr char kPayloadUrl[] = "capstan.membership.Error";
// etcd's backend buckets, as key prefixes of the meta family.
constexpr absl::string_view kMembersPrefix = "members/";
constexpr absl::string_view kRemovedPrefix = "members_removed/";
// Capstan's own: the log indexes of refused conf changes.
constexpr absl::string_view kRejectedPrefix = "members_rejected/";
// etcd's "cluster" bucket's key.
constexpr absl::string_view kClusterVersionKey = "cluster/clusterVersion";

std::string IdHex(uint64_t id) { return absl::StrCat(absl::Hex(id)); }

// A string as Go's encoding/json writes it: JSON's escapes, and <, > and &
// as \u003c, \u003e and \u0026 (json.Marshal escapes HTML).
std::string GoJsonString(std::string_view text) {
  return absl::StrReplaceAll(gotext::JsonEscape(text),
                             {{"<", "\\u003c"}, {">", "\\u003e"}, {"&", "\\u0026"}});
}

// Go's encoding of membership.Member, byte for byte (its string escaping
// included): ID, then the embedded RaftAttributes (peerURLs, null when
// there are none; isLearner, omitted when false), then Attributes (name and
// clientURLs, omitted when empty). `more` is appended before the closing
// brace.
std::string GoMemberJson(const ClusterMember& m, std::string_view more = "") {
  auto list = [](const std::vector<std::string>& urls) -> std::string {
    if (urls.empty()) return "null";
    std::vector<std::string> quoted;
    for (const auto& u : urls) quoted.push_back(absl::StrCat("\"", GoJsonString(u), "\""));
    return absl::StrCat("[", absl::StrJoin(quoted, ","), "]");
  };
  std::string json = absl::StrCat("{\"id\":", m.id, ",\"peerURLs\":", list(m.peer_urls));
  if (m.is_learner) absl::StrAppend(&json, ",\"isLearner\":true");
  if (!m.name.empty()) absl::StrAppend(&json, ",\"name\":\"", GoJsonString(m.name), "\"");
  if (!m.client_urls.empty()) absl::StrAppend(&json, ",\"clientURLs\":", list(m.client_urls));
  json.append(more.data(), more.size());
  json += "}";
  return json;
}

absl::StatusOr<ClusterMember> FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("a member record is not a JSON object");
  ClusterMember m;
  try {
    if (auto it = j.find("id"); it != j.end()) m.id = it->get<uint64_t>();
    if (auto it = j.find("peerURLs"); it != j.end() && !it->is_null()) {
      m.peer_urls = it->get<std::vector<std::string>>();
    }
    if (auto it = j.find("name"); it != j.end()) m.name = it->get<std::string>();
    if (auto it = j.find("clientURLs"); it != j.end() && !it->is_null()) {
      m.client_urls = it->get<std::vector<std::string>>();
    }
    if (auto it = j.find("isLearner"); it != j.end()) m.is_learner = it->get<bool>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("a bad member record: ", e.what()));
  }
  return m;
}

absl::StatusOr<nlohmann::json> ParseJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("a member record is not valid JSON");
  return j;
}

}  // namespace

absl::Status MakeError(Error e) {
  const char* text = "";
  absl::StatusCode code = absl::StatusCode::kFailedPrecondition;
  switch (e) {
    case Error::kIdRemoved: text = "membership: ID removed"; code = absl::StatusCode::kNotFound; break;
    case Error::kIdNotFound: text = "membership: ID not found"; code = absl::StatusCode::kNotFound; break;
    case Error::kIdExists: text = "membership: ID exists"; break;
    case Error::kPeerUrlExists: text = "membership: peerURL exists"; break;
    case Error::kMemberNotLearner: text = "membership: can only promote a learner member"; break;
    case Error::kTooManyLearners: text = "membership: too many learner members in cluster"; break;
    case Error::kLearnerNotReady:
      text = "can only promote a learner member which is in sync with leader";
      break;
    case Error::kNotEnoughStarted:
      text = "re-configuration failed due to not enough started members";
      break;
    case Error::kUnhealthy: text = "unhealthy cluster"; code = absl::StatusCode::kUnavailable; break;
    case Error::kBadUrls:
      text = "given member URLs are invalid";
      code = absl::StatusCode::kInvalidArgument;
      break;
    case Error::kNotSupportedForLearner:
      text = "rpc not supported for learner";
      code = absl::StatusCode::kUnavailable;
      break;
    case Error::kMemberRemoved:
      text = "the member has been permanently removed from the cluster";
      code = absl::StatusCode::kFailedPrecondition;
      break;
  }
  return util::StatusWithPayload(code, text, kPayloadUrl, e);
}

std::optional<Error> ErrorOf(const absl::Status& s) { return util::PayloadOf<Error>(s, kPayloadUrl); }

std::optional<Error> ErrorOfText(std::string_view message) {
  for (int e = 0; e <= static_cast<int>(Error::kMemberRemoved); ++e) {
    const absl::Status s = MakeError(static_cast<Error>(e));
    if (std::string_view(s.message().data(), s.message().size()) == message) {
      return static_cast<Error>(e);
    }
  }
  return std::nullopt;
}

std::string MemberJson(const ClusterMember& m) { return GoMemberJson(m); }

absl::StatusOr<ClusterMember> ParseMemberJson(std::string_view json) {
  auto j = ParseJson(json);
  if (!j.ok()) return j.status();
  return FromJson(*j);
}

std::string ChangeContextJson(const MemberChange& change) {
  if (!change.is_promote) return MemberJson(change.member);
  // etcd's ConfigChangeContext of a promotion: the member's ID alone, then
  // isPromote.
  ClusterMember id_only;
  id_only.id = change.id;
  return GoMemberJson(id_only, ",\"isPromote\":true");
}

absl::StatusOr<MemberChange> ParseChange(int type, uint64_t node_id, std::string_view context) {
  MemberChange c;
  if (type < 0 || type > static_cast<int>(ChangeType::kAddLearnerNode)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ConfChange type ", type));
  }
  c.type = static_cast<ChangeType>(type);
  c.id = node_id;
  if (c.type == ChangeType::kRemoveNode || context.empty()) {
    c.member.id = node_id;
    return c;
  }
  auto j = ParseJson(context);
  if (!j.ok()) return j.status();
  auto m = FromJson(*j);
  if (!m.ok()) return m.status();
  c.member = *std::move(m);
  if (auto it = j->find("isPromote"); it != j->end() && it->is_boolean()) c.is_promote = it->get<bool>();
  if (c.member.id != node_id) {
    return absl::InvalidArgumentError(absl::StrCat("the ConfChange's node ID ", IdHex(node_id),
                                                   " is not its member's ", IdHex(c.member.id)));
  }
  return c;
}

std::vector<ClusterMember> MemberTable::Members() const {
  std::vector<ClusterMember> out;
  out.reserve(members_.size());
  for (const auto& [id, m] : members_) out.push_back(m);
  return out;
}

const ClusterMember* MemberTable::Find(uint64_t id) const {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : &it->second;
}

size_t MemberTable::VoterCount() const {
  return std::count_if(members_.begin(), members_.end(),
                       [](const auto& e) { return !e.second.is_learner; });
}

size_t MemberTable::LearnerCount() const { return members_.size() - VoterCount(); }

absl::Status MemberTable::Validate(const MemberChange& change, int max_learners) const {
  // etcd's RaftCluster.ValidateConfigurationChange, in its order.
  const uint64_t id = change.id;
  if (IsRemoved(id)) return MakeError(Error::kIdRemoved);
  const ClusterMember* existing = Find(id);
  auto url_taken = [this, id](const std::vector<std::string>& urls) {
    for (const auto& [other_id, m] : members_) {
      if (other_id == id) continue;
      for (const auto& u : m.peer_urls) {
        if (std::find(urls.begin(), urls.end(), u) != urls.end()) return true;
      }
    }
    return false;
  };
  switch (change.type) {
    case ChangeType::kAddNode:
      if (change.is_promote) {
        if (existing == nullptr) return MakeError(Error::kIdNotFound);
        if (!existing->is_learner) return MakeError(Error::kMemberNotLearner);
        return absl::OkStatus();
      }
      [[fallthrough]];
    case ChangeType::kAddLearnerNode:
      if (existing != nullptr) return MakeError(Error::kIdExists);
      if (url_taken(change.member.peer_urls)) return MakeError(Error::kPeerUrlExists);
      if (change.type == ChangeType::kAddLearnerNode &&
          static_cast<int>(LearnerCount()) + 1 > max_learners) {
        return MakeError(Error::kTooManyLearners);
      }
      return absl::OkStatus();
    case ChangeType::kRemoveNode:
      if (existing == nullptr) return MakeError(Error::kIdNotFound);
      return absl::OkStatus();
    case ChangeType::kUpdateNode:
      if (existing == nullptr) return MakeError(Error::kIdNotFound);
      if (url_taken(change.member.peer_urls)) return MakeError(Error::kPeerUrlExists);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

void MemberTable::Apply(const MemberChange& change) {
  switch (change.type) {
    case ChangeType::kAddNode:
    case ChangeType::kAddLearnerNode: {
      if (change.is_promote) {
        if (auto it = members_.find(change.id); it != members_.end()) it->second.is_learner = false;
        return;
      }
      ClusterMember m = change.member;
      m.id = change.id;
      m.is_learner = change.type == ChangeType::kAddLearnerNode;
      members_[m.id] = std::move(m);
      return;
    }
    case ChangeType::kRemoveNode:
      members_.erase(change.id);
      removed_.insert(change.id);
      return;
    case ChangeType::kUpdateNode:
      if (auto it = members_.find(change.id); it != members_.end()) {
        it->second.peer_urls = change.member.peer_urls;
      }
      return;
  }
}

void MemberTable::SetAttributes(uint64_t id, const std::string& name,
                                const std::vector<std::string>& client_urls) {
  auto it = members_.find(id);
  if (it == members_.end()) return;
  it->second.name = name;
  it->second.client_urls = client_urls;
}

void MemberTable::WriteRecord(uint64_t changed, storage::WriteBatch* batch) const {
  const std::string hex = IdHex(changed);
  if (const ClusterMember* m = Find(changed)) {
    batch->Put(storage::Cf::kMeta, absl::StrCat(kMembersPrefix, hex), MemberJson(*m));
  } else {
    batch->Delete(storage::Cf::kMeta, absl::StrCat(kMembersPrefix, hex));
  }
  if (IsRemoved(changed)) batch->Put(storage::Cf::kMeta, absl::StrCat(kRemovedPrefix, hex), "removed");
}

void MemberTable::WriteClusterVersion(const std::string& version, storage::WriteBatch* batch) {
  batch->Put(storage::Cf::kMeta, std::string(kClusterVersionKey), version);
}

void MemberTable::WriteRejection(uint64_t index, storage::WriteBatch* batch) {
  batch->Put(storage::Cf::kMeta, absl::StrCat(kRejectedPrefix, absl::Hex(index, absl::kZeroPad16)),
             "");
}

absl::Status MemberTable::Reset(storage::Backend* backend,
                                const std::vector<ClusterMember>& members) {
  storage::WriteBatch batch;
  for (absl::string_view prefix : {kMembersPrefix, kRemovedPrefix, kRejectedPrefix}) {
    std::string end(prefix);
    end.back() = static_cast<char>(end.back() + 1);
    batch.DeleteRange(storage::Cf::kMeta, std::string(prefix), end);
  }
  // A new cluster decides its version anew, as etcd's restored one does.
  batch.Delete(storage::Cf::kMeta, std::string(kClusterVersionKey));
  MemberTable t;
  for (const auto& m : members) t.Put(m);
  for (const auto& m : members) t.WriteRecord(m.id, &batch);
  return backend->Write(&batch);
}

absl::StatusOr<MemberTable> MemberTable::Load(storage::Backend* backend) {
  MemberTable t;
  auto it = backend->NewIterator(storage::Cf::kMeta);
  for (it->Seek(std::string(kMembersPrefix)); it->Valid(); it->Next()) {
    const std::string key(it->key());
    if (!absl::StartsWith(key, kMembersPrefix)) break;
    auto m = ParseMemberJson(std::string(it->value()));
    if (!m.ok()) {
      return absl::DataLossError(absl::StrCat("the member record ", key, ": ", m.status().message()));
    }
    t.members_[m->id] = *std::move(m);
  }
  for (it->Seek(std::string(kRemovedPrefix)); it->Valid(); it->Next()) {
    const std::string key(it->key());
    if (!absl::StartsWith(key, kRemovedPrefix)) break;
    uint64_t id = 0;
    if (!absl::SimpleHexAtoi(absl::string_view(key).substr(kRemovedPrefix.size()), &id)) {
      return absl::DataLossError(absl::StrCat("a bad removed-member record: ", key));
    }
    t.removed_.insert(id);
  }
  for (it->Seek(std::string(kRejectedPrefix)); it->Valid(); it->Next()) {
    const std::string key(it->key());
    if (!absl::StartsWith(key, kRejectedPrefix)) break;
    uint64_t index = 0;
    if (!absl::SimpleHexAtoi(absl::string_view(key).substr(kRejectedPrefix.size()), &index)) {
      return absl::DataLossError(absl::StrCat("a bad rejected-change record: ", key));
    }
    t.rejected_.insert(index);
  }
  if (auto s = it->status(); !s.ok()) return s;
  std::string version;
  if (auto s = backend->Get(storage::Cf::kMeta, std::string(kClusterVersionKey), &version); s.ok()) {
    t.cluster_version_ = std::move(version);
  } else if (!absl::IsNotFound(s)) {
    return s;
  }
  return t;
}

}  // namespace capstan::membership
