// The second half of `capstan migrate --from-etcd`: what etcd logged in its
// WAL after its backend's consistent index, applied to the copied store as
// etcd applies it when it starts.

#include "cmd/migrate/migrate_source.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "auth/auth_store.h"
#include "auth/errors.h"
#include "etcdserverpb/raft_internal.pb.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store.h"
#include "mvcc/meta_keys.h"
#include "mvcc/revision_key.h"
#include "storage/backend.h"
#include "storage/data_dir.h"
#include "storage/etcdfmt/etcd_wal.h"

namespace capstan::server::migrate_internal {
namespace {

using auth::AuthInfo;
using auth::AuthStore;
using mvcc::KvStore;
using auth::PermType;

// What became of one request: applied, refused (with etcd's error for it),
// or skipped (it holds nothing Capstan keeps).
struct Outcome {
  enum Kind { kApplied, kRefused, kSkipped } kind;
  absl::Status why;
};
Outcome Applied() { return {Outcome::kApplied, {}}; }
Outcome Skipped() { return {Outcome::kSkipped, {}}; }
Outcome Refused(absl::Status why) { return {Outcome::kRefused, std::move(why)}; }

// Refusals listed in the report, at most.
constexpr size_t kMaxRefusalsReported = 20;

// Applies requests to one store, with etcd's apply-time auth checks.
class Replayer {
 public:
  Replayer(KvStore* kv, AuthStore* auth) : kv_(kv), auth_(auth) {}

  // One request; an error only when the store itself failed.
  absl::StatusOr<Outcome> Apply(const etcdserverpb::InternalRaftRequest& r) {
    const AuthInfo info{r.header().username(), r.header().auth_revision()};
    if (r.has_put()) {
      if (auto st = auth_->CheckPut(info, r.put()); !st.ok()) return Refused(st);
      return Result(kv_->Put(r.put()).status());
    }
    if (r.has_delete_range()) {
      if (auto st = auth_->CheckDeleteRange(info, r.delete_range()); !st.ok()) return Refused(st);
      return Result(kv_->DeleteRange(r.delete_range()).status());
    }
    if (r.has_txn()) {
      // The txn passed its etcd's own checks before it was logged; when
      // applying it, etcd checks it again as 3.4 does (see TxnRules).
      if (auto st = auth_->CheckTxn(info, r.txn(), AuthStore::TxnRules::kEtcd34); !st.ok()) {
        return Refused(st);
      }
      return Result(kv_->Txn(r.txn()).status());
    }
    if (r.has_compaction()) return Result(kv_->Compact(r.compaction()).status());
    if (r.has_lease_grant()) return Result(kv_->LeaseGrant(r.lease_grant()).status());
    if (r.has_lease_revoke()) {
      if (auto st = auth_->CheckLeaseKeys(info, r.lease_revoke().id(), PermType::kWrite);
          !st.ok()) {
        return Refused(st);
      }
      return Result(kv_->LeaseRevoke(r.lease_revoke()).status());
    }
    if (r.has_alarm()) return Result(kv_->Alarm(r.alarm()).status());
    const std::function<void(AuthStore::Done)> change = AuthChange(r);
    // Reads (ranges, user and role gets and lists), logins (simple tokens
    // live in memory) and lease checkpoints (remaining TTLs are not carried
    // over) change nothing that is kept.
    if (!change) return Skipped();
    // etcd's needAdminPermission.
    if (auto st = auth_->CheckAdmin(info); !st.ok()) return Refused(st);
    return Result(auth_->Wait(change));
  }

