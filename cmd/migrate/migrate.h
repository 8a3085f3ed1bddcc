// Migration from etcd: `capstan migrate --from-etcd SRC --data-dir NEW [--verify]`.
//
// Reads etcd's bbolt backend directly and read-only (etcdfmt::BboltReader)
// and writes a new Capstan data directory holding the same records:
//
//   etcd bucket                     Capstan column family
//   key        (revision -> KV)     kKey, as-is (same keys, same bytes)
//   meta       scheduledCompactRev, finishedCompactRev, consistent_index
//                                   kMeta, same names and encodings
//   lease      (id -> leasepb)      kLease: LeaseKey(id) -> EncodeLeaseRecord
//   auth, authUsers, authRoles      kAuth: "<bucket>/<key>" -> value as-is
//   alarm                           kAlarm, as-is
//
// Then, for an etcd data dir, the requests etcd logged in its WAL after the
// backend's consistent index are applied as etcd applies them when it
// starts: etcd writes its backend every 100 ms, so a member that was killed
// has its last acknowledged writes in the WAL only.
//
// Not carried over: etcd's membership (members, members_removed, cluster
// buckets; the new Capstan member has its own ids), raft state (the snap
// files; meta's term/confState; the WAL once replayed), leases' remaining TTL
// (each lease starts again with its full TTL, as on an etcd restart) and
// buckets Capstan does not know (reported).
//
// SRC is a stopped etcd's data directory (its member/snap/db is read; a
// running etcd holds a lock on it and is refused), a bbolt db file, or a
// file written by `etcdctl snapshot save` (a bbolt file followed by the
// SHA-256 of it, which is checked and stripped).
//
// The new directory is built under a temporary name beside NEW and renamed
// into place only when complete, so NEW never holds half a migration.
//
// Thread safety: the functions here are independent; call each from one
// thread.

#ifndef CAPSTAN_CMD_MIGRATE_MIGRATE_H_
#define CAPSTAN_CMD_MIGRATE_MIGRATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace capstan::server {

struct MigrateOptions {
  // An etcd data dir, a bbolt db file, or an etcdctl snapshot file.
  std::string from;
  // The new Capstan data dir. Must not exist, or be an empty directory.
  std::string data_dir;
  // After migrating, check the result against the source (see Verify).
  bool verify = false;
  // Migrate the db alone, without replaying the WAL beside it: for a WAL
  // that cannot be read. What etcd logged after the db's consistent index,
  // acknowledged writes included, is not migrated.
  bool skip_wal = false;
  // Refuse a source that is not an etcdctl snapshot (no SHA-256 trailer),
  // before writing anything: `capstan snapshot restore`, as etcdctl's.
  bool require_snapshot = false;
  // Verify: a full Range is compared at every `verify_stride`-th retained
  // revision (and always at the first and the last); every revision still
  // gets its changed keys compared. 1 (the default) compares a full Range
  // at every revision.
  int64_t verify_stride = 1;
  // Records per backend write batch, at most.
  int batch_records = 10000;
  // Progress lines (the CLI prints them); may be empty.
  std::function<void(const std::string&)> progress;
};

struct MigrateReport {
  std::string source_file;  // the bbolt file read
  bool snapshot = false;    // an etcdctl snapshot whose SHA-256 was verified
  uint64_t page_size = 0;
  uint64_t txid = 0;

  // What was copied.
  uint64_t key_records = 0;
  uint64_t leases = 0;
  uint64_t auth_records = 0;
  uint64_t alarms = 0;
  int64_t current_revision = 0;
  int64_t compact_revision = 0;
  uint64_t consistent_index = 0;
  // Buckets and meta records found in the source and not carried over.
  std::vector<std::string> not_carried;

  // The etcd WAL replayed after the copy (see ReplayEtcdWal in
  // migrate_source.h). Empty wal_dir: no WAL was read (SRC is a snapshot,
  // or a db file without its data dir around it).
  std::string wal_dir;
  std::string wal_skipped_dir;    // the WAL left unread by --skip-wal
  uint64_t wal_files = 0;
  uint64_t wal_last_index = 0;    // the last entry logged
  uint64_t wal_commit_index = 0;  // the last hard state's commit index
  bool wal_torn_tail = false;     // a record cut short by a crash was dropped
  uint64_t wal_entries = 0;       // entries after the consistent index
  uint64_t wal_replayed = 0;      // requests applied
  uint64_t wal_refused = 0;       // requests refused, as etcd refuses them
  std::vector<std::string> wal_refusals;  // the first few, with etcd's error
  uint64_t wal_skipped = 0;       // entries holding no v3 data (below)
  uint64_t wal_uncommitted = 0;   // left out: past the commit index, several members
  int64_t wal_first_revision = 0; // revisions the replay made (0 if none)
  int64_t wal_last_revision = 0;

  // Verification (when asked).
  bool verified = false;
  int64_t first_revision_checked = 0;
  int64_t revisions_checked = 0;   // every retained revision
  int64_t full_ranges_checked = 0; // of which with a full Range compared
  int64_t live_keys = 0;           // keys at the current revision
  uint64_t leases_checked = 0;
  uint32_t source_hash = 0;        // etcd's HashKV over the source key bucket
  uint32_t capstan_hash = 0;       // KvStore::HashKV of the result
  int64_t mismatches = 0;
  std::vector<std::string> mismatch_examples;  // the first few, described
};

// Migrates options.from into options.data_dir: copies the backend,
// verifies the copy if asked, replays the WAL, and only then moves the
// result to NEW. An error (reading the source, writing the result, a
// verification that could not run, a WAL that cannot be read) leaves NEW as
// it was. A verification that ran and found mismatches returns OK with
// report.mismatches > 0.
absl::StatusOr<MigrateReport> MigrateFromEtcd(const MigrateOptions& options);

// Compares an existing Capstan data dir with an etcd source, as --verify
// does: Range at every retained revision, HashKV, leases and their keys,
// meta, auth and alarm records. Opens the data dir's store without serving
// it and without expiring leases. Fills the verification fields of *report.
absl::Status VerifyMigration(const std::string& from, const std::string& data_dir,
                             int64_t verify_stride, MigrateReport* report);

// The report as printed by `capstan migrate`.
std::string FormatMigrateReport(const MigrateReport& report);

// `capstan migrate ...` (args after "migrate"). Returns the exit code: 0 on
// success, 1 on an error or a verification mismatch, 2 on bad usage.
int MigrateCommand(const std::vector<std::string>& args);

}  // namespace capstan::server

#endif  // CAPSTAN_CMD_MIGRATE_MIGRATE_H_
