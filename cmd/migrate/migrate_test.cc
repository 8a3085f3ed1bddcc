// End-to-end migration from a real etcd: etcd writes (puts, deletes, txns,
// leases, a compaction, auth), its answers at every retained revision are
// recorded, it stops; capstan migrates its data dir and its snapshot, and the
// migrated store must answer alike (Range at every revision, HashKV, leases).
// A second etcd with auth enabled and a NOSPACE alarm checks that a migrated
// Capstan enforces etcd's users, roles, passwords and alarm as etcd did.

#include "cmd/migrate/migrate.h"

#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "auth/auth_store.h"
#include "authpb/auth.pb.h"
#include "etcdctl_command.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mvcc/kv_store.h"
#include "mvccpb/kv.pb.h"
#include "process_fixture.h"
#include "storage/backend.h"
#include "storage/data_dir.h"
#include "storage/etcdfmt/bbolt_reader.h"

namespace capstan::server {
namespace {

namespace fs = std::filesystem;

using testing::ServerOptions;
using testing::ServerProcess;
using testing::TempDir;

using Etcd = testing::EtcdctlServer;

// Every event a watch on the whole key space from revision `from` delivers,
// up to and including those of revision `until`.
std::vector<mvccpb::Event> WatchFrom(const std::shared_ptr<grpc::Channel>& channel, int64_t from,
                                     int64_t until, bool prev_kv) {
  auto stub = etcdserverpb::Watch::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(std::string(1, '\0'));
  create->set_range_end(std::string(1, '\0'));
  create->set_start_revision(from);
  create->set_prev_kv(prev_kv);
  std::vector<mvccpb::Event> events;
  if (!stream->Write(req)) return events;
  etcdserverpb::WatchResponse resp;
  while (stream->Read(&resp)) {
    EXPECT_EQ(resp.compact_revision(), 0) << "watch from " << from << " was compacted";
    if (resp.canceled()) break;
    for (const auto& e : resp.events()) events.push_back(e);
    if (!events.empty() && events.back().kv().mod_revision() >= until) break;
  }
  ctx.TryCancel();
  return events;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A migrated store, opened without expiring leases.
absl::StatusOr<std::unique_ptr<mvcc::KvStore>> OpenStore(const std::string& data_dir) {
  storage::BackendOptions bopts;
  bopts.dir = storage::BackendDir(data_dir);
  auto backend = storage::Backend::Open(bopts);
  if (!backend.ok()) return backend.status();
  mvcc::KvStoreOptions sopts;
  sopts.lease_check_interval = absl::Hours(24);
  return mvcc::KvStore::Open(sopts, std::move(*backend));
}

// The whole key space at rev.
etcdserverpb::RangeRequest EverythingAt(int64_t rev) {
  etcdserverpb::RangeRequest req;
  req.set_key(std::string(1, '\0'));
  req.set_range_end(std::string(1, '\0'));
  req.set_revision(rev);
  return req;
}

// The store answers a Range of the whole key space at rev as etcd did
// (want): the count, and every KeyValue byte for byte.
void ExpectSameKeysAt(const mvcc::KvStore& s, int64_t rev, const etcdserverpb::RangeResponse& want,
                      const std::string& context = "") {
  mvcc::RangeResult got;
  ASSERT_TRUE(s.Range(EverythingAt(rev), &got).ok()) << rev;
  etcdserverpb::RangeResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(got.kvs_wire));
  EXPECT_EQ(got.count, want.count()) << "revision " << rev << "\n" << context;
  EXPECT_EQ(got.more, want.more()) << "revision " << rev << "\n" << context;
  ASSERT_EQ(parsed.kvs_size(), want.kvs_size()) << "revision " << rev << "\n" << context;
  for (int i = 0; i < want.kvs_size(); ++i) {
    EXPECT_EQ(parsed.kvs(i).SerializeAsString(), want.kvs(i).SerializeAsString())
        << "revision " << rev << " key " << want.kvs(i).key() << "\n" << context;
  }
}

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
  static void SetUpTestSuite() {
    if (!Etcd::EtcdAvailable()) return;
    char tmpl[] = "/tmp/capstan-migrate-XXXXXX";
    dir_ = new std::string(mkdtemp(tmpl));
    answers_ = new EtcdAnswers();
    etcd_ = new Etcd();
    Etcd& etcd = *etcd_;
    ASSERT_TRUE(etcd.Start().ok()) << "etcd did not start";
    EtcdAnswers& a = *answers_;
    etcd.Ctl("put /a 1");
    etcd.Ctl("put /b 1");
    etcd.Ctl("put /a 2");
    // Txns of many puts: one revision each, many sub-revisions, enough
    // records for branch pages.
    for (const char* prefix : {"/t/", "/u/"}) {
      std::string txn = "\n";
      for (int i = 0; i < 60; ++i) {
        txn += absl::StrCat("put ", prefix, i, " ", std::string(100, 'a' + i % 26), "\n");
      }
      etcd.Ctl("txn", txn + "\n\n");
    }
    etcd.Ctl("put /big " + std::string(20000, 'B'));  // overflow pages
    a.lease_keys = etcd.Grant(3600);
    etcd.Ctl(absl::StrFormat("put /leased/1 x --lease=%x", a.lease_keys));
    etcd.Ctl(absl::StrFormat("put /leased/2 y --lease=%x", a.lease_keys));
    a.lease_empty = etcd.Grant(7200);
    etcd.Ctl(absl::StrFormat("put /detach v --lease=%x", a.lease_empty));
    etcd.Ctl("put /detach v2");  // no lease any more
    a.lease_revoked = etcd.Grant(60);
    etcd.Ctl(absl::StrFormat("put /revoked r --lease=%x", a.lease_revoked));
    etcd.Ctl(absl::StrFormat("lease revoke %x", a.lease_revoked));  // deletes /revoked
    etcd.Ctl("del /b");
    a.compact = etcd.Rev();
    etcd.Ctl("txn", "mod(\"/a\") > \"0\"\n\nput /c 1\ndel /t/5\n\nput /never 1\n\n");
    etcd.Ctl("txn", "value(\"/a\") = \"nope\"\n\nput /never 1\n\nput /fail 1\n\n");
    etcd.Ctl("del /u/ --prefix");
    etcd.Ctl(absl::StrCat("compact ", a.compact, " --physical"));
    etcd.Ctl("put /a 3");
    etcd.Ctl("put /after 1");
    etcd.Ctl("del /c");
    etcd.Ctl("put /t/1 new");
    etcd.Ctl("user add alice:secret");
    etcd.Ctl("role add r1");
    etcd.Ctl("role grant-permission r1 readwrite /foo");
    etcd.Ctl("user grant-role alice r1");
    a.current = etcd.Rev();
    for (int64_t rev = a.compact; rev <= a.current; ++rev) a.ranges[rev] = etcd.GetAll(rev);
    const std::string hashkv = etcd.Ctl("endpoint hashkv -w json");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(hashkv, m, std::regex(R"re("hash":(\d+),"compact_revision":(-?\d+))re")))
        << hashkv;
    a.hashkv = static_cast<uint32_t>(std::stoul(m[1]));
    a.hashkv_compact = std::stoll(m[2]);
    // What a watcher resuming from an old revision gets (Kubernetes'
    // reflectors resume from their last resourceVersion).
    a.watch_from = a.compact + 1;
    const auto channel = etcd.server().NewChannel();
    a.watch_events = WatchFrom(channel, a.watch_from, a.current, /*prev_kv=*/false);
    a.watch_events_prev_kv = WatchFrom(channel, a.compact, a.current, /*prev_kv=*/true);
    etcd.Ctl(absl::StrCat("snapshot save ", *dir_, "/snap.db"));
    etcd.Stop();
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete etcd_;
    etcd_ = nullptr;
    delete dir_;
    delete answers_;
    dir_ = nullptr;
    answers_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << "/usr/bin/etcd and /usr/bin/etcdctl are needed";
  }

