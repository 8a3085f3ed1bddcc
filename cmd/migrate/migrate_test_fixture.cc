// The MigrateTest fixture and the helpers of migrate_test_fixture.h.

#include "cmd/migrate/migrate_test_fixture.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "authpb/auth.pb.h"
#include "storage/backend.h"
#include "storage/data_dir.h"

namespace capstan::server::migrate_test {

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

void ExpectSameKeysAt(const mvcc::KvStore& s, int64_t rev, const etcdserverpb::RangeResponse& want,
                      const std::string& context) {
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

void MigrateTest::SetUpTestSuite() {
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

void MigrateTest::TearDownTestSuite() {
  if (dir_ != nullptr) fs::remove_all(*dir_);
  delete etcd_;
  etcd_ = nullptr;
  delete dir_;
  delete answers_;
  dir_ = nullptr;
  answers_ = nullptr;
}

void MigrateTest::CheckStoreMatchesEtcd(const std::string& data_dir) {
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

Etcd* MigrateTest::etcd_ = nullptr;
std::string* MigrateTest::dir_ = nullptr;
EtcdAnswers* MigrateTest::answers_ = nullptr;

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
                       const std::string& token) {
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

ServerOptions EtcdWritingItsWalOnly(const std::string& binary) {
  ServerOptions options = ServerOptions::Etcd();
  options.binary = binary;
  options.extra_args = {"--backend-batch-interval=1h", "--backend-batch-limit=1000000"};
  return options;
}

}  // namespace capstan::server::migrate_test
