// etcd v3 auth end to end: one etcdctl session (users, roles, permissions,
// enable/disable, permitted and refused reads, writes and watches, wrong
// passwords, neighbouring key ranges) run against a real etcd and against
// capstan, each on its own fresh data dir. etcdctl's stdout, stderr (without
// its JSON retry logs) and exit status must match step by step.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

struct Outcome {
  int code = -1;
  bool timed_out = false;
  std::string out;
  std::string err;
  std::string ToString() const {
    return "exit " + std::to_string(code) + (timed_out ? " (timed out)" : "") + "\nstdout:\n" +
           out + "stderr:\n" + err;
  }
};

// Drops etcdctl's zap log lines (retry warnings carry timestamps).
std::string StripLogs(const std::string& s) {
  std::vector<std::string> keep;
  for (absl::string_view line : absl::StrSplit(s, '\n')) {
    if (absl::StartsWith(line, "{\"level\"")) continue;
    keep.emplace_back(line);
  }
  return absl::StrJoin(keep, "\n");
}

class AuthE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", EtcdctlBinary());
    CAPSTAN_REQUIRE_REFERENCE("capstan", CapstanBinary());
    auto etcd = ServerProcess::Start(ServerOptions::Etcd());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
    ServerOptions co = ServerOptions::Capstan();
    co.extra_args = {"--bcrypt-cost=4"};
    auto capstan = ServerProcess::Start(co);
    ASSERT_TRUE(capstan.ok()) << capstan.status();
    capstan_ = std::move(*capstan);
  }

  void TearDown() override {
    if (capstan_ && capstan_->running()) capstan_->Stop();
    if (etcd_ && etcd_->running()) etcd_->Stop();
  }

  static Outcome Run(const ServerProcess& server, const std::vector<std::string>& args,
                     std::chrono::milliseconds timeout) {
    std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + server.endpoint(),
                                     "--command-timeout=5s"};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunCommand(argv, "", timeout);
    Outcome o;
    o.timed_out = r.timed_out;
    o.code = r.exit.exited ? r.exit.exit_code : -r.exit.term_signal;
    // Endpoints differ by port only.
    o.out = absl::StrReplaceAll(r.out, {{server.endpoint(), "ENDPOINT"}});
    o.err = absl::StrReplaceAll(StripLogs(r.err), {{server.endpoint(), "ENDPOINT"}});
    return o;
  }

  // Runs args on both servers and expects the same outcome; returns etcd's.
  Outcome Both(const std::vector<std::string>& args,
               std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    Outcome e = Run(*etcd_, args, timeout);
    Outcome c = Run(*capstan_, args, timeout);
    const std::string cmd = absl::StrJoin(args, " ");
    EXPECT_EQ(e.out, c.out) << "etcdctl " << cmd << "\netcd:\n"
                            << e.ToString() << "\ncapstan:\n"
                            << c.ToString();
    EXPECT_EQ(e.err, c.err) << "etcdctl " << cmd << "\netcd:\n"
                            << e.ToString() << "\ncapstan:\n"
                            << c.ToString();
    EXPECT_EQ(e.code, c.code) << "etcdctl " << cmd << "\netcd:\n"
                              << e.ToString() << "\ncapstan:\n"
                              << c.ToString();
    return e;
  }

  std::unique_ptr<ServerProcess> etcd_;
  std::unique_ptr<ServerProcess> capstan_;
};

const std::string kRoot = "--user=root:rootpw";
const std::string kU = "--user=u:upw";

