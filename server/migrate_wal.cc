// The second half of `capstan migrate --from-etcd`: what etcd logged in its
// WAL after its backend's consistent index, applied to the copied store as
// etcd applies it when it starts.

#include "server/migrate_source.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "etcdserverpb/raft_internal.pb.h"
#include "mvcc/auth_store.h"
#include "mvcc/kv_store.h"
#include "server/data_dir.h"
#include "server/etcd_wal.h"
#include "storage/backend.h"

namespace capstan::server::migrate_internal {
namespace {

namespace fs = std::filesystem;

using mvcc::AuthInfo;
using mvcc::AuthStore;
using mvcc::KvStore;
using mvcc::PermType;

enum class Outcome { kApplied, kRefused, kSkipped };

// Applies requests to one store, with etcd's apply-time auth checks.
class Replayer {
 public:
  Replayer(KvStore* kv, AuthStore* auth) : kv_(kv), auth_(auth) {}

  // One request; an error only when the store itself failed.
  absl::StatusOr<Outcome> Apply(const etcdserverpb::InternalRaftRequest& r) {
    const AuthInfo info{r.header().username(), r.header().auth_revision()};
    using R = etcdserverpb::InternalRaftRequest;
    if (NeedsAdmin(r) && !auth_->CheckAdmin(info).ok()) return Outcome::kRefused;
    switch (Which(r)) {
      case R::kPutFieldNumber:
        if (!auth_->CheckPut(info, r.put()).ok()) return Outcome::kRefused;
        return Result(kv_->Put(r.put()).status());
      case R::kDeleteRangeFieldNumber:
        if (!auth_->CheckDeleteRange(info, r.delete_range()).ok()) return Outcome::kRefused;
        return Result(kv_->DeleteRange(r.delete_range()).status());
      case R::kTxnFieldNumber:
        if (!auth_->CheckTxn(info, r.txn()).ok()) return Outcome::kRefused;
        return Result(kv_->Txn(r.txn()).status());
      case R::kCompactionFieldNumber:
        return Result(kv_->Compact(r.compaction()).status());
      case R::kLeaseGrantFieldNumber:
        return Result(kv_->LeaseGrant(r.lease_grant()).status());
      case R::kLeaseRevokeFieldNumber:
        if (!auth_->CheckLeaseKeys(info, r.lease_revoke().id(), PermType::kWrite).ok()) {
          return Outcome::kRefused;
        }
        return Result(kv_->LeaseRevoke(r.lease_revoke()).status());
      case R::kAlarmFieldNumber:
        return Result(kv_->Alarm(r.alarm()).status());
      case R::kAuthEnableFieldNumber:
        return Mutate([&](AuthStore::Done d) { auth_->AuthEnable(std::move(d)); });
      case R::kAuthDisableFieldNumber:
        return Mutate([&](AuthStore::Done d) { auth_->AuthDisable(std::move(d)); });
      case R::kAuthUserAddFieldNumber: {
        const auto& u = r.auth_user_add();
        const bool no_password = u.options().no_password();
        // etcd 3.4 logs the password and hashes it when it applies the
        // request; 3.5 logs the hash.
        std::string hash = u.hashedpassword();
        if (!no_password && hash.empty()) {
          auto h = auth_->HashPassword(u.password());
          if (!h.ok()) return Outcome::kRefused;
          hash = *h;
        }
        return Mutate([&](AuthStore::Done d) {
          auth_->UserAdd(u.name(), hash, no_password, std::move(d));
        });
      }
      case R::kAuthUserDeleteFieldNumber:
        return Mutate([&](AuthStore::Done d) {
          auth_->UserDelete(r.auth_user_delete().name(), std::move(d));
        });
      case R::kAuthUserChangePasswordFieldNumber: {
        const auto& c = r.auth_user_change_password();
        std::string hash = c.hashedpassword();
        if (hash.empty()) {
          auto h = auth_->HashPassword(c.password());
          if (!h.ok()) return Outcome::kRefused;
          hash = *h;
        }
        return Mutate([&](AuthStore::Done d) {
          auth_->UserChangePassword(c.name(), hash, std::move(d));
        });
      }
      case R::kAuthUserGrantRoleFieldNumber:
        return Mutate([&](AuthStore::Done d) {
          auth_->UserGrantRole(r.auth_user_grant_role().user(), r.auth_user_grant_role().role(),
                               std::move(d));
        });
      case R::kAuthUserRevokeRoleFieldNumber:
        return Mutate([&](AuthStore::Done d) {
          auth_->UserRevokeRole(r.auth_user_revoke_role().name(),
                                r.auth_user_revoke_role().role(), std::move(d));
        });
      case R::kAuthRoleAddFieldNumber:
        return Mutate([&](AuthStore::Done d) {
          auth_->RoleAdd(r.auth_role_add().name(), std::move(d));
        });
      case R::kAuthRoleDeleteFieldNumber:
        return Mutate([&](AuthStore::Done d) {
          auth_->RoleDelete(r.auth_role_delete().role(), std::move(d));
        });
      case R::kAuthRoleGrantPermissionFieldNumber: {
        const auto& g = r.auth_role_grant_permission();
        if (!g.has_perm()) return Outcome::kRefused;
        return Mutate([&](AuthStore::Done d) {
          auth_->RoleGrantPermission(g.name(), g.perm(), std::move(d));
        });
      }
      case R::kAuthRoleRevokePermissionFieldNumber: {
        const auto& v = r.auth_role_revoke_permission();
        return Mutate([&](AuthStore::Done d) {
          auth_->RoleRevokePermission(v.role(), v.key(), v.range_end(), std::move(d));
        });
      }
      default:
        // Reads (ranges, user and role gets and lists), logins (simple
        // tokens live in memory) and lease checkpoints (remaining TTLs are
        // not carried over) change nothing that is kept.
        return Outcome::kSkipped;
    }
  }

