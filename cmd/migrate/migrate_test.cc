// End-to-end migration from a real etcd: etcd writes (puts, deletes, txns,
// leases, a compaction, auth), its answers at every retained revision are
// recorded, it stops; capstan migrates its data dir and its snapshot, and the
// migrated store must answer alike (Range at every revision, HashKV, leases).
//
// The auth and alarm case is in migrate_auth_test.cc, a killed etcd's WAL in
// migrate_wal_test.cc and migrate_wal_auth_test.cc; the fixture in
// migrate_test_fixture.h.

#include "cmd/migrate/migrate.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cmd/migrate/migrate_test_fixture.h"
#include "gtest/gtest.h"
#include "storage/backend.h"
#include "storage/data_dir.h"

namespace capstan::server::migrate_test {
namespace {

void ExpectClean(const MigrateReport& r) {
  EXPECT_TRUE(r.verified);
  EXPECT_EQ(r.mismatches, 0) << FormatMigrateReport(r);
  EXPECT_EQ(r.source_hash, r.capstan_hash);
  EXPECT_EQ(r.leases, 2u);
  EXPECT_EQ(r.leases_checked, 2u);
  EXPECT_GE(r.auth_records, 2u);
}

TEST_F(MigrateTest, MigratesAStoppedEtcdDataDir) {
  const std::string db = EtcdDir() + "/member/snap/db";
  const std::string before = ReadFile(db);
  const auto mtime = fs::last_write_time(db);
  MigrateOptions options;
  options.from = EtcdDir();
  options.data_dir = NewDir("from-dir");
  options.verify = true;
  auto report = MigrateFromEtcd(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectClean(*report);
  EXPECT_FALSE(report->snapshot);
  EXPECT_EQ(report->current_revision, answers_->current);
  EXPECT_EQ(report->compact_revision, answers_->compact);
  EXPECT_EQ(report->revisions_checked, answers_->current - answers_->compact + 1);
  EXPECT_EQ(report->full_ranges_checked, report->revisions_checked);
  EXPECT_EQ(report->source_hash, answers_->hashkv) << "the source hash is etcd's HashKV";
  EXPECT_GT(report->consistent_index, 0u);
  bool members_reported = false;
  for (const auto& n : report->not_carried) members_reported |= n.rfind("bucket members", 0) == 0;
  EXPECT_TRUE(members_reported) << FormatMigrateReport(*report);
  CheckStoreMatchesEtcd(options.data_dir);
  // The source was only read.
  EXPECT_EQ(ReadFile(db), before);
  EXPECT_EQ(fs::last_write_time(db), mtime);
  // No temporary directory left behind.
  for (const auto& e : fs::directory_iterator(*dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".migrating-"), std::string::npos) << e.path();
  }
}

TEST_F(MigrateTest, MigratesAnEtcdctlSnapshot) {
  MigrateOptions options;
  options.from = Snapshot();
  options.data_dir = NewDir("from-snapshot");
  ASSERT_TRUE(fs::create_directory(options.data_dir));  // an empty NEW is fine
  options.verify = true;
  options.verify_stride = 3;
  auto report = MigrateFromEtcd(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectClean(*report);
  EXPECT_TRUE(report->snapshot);
  EXPECT_LT(report->full_ranges_checked, report->revisions_checked);
  CheckStoreMatchesEtcd(options.data_dir);
}

TEST_F(MigrateTest, VerifyFindsTamperedData) {
  MigrateOptions options;
  options.from = Snapshot();
  options.data_dir = NewDir("tampered");
  auto report = MigrateFromEtcd(options);
  ASSERT_TRUE(report.ok()) << report.status();
  {
    storage::BackendOptions bopts;
    bopts.dir = storage::BackendDir(options.data_dir);
    auto backend = storage::Backend::Open(bopts);
    ASSERT_TRUE(backend.ok());
    auto it = (*backend)->NewIterator(storage::Cf::kKey);
    it->SeekToLast();
    ASSERT_TRUE(it->Valid());
    storage::WriteBatch batch;
    batch.Delete(storage::Cf::kKey, std::string(it->key()));  // lose the last revision
    it.reset();
    ASSERT_TRUE((*backend)->Write(&batch).ok());
  }
  MigrateReport verify;
  ASSERT_TRUE(VerifyMigration(Snapshot(), options.data_dir, 1, &verify).ok());
  EXPECT_GT(verify.mismatches, 0);
  EXPECT_NE(verify.source_hash, verify.capstan_hash);
}

TEST_F(MigrateTest, RefusesBadInputsAndNeverHalfWrites) {
  auto migrate = [](const std::string& from, const std::string& to) {
    MigrateOptions options;
    options.from = from;
    options.data_dir = to;
    return MigrateFromEtcd(options);
  };
  auto expect_error = [](const absl::StatusOr<MigrateReport>& r, const std::string& text) {
    ASSERT_FALSE(r.ok()) << "expected an error mentioning " << text;
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status();
  };
  // NEW not empty.
  const std::string full = NewDir("not-empty");
  fs::create_directories(full);
  WriteFile(full + "/x", "x");
  expect_error(migrate(EtcdDir(), full), "not empty");
  // A directory without etcd data.
  expect_error(migrate(full, NewDir("n1")), "member/snap/db");
  expect_error(migrate(NewDir("nothing-here"), NewDir("n1")), "no such file");

  const std::string snap = ReadFile(Snapshot());
  // A snapshot whose checksum does not match.
  std::string bad = snap;
  bad[bad.size() / 2] ^= 1;
  WriteFile(NewDir("bad-sum.db"), bad);
  expect_error(migrate(NewDir("bad-sum.db"), NewDir("n2")), "sha256");
  // A truncated db file (not a snapshot size: no checksum to check).
  const std::string db = ReadFile(EtcdDir() + "/member/snap/db");
  WriteFile(NewDir("truncated.db"), db.substr(0, 3 * 4096));
  expect_error(migrate(NewDir("truncated.db"), NewDir("n3")), "truncated");
  // Bad magic in both meta pages.
  std::string magic = db;
  magic[16] ^= 0x5a;
  magic[4096 + 16] ^= 0x5a;
  WriteFile(NewDir("magic.db"), magic);
  expect_error(migrate(NewDir("magic.db"), NewDir("n4")), "not a bbolt file");
  // Bad checksums in both meta pages.
  std::string sum = db;
  sum[16 + 40] ^= 1;
  sum[4096 + 16 + 40] ^= 1;
  WriteFile(NewDir("sum.db"), sum);
  expect_error(migrate(NewDir("sum.db"), NewDir("n5")), "checksum");
  // A db locked by a running etcd (bbolt holds an exclusive flock).
  const std::string locked = NewDir("locked.db");
  WriteFile(locked, db);
  {
    const int fd = ::open(locked.c_str(), O_RDONLY);
    ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
    expect_error(migrate(locked, NewDir("n6")), "still running");
    ::close(fd);
  }
  for (const char* n : {"n1", "n2", "n3", "n4", "n5", "n6"}) {
    EXPECT_FALSE(fs::exists(NewDir(n))) << n << " must not be created by a failed migration";
  }
  EXPECT_TRUE(fs::exists(full + "/x"));
}

// A watcher resuming from an old revision on the migrated Capstan gets the
// events etcd sent for the same watch before it stopped.
TEST_F(MigrateTest, WatchFromOldRevisionSeesEtcdsEvents) {
  const EtcdAnswers& a = *answers_;
  ASSERT_FALSE(a.watch_events.empty());
  ASSERT_FALSE(a.watch_events_prev_kv.empty());
  auto capstan = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(capstan.ok()) << capstan.status();
  (*capstan)->Stop();
  ASSERT_TRUE(testing::RemoveTree((*capstan)->data_dir()));
  MigrateOptions options;
  options.from = EtcdDir();
  options.data_dir = (*capstan)->data_dir();
  auto report = MigrateFromEtcd(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE((*capstan)->Restart().ok()) << (*capstan)->ReadLog(2000);
  const auto channel = (*capstan)->NewChannel();
  auto expect_same = [](const std::vector<mvccpb::Event>& want,
                        const std::vector<mvccpb::Event>& got) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].SerializeAsString(), want[i].SerializeAsString())
          << "event " << i << ": etcd " << want[i].ShortDebugString() << "\ncapstan "
          << got[i].ShortDebugString();
    }
  };
  expect_same(a.watch_events, WatchFrom(channel, a.watch_from, a.current, false));
  expect_same(a.watch_events_prev_kv, WatchFrom(channel, a.compact, a.current, true));
}

TEST_F(MigrateTest, CommandLine) {
  const std::string to = NewDir("cli");
  const std::string cmd = absl::StrCat(CAPSTAN_BINARY, " migrate --from-etcd ", EtcdDir(),
                                       " --data-dir=", to, " --verify 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("verify mismatches: 0"), std::string::npos) << out;
  EXPECT_NE(out.find("(equal)"), std::string::npos) << out;
  // Again into the same directory: refused, exit 1.
  status = std::system((cmd + " >/dev/null").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 1);
  // Usage errors: exit 2.
  status = std::system(absl::StrCat(CAPSTAN_BINARY, " migrate --data-dir x 2>/dev/null").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

}  // namespace
}  // namespace capstan::server::migrate_test
