// Differential tests: the same requests against real etcd and Capstan.
//
// DiffTest starts one etcd and one capstan per test suite and sends every
// request to both, etcd first. A case passes when Capstan answers what etcd
// answers: the same gRPC status code, the same error text, and the same
// response once the volatile fields are normalized (see Normalize()).
//
//   TEST_F(DiffKvTest, RangeLimit) {
//     PutBoth(K("a"), "1");
//     etcdserverpb::RangeRequest r;
//     r.set_key(K("a"));
//     r.set_limit(1);
//     auto p = Both(r);
//     EXPECT_SAME(p);
//     EXPECT_EQ(p.etcd.resp.count(), 1);  // the case tests what it says
//   }
//
// Revisions are global per server, so every write goes to both servers in
// the same order (Both() does; never write to only one) and each test uses
// its own key prefix K(...), which sorts after the prefixes of all earlier
// tests of the process: a from-key range starting at K("") sees only the
// keys of its own test. TearDown checks that both servers are still at the
// same revision; if not, the test fails and the lagging server is brought
// level with no-op writes to kResyncKey so later cases stay meaningful.
//
// Environment:
//   CAPSTAN_DIFF_BOTH_ETCD=1  start a second etcd in place of capstan (to
//                             validate the harness and the cases themselves).
//   CAPSTAN_DIFF_VERBOSE=1    print every request and etcd's answer.
//   see also process_fixture.h.

#ifndef CAPSTAN_TESTS_DIFF_FIXTURE_H_
#define CAPSTAN_TESTS_DIFF_FIXTURE_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mvcc/key_range.h"
#include "process_fixture.h"
#include "v3electionpb/v3election.grpc.pb.h"
#include "v3lockpb/v3lock.grpc.pb.h"

namespace capstan::testing {

// One server's answer to a unary RPC. `resp` is meaningful only if status.ok().
template <typename Resp>
struct Answer {
  grpc::Status status;
  Resp resp;
};

template <typename Resp>
struct AnswerPair {
  Answer<Resp> etcd;
  Answer<Resp> capstan;
};

// Clears what differs between two servers by design, in place, recursively:
//  - every etcdserverpb.ResponseHeader: cluster_id, member_id, raft_term;
//  - every etcdserverpb.Member: ID; the server's own client and peer ports
//    inside URLs become "CLIENT-PORT" / "PEER-PORT";
//  - etcdserverpb.StatusResponse: version, dbSize, dbSizeInUse, leader,
//    raftIndex, raftTerm, raftAppliedIndex (their shape is tested apart),
//    and etcd 3.6's storageVersion, dbSizeQuota and downgradeInfo.
void Normalize(google::protobuf::Message* m, const ServerProcess& server);

// The smallest key greater than every key with prefix `p` (etcd's
// GetPrefixRangeEnd): "\0", from-key, when `p` is empty or all 0xff bytes.
using mvcc::PrefixEnd;

// Replaces the server's client/peer/metrics ports in `s` by placeholders.
std::string NormalizePorts(std::string s, const ServerProcess& server);

// Compares two answers: code, error text, and (if OK) the normalized
// responses. The failure message shows a field-by-field diff and both
// responses.
::testing::AssertionResult SameAnswer(const grpc::Status& etcd_status,
                                      const google::protobuf::Message& etcd_resp,
                                      const ServerProcess& etcd,
                                      const grpc::Status& capstan_status,
                                      const google::protobuf::Message& capstan_resp,
                                      const ServerProcess& capstan);

// A compact, size-bounded text form of a message for failure output.
std::string Describe(const google::protobuf::Message& m, size_t max_bytes = 4096);
std::string Describe(const grpc::Status& s);

// etcdctl run against one server.
struct EtcdctlResult {
  std::vector<std::string> argv;
  CommandResult raw;
  // stdout with ports normalized.
  std::string out;
  // stderr without etcdctl's JSON log lines ({"level":...}), ports normalized.
  std::string err;
  // stdout parsed as JSON (if it is JSON), normalized: cluster_id, member_id,
  // raft_term removed everywhere, members' "ID" removed.
  bool is_json = false;
  google::protobuf::Value json;
};

struct EtcdctlPair {
  EtcdctlResult etcd;
  EtcdctlResult capstan;
};

// Compares exit status, stderr, and stdout (as JSON if both are JSON, else as text).
::testing::AssertionResult SameEtcdctl(const EtcdctlPair& p);

// Parses JSON text into a Value. Returns false if it is not JSON.
bool ParseJson(const std::string& text, google::protobuf::Value* out);

// Normalizes JSON answers in place as etcdctl's are: cluster_id, member_id
// and raft_term removed everywhere, "ID" removed inside "members", the
// server's ports replaced in strings.
void NormalizeJson(google::protobuf::Value* v, const ServerProcess& server,
                   bool in_members = false);

// Serves both servers' gRPC stubs.
struct ServerStubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  std::unique_ptr<etcdserverpb::Cluster::Stub> cluster;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  std::unique_ptr<v3lockpb::Lock::Stub> lock;
  std::unique_ptr<v3electionpb::Election::Stub> election;