  static std::string EtcdDir() { return etcd_->data_dir(); }
  static std::string Snapshot() { return *dir_ + "/snap.db"; }
  static std::string NewDir(const std::string& name) { return *dir_ + "/" + name; }

  // The migrated store answers exactly what etcd answered.
  static void CheckStoreMatchesEtcd(const std::string& data_dir) {
    const EtcdAnswers& a = *answers_;
    auto store = OpenStore(data_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    mvcc::KvStore& s = **store;
    EXPECT_EQ(s.Rev(), a.current);
    EXPECT_EQ(s.CompactRev(), a.compact);
    for (const auto& [rev, want] : a.ranges) ExpectSameKeysAt(s, rev, want);
    // Below the compaction: compacted, as in etcd.
    etcdserverpb::RangeRequest old;
    old.set_key("/a");
    old.set_revision(a.compact - 1);
    mvcc::RangeResult unused;
    EXPECT_FALSE(s.Range(old, &unused).ok());

    // HashKV: etcd's algorithm over byte-identical records. etcd (3.4 and
    // 3.5, store.hashByRev) leaves out the records at or below the
    // compaction revision that are not in treeIndex.Keep(hash revision);
    // this workload overwrites and deletes keys kept by its compaction, so
    // taking Keep at the compaction revision instead gives another hash.
    uint32_t hash = 0;
    int64_t compact = 0, hash_rev = 0;
    ASSERT_TRUE(s.HashKV(0, &hash, &compact, &hash_rev).ok());
    EXPECT_EQ(hash_rev, a.current);
    EXPECT_EQ(compact, a.hashkv_compact);
    EXPECT_EQ(hash, a.hashkv) << "HashKV differs from etcd's endpoint hashkv";

    // Leases, with their keys.
    auto l1 = s.lessor()->Get(a.lease_keys, /*with_keys=*/true);
    ASSERT_TRUE(l1.has_value());
    EXPECT_EQ(l1->granted_ttl, 3600);
    EXPECT_EQ(l1->keys, (std::vector<std::string>{"/leased/1", "/leased/2"}));
    auto l2 = s.lessor()->Get(a.lease_empty, true);
    ASSERT_TRUE(l2.has_value());
    EXPECT_EQ(l2->granted_ttl, 7200);
    EXPECT_TRUE(l2->keys.empty());
    EXPECT_FALSE(s.lessor()->Exists(a.lease_revoked));
    EXPECT_EQ(s.lessor()->size(), 2u);
    EXPECT_EQ(s.lessor()->LeaseOf("/leased/1"), a.lease_keys);
    EXPECT_EQ(s.lessor()->LeaseOf("/detach"), 0);

    // Auth records under "<bucket>/<key>".
    std::string user;
    ASSERT_TRUE(s.backend()->Get(storage::Cf::kAuth, "authUsers/alice", &user).ok());
    authpb::User u;
    ASSERT_TRUE(u.ParseFromString(user));
    EXPECT_EQ(u.name(), "alice");
    ASSERT_EQ(u.roles_size(), 1);
    EXPECT_EQ(u.roles(0), "r1");
    std::string role;
    ASSERT_TRUE(s.backend()->Get(storage::Cf::kAuth, "authRoles/r1", &role).ok());
    authpb::Role r;
    ASSERT_TRUE(r.ParseFromString(role));
    ASSERT_EQ(r.keypermission_size(), 1);
    EXPECT_EQ(r.keypermission(0).key(), "/foo");

    // A later write continues the revision sequence (resourceVersions go on).
    etcdserverpb::PutRequest put;
    put.set_key("/post-migration");
    put.set_value("1");
    auto resp = s.Put(put);
    ASSERT_TRUE(resp.ok());
    EXPECT_EQ(resp->header().revision(), a.current + 1);
  }

  static Etcd* etcd_;  // stopped after set-up; its data dir lives until tear-down
  static std::string* dir_;
  static EtcdAnswers* answers_;
};
Etcd* MigrateTest::etcd_ = nullptr;
std::string* MigrateTest::dir_ = nullptr;
EtcdAnswers* MigrateTest::answers_ = nullptr;

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

// What etcdctl answered: exit code, stdout and the "Error: ..." line of its
// stderr (etcdctl 3.4 also logs each retry there, with a timestamp).
struct CtlAnswer {
  int rc = -1;
  std::string out;
  std::string error;
};

CtlAnswer Ask(const ServerProcess& server, const std::string& args, const std::string& input = "") {
  testing::CommandResult r = testing::EtcdctlCommand(server, args, input);
  CtlAnswer a;
  a.rc = r.exit.exited ? r.exit.exit_code : -1;
  a.out = r.out;
  std::smatch m;
  if (std::regex_search(r.err, m, std::regex("(^|\n)(Error: [^\n]*)"))) a.error = m[2];
  return a;
}

void ExpectSameAnswer(const CtlAnswer& want, const CtlAnswer& got, const std::string& what) {
  EXPECT_EQ(got.rc, want.rc) << what;
  EXPECT_EQ(got.out, want.out) << what;
  EXPECT_EQ(got.error, want.error) << what;
}

// AuthStatus over gRPC as root (etcdctl 3.4 has no `auth status`).
etcdserverpb::AuthStatusResponse AuthStatusAsRoot(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = etcdserverpb::Auth::NewStub(channel);
  etcdserverpb::AuthenticateRequest login;
  login.set_name("root");
  login.set_password("rootpw");
  etcdserverpb::AuthenticateResponse token;
  grpc::ClientContext login_ctx;
  grpc::Status s = stub->Authenticate(&login_ctx, login, &token);
  EXPECT_TRUE(s.ok()) << s.error_message();
  grpc::ClientContext ctx;
  ctx.AddMetadata("token", token.token());
  etcdserverpb::AuthStatusResponse resp;
  s = stub->AuthStatus(&ctx, etcdserverpb::AuthStatusRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

// An etcd with auth enabled (users made by etcd, so their passwords are Go
// bcrypt "$2a$" hashes) and an active NOSPACE alarm is migrated, from its
// data dir and from a snapshot; a Capstan started on the result refuses and
// allows what etcd refused and allowed, with etcd's texts, and continues
// etcd's auth revision.
TEST_F(MigrateTest, MigratedAuthAndAlarmAreEnforced) {
  Etcd etcd;
  ServerOptions etcd_options = ServerOptions::Etcd();
  etcd_options.extra_args = {"--quota-backend-bytes=262144"};  // a NOSPACE alarm is one put away
  ASSERT_TRUE(etcd.Start(etcd_options).ok()) << "etcd did not start";
  const std::string root = "--user=root:rootpw ";
  for (const char* cmd : {"user add root:rootpw", "user grant-role root root",
                          "role add reader", "role grant-permission reader read /r/ --prefix",
                          "role add writer", "role grant-permission writer readwrite /w/ --prefix",
                          "user add alice:alicepw", "user grant-role alice reader",
                          "user grant-role alice writer", "auth enable"}) {
    etcd.Ctl(cmd);
  }
  for (const char* kv : {"/r/1 r1", "/w/1 w1", "/other/1 o1"}) etcd.Ctl(root + "put " + kv);

  // Asked of etcd and then of each migrated Capstan, in this order; the
  // error etcd gives ("" for success) is checked too, so that each probe
  // tests what it is meant to.
  struct Probe {
    std::string args, input, etcd_error;
  };
  const std::string alice = "--user=alice:alicepw ";
  const std::string denied = "Error: etcdserver: permission denied";
  const std::string bad_login =
      "Error: etcdserver: authentication failed, invalid user ID or password";
  const std::vector<Probe> probes = {
      {"get /r/1", "", "Error: etcdserver: user name is empty"},
      {"--user=alice:wrong get /r/1", "", bad_login},
      {"--user=nobody:alicepw get /r/1", "", bad_login},
      {alice + "get /r/1", "", ""},
      {alice + "get /r/ --prefix", "", ""},
      {alice + "put /r/2 x", "", denied},
      {alice + "get /w/1", "", ""},
      {alice + "put /w/2 alice", "", ""},
      {alice + "get /other/1", "", denied},
      {alice + "get /r/ /x", "", denied},  // spans /r/ .. /w/ and keys between
      {alice + "del /r/1", "", denied},
      {alice + "txn", "value(\"/r/1\") = \"r1\"\n\nput /w/t yes\n\nput /w/t no\n\n", ""},
      {alice + "txn", "value(\"/other/1\") = \"o1\"\n\nput /w/t yes\n\n\n", denied},
      {alice + "txn", "\nput /r/t yes\n\n\n", denied},
      {alice + "user get alice", "", ""},
      {alice + "role get writer", "", ""},
      {alice + "user list", "", denied},
      {alice + "user add mallory:x", "", denied},
      {root + "get /other/1", "", ""},
      {root + "user list", "", ""},
      {root + "role get reader", "", ""},
      {root + "user get alice", "", ""},
  };
  std::vector<CtlAnswer> want;
  for (const Probe& p : probes) {
    want.push_back(Ask(etcd.server(), p.args, p.input));
    EXPECT_EQ(want.back().error, p.etcd_error) << "etcd answered etcdctl " << p.args;
  }
  // NOSPACE: a put beyond the quota raises the alarm; writes are refused.
  int rc = 0;
  etcd.Ctl(root + "put /big", std::string(300000, 'x'), &rc);
  ASSERT_EQ(rc, 1) << "the put beyond the quota was not refused";
  const std::vector<std::string> alarm_probes = {"alarm list", root + "alarm list",
                                                 root + "put /after-alarm 1"};
  std::vector<CtlAnswer> alarm_want;
  for (const std::string& p : alarm_probes) alarm_want.push_back(Ask(etcd.server(), p));
  ASSERT_NE(alarm_want[1].out.find("alarm:NOSPACE"), std::string::npos) << alarm_want[1].out;
  EXPECT_EQ(alarm_want[2].error, "Error: etcdserver: mvcc: database space exceeded");
  const std::string snapshot = NewDir("auth-snap.db");
  etcd.Ctl(root + "snapshot save " + snapshot);
  etcd.Stop();

  // What etcd stored: its auth revision, and alice's password hash as Go's
  // bcrypt writes it.
  uint64_t etcd_auth_revision = 0;
  {
    auto db = etcdfmt::BboltReader::Open(etcd.db_path());
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->ForEach({"auth"}, [&](std::string_view k, std::string_view v, bool) {
                       if (k == "authRevision") {
                         for (unsigned char c : v) etcd_auth_revision = etcd_auth_revision << 8 | c;
                       }
                       return absl::OkStatus();
                     }).ok());
    authpb::User user;
    ASSERT_TRUE((*db)->ForEach({"authUsers"}, [&](std::string_view k, std::string_view v, bool) {
                       if (k == "alice") user.ParseFromArray(v.data(), static_cast<int>(v.size()));
                       return absl::OkStatus();
                     }).ok());
    EXPECT_EQ(user.password().substr(0, 4), "$2a$");
  }
  ASSERT_GT(etcd_auth_revision, 1u);

  for (const std::string& from : {etcd.data_dir(), snapshot}) {
    SCOPED_TRACE("migrated from " + from);
    auto capstan = ServerProcess::Start(ServerOptions::Capstan());
    ASSERT_TRUE(capstan.ok()) << capstan.status();
    (*capstan)->Stop();
    ASSERT_TRUE(testing::RemoveTree((*capstan)->data_dir()));
    MigrateOptions options;
    options.from = from;
    options.data_dir = (*capstan)->data_dir();
    auto report = MigrateFromEtcd(options);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->alarms, 1u);
    ASSERT_TRUE((*capstan)->Restart().ok()) << (*capstan)->ReadLog(2000);
    const ServerProcess& server = **capstan;

    // The alarm came along: writes are refused until it is disarmed.
    for (size_t i = 0; i < alarm_probes.size(); ++i) {
      ExpectSameAnswer(alarm_want[i], Ask(server, alarm_probes[i]), alarm_probes[i]);
    }
    const CtlAnswer disarm = Ask(server, root + "alarm disarm");
    EXPECT_EQ(disarm.rc, 0) << disarm.error;
    EXPECT_EQ(disarm.out, alarm_want[1].out);  // the alarm it disarmed
    EXPECT_EQ(Ask(server, root + "alarm list").out, "");

    // Auth: enabled, etcd's users, roles and passwords, etcd's answers.
    for (size_t i = 0; i < probes.size(); ++i) {
      ExpectSameAnswer(want[i], Ask(server, probes[i].args, probes[i].input), probes[i].args);
    }
    const auto channel = server.NewChannel();
    auto status = AuthStatusAsRoot(channel);
    EXPECT_TRUE(status.enabled());
    EXPECT_EQ(status.authrevision(), etcd_auth_revision);
    // The auth revision goes on from etcd's; a new user logs in.
    EXPECT_EQ(Ask(server, root + "user add bob:bobpw").rc, 0);
    status = AuthStatusAsRoot(channel);
    EXPECT_EQ(status.authrevision(), etcd_auth_revision + 1);
    EXPECT_EQ(Ask(server, "--user=bob:bobpw get /r/1").error, denied);  // logged in, no role
    // Capstan stored the revision it continued from etcd's.
    (*capstan)->Stop();
    ASSERT_TRUE((*capstan)->Restart().ok()) << (*capstan)->ReadLog(2000);
    EXPECT_EQ(AuthStatusAsRoot(server.NewChannel()).authrevision(), etcd_auth_revision + 1);
  }
}

// A put etcd acknowledged.
struct AckedPut {
  std::string key, value;
  int64_t rev;
};

// Each acknowledged put (at or above the store's compaction) is in the store
// at its revision, with its value.
void ExpectAckedPuts(const mvcc::KvStore& s, const std::vector<AckedPut>& acked,
                     const std::string& report) {
  for (const AckedPut& a : acked) {
    if (a.rev < s.CompactRev()) continue;
    etcdserverpb::RangeRequest req;
    req.set_key(a.key);
    req.set_revision(a.rev);
    mvcc::RangeResult got;
    ASSERT_TRUE(s.Range(req, &got).ok());
    etcdserverpb::RangeResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(got.kvs_wire));
    ASSERT_EQ(parsed.kvs_size(), 1) << a.key << " at " << a.rev << "\n" << report;
    EXPECT_EQ(parsed.kvs(0).value(), a.value) << a.key << " at " << a.rev << "\n" << report;
    EXPECT_EQ(parsed.kvs(0).mod_revision(), a.rev) << a.key << "\n" << report;
  }
}

