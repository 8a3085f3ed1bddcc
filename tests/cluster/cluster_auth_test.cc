// Auth across the members of a 3-member cluster, on etcd 3.5 and on Capstan,
// through the gRPC API: a simple token issued by one member (etcd proposes
// an InternalAuthenticateRequest that every member applies) is accepted by
// every member, still after the leader was killed and replaced; it is
// refused everywhere once its user's password changed, and once its TTL
// (--auth-token-ttl) passed without use; a permission revoked through one
// member refuses the user's writes at every member with etcd's error.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "reference.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// One RPC's outcome: the gRPC code and message.
struct Outcome {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  bool ok() const { return code == grpc::StatusCode::OK; }
};

Outcome OutcomeOf(const grpc::Status& s) { return {s.error_code(), s.error_message()}; }

std::string Describe(const Outcome& o) { return absl::StrCat(o.code, " ", o.message); }

class AuthClusterTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  }

  // Starts the cluster (extra flags appended) and, through member 0, adds
  // root (role root) and alice (role rw: read and write on [a, b)), then
  // enables auth.
  void StartWithAuth(std::vector<std::string> extra_args = {}) {
    ClusterOptions o = GetParam() == ServerFlavor::kEtcd ? ClusterOptions::Etcd(3)
                                                          : ClusterOptions::Capstan(3);
    o.extra_args = std::move(extra_args);
    auto started = Cluster::Start(o);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(*started);
    ASSERT_TRUE(cluster_->WaitForLeader(seconds(10)).ok());
    auto admin = etcdserverpb::Auth::NewStub(cluster_->NewChannel(0));
    auto call = [&](auto rpc, const auto& req, auto* resp) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
      grpc::Status s = ((*admin).*rpc)(&ctx, req, resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
    };
    etcdserverpb::AuthUserAddRequest root;
    root.set_name("root");
    root.set_password("rootpw");
    etcdserverpb::AuthUserAddResponse add_resp;
    call(&etcdserverpb::Auth::Stub::UserAdd, root, &add_resp);
    etcdserverpb::AuthUserGrantRoleRequest root_role;
    root_role.set_user("root");
    root_role.set_role("root");
    etcdserverpb::AuthUserGrantRoleResponse grant_resp;
    call(&etcdserverpb::Auth::Stub::UserGrantRole, root_role, &grant_resp);
    etcdserverpb::AuthUserAddRequest alice;
    alice.set_name("alice");
    alice.set_password("alicepw");
    call(&etcdserverpb::Auth::Stub::UserAdd, alice, &add_resp);
    etcdserverpb::AuthRoleAddRequest rw;
    rw.set_name("rw");
    etcdserverpb::AuthRoleAddResponse role_resp;
    call(&etcdserverpb::Auth::Stub::RoleAdd, rw, &role_resp);
    etcdserverpb::AuthRoleGrantPermissionRequest perm;
    perm.set_name("rw");
    perm.mutable_perm()->set_permtype(authpb::Permission::READWRITE);
    perm.mutable_perm()->set_key("a");
    perm.mutable_perm()->set_range_end("b");
    etcdserverpb::AuthRoleGrantPermissionResponse perm_resp;
    call(&etcdserverpb::Auth::Stub::RoleGrantPermission, perm, &perm_resp);
    etcdserverpb::AuthUserGrantRoleRequest alice_role;
    alice_role.set_user("alice");
    alice_role.set_role("rw");
    call(&etcdserverpb::Auth::Stub::UserGrantRole, alice_role, &grant_resp);
    etcdserverpb::AuthEnableResponse enable_resp;
    call(&etcdserverpb::Auth::Stub::AuthEnable, etcdserverpb::AuthEnableRequest(), &enable_resp);
  }

  // A token for user from member i (the password checked there).
  std::string Authenticate(int i, const std::string& user, const std::string& password,
                           Outcome* outcome = nullptr) {
    auto stub = etcdserverpb::Auth::NewStub(cluster_->NewChannel(i));
    etcdserverpb::AuthenticateRequest req;
    req.set_name(user);
    req.set_password(password);
    etcdserverpb::AuthenticateResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    Outcome o = OutcomeOf(stub->Authenticate(&ctx, req, &resp));
    if (outcome != nullptr) *outcome = o;
    EXPECT_TRUE(outcome != nullptr || o.ok()) << Describe(o);
    return resp.token();
  }

  Outcome Put(int i, const std::string& token, const std::string& key) {
    auto stub = etcdserverpb::KV::NewStub(cluster_->NewChannel(i));
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value("v");
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    if (!token.empty()) ctx.AddMetadata("token", token);
    return OutcomeOf(stub->Put(&ctx, req, &resp));
  }

  Outcome Get(int i, const std::string& token, const std::string& key) {
    auto stub = etcdserverpb::KV::NewStub(cluster_->NewChannel(i));
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    if (!token.empty()) ctx.AddMetadata("token", token);
    return OutcomeOf(stub->Range(&ctx, req, &resp));
  }

  // Polls rpc until its outcome is not `ok` (or the deadline): a member
  // answers by what it has applied, which may lag the member that took a
  // change.
  static Outcome PollUntilRefused(const std::function<Outcome()>& rpc,
                                  milliseconds timeout = milliseconds(10000)) {
    const auto deadline = Clock::now() + timeout;
    Outcome o = rpc();
    while (o.ok() && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(20));  // polling a condition, with a deadline
      o = rpc();
    }
    return o;
  }

  // Polls rpc until it succeeds, through transient errors (an election).
  static Outcome PollUntilOk(const std::function<Outcome()>& rpc,
                             milliseconds timeout = milliseconds(15000)) {
    const auto deadline = Clock::now() + timeout;
    Outcome o = rpc();
    while (!o.ok() && o.code == grpc::StatusCode::UNAVAILABLE && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));  // polling a condition, with a deadline
      o = rpc();
    }
    return o;
  }

  void ChangePassword(int i, const std::string& root_token, const std::string& user,
                      const std::string& password) {
    auto stub = etcdserverpb::Auth::NewStub(cluster_->NewChannel(i));
    etcdserverpb::AuthUserChangePasswordRequest req;
    req.set_name(user);
    req.set_password(password);
    etcdserverpb::AuthUserChangePasswordResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    ctx.AddMetadata("token", root_token);
    grpc::Status s = stub->UserChangePassword(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_P(AuthClusterTest, ASimpleTokenFromOneMemberWorksAtEveryMemberAndAfterALeaderChange) {
  ASSERT_NO_FATAL_FAILURE(StartWithAuth());
  const std::string token = Authenticate(0, "alice", "alicepw");
  ASSERT_FALSE(token.empty());
  // At once, at every member: each registered the token when it applied the
  // entry, and one that has not yet waits for it.
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome put = Put(i, token, absl::StrCat("a/", i));
    EXPECT_TRUE(put.ok()) << "member " << i << ": " << Describe(put);
    Outcome get = Get(i, token, "a/0");
    EXPECT_TRUE(get.ok()) << "member " << i << ": " << Describe(get);
  }
  // Outside alice's permission: etcd's error, at every member.
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome put = Put(i, token, "z");
    EXPECT_EQ(put.code, grpc::StatusCode::PERMISSION_DENIED) << "member " << i;
    EXPECT_EQ(put.message, "etcdserver: permission denied") << "member " << i;
  }

  // The leader dies; the others elect a new one and still know the token.
  auto leader = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  cluster_->Kill(*leader);
  auto next = cluster_->WaitForLeader(seconds(20));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_NE(*next, *leader);
  for (int i = 0; i < cluster_->size(); ++i) {
    if (i == *leader) continue;
    Outcome put = PollUntilOk([&] { return Put(i, token, absl::StrCat("a/after/", i)); });
    EXPECT_TRUE(put.ok()) << "member " << i << ": " << Describe(put);
  }
  // A token issued by the new leader works at the other survivor.
  const std::string fresh = Authenticate(*next, "alice", "alicepw");
  for (int i = 0; i < cluster_->size(); ++i) {
    if (i == *leader) continue;
    Outcome put = PollUntilOk([&] { return Put(i, fresh, "a/fresh"); });
    EXPECT_TRUE(put.ok()) << "member " << i << ": " << Describe(put);
  }
  ASSERT_TRUE(cluster_->Restart(*leader).ok());
}