  explicit ServerStubs(std::shared_ptr<grpc::Channel> ch);
};

// A positive count from the environment variable `name`, or `fallback`
// (CAPSTAN_RANDOM_SEEDS, CAPSTAN_RANDOM_STEPS).
int EnvCount(const char* name, int fallback);

// Deadline of every unary call made by the fixture.
inline constexpr std::chrono::seconds kRpcDeadline{15};

// Key used to bring a lagging server level (sorts before every test prefix).
// It exists on both servers from the suite's start; after a resync its
// version differs, so a case that reads the whole keyspace uses count_only.
inline constexpr std::string_view kResyncKey = "/diff-resync";

class DiffTest : public ::testing::Test {
 public:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

  // True if CAPSTAN_DIFF_BOTH_ETCD is set: the "capstan" side is an etcd.
  static bool BothEtcd();
  // True once a test of this suite left the servers at different revisions
  // (TearDown brought them level): their key histories differ from then on.
  static bool Resynced() { return resynced_; }

 protected:
  void SetUp() override;
  void TearDown() override;

  static ServerProcess& etcd() { return *etcd_; }
  static ServerProcess& capstan() { return *capstan_; }
  static ServerStubs& etcd_stubs() { return *etcd_stubs_; }
  static ServerStubs& capstan_stubs() { return *capstan_stubs_; }

  // This test's key prefix: "/diff/<seq>-<Suite>.<Test>/".
  const std::string& prefix() const { return prefix_; }
  // prefix() + suffix.
  std::string K(std::string_view suffix) const { return prefix_ + std::string(suffix); }

  // One unary RPC on both servers, etcd first.
  // Msg: the request/response message names without "Request"/"Response".
#define CAPSTAN_DIFF_BOTH_IN(Pkg, Svc, member, Method, Msg)                                 \
  AnswerPair<Pkg::Msg##Response> Both(const Pkg::Msg##Request& req) {                      \
    return BothUnary<Pkg::Svc::Stub>([](ServerStubs& s) { return s.member.get(); },         \
                                     &Pkg::Svc::Stub::Method, req);                         \
  }
#define CAPSTAN_DIFF_BOTH_MSG(Svc, member, Method, Msg) \
  CAPSTAN_DIFF_BOTH_IN(etcdserverpb, Svc, member, Method, Msg)