// The store's HashKV at its current revision is etcd's, at the same revision.
void ExpectEtcdsHashKV(mvcc::KvStore& s, const ServerProcess& etcd, const std::string& report,
                       const std::string& token = "") {
  auto maintenance = etcdserverpb::Maintenance::NewStub(etcd.NewChannel());
  etcdserverpb::HashKVResponse want;
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("token", token);
  ASSERT_TRUE(maintenance->HashKV(&ctx, etcdserverpb::HashKVRequest(), &want).ok());
  EXPECT_EQ(s.Rev(), want.header().revision()) << report;
  uint32_t hash = 0;
  int64_t compact = 0, hash_rev = 0;
  ASSERT_TRUE(s.HashKV(0, &hash, &compact, &hash_rev).ok());
  EXPECT_EQ(hash, want.hash()) << report;
  // etcd says -1 until its first compaction; so does Capstan's HashKV RPC.
  EXPECT_EQ(compact == 0 ? -1 : compact, want.compact_revision()) << report;
}

// The store and etcd end at the same revision and hold the same keys, byte
// for byte, at every revision from the store's compaction on (etcd read
// with token, if auth is on).
void ExpectEtcdsHistory(const mvcc::KvStore& s, const ServerProcess& etcd, const std::string& token,
                        const std::string& report) {
  auto kv = etcdserverpb::KV::NewStub(etcd.NewChannel());
  for (int64_t rev = std::max<int64_t>(s.CompactRev(), 1); rev <= s.Rev(); ++rev) {
    etcdserverpb::RangeResponse want;
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("token", token);
    grpc::Status st = kv->Range(&ctx, EverythingAt(rev), &want);
    ASSERT_TRUE(st.ok()) << rev << ": " << st.error_message();
    ASSERT_EQ(want.header().revision(), s.Rev()) << report;
    ExpectSameKeysAt(s, rev, want, report);
  }
}