 private:
  // The auth store mutation a request logs (run by AuthStore::Wait, on the
  // calling thread); empty for a request that changes no auth state.
  std::function<void(AuthStore::Done)> AuthChange(const etcdserverpb::InternalRaftRequest& r) {
    AuthStore* auth = auth_;
    // etcd 3.4 logs passwords and hashes them when it applies the request;
    // 3.5 logs the hash.
    auto with_hash = [auth](const std::string& hashed, const std::string& password,
                            AuthStore::Done& d) -> std::optional<std::string> {
      if (!hashed.empty()) return hashed;
      auto h = auth->HashPassword(password);
      if (h.ok()) return *h;
      d(h.status());
      return std::nullopt;
    };
    if (r.has_auth_enable()) return [auth](AuthStore::Done d) { auth->AuthEnable(std::move(d)); };
    if (r.has_auth_disable()) return [auth](AuthStore::Done d) { auth->AuthDisable(std::move(d)); };
    if (r.has_auth_user_add()) {
      return [auth, with_hash, &u = r.auth_user_add()](AuthStore::Done d) {
        const bool no_password = u.options().no_password();
        std::optional<std::string> hash;
        if (no_password) {
          hash.emplace();
        } else {
          hash = with_hash(u.hashedpassword(), u.password(), d);
        }
        if (hash) auth->UserAdd(u.name(), *hash, no_password, std::move(d));
      };
    }
    if (r.has_auth_user_change_password()) {
      return [auth, with_hash, &c = r.auth_user_change_password()](AuthStore::Done d) {
        auto hash = with_hash(c.hashedpassword(), c.password(), d);
        if (hash) auth->UserChangePassword(c.name(), *hash, std::move(d));
      };
    }
    if (r.has_auth_user_delete()) {
      return [auth, &u = r.auth_user_delete()](AuthStore::Done d) {
        auth->UserDelete(u.name(), std::move(d));
      };
    }
    if (r.has_auth_user_grant_role()) {
      return [auth, &g = r.auth_user_grant_role()](AuthStore::Done d) {
        auth->UserGrantRole(g.user(), g.role(), std::move(d));
      };
    }
    if (r.has_auth_user_revoke_role()) {
      return [auth, &v = r.auth_user_revoke_role()](AuthStore::Done d) {
        auth->UserRevokeRole(v.name(), v.role(), std::move(d));
      };
    }
    if (r.has_auth_role_add()) {
      return [auth, &a = r.auth_role_add()](AuthStore::Done d) {
        auth->RoleAdd(a.name(), std::move(d));
      };
    }
    if (r.has_auth_role_delete()) {
      return [auth, &del = r.auth_role_delete()](AuthStore::Done d) {
        auth->RoleDelete(del.role(), std::move(d));
      };
    }
    if (r.has_auth_role_grant_permission()) {
      return [auth, &g = r.auth_role_grant_permission()](AuthStore::Done d) {
        if (!g.has_perm()) {
          d(auth::MakeError(auth::Error::kPermissionNotGiven));
          return;
        }
        auth->RoleGrantPermission(g.name(), g.perm(), std::move(d));
      };
    }
    if (r.has_auth_role_revoke_permission()) {
      return [auth, &v = r.auth_role_revoke_permission()](AuthStore::Done d) {
        auth->RoleRevokePermission(v.role(), v.key(), v.range_end(), std::move(d));
      };
    }
    return {};
  }

  // A refused request is etcd's answer to it; a store that failed is not.
  absl::StatusOr<Outcome> Result(const absl::Status& s) const {
    if (s.ok()) return Applied();
    if (auto failed = kv_->StorageFailure(); !failed.ok()) return failed;
    return Refused(s);
  }

