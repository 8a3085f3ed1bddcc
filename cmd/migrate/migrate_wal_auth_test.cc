// Migration from a killed etcd with auth on (the WAL's requests applied as
// etcd 3.4 applies them), with --skip-wal, and of a WAL another member wrote.

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "auth/auth_store.h"
#include "authpb/auth.pb.h"
#include "cmd/migrate/migrate.h"
#include "cmd/migrate/migrate_test_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "storage/backend.h"

namespace capstan::server::migrate_test {
namespace {

// With auth on, etcd checks each logged request again when it applies it,
// as its version does: etcd 3.4.23 checks a txn's puts for write permission
// only and its nested txns not at all, so a write-only user's txn put with
// prev_kv and a nested txn writing outside its permission are applied; so
// are user names and passwords that are not UTF-8. The replay must apply the
// same (a txn refused here would lose an acknowledged write and move every
// later revision).
TEST(MigrateWalTest, AuthOnAppliedAsEtcdAppliedIt) {
  CAPSTAN_REQUIRE_ETCD_AND_ETCDCTL();
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
  CAPSTAN_REQUIRE_ETCD_AND_ETCDCTL();
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

}  // namespace
}  // namespace capstan::server::migrate_test