// etcd flags that keep it from writing its backend on its own for an hour:
// what it writes after a clean (re)start is in its WAL only until it stops.
ServerOptions EtcdWritingItsWalOnly() {
  ServerOptions options = ServerOptions::Etcd();
  options.extra_args = {"--backend-batch-interval=1h", "--backend-batch-limit=1000000"};
  return options;
}

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

// etcd writes its bbolt backend in batches (every 100 ms by default), so a
// member that dies (SIGKILL, an OOM kill, a power cut) has its newest
// acknowledged writes in its WAL only; when it starts it applies them again.
// A migration from its data dir must carry them too. etcd runs here with a
// batch interval of an hour, so that everything after its clean restart
// (and after the compaction, which forces a backend commit) is in the WAL
// only when it is killed. The migrated store is then compared with the same
// etcd restarted on its data dir (which replays its WAL): every revision,
// HashKV, leases and their keys, users and roles.
TEST(MigrateWalTest, KilledEtcdLosesNothingItAcknowledged) {
  if (!Etcd::EtcdAvailable()) GTEST_SKIP() << "/usr/bin/etcd and /usr/bin/etcdctl are needed";
  auto etcd = ServerProcess::Start(EtcdWritingItsWalOnly());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  auto channel = (*etcd)->NewChannel();
  auto kv = etcdserverpb::KV::NewStub(channel);
  auto lease = etcdserverpb::Lease::NewStub(channel);
  auto auth = etcdserverpb::Auth::NewStub(channel);

  std::vector<AckedPut> acked;
  auto put = [&](const std::string& key, const std::string& value, int64_t lease_id = 0) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    req.set_lease(lease_id);
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = kv->Put(&ctx, req, &resp);
    if (st.ok()) acked.push_back({key, value, resp.header().revision()});
    return st;
  };
  auto grant = [&](int64_t ttl) {
    etcdserverpb::LeaseGrantRequest req;
    req.set_ttl(ttl);
    etcdserverpb::LeaseGrantResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(lease->LeaseGrant(&ctx, req, &resp).ok());
    return resp.id();
  };
  auto del = [&](const std::string& key, const std::string& end) {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(key);
    req.set_range_end(end);
    etcdserverpb::DeleteRangeResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(kv->DeleteRange(&ctx, req, &resp).ok());
  };

  // Written, then made durable in the backend by a clean stop.
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(put(absl::StrCat("/p/", i), "v1").ok());
  const int64_t kept_lease = grant(3600);
  ASSERT_TRUE(put("/p/leased", "x", kept_lease).ok());
  (*etcd)->Stop();
  ASSERT_TRUE((*etcd)->Restart().ok()) << (*etcd)->ReadLog(2000);
  channel = (*etcd)->NewChannel();
  kv = etcdserverpb::KV::NewStub(channel);
  lease = etcdserverpb::Lease::NewStub(channel);
  auth = etcdserverpb::Auth::NewStub(channel);

  // In the WAL only, except what the compaction's forced commit writes.
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(put(absl::StrCat("/k/", i), "a").ok());
  {
    etcdserverpb::CompactionRequest req;
    req.set_revision(acked.back().rev - 10);
    req.set_physical(true);
    etcdserverpb::CompactionResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kv->Compact(&ctx, req, &resp).ok());
  }
  const int64_t backend_rev = acked.back().rev;  // at most this is in the backend
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(put(absl::StrCat("/k/", i), "b").ok());
  del("/k/3", "");
  del("/k/4", "/k/5");  // /k/4 and /k/40..49: just /k/4
  {
    etcdserverpb::TxnRequest req;
    auto* cmp = req.add_compare();
    cmp->set_key("/k/1");
    cmp->set_target(etcdserverpb::Compare::VALUE);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_value("b");
    auto* p = req.add_success()->mutable_request_put();
    p->set_key("/t/ok");
    p->set_value("yes");
    req.add_success()->mutable_request_delete_range()->set_key("/k/10");
    req.add_failure()->mutable_request_put()->set_key("/t/never");
    etcdserverpb::TxnResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kv->Txn(&ctx, req, &resp).ok());
    EXPECT_TRUE(resp.succeeded());
  }
  const int64_t l2 = grant(600);
  const int64_t l3 = grant(600);
  ASSERT_TRUE(put("/l/1", "one", l2).ok());
  ASSERT_TRUE(put("/l/2", "two", l2).ok());
  ASSERT_TRUE(put("/l/3", "three", l3).ok());
  ASSERT_TRUE(put("/p/leased", "moved", l2).ok());  // from kept_lease to l2
  {
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(l3);
    etcdserverpb::LeaseRevokeResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(lease->LeaseRevoke(&ctx, req, &resp).ok());
  }
  // Logged, then refused when applied: the lease does not exist.
  EXPECT_FALSE(put("/x", "no lease", 0x7777).ok());
  {
    etcdserverpb::AuthRoleAddRequest req;
    req.set_name("reader");
    etcdserverpb::AuthRoleAddResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(auth->RoleAdd(&ctx, req, &resp).ok());
  }
  {
    etcdserverpb::AuthUserAddRequest req;
    req.set_name("carol");
    req.set_password("pw");
    etcdserverpb::AuthUserAddResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(auth->UserAdd(&ctx, req, &resp).ok());
  }
  ASSERT_TRUE(put("/last", "z").ok());
  const int64_t last_rev = acked.back().rev;
  (*etcd)->Kill();

  WalMigration m;
  m.options.verify = true;
  auto report = m.Run(**etcd);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::string text = FormatMigrateReport(*report);
  EXPECT_EQ(report->mismatches, 0) << text;
  // The backend alone lacks the last writes; the WAL had them.
  EXPECT_LE(report->current_revision, backend_rev) << text;
  EXPECT_EQ(report->wal_dir, (*etcd)->data_dir() + "/member/wal") << text;
  // At least every write after the compaction: 30 puts, 2 deletes, a txn,
  // 2 grants, 4 puts, a revocation, a role and a user, the last put.
  EXPECT_GE(report->wal_replayed, 43u) << text;
  // Refused again as etcd refused it: the put with an unknown lease (and
  // the compaction the backend already holds).
  bool lease_refusal = false;
  for (const auto& refusal : report->wal_refusals) {
    lease_refusal |= refusal.find("(put /x): requested lease not found") !=
                     std::string::npos;
  }
  EXPECT_TRUE(lease_refusal) << text;
  EXPECT_EQ(report->wal_last_revision, last_rev) << text;
  EXPECT_EQ(report->wal_uncommitted, 0u) << text;

  // etcd on the same data dir applies its WAL as it starts.
  ASSERT_TRUE((*etcd)->Restart().ok()) << (*etcd)->ReadLog(2000);
  channel = (*etcd)->NewChannel();
  kv = etcdserverpb::KV::NewStub(channel);
  auto store = OpenStore(m.options.data_dir);
  ASSERT_TRUE(store.ok()) << store.status();
  mvcc::KvStore& s = **store;
  ASSERT_EQ(s.Rev(), last_rev);
  EXPECT_EQ(s.CompactRev(), backend_rev - 10);
  EXPECT_EQ(s.AppliedIndex(), report->wal_last_index) << "the raft index goes on from etcd's";

  ExpectEtcdsHistory(s, **etcd, "", text);
  ExpectAckedPuts(s, acked, text);
  ExpectEtcdsHashKV(s, **etcd, text);
  // Leases: the one from before, l2 with its keys (one moved to it), l3
  // revoked.
  lease = etcdserverpb::Lease::NewStub(channel);
  for (int64_t id : {kept_lease, l2, l3}) {
    etcdserverpb::LeaseTimeToLiveRequest req;
    req.set_id(id);
    req.set_keys(true);
    etcdserverpb::LeaseTimeToLiveResponse want;
    grpc::ClientContext ctx;
    ASSERT_TRUE(lease->LeaseTimeToLive(&ctx, req, &want).ok());
    auto got = s.lessor()->Get(id, /*with_keys=*/true);
    if (want.ttl() == -1) {
      EXPECT_FALSE(got.has_value()) << id;
      continue;
    }
    ASSERT_TRUE(got.has_value()) << id;
    EXPECT_EQ(got->granted_ttl, want.grantedttl());
    std::vector<std::string> keys(want.keys().begin(), want.keys().end());
    std::sort(keys.begin(), keys.end());
    std::vector<std::string> got_keys = got->keys;
    std::sort(got_keys.begin(), got_keys.end());
    EXPECT_EQ(got_keys, keys) << id;
  }
  EXPECT_FALSE(s.lessor()->Exists(l3));
  // Users and roles.
  auth = etcdserverpb::Auth::NewStub(channel);
  etcdserverpb::AuthUserListResponse users;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(auth->UserList(&ctx, etcdserverpb::AuthUserListRequest(), &users).ok());
  }
  ASSERT_EQ(users.users_size(), 1);
  std::string record;
  EXPECT_TRUE(s.backend()->Get(storage::Cf::kAuth, "authUsers/carol", &record).ok());
  EXPECT_TRUE(s.backend()->Get(storage::Cf::kAuth, "authRoles/reader", &record).ok());
}

