// Shared by the migration tests (migrate_test.cc, migrate_auth_test.cc,
// migrate_wal_test.cc, migrate_wal_auth_test.cc): the MigrateTest fixture,
// whose suite set-up has a real etcd write a history (puts, deletes, txns,
// leases, a compaction, auth), records etcd's answers at every retained
// revision and stops it; and helpers that compare a migrated store with what
// etcd answered. Every test needs etcd and etcdctl: without them it skips,
// or fails under CI=true (tests/reference.h).
//
// Test code only. Used by one thread at a time.

#ifndef CAPSTAN_CMD_MIGRATE_MIGRATE_TEST_FIXTURE_H_
#define CAPSTAN_CMD_MIGRATE_MIGRATE_TEST_FIXTURE_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cmd/migrate/migrate.h"
#include "etcdctl_command.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mvcc/kv_store.h"
#include "mvccpb/kv.pb.h"
#include "process_fixture.h"

namespace capstan::server::migrate_test {

namespace fs = std::filesystem;

using testing::ServerOptions;
using testing::ServerProcess;
using testing::TempDir;

using Etcd = testing::EtcdctlServer;

// Skips the test without etcd and etcdctl, or fails it in CI.
#define CAPSTAN_REQUIRE_ETCD_AND_ETCDCTL()                                       \
  do {                                                                          \
    CAPSTAN_REQUIRE_REFERENCE("etcd", ::capstan::testing::EtcdBinary());       \
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", ::capstan::testing::EtcdctlBinary()); \
  } while (0)

// Every event a watch on the whole key space from revision `from` delivers,
// up to and including those of revision `until`.
std::vector<mvccpb::Event> WatchFrom(const std::shared_ptr<grpc::Channel>& channel, int64_t from,
                                     int64_t until, bool prev_kv);

std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& bytes);

// A migrated store, opened without expiring leases.
absl::StatusOr<std::unique_ptr<mvcc::KvStore>> OpenStore(const std::string& data_dir);

// The whole key space at rev.
etcdserverpb::RangeRequest EverythingAt(int64_t rev);

// The store answers a Range of the whole key space at rev as etcd did
// (want): the count, and every KeyValue byte for byte.
void ExpectSameKeysAt(const mvcc::KvStore& s, int64_t rev, const etcdserverpb::RangeResponse& want,
                      const std::string& context = "");

// What etcd answered before it stopped.
struct EtcdAnswers {
  std::map<int64_t, etcdserverpb::RangeResponse> ranges;  // every retained revision
  int64_t compact = 0;
  int64_t current = 0;
  uint32_t hashkv = 0;
  int64_t hashkv_compact = 0;
  int64_t lease_keys = 0, lease_empty = 0, lease_revoked = 0;
  // Watches of the whole key space: from watch_from, and with prev_kv from
  // the compaction revision.
  int64_t watch_from = 0;
  std::vector<mvccpb::Event> watch_events;
  std::vector<mvccpb::Event> watch_events_prev_kv;
};

class MigrateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override {
    CAPSTAN_REQUIRE_ETCD_AND_ETCDCTL();
    ASSERT_NE(dir_, nullptr);
  }

  static std::string EtcdDir() { return etcd_->data_dir(); }
  static std::string Snapshot() { return *dir_ + "/snap.db"; }
  static std::string NewDir(const std::string& name) { return *dir_ + "/" + name; }

  // The migrated store answers exactly what etcd answered.
  static void CheckStoreMatchesEtcd(const std::string& data_dir);

  static Etcd* etcd_;  // stopped after set-up; its data dir lives until tear-down
  static std::string* dir_;
  static EtcdAnswers* answers_;
};

// ---------------------------------------------------------------------------
// Killed etcds and their WALs (migrate_wal_test.cc, migrate_wal_auth_test.cc).

// A put etcd acknowledged.
struct AckedPut {
  std::string key, value;
  int64_t rev;
};

// Each acknowledged put (at or above the store's compaction) is in the store
// at its revision, with its value.
void ExpectAckedPuts(const mvcc::KvStore& s, const std::vector<AckedPut>& acked,
                     const std::string& report);

// The store's HashKV at its current revision is etcd's, at the same revision.
void ExpectEtcdsHashKV(mvcc::KvStore& s, const ServerProcess& etcd, const std::string& report,
                       const std::string& token = "");

// The store and etcd end at the same revision and hold the same keys, byte
// for byte, at every revision from the store's compaction on (etcd read
// with token, if auth is on).
void ExpectEtcdsHistory(const mvcc::KvStore& s, const ServerProcess& etcd, const std::string& token,
                        const std::string& report);

// etcd flags that keep it from writing its backend on its own for an hour:
// what it writes after a clean (re)start is in its WAL only until it stops
// (etcd 3.4; 3.5 also commits its backend at other moments). `binary`: the
// etcd to run (empty: the reference).
ServerOptions EtcdWritingItsWalOnly(const std::string& binary = "");

// Migrates an etcd's data dir into a new directory of its own.
struct WalMigration {
  absl::StatusOr<MigrateReport> Run(const ServerProcess& etcd, const std::string& name = "new",
                                    bool skip_wal = false) {
    options.from = etcd.data_dir();
    options.data_dir = out.path() + "/" + name;
    options.skip_wal = skip_wal;
    return MigrateFromEtcd(options);
  }
  TempDir out{"capstan-migrate-wal"};
  MigrateOptions options;
};

}  // namespace capstan::server::migrate_test

#endif  // CAPSTAN_CMD_MIGRATE_MIGRATE_TEST_FIXTURE_H_