 private:
  // The request's field number; 0 when it holds none.
  static int Which(const etcdserverpb::InternalRaftRequest& r) {
    using R = etcdserverpb::InternalRaftRequest;
    if (r.has_put()) return R::kPutFieldNumber;
    if (r.has_delete_range()) return R::kDeleteRangeFieldNumber;
    if (r.has_txn()) return R::kTxnFieldNumber;
    if (r.has_compaction()) return R::kCompactionFieldNumber;
    if (r.has_lease_grant()) return R::kLeaseGrantFieldNumber;
    if (r.has_lease_revoke()) return R::kLeaseRevokeFieldNumber;
    if (r.has_alarm()) return R::kAlarmFieldNumber;
    if (r.has_auth_enable()) return R::kAuthEnableFieldNumber;
    if (r.has_auth_disable()) return R::kAuthDisableFieldNumber;
    if (r.has_auth_user_add()) return R::kAuthUserAddFieldNumber;
    if (r.has_auth_user_delete()) return R::kAuthUserDeleteFieldNumber;
    if (r.has_auth_user_change_password()) return R::kAuthUserChangePasswordFieldNumber;
    if (r.has_auth_user_grant_role()) return R::kAuthUserGrantRoleFieldNumber;
    if (r.has_auth_user_revoke_role()) return R::kAuthUserRevokeRoleFieldNumber;
    if (r.has_auth_role_add()) return R::kAuthRoleAddFieldNumber;
    if (r.has_auth_role_delete()) return R::kAuthRoleDeleteFieldNumber;
    if (r.has_auth_role_grant_permission()) return R::kAuthRoleGrantPermissionFieldNumber;
    if (r.has_auth_role_revoke_permission()) return R::kAuthRoleRevokePermissionFieldNumber;
    return 0;
  }

  // etcd's needAdminPermission: auth changes, and user and role lists.
  static bool NeedsAdmin(const etcdserverpb::InternalRaftRequest& r) {
    return r.has_auth_enable() || r.has_auth_disable() || r.has_auth_user_add() ||
           r.has_auth_user_delete() || r.has_auth_user_change_password() ||
           r.has_auth_user_grant_role() || r.has_auth_user_revoke_role() ||
           r.has_auth_role_add() || r.has_auth_role_grant_permission() ||
           r.has_auth_role_revoke_permission() || r.has_auth_role_delete() ||
           r.has_auth_user_list() || r.has_auth_role_list();
  }

  // A refused request is etcd's answer to it; a store that failed is not.
  absl::StatusOr<Outcome> Result(const absl::Status& s) const {
    if (s.ok()) return Outcome::kApplied;
    if (auto failed = kv_->StorageFailure(); !failed.ok()) return failed;
    return Outcome::kRefused;
  }

  absl::StatusOr<Outcome> Mutate(const std::function<void(AuthStore::Done)>& mutation) {
    return Result(auth_->Wait(mutation));
  }