TEST_F(AuthE2eTest, EtcdctlSession) {
  // Set-up errors before any user exists.
  EXPECT_EQ(Both({"auth", "enable"}).err, "Error: etcdserver: root user does not exist\n");
  EXPECT_EQ(Both({"user", "add", "root", "--new-user-password=rootpw"}).out, "User root created\n");
  Both({"user", "add", "root", "--new-user-password=x"});  // already exists
  Both({"role", "add", "r"});
  Both({"role", "add", "r"});  // already exists
  Both({"role", "grant-permission", "r", "readwrite", "foo", "--prefix"});
  Both({"role", "grant-permission", "r", "read", "bar"});
  Both({"role", "grant-permission", "r", "write", "w1", "w3"});
  Both({"role", "grant-permission", "r", "write", "w3", "w5"});  // adjacent: merged
  Both({"role", "grant-permission", "nope", "read", "x"});
  Both({"user", "add", "u", "--new-user-password=upw"});
  Both({"user", "grant-role", "u", "r"});
  Both({"user", "grant-role", "u", "nope"});
  Both({"user", "grant-role", "nobody", "r"});
  Both({"user", "revoke-role", "u", "nope"});
  Both({"user", "list"});
  Both({"role", "list"});
  Both({"role", "get", "r"});
  Both({"user", "get", "u"});
  // etcdctl adds the root role and grants it to root when auth enable asks.
  EXPECT_EQ(Both({"auth", "enable"}).out, "Authentication Enabled\n");
  Both({"auth", "enable", kRoot});

  // Without a user, with a wrong password, with a user.
  Both({"get", "foo"});
  Both({"put", "foo", "x"});
  Both({"--user=u:wrong", "get", "foo"});
  Both({"--user=nobody:x", "get", "foo"});
  Both({"put", kRoot, "foo1", "v1"});
  Both({"put", kU, "foo2", "v2"});
  Both({"get", kU, "foo", "--prefix"});
  Both({"get", kU, "foo1", "--print-value-only"});
  // Neighbouring ranges and keys outside the grants.
  Both({"put", kU, "fop", "x"});
  Both({"get", kU, "fo", "--prefix"});
  Both({"get", kU, "foo", "fop"});
  Both({"get", kU, "foo", "foq"});
  Both({"get", kU, "foo", "--from-key"});
  Both({"get", kU, "bar"});
  Both({"put", kU, "bar", "x"});
  Both({"put", kU, "w2", "x"});
  Both({"put", kU, "w4", "x"});
  Both({"del", kU, "w1", "w5"});     // covered by two adjacent write grants
  Both({"del", kU, "w1", "w6"});     // not covered
  Both({"del", kU, "w2", "--prev-kv"});  // no read permission for prev_kv
  Both({"del", kU, "foo2"});
  Both({"put", kU, "foo3", "x", "--prev-kv"});
  Both({"txn", kU, "-i"});  // empty txn: no checks
  // Admin-only APIs.
  Both({"user", "list", kU});
  Both({"role", "list", kU});
  Both({"user", "get", "u", kU});     // itself: allowed
  Both({"user", "get", "root", kU});  // someone else: refused
  Both({"role", "get", "r", kU});     // its own role: allowed
  Both({"role", "get", "root", kU});
  Both({"user", "list", kRoot});
  // etcd 3.6 reports the root role's implicit permission; 3.5.16, the
  // reference, reports none, as 3.4 did. Capstan follows 3.6.
  Outcome root_role = Run(*capstan_, {"role", "get", "root", kRoot}, std::chrono::seconds(10));
  EXPECT_EQ(root_role.out,
            "Role root\nKV Read:\n\t[, <open ended> (prefix )\nKV Write:\n\t[, <open ended> "
            "(prefix )\n");
  Both({"role", "get", "r", kRoot});
  Both({"user", "delete", "root", kRoot});
  Both({"user", "revoke-role", "root", "root", kRoot});
  Both({"role", "delete", "root", kRoot});
  Both({"role", "revoke-permission", "r", "bar", kRoot});
  Both({"role", "revoke-permission", "r", "bar", kRoot});  // not granted any more
  Both({"get", kU, "bar"});
  Both({"compaction", "1"});  // any user may compact
  Both({"endpoint", "hashkv", kU});
  Both({"defrag", kU});

  // Watches: a refused one is created and canceled at once; a permitted
  // one streams events until the client gives up.
  Both({"watch", kU, "fop"});
  Both({"watch", kU, "fo", "--prefix"});
  Outcome w = Both({"watch", kU, "foo1", "--rev=1"}, std::chrono::seconds(3));
  EXPECT_TRUE(w.timed_out);
  EXPECT_EQ(w.out, "PUT\nfoo1\nv1\n");

  // Changing a password invalidates the old one; deleting a user.
  Both({"user", "passwd", "u", "--new-user-password=upw2", kRoot});
  Both({"get", kU, "foo1"});
  Both({"get", "--user=u:upw2", "foo1", "--print-value-only"});
  Both({"user", "delete", "u", kRoot});
  Both({"get", "--user=u:upw2", "foo1"});

  EXPECT_EQ(Both({"auth", "disable", kRoot}).out, "Authentication Disabled\n");
  Both({"get", "foo1", "--print-value-only"});
  Both({"auth", "disable"});
  Both({"user", "list"});
  Both({"role", "get", "r"});

  // AuthStatus: both report auth off and the same auth revision.
  etcdserverpb::AuthStatusRequest req;
  etcdserverpb::AuthStatusResponse resp, etcd_resp;
  {
    grpc::ClientContext ctx;
    grpc::Status s = etcdserverpb::Auth::NewStub(etcd_->NewChannel())->AuthStatus(&ctx, req, &etcd_resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto stub = etcdserverpb::Auth::NewStub(capstan_->NewChannel());
  grpc::ClientContext ctx;
  grpc::Status s = stub->AuthStatus(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.enabled());
  EXPECT_FALSE(etcd_resp.enabled());
  EXPECT_GT(resp.authrevision(), 10u);
  EXPECT_EQ(resp.authrevision(), etcd_resp.authrevision());

  // Everything survives a restart.
  capstan_->Stop();
  ASSERT_TRUE(capstan_->Restart().ok());
  grpc::ClientContext ctx2;
  etcdserverpb::AuthStatusResponse resp2;
  stub = etcdserverpb::Auth::NewStub(capstan_->NewChannel());
  ASSERT_TRUE(stub->AuthStatus(&ctx2, req, &resp2).ok());
  EXPECT_EQ(resp2.authrevision(), resp.authrevision());
  Outcome roles = Run(*capstan_, {"role", "get", "r"}, std::chrono::seconds(10));
  EXPECT_EQ(roles.code, 0) << roles.ToString();
  EXPECT_NE(roles.out.find("foo"), std::string::npos) << roles.out;
}

}  // namespace
}  // namespace capstan::testing
