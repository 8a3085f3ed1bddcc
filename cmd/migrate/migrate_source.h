// The source of `capstan migrate --from-etcd`: etcd's bbolt file, opened
// read-only and locked against a running etcd, and its records decoded.
// Internal to the migration (migrate.cc copies, migrate_verify.cc checks).
//
// Thread safety: a Source is used by one thread at a time.

#ifndef CAPSTAN_CMD_MIGRATE_MIGRATE_SOURCE_H_
#define CAPSTAN_CMD_MIGRATE_MIGRATE_SOURCE_H_

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "cmd/migrate/migrate.h"
#include "index/revision.h"
#include "storage/etcdfmt/bbolt_reader.h"

namespace capstan::server::migrate_internal {

// etcd's bucket names.
inline constexpr char kKeyBucket[] = "key";
inline constexpr char kMetaBucket[] = "meta";
inline constexpr char kLeaseBucket[] = "lease";
inline constexpr char kAlarmBucket[] = "alarm";
inline constexpr const char* kAuthBuckets[] = {"auth", "authUsers", "authRoles"};

// Abseil here has its own string_view; keys go into messages escaped.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string Printable(std::string_view s) { return absl::CHexEscape(Sv(s)); }

// An opened bbolt file, locked against a running etcd.
struct Source {
  ~Source() {
    if (lock_fd >= 0) ::close(lock_fd);
  }
  std::string file;
  bool snapshot = false;
  int lock_fd = -1;
  std::unique_ptr<etcdfmt::BboltReader> reader;
};

// Opens `from`: an etcd data dir (its member/snap/db) or a bbolt file; a
// file of an etcdctl snapshot's size must carry a matching SHA-256.
absl::StatusOr<std::unique_ptr<Source>> OpenSource(const std::string& from);

// One record of the key bucket. The views point into the reader's mapping.
struct SourceRecord {
  index::Revision rev;
  bool tombstone = false;
  std::string_view key_bytes;  // the 17/18-byte revision key
  std::string_view record;     // the stored mvccpb.KeyValue
  std::string_view key;        // the KV key, inside record
  int64_t lease = 0;
};

// Visits the key bucket in order, checking every record.
absl::Status ForEachKeyRecord(const etcdfmt::BboltReader& r,
                              const std::function<absl::Status(const SourceRecord&)>& fn);

// The meta bucket: compaction state and what Capstan carries over.
struct SourceMeta {
  int64_t scheduled = 0, finished = 0;
  std::optional<uint64_t> consistent_index;
  std::vector<std::pair<std::string, std::string>> carried;  // as written to kMeta
  std::vector<std::string> not_carried;
};
absl::StatusOr<SourceMeta> ReadSourceMeta(const etcdfmt::BboltReader& r);

// Compares the Capstan store in data_dir with the source at every retained
// revision (a full Range every `stride`-th one) and fills report's verify
// fields (migrate_verify.cc).
absl::Status VerifyAgainstSource(const etcdfmt::BboltReader& r, const std::string& data_dir,
                                 int64_t stride, MigrateReport* report);

// The WAL that goes with SRC: <dir>/member/wal for an etcd data dir, and
// for a db file at <dir>/member/snap/db the same; empty for a snapshot (its
// writer's WAL is not there) or a db file without that layout around it.
std::string WalDirOf(const Source& source);

// The member ids (hex) in the source's `members` bucket (etcd 3.4+ keeps
// them there); none when it has no such bucket.
absl::StatusOr<std::vector<std::string>> ListMembers(const etcdfmt::BboltReader& r);

// Applies to the Capstan store in data_dir the requests etcd logged in
// wal_dir after consistent_index, as etcd applies them when it starts
// (etcdserver's applierV3 with its auth checks, from each request's header):
// puts, deletes, txns, compactions, lease grants and revocations, alarms and
// auth changes. A request etcd would refuse (an unknown lease, a stale auth
// revision, a user without permission) changes nothing here either. Empty
// entries, membership changes, v2 store requests, reads, logins and lease
// checkpoints hold no v3 data and are skipped. A single member (members
// lists one, and the WAL tail changes no membership) applies every entry it
// logged when it starts (it commits them itself); otherwise entries after
// the logged commit index are left out, as etcd's --force-new-cluster leaves
// them out. The WAL's metadata must name one of members. Fills the wal_
// fields of *report and sets the store's raft index to the last entry
// considered.
absl::Status ReplayEtcdWal(const std::string& wal_dir, const std::string& data_dir,
                           uint64_t consistent_index, const std::vector<std::string>& members,
                           MigrateReport* report);

}  // namespace capstan::server::migrate_internal

#endif  // CAPSTAN_CMD_MIGRATE_MIGRATE_SOURCE_H_