// The same under load at etcd's default batching: eight clients put as fast
// as they can, etcd is killed while they run, and every put it acknowledged
// is in the migrated store at its revision, which ends where etcd, restarted
// on its data dir, ends (same HashKV).
TEST(MigrateWalTest, EtcdKilledMidLoad) {
  if (!Etcd::EtcdAvailable()) GTEST_SKIP() << "/usr/bin/etcd and /usr/bin/etcdctl are needed";
  auto etcd = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  auto channel = (*etcd)->NewChannel();
  std::vector<std::vector<AckedPut>> acked(8);
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      auto kv = etcdserverpb::KV::NewStub(channel);
      for (int i = 0; !stop.load(); ++i) {
        etcdserverpb::PutRequest req;
        req.set_key(absl::StrCat("/load/", c, "/", i % 50));
        req.set_value(absl::StrCat(c, "-", i));
        etcdserverpb::PutResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        if (!kv->Put(&ctx, req, &resp).ok()) break;
        acked[c].push_back({req.key(), req.value(), resp.header().revision()});
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  (*etcd)->Kill();
  stop = true;
  for (auto& t : clients) t.join();
  int64_t last_acked = 0;
  size_t total = 0;
  for (const auto& list : acked) {
    total += list.size();
    if (!list.empty()) last_acked = std::max(last_acked, list.back().rev);
  }
  ASSERT_GT(total, 100u);

  WalMigration m;
  auto report = m.Run(**etcd);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::string text = FormatMigrateReport(*report);
  auto store = OpenStore(m.options.data_dir);
  ASSERT_TRUE(store.ok()) << store.status();
  mvcc::KvStore& s = **store;
  EXPECT_GE(s.Rev(), last_acked) << text;
  for (const auto& list : acked) ExpectAckedPuts(s, list, text);
  ASSERT_TRUE((*etcd)->Restart().ok()) << (*etcd)->ReadLog(2000);
  ExpectEtcdsHashKV(s, **etcd, text);
  std::cout << "acknowledged puts: " << total << ", last at revision " << last_acked << "\n"
            << text;
}

// etcd 3.4 saves its consistent index only with a key change, so after a
// restart the entries it logs (a new leader's empty entry, its v2 member
// attributes) follow the db's consistent index until the next write: a data
// dir stopped or killed then, with nothing written since, migrates as it is.
// So does a fresh etcd killed before its first backend commit, whose WAL
// starts with its membership entry.
TEST(MigrateWalTest, EntriesWithoutV3DataAfterARestart) {
  if (!Etcd::EtcdAvailable()) GTEST_SKIP() << "/usr/bin/etcd and /usr/bin/etcdctl are needed";
  for (bool kill : {false, true}) {
    SCOPED_TRACE(kill ? "killed" : "stopped");
    auto etcd = ServerProcess::Start(ServerOptions::Etcd());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    {
      auto kv = etcdserverpb::KV::NewStub((*etcd)->NewChannel());
      etcdserverpb::PutRequest req;
      req.set_key("/a");
      req.set_value("1");
      etcdserverpb::PutResponse resp;
      grpc::ClientContext ctx;
      ASSERT_TRUE(kv->Put(&ctx, req, &resp).ok());
    }
    (*etcd)->Stop();
    ASSERT_TRUE((*etcd)->Restart().ok());
    ASSERT_TRUE((*etcd)->WaitReady(std::chrono::seconds(10)).ok());
    if (kill) {
      (*etcd)->Kill();
    } else {
      (*etcd)->Stop();
    }
    WalMigration m;
    auto report = m.Run(**etcd);
    ASSERT_TRUE(report.ok()) << report.status();
    const std::string text = FormatMigrateReport(*report);
    EXPECT_GT(report->wal_skipped, 0u) << text;
    EXPECT_EQ(report->wal_refused, 0u) << text;
    ASSERT_TRUE((*etcd)->Restart().ok());
    auto store = OpenStore(m.options.data_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->Rev(), 2);
    ExpectEtcdsHistory(**store, **etcd, "", text);
  }
  // A fresh etcd that never wrote its backend after its first writes.
  auto fresh = ServerProcess::Start(EtcdWritingItsWalOnly());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto kv = etcdserverpb::KV::NewStub((*fresh)->NewChannel());
  for (int i = 0; i < 3; ++i) {
    etcdserverpb::PutRequest req;
    req.set_key(absl::StrCat("/fresh/", i));
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kv->Put(&ctx, req, &resp).ok());
  }
  (*fresh)->Kill();
  WalMigration m;
  auto report = m.Run(**fresh);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE((*fresh)->Restart().ok());
  auto store = OpenStore(m.options.data_dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Rev(), 4) << FormatMigrateReport(*report);
  ExpectEtcdsHistory(**store, **fresh, "", FormatMigrateReport(*report));
}

