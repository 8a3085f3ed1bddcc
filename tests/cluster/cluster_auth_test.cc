// Auth across the members of a 3-member cluster, on etcd 3.5 and on Capstan,
// through the gRPC API: a simple token issued by one member (etcd proposes
// an InternalAuthenticateRequest that every member applies) is accepted by
// every member, still after the leader was killed and replaced; it is
// refused everywhere once its user's password changed, and once its TTL
// (--auth-token-ttl) passed without use; a permission revoked through one
// member refuses the user's writes at every member with etcd's error; a
// lease holding a user's key expires at every member.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
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

using etcdserverpb::Auth;
using etcdserverpb::KV;

class AuthClusterTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  }

  // The step every scenario starts with. Starts the cluster (extra flags
  // appended); through member 0, adds root (role root) and alice (role rw:
  // read and write on [a, b)) and enables auth; then takes a token for
  // alice from member `issuer` (the password checked there) into alice_.
  // Every member accepts it at once for a write and a read: each
  // registered the token when it applied the entry, and one that has not
  // yet waits for it.
  void StartWithAliceToken(int issuer, std::vector<std::string> extra_args = {}) {
    ClusterOptions o = GetParam() == ServerFlavor::kEtcd ? ClusterOptions::Etcd(3)
                                                          : ClusterOptions::Capstan(3);
    o.extra_args = std::move(extra_args);
    auto started = Cluster::Start(o);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(*started);
    ASSERT_TRUE(cluster_->WaitForLeader(seconds(10)).ok());

    const auto admin = [&](auto rpc, const auto& request) {
      const Outcome done = Call(0, "", rpc, request);
      ASSERT_TRUE(done.ok()) << Describe(done);
    };
    etcdserverpb::AuthRoleAddRequest rw;
    rw.set_name("rw");
    ASSERT_NO_FATAL_FAILURE(admin(&Auth::Stub::RoleAdd, rw));
    etcdserverpb::AuthRoleGrantPermissionRequest perm;
    perm.set_name("rw");
    perm.mutable_perm()->set_permtype(authpb::Permission::READWRITE);
    perm.mutable_perm()->set_key("a");
    perm.mutable_perm()->set_range_end("b");
    ASSERT_NO_FATAL_FAILURE(admin(&Auth::Stub::RoleGrantPermission, perm));
    for (const auto& [name, password, role] :
         {std::tuple{"root", "rootpw", "root"}, std::tuple{"alice", "alicepw", "rw"}}) {
      etcdserverpb::AuthUserAddRequest user;
      user.set_name(name);
      user.set_password(password);
      ASSERT_NO_FATAL_FAILURE(admin(&Auth::Stub::UserAdd, user));
      etcdserverpb::AuthUserGrantRoleRequest grant;
      grant.set_user(name);
      grant.set_role(role);
      ASSERT_NO_FATAL_FAILURE(admin(&Auth::Stub::UserGrantRole, grant));
    }
    ASSERT_NO_FATAL_FAILURE(admin(&Auth::Stub::AuthEnable, etcdserverpb::AuthEnableRequest()));

    alice_ = Authenticate(issuer, "alice", "alicepw");
    ASSERT_FALSE(alice_.empty());
    for (int i = 0; i < cluster_->size(); ++i) {
      const Outcome put = Put(i, alice_, absl::StrCat("a/", i));
      ASSERT_TRUE(put.ok()) << "member " << i << ": " << Describe(put);
      const Outcome get = Get(i, alice_, "a/0");
      ASSERT_TRUE(get.ok()) << "member " << i << ": " << Describe(get);
    }
  }

  // Calls rpc at member i, as the user of `token` ("" for none), with a
  // 10 s deadline; the response in *response when it is not null.
  template <typename Stub, typename Request, typename Response>
  Outcome Call(int i, const std::string& token,
               grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
               const Request& request, Response* response = nullptr) {
    Stub stub(cluster_->NewChannel(i));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    if (!token.empty()) ctx.AddMetadata("token", token);
    Response unused;
    return OutcomeOf((stub.*rpc)(&ctx, request, response != nullptr ? response : &unused));
  }

  // Calls rpc at member i as root (with a token from that member); it must
  // succeed.
  template <typename Rpc, typename Request>
  void AsRoot(int i, Rpc rpc, const Request& request) {
    const std::string root = Authenticate(i, "root", "rootpw");
    const Outcome done = Call(i, root, rpc, request);
    ASSERT_TRUE(done.ok()) << Describe(done);
  }

  // A token for user from member i (the password checked there). Expects
  // success unless `outcome` is given.
  std::string Authenticate(int i, const std::string& user, const std::string& password,
                           Outcome* outcome = nullptr) {
    etcdserverpb::AuthenticateRequest req;
    req.set_name(user);
    req.set_password(password);
    etcdserverpb::AuthenticateResponse resp;
    const Outcome o = Call(i, "", &Auth::Stub::Authenticate, req, &resp);
    if (outcome != nullptr) *outcome = o;
    EXPECT_TRUE(outcome != nullptr || o.ok()) << Describe(o);
    return resp.token();
  }

  Outcome Put(int i, const std::string& token, const std::string& key) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value("v");
    return Call(i, token, &KV::Stub::Put, req);
  }

  Outcome Get(int i, const std::string& token, const std::string& key) {
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    return Call(i, token, &KV::Stub::Range, req);
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

  std::unique_ptr<Cluster> cluster_;
  std::string alice_;  // alice's token (StartWithAliceToken)
};