TEST_P(AuthClusterTest, AChangedPasswordRefusesTheTokenAtEveryMember) {
  ASSERT_NO_FATAL_FAILURE(StartWithAuth());
  const std::string token = Authenticate(1, "alice", "alicepw");
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome get = Get(i, token, "a");
    ASSERT_TRUE(get.ok()) << "member " << i << ": " << Describe(get);
  }
  const std::string root = Authenticate(2, "root", "rootpw");
  ASSERT_NO_FATAL_FAILURE(ChangePassword(2, root, "alice", "newpw"));
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome get = PollUntilRefused([&] { return Get(i, token, "a"); });
    EXPECT_EQ(get.code, grpc::StatusCode::UNAUTHENTICATED) << "member " << i;
    EXPECT_EQ(get.message, "etcdserver: invalid auth token") << "member " << i;
    Outcome put = Put(i, token, "a/x");
    EXPECT_EQ(put.message, "etcdserver: invalid auth token") << "member " << i;
  }
  // The old password is refused; the new one gives a token every member takes.
  Outcome refused;
  Authenticate(0, "alice", "alicepw", &refused);
  EXPECT_EQ(refused.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.message,
            "etcdserver: authentication failed, invalid user ID or password");
  const std::string fresh = Authenticate(0, "alice", "newpw");
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome put = Put(i, fresh, "a/new");
    EXPECT_TRUE(put.ok()) << "member " << i << ": " << Describe(put);
  }
}