#define CAPSTAN_DIFF_BOTH(Svc, member, Method) CAPSTAN_DIFF_BOTH_MSG(Svc, member, Method, Method)
  CAPSTAN_DIFF_BOTH(KV, kv, Range)
  CAPSTAN_DIFF_BOTH(KV, kv, Put)
  CAPSTAN_DIFF_BOTH(KV, kv, DeleteRange)
  CAPSTAN_DIFF_BOTH(KV, kv, Txn)
  CAPSTAN_DIFF_BOTH(Lease, lease, LeaseGrant)
  CAPSTAN_DIFF_BOTH(Lease, lease, LeaseRevoke)
  CAPSTAN_DIFF_BOTH(Lease, lease, LeaseTimeToLive)
  CAPSTAN_DIFF_BOTH(Lease, lease, LeaseLeases)
  CAPSTAN_DIFF_BOTH(Cluster, cluster, MemberList)
  CAPSTAN_DIFF_BOTH(Maintenance, maintenance, Alarm)
  CAPSTAN_DIFF_BOTH(Maintenance, maintenance, Status)
  CAPSTAN_DIFF_BOTH(Maintenance, maintenance, Hash)
  CAPSTAN_DIFF_BOTH(Maintenance, maintenance, HashKV)
  CAPSTAN_DIFF_BOTH(Maintenance, maintenance, Defragment)
  CAPSTAN_DIFF_BOTH(Maintenance, maintenance, MoveLeader)
  CAPSTAN_DIFF_BOTH(Maintenance, maintenance, Downgrade)
  CAPSTAN_DIFF_BOTH_MSG(KV, kv, Compact, Compaction)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, AuthStatus, AuthStatus)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, UserGet, AuthUserGet)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, UserList, AuthUserList)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, RoleGet, AuthRoleGet)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, RoleList, AuthRoleList)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, AuthEnable, AuthEnable)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, AuthDisable, AuthDisable)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, Authenticate, Authenticate)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, UserAdd, AuthUserAdd)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, UserDelete, AuthUserDelete)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, UserChangePassword, AuthUserChangePassword)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, UserGrantRole, AuthUserGrantRole)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, UserRevokeRole, AuthUserRevokeRole)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, RoleAdd, AuthRoleAdd)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, RoleDelete, AuthRoleDelete)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, RoleGrantPermission, AuthRoleGrantPermission)
  CAPSTAN_DIFF_BOTH_MSG(Auth, auth, RoleRevokePermission, AuthRoleRevokePermission)
  CAPSTAN_DIFF_BOTH_IN(v3lockpb, Lock, lock, Lock, Lock)
  CAPSTAN_DIFF_BOTH_IN(v3lockpb, Lock, lock, Unlock, Unlock)
  CAPSTAN_DIFF_BOTH_IN(v3electionpb, Election, election, Campaign, Campaign)
  CAPSTAN_DIFF_BOTH_IN(v3electionpb, Election, election, Proclaim, Proclaim)
  CAPSTAN_DIFF_BOTH_IN(v3electionpb, Election, election, Leader, Leader)
  CAPSTAN_DIFF_BOTH_IN(v3electionpb, Election, election, Resign, Resign)