TEST_P(AuthClusterTest, ASimpleTokenFromOneMemberWorksAtEveryMemberAndAfterALeaderChange) {
  ASSERT_NO_FATAL_FAILURE(StartWithAliceToken(0));
  // Outside alice's permission: etcd's error, at every member.
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome put = Put(i, alice_, "z");
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
    Outcome put = PollUntilOk([&] { return Put(i, alice_, absl::StrCat("a/after/", i)); });
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
  ASSERT_NO_FATAL_FAILURE(StartWithAliceToken(1));
  etcdserverpb::AuthUserChangePasswordRequest change;
  change.set_name("alice");
  change.set_password("newpw");
  ASSERT_NO_FATAL_FAILURE(AsRoot(2, &Auth::Stub::UserChangePassword, change));
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome get = PollUntilRefused([&] { return Get(i, alice_, "a"); });
    EXPECT_EQ(get.code, grpc::StatusCode::UNAUTHENTICATED) << "member " << i;
    EXPECT_EQ(get.message, "etcdserver: invalid auth token") << "member " << i;
    Outcome put = Put(i, alice_, "a/x");
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
  ASSERT_NO_FATAL_FAILURE(StartWithAliceToken(0, {"--auth-token-ttl=2"}));
  // The TTL is a span of real time on each member (etcd's keeper sweeps
  // every second): nothing to poll without using the token, which would
  // renew it.
  std::this_thread::sleep_for(seconds(4));
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome get = Get(i, alice_, "a");
    EXPECT_EQ(get.code, grpc::StatusCode::UNAUTHENTICATED) << "member " << i;
    EXPECT_EQ(get.message, "etcdserver: invalid auth token") << "member " << i;
  }
}

TEST_P(AuthClusterTest, APermissionRevokedAtOneMemberRefusesWritesAtEveryMember) {
  ASSERT_NO_FATAL_FAILURE(StartWithAliceToken(0));
  etcdserverpb::AuthRoleRevokePermissionRequest revoke;
  revoke.set_role("rw");
  revoke.set_key("a");
  revoke.set_range_end("b");
  ASSERT_NO_FATAL_FAILURE(AsRoot(1, &Auth::Stub::RoleRevokePermission, revoke));
  // A simple token carries the member's current auth revision: the write is
  // judged by the permissions as they are when it applies.
  for (int i = 0; i < cluster_->size(); ++i) {
    Outcome put = PollUntilRefused([&] { return Put(i, alice_, "a/after"); });
    // A write that arrived before the member applied the revocation and was
    // applied after it: refused as checked at an older auth revision (the
    // client retries with a new token, as clientv3 does).
    if (put.message == "etcdserver: revision of auth store is old") put = Put(i, alice_, "a/after");
    EXPECT_EQ(put.code, grpc::StatusCode::PERMISSION_DENIED) << "member " << i;
    EXPECT_EQ(put.message, "etcdserver: permission denied") << "member " << i;
  }
}

TEST_P(AuthClusterTest, ALeaseHoldingAUsersKeyExpiresAtEveryMember) {
  ASSERT_NO_FATAL_FAILURE(StartWithAliceToken(0));
  // The leader revokes an expired lease as root (etcd's WithRoot): every
  // member's apply-time check passes it, whoever's keys it holds.
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(3);
  etcdserverpb::LeaseGrantResponse granted;
  Outcome o = Call(1, alice_, &etcdserverpb::Lease::Stub::LeaseGrant, grant, &granted);
  ASSERT_TRUE(o.ok()) << Describe(o);
  etcdserverpb::PutRequest put;
  put.set_key("a/leased");
  put.set_value("v");
  put.set_lease(granted.id());
  o = Call(1, alice_, &KV::Stub::Put, put);
  ASSERT_TRUE(o.ok()) << Describe(o);
  for (int i = 0; i < cluster_->size(); ++i) {
    const auto deadline = Clock::now() + seconds(20);
    int64_t count = 1;
    while (count != 0 && Clock::now() < deadline) {
      etcdserverpb::RangeRequest get;
      get.set_key("a/leased");
      etcdserverpb::RangeResponse got;
      o = Call(i, alice_, &KV::Stub::Range, get, &got);
      ASSERT_TRUE(o.ok()) << "member " << i << ": " << Describe(o);
      count = got.count();
      if (count != 0) std::this_thread::sleep_for(milliseconds(100));  // polling, with a deadline
    }
    EXPECT_EQ(count, 0) << "member " << i << ": the key outlived its lease by 17 s";
  }
}

INSTANTIATE_TEST_SUITE_P(Servers, AuthClusterTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

}  // namespace
}  // namespace capstan::testing::cluster
