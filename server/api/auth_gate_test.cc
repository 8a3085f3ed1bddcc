// AuthGate::CallerOf: who a write is logged as made by, and what that means
// once the write applies. A client without an identity (every client while
// auth is off) is etcd's empty AuthInfo; a write it made that applies after
// auth was enabled is refused, "user name is empty", as etcd's
// authApplierV3 refuses a write checked before the enable applied.

#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "auth/auth_store.h"
#include "auth/errors.h"
#include "grpcpp/server_context.h"
#include "gtest/gtest.h"
#include "mvcc/kv_store.h"
#include "server/api/auth_service.h"
#include "storage/backend.h"

namespace capstan::server {
namespace {

class AuthGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-auth-gate-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    storage::BackendOptions bo;
    bo.dir = dir_;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto kv = mvcc::KvStore::Open(mvcc::KvStoreOptions{}, std::move(*backend));
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    auth::AuthStoreOptions options;
    options.bcrypt_cost = 4;
    auto as = auth::AuthStore::Open(kv_.get(), options);
    ASSERT_TRUE(as.ok()) << as.status();
    auth_ = std::move(*as);
    gate_.emplace(auth_.get(), /*client_cert_auth=*/false);
  }
  void TearDown() override {
    gate_.reset();
    auth_.reset();
    kv_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Adds root (role root) and enables auth.
  void EnableAuth() {
    auto hash = auth_->HashPassword("rootpw");
    ASSERT_TRUE(hash.ok()) << hash.status();
    ASSERT_TRUE(Do([&](auto d) { auth_->UserAdd("root", *hash, false, std::move(d)); }).ok());
    ASSERT_TRUE(Do([&](auto d) { auth_->UserGrantRole("root", "root", std::move(d)); }).ok());
    ASSERT_TRUE(Do([&](auto d) { auth_->AuthEnable(std::move(d)); }).ok());
  }

  absl::Status Do(const std::function<void(auth::AuthStore::Done)>& m) { return auth_->Wait(m); }

  absl::Status SubmitAndWait(mvcc::WriteRequest w) {
    std::promise<absl::Status> p;
    auto f = p.get_future();
    w.done = [&p](absl::Status s) { p.set_value(s); };
    kv_->Submit(std::move(w));
    return f.get();
  }

  std::string dir_;
  std::unique_ptr<mvcc::KvStore> kv_;
  std::unique_ptr<auth::AuthStore> auth_;
  std::optional<AuthGate> gate_;
};

TEST_F(AuthGateTest, AWriteCheckedWhileAuthWasOffIsRefusedIfAuthIsOnWhenItApplies) {
  grpc::ServerContext ctx;  // no token, no certificate
  etcdserverpb::PutRequest put;
  put.set_key("k");
  put.set_value("v");
  etcdserverpb::PutResponse resp;
  auto write = [&] {
    // As the KV service makes it once the request's check passed.
    mvcc::WriteRequest w;
    w.op = mvcc::PutOp{&put, &resp};
    w.caller = gate_->CallerOf(ctx);
    return w;
  };

  // Auth off: checked and applied as nobody's.
  ASSERT_TRUE(gate_->CheckPut(ctx, put).ok());
  mvcc::WriteRequest before = write();
  ASSERT_TRUE(before.caller.has_value());
  EXPECT_EQ(before.caller->user, "");
  EXPECT_EQ(before.caller->auth_revision, 0u);
  ASSERT_TRUE(SubmitAndWait(write()).ok());
  const int64_t rev = kv_->Rev();

  // Checked while auth was off; auth is enabled before it applies.
  mvcc::WriteRequest late = write();
  ASSERT_NO_FATAL_FAILURE(EnableAuth());
  absl::Status s = SubmitAndWait(std::move(late));
  EXPECT_TRUE(auth::Is(s, auth::Error::kUserEmpty)) << s;
  EXPECT_EQ(kv_->Rev(), rev) << "a refused write changed the store";

  // Now nobody's request is refused where it arrives, and its caller is
  // still the empty one.
  EXPECT_TRUE(auth::Is(gate_->CheckPut(ctx, put), auth::Error::kUserEmpty));
  EXPECT_EQ(gate_->CallerOf(ctx).user, "");

  // A write of the server's own that etcd checks (an expired lease's
  // revocation) is made as root, and applies.
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  auto granted = kv_->LeaseGrant(grant);
  ASSERT_TRUE(granted.ok()) << granted.status();
  etcdserverpb::PutRequest leased;
  leased.set_key("leased");
  leased.set_lease(granted->id());
  mvcc::WriteRequest lw;
  lw.op = mvcc::PutOp{&leased, &resp};
  lw.caller = mvcc::Caller{"root", auth_->Revision()};
  ASSERT_TRUE(SubmitAndWait(std::move(lw)).ok());
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(granted->id());
  etcdserverpb::LeaseRevokeResponse revoked;
  mvcc::WriteRequest by_nobody{mvcc::LeaseRevokeOp{&revoke, &revoked}, nullptr};
  by_nobody.caller = gate_->CallerOf(ctx);
  s = SubmitAndWait(std::move(by_nobody));
  EXPECT_TRUE(auth::Is(s, auth::Error::kUserEmpty)) << s;
  mvcc::WriteRequest by_root{mvcc::LeaseRevokeOp{&revoke, &revoked}, nullptr};
  by_root.caller = mvcc::RootCaller();
  s = SubmitAndWait(std::move(by_root));
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace capstan::server
