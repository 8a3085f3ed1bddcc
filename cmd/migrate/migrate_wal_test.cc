// Migration from a killed etcd: its newest acknowledged writes are in its
// WAL only, and the migration applies them as etcd does when it restarts.
// With auth on and a foreign or skipped WAL: migrate_wal_auth_test.cc.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cmd/migrate/migrate.h"
#include "cmd/migrate/migrate_test_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "storage/backend.h"

namespace capstan::server::migrate_test {
namespace {

// etcd writes its bbolt backend in batches (every 100 ms by default), so a
// member that dies (SIGKILL, an OOM kill, a power cut) has its newest
// acknowledged writes in its WAL only; when it starts it applies them again.
// A migration from its data dir must carry them too. etcd runs here with a
// batch interval of an hour, so that everything after its clean restart
// (and after the compaction, which forces a backend commit) is in the WAL
// only when it is killed. The migrated store is then compared with the same
// etcd restarted on its data dir (which replays its WAL): every revision,
// HashKV, leases and their keys, users and roles. Run with Debian 12's etcd
// 3.4, which leaves its backend alone for that long (3.5 commits it on
// other occasions too, so fewer writes are left to the WAL alone; its
// killed data dirs are migrated by EtcdKilledMidLoad).
TEST(MigrateWal34Test, KilledEtcdLosesNothingItAcknowledged) {
  CAPSTAN_REQUIRE_ETCD_AND_ETCDCTL();
  CAPSTAN_REQUIRE_REFERENCE("etcd 3.4", ::capstan::testing::Etcd34Binary());
  auto etcd = ServerProcess::Start(EtcdWritingItsWalOnly(::capstan::testing::Etcd34Binary()));
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
  CAPSTAN_REQUIRE_ETCD_AND_ETCDCTL();
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
TEST(MigrateWal34Test, EntriesWithoutV3DataAfterARestart) {
  CAPSTAN_REQUIRE_ETCD_AND_ETCDCTL();
  CAPSTAN_REQUIRE_REFERENCE("etcd 3.4", ::capstan::testing::Etcd34Binary());
  for (bool kill : {false, true}) {
    SCOPED_TRACE(kill ? "killed" : "stopped");
    ServerOptions options = ServerOptions::Etcd();
    options.binary = ::capstan::testing::Etcd34Binary();
    auto etcd = ServerProcess::Start(options);
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

}  // namespace
}  // namespace capstan::server::migrate_test