TEST_P(AuthClusterTest, AnUnusedTokenExpiresAtEveryMember) {
  ASSERT_NO_FATAL_FAILURE(StartWithAuth({"--auth-token-ttl=2"}));
  const std::string token = Authenticate(0, "alice", "alicepw");
  Outcome first = Get(1, token, "a");
  ASSERT_TRUE(first.ok()) << Describe(first);
  // The TTL is a span of real time on each member (etcd's keeper sweeps
  // every second): nothing to poll without using the token, which would
  // renew it.
  std::this_thread::sleep_for(seconds(4));
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome get = Get(i, token, "a");
    EXPECT_EQ(get.code, grpc::StatusCode::UNAUTHENTICATED) << "member " << i;
    EXPECT_EQ(get.message, "etcdserver: invalid auth token") << "member " << i;
  }
}

TEST_P(AuthClusterTest, APermissionRevokedAtOneMemberRefusesWritesAtEveryMember) {
  ASSERT_NO_FATAL_FAILURE(StartWithAuth());
  const std::string token = Authenticate(0, "alice", "alicepw");
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome put = Put(i, token, "a/before");
    ASSERT_TRUE(put.ok()) << "member " << i << ": " << Describe(put);
  }
  const std::string root = Authenticate(1, "root", "rootpw");
  {
    auto stub = etcdserverpb::Auth::NewStub(cluster_->NewChannel(1));
    etcdserverpb::AuthRoleRevokePermissionRequest req;
    req.set_role("rw");
    req.set_key("a");
    req.set_range_end("b");
    etcdserverpb::AuthRoleRevokePermissionResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    ctx.AddMetadata("token", root);
    grpc::Status s = stub->RoleRevokePermission(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // A simple token carries the member's current auth revision: the write is
  // judged by the permissions as they are when it applies.
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome put = PollUntilRefused([&] { return Put(i, token, "a/after"); });
    // A write that arrived before the member applied the revocation and was
    // applied after it: refused as checked at an older auth revision (the
    // client retries with a new token, as clientv3 does).
    if (put.message == "etcdserver: revision of auth store is old") put = Put(i, token, "a/after");
    EXPECT_EQ(put.code, grpc::StatusCode::PERMISSION_DENIED) << "member " << i;
    EXPECT_EQ(put.message, "etcdserver: permission denied") << "member " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Servers, AuthClusterTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         [](const ::testing::TestParamInfo<ServerFlavor>& info) {
                           return info.param == ServerFlavor::kEtcd ? "Etcd" : "Capstan";
                         });

}  // namespace
}  // namespace capstan::testing::cluster
