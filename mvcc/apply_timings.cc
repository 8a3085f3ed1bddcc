#include "mvcc/apply_timings.h"

#include <string_view>
#include <variant>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "mvcc/errors.h"

namespace capstan::mvcc {
namespace {

constexpr int IndexOf(std::string_view name) {
  for (size_t i = 0; i < ApplyTimings::kOps.size(); ++i) {
    if (std::string_view(ApplyTimings::kOps[i]) == name) return static_cast<int>(i);
  }
  return -1;
}

constexpr int kAlarm = IndexOf("Alarm");
constexpr int kAuthDisable = IndexOf("AuthDisable");
constexpr int kAuthEnable = IndexOf("AuthEnable");
constexpr int kAuthRoleAdd = IndexOf("AuthRoleAdd");
constexpr int kAuthRoleDelete = IndexOf("AuthRoleDelete");
constexpr int kAuthRoleGet = IndexOf("AuthRoleGet");
constexpr int kAuthRoleGrantPermission = IndexOf("AuthRoleGrantPermission");
constexpr int kAuthRoleList = IndexOf("AuthRoleList");
constexpr int kAuthRoleRevokePermission = IndexOf("AuthRoleRevokePermission");
constexpr int kAuthUserAdd = IndexOf("AuthUserAdd");
constexpr int kAuthUserChangePassword = IndexOf("AuthUserChangePassword");
constexpr int kAuthUserDelete = IndexOf("AuthUserDelete");
constexpr int kAuthUserGet = IndexOf("AuthUserGet");
constexpr int kAuthUserGrantRole = IndexOf("AuthUserGrantRole");
constexpr int kAuthUserList = IndexOf("AuthUserList");
constexpr int kAuthUserRevokeRole = IndexOf("AuthUserRevokeRole");
constexpr int kAuthenticate = IndexOf("Authenticate");
constexpr int kClusterMemberAttrSet = IndexOf("ClusterMemberAttrSet");
constexpr int kClusterVersionSet = IndexOf("ClusterVersionSet");
constexpr int kCompaction = IndexOf("Compaction");
constexpr int kDeleteRange = IndexOf("DeleteRange");
constexpr int kLeaseCheckpoint = IndexOf("LeaseCheckpoint");
constexpr int kLeaseGrant = IndexOf("LeaseGrant");
constexpr int kLeaseRevoke = IndexOf("LeaseRevoke");
constexpr int kPut = IndexOf("Put");
constexpr int kTxn = IndexOf("Txn");
constexpr int kUnknown = IndexOf("unknown");

// The op of an entry a cluster logged, in etcd's applier's order.
int OpOfEntry(const etcdserverpb::InternalRaftRequest& r) {
  if (r.has_cluster_version_set()) return kClusterVersionSet;
  if (r.has_cluster_member_attr_set()) return kClusterMemberAttrSet;
  if (r.has_put()) return kPut;
  if (r.has_delete_range()) return kDeleteRange;
  if (r.has_txn()) return kTxn;
  if (r.has_compaction()) return kCompaction;
  if (r.has_lease_grant()) return kLeaseGrant;
  if (r.has_lease_revoke()) return kLeaseRevoke;
  if (!r.lease_checkpoint().empty()) return kLeaseCheckpoint;
  if (r.has_alarm()) return kAlarm;
  if (!r.authenticate().empty()) return kAuthenticate;
  if (r.has_auth_enable()) return kAuthEnable;
  if (r.has_auth_disable()) return kAuthDisable;
  if (r.has_auth_status()) return kUnknown;
  if (r.has_auth_user_add()) return kAuthUserAdd;
  if (r.has_auth_user_delete()) return kAuthUserDelete;
  if (r.has_auth_user_change_password()) return kAuthUserChangePassword;
  if (r.has_auth_user_grant_role()) return kAuthUserGrantRole;
  if (r.has_auth_user_get()) return kAuthUserGet;
  if (r.has_auth_user_revoke_role()) return kAuthUserRevokeRole;
  if (r.has_auth_role_add()) return kAuthRoleAdd;
  if (r.has_auth_role_grant_permission()) return kAuthRoleGrantPermission;
  if (r.has_auth_role_get()) return kAuthRoleGet;
  if (r.has_auth_role_revoke_permission()) return kAuthRoleRevokePermission;
  if (r.has_auth_role_delete()) return kAuthRoleDelete;
  if (r.has_auth_user_list()) return kAuthUserList;
  if (r.has_auth_role_list()) return kAuthRoleList;
  return -1;
}

std::string Key(const std::string& key) { return absl::StrCat("key:\"", absl::CEscape(key), "\""); }

}  // namespace

ApplyTimings::ApplyTimings() {
  for (auto& h : histograms_) h = std::make_unique<util::LatencyHistogram>(0.0001, 20);
}

int ApplyTimings::OpOf(const WriteRequest& w) {
  return std::visit(
      [&w](const auto& op) -> int {
        using T = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<T, PutOp>) {
          return kPut;
        } else if constexpr (std::is_same_v<T, DeleteRangeOp>) {
          return kDeleteRange;
        } else if constexpr (std::is_same_v<T, TxnOp>) {
          return kTxn;
        } else if constexpr (std::is_same_v<T, CompactOp>) {
          return kCompaction;
        } else if constexpr (std::is_same_v<T, LeaseGrantOp>) {
          return kLeaseGrant;
        } else if constexpr (std::is_same_v<T, LeaseRevokeOp>) {
          return kLeaseRevoke;
        } else if constexpr (std::is_same_v<T, AlarmOp>) {
          return kAlarm;
        } else if constexpr (std::is_same_v<T, CustomOp>) {
          return w.raft_request != nullptr ? OpOfEntry(*w.raft_request) : -1;
        } else {
          return -1;
        }
      },
      w.op);
}

std::string ApplyTimings::Describe(const WriteRequest& w) {
  return std::visit(
      [&w](const auto& op) -> std::string {
        using T = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<T, PutOp>) {
          return absl::StrCat("put:<", Key(op.request->key()),
                              " value_size:", op.request->value().size(), ">");
        } else if constexpr (std::is_same_v<T, DeleteRangeOp>) {
          return absl::StrCat("delete_range:<", Key(op.request->key()), " range_end:\"",
                              absl::CEscape(op.request->range_end()), "\">");
        } else if constexpr (std::is_same_v<T, TxnOp>) {
          return absl::StrCat("txn:<compare:", op.request->compare_size(),
                              " success:", op.request->success_size(),
                              " failure:", op.request->failure_size(), ">");
        } else if constexpr (std::is_same_v<T, CompactOp>) {
          return absl::StrCat("compaction:<revision:", op.request->revision(),
                              " physical:", op.request->physical() ? "true" : "false", ">");
        } else {
          const int i = OpOf(w);
          return i < 0 ? "internal" : kOps[i];
        }
      },
      w.op);
}

void ApplyTimings::Record(int op, const absl::Status& s, double seconds) {
  const bool success = s.ok() || Is(s, Error::kCompacted);
  histograms_[op * 2 + (success ? 1 : 0)]->Record(seconds);
}

}  // namespace capstan::mvcc