  KvStore* const kv_;
  AuthStore* const auth_;
};

// The request's kind as etcd's raft_internal.proto names it, with the key
// of a put or delete.
std::string RequestName(const etcdserverpb::InternalRaftRequest& r) {
  if (r.has_put()) return absl::StrCat("put ", Printable(r.put().key()));
  if (r.has_delete_range()) return absl::StrCat("delete_range ", Printable(r.delete_range().key()));
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r.GetReflection()->ListFields(r, &fields);
  for (const auto* f : fields) {
    if (f->name() != "header" && f->name() != "ID") return f->name();
  }
  return "empty";
}

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

absl::Status ReplayEtcdWal(const std::string& wal_dir, const std::string& data_dir,
                           uint64_t consistent_index, const std::vector<std::string>& members,
                           MigrateReport* report) {
  auto wal = etcdfmt::ReadEtcdWal(wal_dir, consistent_index);
  if (!wal.ok()) return wal.status();
  report->wal_dir = wal_dir;
  report->wal_files = wal->files.size();
  report->wal_commit_index = wal->state.commit();
  report->wal_torn_tail = wal->torn_tail;
  report->wal_last_index = wal->last_index;
  report->wal_entries = wal->entries.size();
  // The WAL must be this member's: its metadata names the member that wrote
  // it, which the db lists.
  etcdserverpb::WalMetadata meta;
  if (!wal->metadata.empty() && meta.ParseFromString(wal->metadata) && !members.empty()) {
    const std::string id = absl::StrFormat("%x", meta.nodeid());
    if (std::find(members.begin(), members.end(), id) == members.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the WAL in ", wal_dir, " was written by member ", id,
          ", which the db's members bucket does not hold: it is not this db's WAL"));
    }
  }
  if (wal->entries.empty()) return absl::OkStatus();
  // A member that was its cluster's only one commits whatever it logged
  // when it starts; a member of several (or of a cluster whose size the db
  // does not tell, or that changed in the WAL) keeps what it knew committed,
  // as etcd's --force-new-cluster does.
  const bool single_member =
      members.size() == 1 &&
      std::none_of(wal->entries.begin(), wal->entries.end(),
                   [](const raftpb::Entry& e) { return e.type() != raftpb::EntryNormal; });
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
  bopts.dir = storage::BackendDir(data_dir);
  bopts.sync = false;  // one Flush at the end makes it all durable
  auto backend = storage::Backend::Open(bopts);
  if (!backend.ok()) return backend.status();
  mvcc::KvStoreOptions sopts;
  sopts.lease_check_interval = absl::Hours(24 * 365);
  sopts.max_txn_ops = INT_MAX;
  sopts.max_request_bytes = INT64_MAX;
  auto kv = KvStore::Open(sopts, std::move(*backend));
  if (!kv.ok()) return kv.status();
  auto auth = AuthStore::Open(kv->get(), auth::AuthStoreOptions{});
  if (!auth.ok()) return auth.status();
  const int64_t rev_before = (*kv)->Rev();

  Replayer replayer(kv->get(), auth->get());
  uint64_t last_considered = consistent_index;
  for (const raftpb::Entry& e : wal->entries) {
    if (!single_member && e.index() > wal->state.commit()) {
      ++report->wal_uncommitted;
      continue;
    }
    last_considered = e.index();
    // etcd's applyEntryNormal: a new leader's empty entry holds nothing;
    // membership changes are not migrated.
    if (e.type() != raftpb::EntryNormal || e.data().empty()) {
      ++report->wal_skipped;
      continue;
    }
    bool v2 = false;
    auto request = DecodeRequest(e, &v2);
    if (!request.ok()) return request.status();
    if (v2) {
      ++report->wal_skipped;
      continue;
    }
    auto outcome = replayer.Apply(*request);
    if (!outcome.ok()) return outcome.status();
    switch (outcome->kind) {
      case Outcome::kApplied: ++report->wal_replayed; break;
      case Outcome::kSkipped: ++report->wal_skipped; break;
      case Outcome::kRefused:
        if (report->wal_refusals.size() < kMaxRefusalsReported) {
          report->wal_refusals.push_back(
              absl::StrCat("entry ", e.index(), " (", RequestName(*request), "): ",
                           outcome->why.message()));
        }
        ++report->wal_refused;
        break;
    }
  }
  (*kv)->WaitCompactionDone();
  if ((*kv)->Rev() != rev_before) {
    report->wal_first_revision = rev_before + 1;
    report->wal_last_revision = (*kv)->Rev();
  }
  // The raft index goes on from the last entry applied, as etcd's does
  // (the store counted only the requests it applied).
  storage::WriteBatch index;
  std::string index_bytes;
  util::AppendBigEndian64(last_considered, &index_bytes);
  index.Put(storage::Cf::kMeta, mvcc::kConsistentIndexKey, index_bytes);
  if (auto st = (*kv)->backend()->Write(&index); !st.ok()) return st;
  return (*kv)->backend()->Flush();
}

}  // namespace capstan::server::migrate_internal
