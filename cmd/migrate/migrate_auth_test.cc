// A second etcd with auth enabled and a NOSPACE alarm checks that a migrated
// Capstan enforces etcd's users, roles, passwords and alarm as etcd did.
// (The MigrateTest fixture: migrate_test_fixture.h.)

#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "authpb/auth.pb.h"
#include "cmd/migrate/migrate.h"
#include "cmd/migrate/migrate_test_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "storage/etcdfmt/bbolt_reader.h"

namespace capstan::server::migrate_test {
namespace {

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

}  // namespace
}  // namespace capstan::server::migrate_test