  KvStore* const kv_;
  AuthStore* const auth_;
};

// An entry's request. A v2 store request comes bare (not wrapped in an
// InternalRaftRequest) or as its v2 field; either is reported as v2.
absl::StatusOr<etcdserverpb::InternalRaftRequest> DecodeRequest(const raftpb::Entry& e,
                                                                bool* v2) {
  etcdserverpb::InternalRaftRequest r;
  *v2 = false;
  if (r.ParseFromString(e.data())) {
    *v2 = !r.v2().empty();
    return r;
  }
  etcdserverpb::RequestV2 legacy;
  if (legacy.ParseFromString(e.data()) && !legacy.method().empty()) {
    *v2 = true;
    return r;
  }
  return absl::DataLossError(absl::StrCat("etcd WAL entry ", e.index(),
                                          " holds a request Capstan cannot decode"));
}

}  // namespace

std::string WalDirOf(const Source& source) {
  if (source.snapshot) return {};
  const fs::path snap = fs::path(source.file).parent_path();
  if (snap.filename() != "snap") return {};
  const fs::path wal = snap.parent_path() / "wal";
  std::error_code ec;
  return fs::is_directory(wal, ec) ? wal.string() : std::string();
}

absl::StatusOr<uint64_t> CountMembers(const storage::BboltReader& r) {
  uint64_t members = 0;
  auto buckets = r.Buckets();
  if (!buckets.ok()) return buckets.status();
  if (std::find(buckets->begin(), buckets->end(), "members") == buckets->end()) return 0;
  auto s = r.ForEach({"members"}, [&members](std::string_view, std::string_view, bool) {
    ++members;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return members;
}

absl::Status ReplayEtcdWal(const std::string& wal_dir, const std::string& data_dir,
                           uint64_t consistent_index, bool single_member, MigrateReport* report) {
  auto wal = ReadEtcdWal(wal_dir, consistent_index);
  if (!wal.ok()) return wal.status();
  report->wal_dir = wal_dir;
  report->wal_files = wal->files.size();
  report->wal_commit_index = wal->state.commit();
  report->wal_torn_tail = wal->torn_tail;
  report->wal_last_index = wal->last_index;
  report->wal_entries = wal->entries.size();
  if (wal->entries.empty()) return absl::OkStatus();
  if (wal->entries.front().index() != consistent_index + 1) {
    return absl::DataLossError(absl::StrCat(
        "the etcd WAL in ", wal_dir, " starts at entry ", wal->entries.front().index(),
        ", after the backend's consistent index ", consistent_index,
        ": the entries in between are missing"));
  }

  // The store, opened as a server would, with etcd's limits lifted (etcd
  // checked its requests against its own flags before logging them) and no
  // lease expiring while the log is applied.
  storage::BackendOptions bopts;
  bopts.dir = BackendDir(data_dir);
  bopts.sync = false;  // one Flush at the end makes it all durable
  auto backend = storage::Backend::Open(bopts);
  if (!backend.ok()) return backend.status();
  mvcc::KvStoreOptions sopts;
  sopts.lease_check_interval = absl::Hours(24 * 365);
  sopts.max_txn_ops = INT_MAX;
  sopts.max_request_bytes = INT64_MAX;
  auto kv = KvStore::Open(sopts, std::move(*backend));
  if (!kv.ok()) return kv.status();
  auto auth = AuthStore::Open(kv->get(), mvcc::AuthStoreOptions{});
  if (!auth.ok()) return auth.status();
  const int64_t rev_before = (*kv)->Rev();

  Replayer replayer(kv->get(), auth->get());
  for (const raftpb::Entry& e : wal->entries) {
    if (!single_member && e.index() > wal->state.commit()) {
      ++report->wal_uncommitted;
      continue;
    }
    bool v2 = false;
    absl::StatusOr<etcdserverpb::InternalRaftRequest> request;
    if (e.type() == raftpb::EntryNormal && !e.data().empty()) request = DecodeRequest(e, &v2);
    if (!request.ok()) return request.status();
    if (e.type() != raftpb::EntryNormal || e.data().empty() || v2) {
      ++report->wal_skipped;
      continue;
    }
    auto outcome = replayer.Apply(*request);
    if (!outcome.ok()) return outcome.status();
    switch (*outcome) {
      case Outcome::kApplied: ++report->wal_replayed; break;
      case Outcome::kRefused: ++report->wal_refused; break;
      case Outcome::kSkipped: ++report->wal_skipped; break;
    }
  }
  (*kv)->WaitCompactionDone();
  if ((*kv)->Rev() != rev_before) {
    report->wal_first_revision = rev_before + 1;
    report->wal_last_revision = (*kv)->Rev();
  }
  return (*kv)->backend()->Flush();
}

}  // namespace capstan::server::migrate_internal