// With auth on, etcd checks each logged request again when it applies it,
// as its version does: etcd 3.4.23 checks a txn's puts for write permission
// only and its nested txns not at all, so a write-only user's txn put with
// prev_kv and a nested txn writing outside its permission are applied; so
// are user names and passwords that are not UTF-8. The replay must apply the
// same (a txn refused here would lose an acknowledged write and move every
// later revision).
TEST(MigrateWalTest, AuthOnAppliedAsEtcdAppliedIt) {
  if (!Etcd::EtcdAvailable()) GTEST_SKIP() << "/usr/bin/etcd and /usr/bin/etcdctl are needed";
  auto etcd = ServerProcess::Start(EtcdWritingItsWalOnly());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  auto channel = (*etcd)->NewChannel();
  auto auth = etcdserverpb::Auth::NewStub(channel);
  auto kv = etcdserverpb::KV::NewStub(channel);
  auto call = [](auto fn, const std::string& token = "") {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("token", token);
    return fn(&ctx);
  };
  auto add_user = [&](const std::string& name, const std::string& password,
                      const std::string& token = "") {
    etcdserverpb::AuthUserAddRequest req;
    req.set_name(name);
    req.set_password(password);
    etcdserverpb::AuthUserAddResponse resp;
    return call([&](grpc::ClientContext* c) { return auth->UserAdd(c, req, &resp); }, token);
  };
  auto grant_role = [&](const std::string& user, const std::string& role) {
    etcdserverpb::AuthUserGrantRoleRequest req;
    req.set_user(user);
    req.set_role(role);
    etcdserverpb::AuthUserGrantRoleResponse resp;
    return call([&](grpc::ClientContext* c) { return auth->UserGrantRole(c, req, &resp); });
  };
  auto login = [&](const std::string& name, const std::string& password) {
    etcdserverpb::AuthenticateRequest req;
    req.set_name(name);
    req.set_password(password);
    etcdserverpb::AuthenticateResponse resp;
    EXPECT_TRUE(call([&](grpc::ClientContext* c) { return auth->Authenticate(c, req, &resp); })
                    .ok());
    return resp.token();
  };
  auto txn = [&](const etcdserverpb::TxnRequest& req, const std::string& token) {
    etcdserverpb::TxnResponse resp;
    return call([&](grpc::ClientContext* c) { return kv->Txn(c, req, &resp); }, token);
  };
  auto put = [&](const std::string& key, const std::string& token) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value("v");
    etcdserverpb::PutResponse resp;
    return call([&](grpc::ClientContext* c) { return kv->Put(c, req, &resp); }, token);
  };

  ASSERT_TRUE(add_user("root", "rootpw").ok());
  ASSERT_TRUE(grant_role("root", "root").ok());
  {
    etcdserverpb::AuthRoleAddRequest req;
    req.set_name("w");
    etcdserverpb::AuthRoleAddResponse resp;
    ASSERT_TRUE(call([&](grpc::ClientContext* c) { return auth->RoleAdd(c, req, &resp); }).ok());
    etcdserverpb::AuthRoleGrantPermissionRequest grant;
    grant.set_name("w");
    grant.mutable_perm()->set_permtype(authpb::Permission::WRITE);
    grant.mutable_perm()->set_key("/w/");
    grant.mutable_perm()->set_range_end("/w0");
    etcdserverpb::AuthRoleGrantPermissionResponse gresp;
    ASSERT_TRUE(call([&](grpc::ClientContext* c) {
                  return auth->RoleGrantPermission(c, grant, &gresp);
                }).ok());
  }
  ASSERT_TRUE(add_user("alice", "apw").ok());
  ASSERT_TRUE(grant_role("alice", "w").ok());
  {
    etcdserverpb::AuthEnableResponse resp;
    ASSERT_TRUE(call([&](grpc::ClientContext* c) {
                  return auth->AuthEnable(c, etcdserverpb::AuthEnableRequest(), &resp);
                }).ok());
  }
  const std::string root = login("root", "rootpw");
  const std::string alice = login("alice", "apw");
  ASSERT_TRUE(put("/w/base", root).ok());
  etcdserverpb::TxnRequest with_prev;
  auto* p = with_prev.add_success()->mutable_request_put();
  p->set_key("/w/txnprev");
  p->set_prev_kv(true);
  ASSERT_TRUE(txn(with_prev, alice).ok()) << "etcd 3.4.23 applies it";
  etcdserverpb::TxnRequest nested;
  nested.add_success()->mutable_request_txn()->add_success()->mutable_request_put()->set_key(
      "/secret/x");
  ASSERT_TRUE(txn(nested, alice).ok()) << "etcd 3.4.23 applies it";
  ASSERT_FALSE(put("/secret/y", alice).ok());  // logged, refused when applied
  ASSERT_TRUE(add_user("b\xe9la", "\xe9t\xe9", root).ok());  // Latin-1, not UTF-8
  {
    etcdserverpb::AuthRoleAddRequest req;
    req.set_name("r\xe9");
    etcdserverpb::AuthRoleAddResponse resp;
    ASSERT_TRUE(
        call([&](grpc::ClientContext* c) { return auth->RoleAdd(c, req, &resp); }, root).ok());
    etcdserverpb::AuthUserGrantRoleRequest grant;
    grant.set_user("b\xe9la");
    grant.set_role("r\xe9");
    etcdserverpb::AuthUserGrantRoleResponse gresp;
    ASSERT_TRUE(call([&](grpc::ClientContext* c) { return auth->UserGrantRole(c, grant, &gresp); },
                     root)
                    .ok());
  }
  ASSERT_TRUE(put("/w/last", root).ok());
  (*etcd)->Kill();

  WalMigration m;
  auto report = m.Run(**etcd);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::string text = FormatMigrateReport(*report);
  // Refused again: alice's put outside her permission, and the auth enable
  // the db already holds (etcd 3.4 applies it again after its consistent
  // index, as root-less: "user name is empty").
  for (const auto& refusal : report->wal_refusals) {
    EXPECT_TRUE(refusal.find("put /secret/y): permission denied") != std::string::npos ||
                refusal.find("(auth_enable): user name is empty") != std::string::npos)
        << text;
  }
  EXPECT_GE(report->wal_refused, 1u) << text;
  ASSERT_TRUE((*etcd)->Restart().ok()) << (*etcd)->ReadLog(2000);
  const std::string token = login("root", "rootpw");
  auto store = OpenStore(m.options.data_dir);
  ASSERT_TRUE(store.ok()) << store.status();
  mvcc::KvStore& s = **store;
  ExpectEtcdsHistory(s, **etcd, token, text);
  ExpectEtcdsHashKV(s, **etcd, text, token);
  std::string record;
  EXPECT_TRUE(s.backend()->Get(storage::Cf::kAuth, "authUsers/b\xe9la", &record).ok()) << text;
  EXPECT_TRUE(s.backend()->Get(storage::Cf::kAuth, "authUsers/alice", &record).ok()) << text;
  // The auth store loads them, the Latin-1 role of the Latin-1 user included.
  auto auth_store = auth::AuthStore::Open(&s, auth::AuthStoreOptions{});
  ASSERT_TRUE(auth_store.ok()) << auth_store.status();
  EXPECT_TRUE((*auth_store)->Enabled());
  EXPECT_TRUE((*auth_store)->UserHasRole("b\xe9la", "r\xe9"));
}