#undef CAPSTAN_DIFF_BOTH
#undef CAPSTAN_DIFF_BOTH_MSG
#undef CAPSTAN_DIFF_BOTH_IN

  // Every later Both() call carries these auth tokens, each server its own
  // (tokens differ between servers); an empty token sends none.
  void SetTokens(std::string etcd_token, std::string capstan_token) {
    tokens_[0] = std::move(etcd_token);
    tokens_[1] = std::move(capstan_token);
  }
  // The token Both() sends to etcd (false) or capstan (true).
  const std::string& token(bool capstan) const { return tokens_[capstan ? 1 : 0]; }

  // SameAnswer for a pair from Both().
  template <typename Resp>
  ::testing::AssertionResult Same(const AnswerPair<Resp>& p) const {
    return SameAnswer(p.etcd.status, p.etcd.resp, etcd(), p.capstan.status, p.capstan.resp,
                      capstan());
  }
  template <typename Resp>
  void ExpectSame(const Answer<Resp>& etcd_answer, const Answer<Resp>& capstan_answer) const {
    EXPECT_TRUE(SameAnswer(etcd_answer.status, etcd_answer.resp, etcd(), capstan_answer.status,
                           capstan_answer.resp, capstan()));
  }

  // Puts on both servers; both must succeed. Returns the new revision.
  int64_t PutBoth(const std::string& key, const std::string& value, int64_t lease = 0);
  // Deletes [key, range_end) on both servers; both must succeed.
  void DeleteBoth(const std::string& key, const std::string& range_end = "");
  // Grants a lease with the given ID on both servers (ID 0: etcd chooses;
  // capstan then gets the ID etcd chose). Returns the ID.
  int64_t GrantBoth(int64_t ttl, int64_t id = 0);
  // Both servers' current revision; fails the test if they differ.
  int64_t Revision();

  // Restarts both servers on their data dirs and ports: stops them with
  // SIGKILL (`crash`) or SIGTERM, starts them again, and waits until the
  // fixture's channels to both are connected again (they reconnect by
  // themselves on the next call; waiting makes sure the next request finds
  // both serving). A SIGTERM that does not end a server cleanly is an error.
  absl::Status RestartBoth(bool crash);

  // etcdctl <args> against both servers (with "-w json" appended if `json`).
  EtcdctlPair Etcdctl(const std::vector<std::string>& args, const std::string& stdin_data = "",
                      bool json = true);

 private:
  template <typename Stub, typename Req, typename Resp>
  AnswerPair<Resp> BothUnary(
      const std::function<Stub*(ServerStubs&)>& pick,
      grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*), const Req& req) {
    AnswerPair<Resp> p;
    p.etcd = CallUnary(pick(etcd_stubs()), method, req, tokens_[0]);
    p.capstan = CallUnary(pick(capstan_stubs()), method, req, tokens_[1]);
    if (Verbose()) LogAnswer(req, p.etcd.status, p.etcd.resp);
    return p;
  }
  template <typename Stub, typename Req, typename Resp>
  static Answer<Resp> CallUnary(Stub* stub,
                                grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&,
                                                             Resp*),
                                const Req& req, const std::string& token = "") {
    Answer<Resp> a;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    if (!token.empty()) ctx.AddMetadata("token", token);
    a.status = (stub->*method)(&ctx, req, &a.resp);
    return a;
  }
  // CAPSTAN_DIFF_VERBOSE=1: print every request and etcd's answer.
  static bool Verbose();
  static void LogAnswer(const google::protobuf::Message& req, const grpc::Status& status,
                        const google::protobuf::Message& resp);
  EtcdctlResult RunEtcdctl(const ServerProcess& server, const std::vector<std::string>& args,
                           const std::string& stdin_data, bool json);
  void Resync(int64_t etcd_rev, int64_t capstan_rev);

  std::string prefix_;
  std::string tokens_[2];  // etcd's, capstan's (SetTokens)

  static std::unique_ptr<ServerProcess> etcd_;
  static std::unique_ptr<ServerProcess> capstan_;
  static std::unique_ptr<ServerStubs> etcd_stubs_;
  static std::unique_ptr<ServerStubs> capstan_stubs_;
  // Why the suite can't run: skip_reason_ (a missing reference) skips every
  // test, or fails it in CI (reference.h); error_ fails every test.
  static std::string skip_reason_;
  static std::string error_;
  static int sequence_;
  // A Resync() write failed: don't try again in this suite.
  static bool resync_failed_;
  static bool resynced_;  // see Resynced()
};

}  // namespace capstan::testing

// EXPECT that both answers of a Both() pair are the same.
#define EXPECT_SAME(pair) EXPECT_TRUE(Same(pair))
#define ASSERT_SAME(pair) ASSERT_TRUE(Same(pair))
// EXPECT that both etcdctl runs of an Etcdctl() pair are the same.
#define EXPECT_SAME_CTL(pair) EXPECT_TRUE(::capstan::testing::SameEtcdctl(pair))

#endif  // CAPSTAN_TESTS_DIFF_FIXTURE_H_