// --skip-wal migrates the db alone; a WAL another member wrote is refused.
TEST(MigrateWalTest, SkipWalAndAForeignWal) {
  if (!Etcd::EtcdAvailable()) GTEST_SKIP() << "/usr/bin/etcd and /usr/bin/etcdctl are needed";
  auto etcd = ServerProcess::Start(EtcdWritingItsWalOnly());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ServerOptions foreign = ServerOptions::Etcd();
  foreign.extra_args = {"--initial-cluster-token=foreign"};  // another member id
  auto other = ServerProcess::Start(foreign);
  ASSERT_TRUE(other.ok()) << other.status();
  (*etcd)->Stop();  // the db now lists the member
  ASSERT_TRUE((*etcd)->Restart().ok());
  auto kv = etcdserverpb::KV::NewStub((*etcd)->NewChannel());
  for (int i = 0; i < 3; ++i) {
    etcdserverpb::PutRequest req;
    req.set_key(absl::StrCat("/k/", i));
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kv->Put(&ctx, req, &resp).ok());
  }
  (*etcd)->Kill();
  (*other)->Stop();

  WalMigration m;
  auto report = m.Run(**etcd, "db-only", /*skip_wal=*/true);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->wal_skipped_dir, (*etcd)->data_dir() + "/member/wal");
  EXPECT_NE(FormatMigrateReport(*report).find("NOT REPLAYED (--skip-wal)"), std::string::npos);
  EXPECT_LT(report->current_revision, 4) << "the puts were in the WAL only";

  const std::string wal = (*etcd)->data_dir() + "/member/wal";
  fs::remove_all(wal);
  fs::copy((*other)->data_dir() + "/member/wal", wal);
  report = m.Run(**etcd, "foreign");
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition) << report.status();
  EXPECT_NE(report.status().message().find("it is not this db's WAL"), std::string::npos)
      << report.status();
  EXPECT_FALSE(fs::exists(m.options.data_dir)) << "nothing is made";
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
}  // namespace capstan::server
