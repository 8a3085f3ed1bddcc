// Permission checks of Lease and Txn requests over raw gRPC, against a real
// etcd and capstan set up alike: user "u" may read and write the prefix /a/,
// user "w" may only write the prefix /w/, root may do anything. Each request
// is sent to both servers with the same identity (u, root, none, or a bogus
// token) and must get the same gRPC code and message; where etcd 3.5 (or a
// later fix) differs from the installed 3.4, the test says so and checks
// capstan against the newer rule (docs/COMPATIBILITY.md).

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <ostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpc_reply.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "v3electionpb/v3election.grpc.pb.h"
#include "v3lockpb/v3lock.grpc.pb.h"

namespace capstan::testing {
namespace {

using etcdserverpb::RequestOp;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;

constexpr char kDenied[] = "etcdserver: permission denied";
constexpr char kBadToken[] = "etcdserver: invalid auth token";
constexpr char kNoUser[] = "etcdserver: user name is empty";
constexpr char kNoLease[] = "etcdserver: requested lease not found";

// The response headers (cluster and member ids differ) cleared, recursively.
void ClearHeaders(TxnResponse* t) {
  t->clear_header();
  for (auto& r : *t->mutable_responses()) {
    if (r.has_response_range()) r.mutable_response_range()->clear_header();
    if (r.has_response_put()) r.mutable_response_put()->clear_header();
    if (r.has_response_delete_range()) r.mutable_response_delete_range()->clear_header();
    if (r.has_response_txn()) ClearHeaders(r.mutable_response_txn());
  }
}

RequestOp PutOp(const std::string& key, const std::string& value, int64_t lease = 0,
                bool prev_kv = false) {
  RequestOp op;
  op.mutable_request_put()->set_key(key);
  op.mutable_request_put()->set_value(value);
  op.mutable_request_put()->set_lease(lease);
  op.mutable_request_put()->set_prev_kv(prev_kv);
  return op;
}

RequestOp RangeOp(const std::string& key, const std::string& range_end = "") {
  RequestOp op;
  op.mutable_request_range()->set_key(key);
  op.mutable_request_range()->set_range_end(range_end);
  return op;
}

RequestOp DeleteOp(const std::string& key) {
  RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  return op;
}

RequestOp TxnOp(const TxnRequest& t) {
  RequestOp op;
  *op.mutable_request_txn() = t;
  return op;
}

// A compare that holds whether or not key exists: version(key) > -1.
etcdserverpb::Compare Holds(const std::string& key) {
  etcdserverpb::Compare c;
  c.set_key(key);
  c.set_target(etcdserverpb::Compare::VERSION);
  c.set_result(etcdserverpb::Compare::GREATER);
  c.set_version(-1);
  return c;
}

class AuthPermTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!IsExecutable(EtcdBinary()) || !IsExecutable(EtcdctlBinary()) ||
        !IsExecutable(CapstanBinary())) {
      GTEST_SKIP() << "needs etcd, etcdctl and capstan";
    }
    ServerOptions c = ServerOptions::Capstan();
    c.extra_args = {"--bcrypt-cost=4"};
    auto es = ServerProcess::Start(ServerOptions::Etcd());
    auto cs = ServerProcess::Start(c);
    ASSERT_TRUE(es.ok()) << es.status();
    ASSERT_TRUE(cs.ok()) << cs.status();
    servers_[0] = std::move(*es);
    servers_[1] = std::move(*cs);
    for (int i = 0; i < 2; ++i) channels_[i] = servers_[i]->NewChannel();

    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"user", "add", "root", "--new-user-password=rootpw"},
             {"user", "add", "u", "--new-user-password=upw"},
             {"user", "add", "w", "--new-user-password=wpw"},
             {"role", "add", "ra"},
             {"role", "grant-permission", "ra", "readwrite", "/a/", "--prefix"},
             {"role", "add", "ww"},
             {"role", "grant-permission", "ww", "write", "/w/", "--prefix"},
             {"user", "grant-role", "u", "ra"},
             {"user", "grant-role", "w", "ww"},
             {"auth", "enable"}}) {
      for (int i = 0; i < 2; ++i) {
        std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + servers_[i]->endpoint()};
        argv.insert(argv.end(), args.begin(), args.end());
        CommandResult r = RunCommand(argv, "", std::chrono::seconds(20));
        ASSERT_TRUE(r.exit.exited && r.exit.exit_code == 0) << absl::StrJoin(args, " ") << r.err;
      }
    }
    for (int i = 0; i < 2; ++i) {
      for (const auto& [user, password] :
           std::vector<std::pair<std::string, std::string>>{{"root", "rootpw"}, {"u", "upw"},
                                                            {"w", "wpw"}}) {
        auto stub = etcdserverpb::Auth::NewStub(channels_[i]);
        grpc::ClientContext ctx;
        etcdserverpb::AuthenticateRequest req;
        req.set_name(user);
        req.set_password(password);
        etcdserverpb::AuthenticateResponse resp;
        grpc::Status st = stub->Authenticate(&ctx, req, &resp);
        ASSERT_TRUE(st.ok()) << user << ": " << st.error_message();
        tokens_[i][user] = resp.token();
      }
    }
  }

  // A call on server i (0 etcd, 1 capstan) with ctx already carrying the
  // identity.
  using Call = std::function<grpc::Status(int i, grpc::ClientContext* ctx)>;

  // Runs call on each server as who ("root", "u", "w", "" for no token,
  // "bogus" for an unknown token). Returns {etcd's reply, capstan's}.
  std::pair<Reply, Reply> Each(const std::string& who, const Call& call) {
    Reply r[2];
    for (int i = 0; i < 2; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      if (who == "bogus") {
        ctx.AddMetadata("token", "bogus.7");
      } else if (!who.empty()) {
        ctx.AddMetadata("token", tokens_[i].at(who));
      }
      r[i] = ReplyOf(call(i, &ctx));
    }
    return {r[0], r[1]};
  }

  // Each, expecting the same reply from both; returns it.
  Reply Both(const std::string& who, const std::string& what, const Call& call) {
    auto [e, c] = Each(who, call);
    EXPECT_EQ(e, c) << what << " as '" << who << "'\netcd:    " << e.ToString()
                    << "\ncapstan: " << c.ToString();
    return c;
  }

  std::unique_ptr<etcdserverpb::Lease::Stub> Lease(int i) {
    return etcdserverpb::Lease::NewStub(channels_[i]);
  }
  std::unique_ptr<etcdserverpb::KV::Stub> Kv(int i) { return etcdserverpb::KV::NewStub(channels_[i]); }

  Reply Grant(const std::string& who, int64_t id) {
    return Both(who, absl::StrCat("LeaseGrant ", id), [&](int i, grpc::ClientContext* ctx) {
      etcdserverpb::LeaseGrantRequest req;
      req.set_id(id);
      req.set_ttl(60);
      etcdserverpb::LeaseGrantResponse resp;
      grpc::Status s = Lease(i)->LeaseGrant(ctx, req, &resp);
      if (s.ok()) {
        EXPECT_EQ(resp.id(), id);
      }
      return s;
    });
  }

  Reply Put(const std::string& who, const std::string& key, int64_t lease, bool prev_kv = false) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value("v");
    req.set_lease(lease);
    req.set_prev_kv(prev_kv);
    return Put(who, absl::StrCat("Put ", key, " lease ", lease), req);
  }
  Reply Put(const std::string& who, const std::string& what, const etcdserverpb::PutRequest& req) {
    return Both(who, what, [&](int i, grpc::ClientContext* ctx) {
      etcdserverpb::PutResponse resp;
      return Kv(i)->Put(ctx, req, &resp);
    });
  }

  // LeaseTimeToLive on each server; the responses (headers cleared) in out.
  std::pair<Reply, Reply> TimeToLive(const std::string& who, int64_t id, bool keys,
                                     etcdserverpb::LeaseTimeToLiveResponse out[2]) {
    return Each(who, [&](int i, grpc::ClientContext* ctx) {
      etcdserverpb::LeaseTimeToLiveRequest req;
      req.set_id(id);
      req.set_keys(keys);
      grpc::Status s = Lease(i)->LeaseTimeToLive(ctx, req, &out[i]);
      out[i].clear_header();
      out[i].set_ttl(out[i].ttl() > 0 ? 1 : out[i].ttl());  // remaining time varies
      // etcd lists the keys in Go's map order.
      std::sort(out[i].mutable_keys()->begin(), out[i].mutable_keys()->end());
      return s;
    });
  }

  Reply Revoke(const std::string& who, int64_t id) {
    return Both(who, absl::StrCat("LeaseRevoke ", id), [&](int i, grpc::ClientContext* ctx) {
      etcdserverpb::LeaseRevokeRequest req;
      req.set_id(id);
      etcdserverpb::LeaseRevokeResponse resp;
      return Lease(i)->LeaseRevoke(ctx, req, &resp);
    });
  }

  // Sends the same txn to both servers as who; expects the same reply and,
  // on success, the same response (headers aside). Returns capstan's reply.
  Reply Txn(const std::string& who, const std::string& what, const TxnRequest& req) {
    TxnResponse resp[2];
    Reply r = Both(who, what, [&](int i, grpc::ClientContext* ctx) {
      return Kv(i)->Txn(ctx, req, &resp[i]);
    });
    ClearHeaders(&resp[0]);
    ClearHeaders(&resp[1]);
    EXPECT_EQ(resp[0].DebugString(), resp[1].DebugString()) << what;
    return r;
  }

  // The keys under prefix on server i, read as root.
  std::vector<std::string> Keys(int i, const std::string& prefix) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("token", tokens_[i].at("root"));
    etcdserverpb::RangeRequest req;
    req.set_key(prefix);
    std::string end = prefix;
    end.back()++;
    req.set_range_end(end);
    etcdserverpb::RangeResponse resp;
    grpc::Status s = Kv(i)->Range(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> keys;
    for (const auto& kv : resp.kvs()) keys.push_back(kv.key());
    return keys;
  }

  std::unique_ptr<ServerProcess> servers_[2];  // etcd, capstan
  std::shared_ptr<grpc::Channel> channels_[2];
  std::map<std::string, std::string> tokens_[2];  // user -> token, per server
};

TEST_F(AuthPermTest, LeaseOperations) {
  // LeaseGrant needs no permission, only a valid identity (etcd checks the
  // token before proposing any request).
  EXPECT_EQ(Grant("u", 101).code, grpc::OK);
  EXPECT_EQ(Grant("u", 102).code, grpc::OK);
  EXPECT_EQ(Grant("", 103).code, grpc::OK);
  Reply bad = Grant("bogus", 104);
  EXPECT_EQ(bad.code, grpc::UNAUTHENTICATED);
  EXPECT_EQ(bad.message, kBadToken);

  // Lease 101 holds only /a/x; lease 102 holds /a/y and root's /b/z.
  EXPECT_EQ(Put("u", "/a/x", 101).code, grpc::OK);
  EXPECT_EQ(Put("u", "/a/y", 102).code, grpc::OK);
  EXPECT_EQ(Put("root", "/b/z", 102).code, grpc::OK);
  EXPECT_EQ(Put("u", "/b/q", 101).message, kDenied);
  // u could not revoke 102, so it may not attach more keys to it.
  EXPECT_EQ(Put("u", "/a/w", 102).message, kDenied);
  EXPECT_EQ(Put("u", "/a/w", 999).message, kNoLease);
  EXPECT_EQ(Put("", "/a/w", 101).message, kNoUser);
  EXPECT_EQ(Put("bogus", "/a/w", 101).message, kBadToken);

  // LeaseTimeToLive without keys: no check, not even of the token.
  etcdserverpb::LeaseTimeToLiveResponse ttl[2];
  for (const std::string who : {"u", "", "bogus"}) {
    auto [e, c] = TimeToLive(who, 102, /*keys=*/false, ttl);
    EXPECT_EQ(e, c) << who;
    EXPECT_EQ(c.code, grpc::OK) << who << ": " << c.message;
    EXPECT_EQ(ttl[0].DebugString(), ttl[1].DebugString());
    EXPECT_EQ(ttl[1].grantedttl(), 60);
  }
  // With keys, read permission on each attached key.
  {
    auto [e, c] = TimeToLive("u", 101, /*keys=*/true, ttl);
    EXPECT_EQ(e, c);
    ASSERT_EQ(c.code, grpc::OK) << c.message;
    EXPECT_EQ(ttl[0].DebugString(), ttl[1].DebugString());
    ASSERT_EQ(ttl[1].keys_size(), 1);
    EXPECT_EQ(ttl[1].keys(0), "/a/x");
  }
  // etcd 3.4 lists every key of any lease; etcd 3.5.13+ (and capstan) refuse
  // unless the caller may read them all, and want a valid identity.
  for (const auto& [who, want] : std::vector<std::pair<std::string, std::string>>{
           {"u", kDenied}, {"", kNoUser}, {"bogus", kBadToken}}) {
    auto [e, c] = TimeToLive(who, 102, /*keys=*/true, ttl);
    EXPECT_EQ(e.code, grpc::OK) << "etcd 3.4 answers " << e.ToString();
    EXPECT_EQ(c.message, want) << who;
  }
  {
    auto [e, c] = TimeToLive("root", 102, /*keys=*/true, ttl);
    EXPECT_EQ(e, c);
    EXPECT_EQ(ttl[0].DebugString(), ttl[1].DebugString());
    EXPECT_EQ(ttl[1].keys_size(), 2);
  }
  {
    // An unknown lease: TTL -1, whoever asks.
    auto [e, c] = TimeToLive("u", 999, /*keys=*/true, ttl);
    EXPECT_EQ(e, c);
    EXPECT_EQ(ttl[0].DebugString(), ttl[1].DebugString());
    EXPECT_EQ(ttl[1].ttl(), -1);
  }

  // LeaseLeases: no check at all.
  for (const std::string who : {"u", "", "bogus"}) {
    etcdserverpb::LeaseLeasesResponse leases[2];
    Reply r = Both(who, "LeaseLeases", [&](int i, grpc::ClientContext* ctx) {
      return Lease(i)->LeaseLeases(ctx, etcdserverpb::LeaseLeasesRequest(), &leases[i]);
    });
    EXPECT_EQ(r.code, grpc::OK) << who;
    std::vector<int64_t> ids[2];
    for (int i = 0; i < 2; ++i) {
      for (const auto& l : leases[i].leases()) ids[i].push_back(l.id());
      std::sort(ids[i].begin(), ids[i].end());
    }
    EXPECT_EQ(ids[0], ids[1]) << who;
    EXPECT_EQ(ids[1], (std::vector<int64_t>{101, 102, 103})) << who;
  }

  // Keep-alives are not checked either.
  for (const std::string who : {"u", "", "bogus"}) {
    Reply r = Both(who, "LeaseKeepAlive", [&](int i, grpc::ClientContext* ctx) {
      auto stream = Lease(i)->LeaseKeepAlive(ctx);
      etcdserverpb::LeaseKeepAliveRequest req;
      req.set_id(102);
      etcdserverpb::LeaseKeepAliveResponse resp;
      EXPECT_TRUE(stream->Write(req));
      EXPECT_TRUE(stream->Read(&resp)) << who;
      EXPECT_EQ(resp.id(), 102);
      EXPECT_EQ(resp.ttl(), 60);
      stream->WritesDone();
      while (stream->Read(&resp)) {
      }
      return stream->Finish();
    });
    EXPECT_EQ(r.code, grpc::OK) << who << ": " << r.message;
  }

  // LeaseRevoke: write permission on every attached key.
  EXPECT_EQ(Revoke("u", 102).message, kDenied);
  EXPECT_EQ(Revoke("", 102).message, kNoUser);
  EXPECT_EQ(Revoke("bogus", 103).message, kBadToken);
  EXPECT_EQ(Revoke("u", 999).message, kNoLease);
  EXPECT_EQ(Revoke("", 103).code, grpc::OK);  // no keys: nothing to check
  EXPECT_EQ(Revoke("u", 101).code, grpc::OK);
  EXPECT_EQ(Revoke("root", 102).code, grpc::OK);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(Keys(i, "/a/").empty()) << i;
    EXPECT_TRUE(Keys(i, "/b/").empty()) << i;
  }
}

TEST_F(AuthPermTest, TxnChecksEveryCompareAndBothBranches) {
  ASSERT_EQ(Put("u", "/a/k", 0).code, grpc::OK);
  ASSERT_EQ(Put("root", "/b/k", 0).code, grpc::OK);

  TxnRequest allowed;
  *allowed.add_compare() = Holds("/a/k");
  *allowed.add_success() = PutOp("/a/k", "2");
  *allowed.add_success() = RangeOp("/a/", "/a0");
  *allowed.add_failure() = DeleteOp("/a/z");
  EXPECT_EQ(Txn("u", "allowed", allowed).code, grpc::OK);

  TxnRequest put_forbidden = allowed;
  *put_forbidden.add_success() = PutOp("/b/x", "1");
  EXPECT_EQ(Txn("u", "success puts /b/x", put_forbidden).message, kDenied);

  TxnRequest compare_forbidden = allowed;
  *compare_forbidden.add_compare() = Holds("/b/k");
  EXPECT_EQ(Txn("u", "compare reads /b/k", compare_forbidden).message, kDenied);

  // The failure branch is not taken, and is checked all the same.
  TxnRequest failure_put = allowed;
  *failure_put.add_failure() = PutOp("/b/x", "1");
  EXPECT_EQ(Txn("u", "failure puts /b/x", failure_put).message, kDenied);
  TxnRequest failure_read = allowed;
  *failure_read.add_failure() = RangeOp("/b/", "/b0");
  EXPECT_EQ(Txn("u", "failure reads /b/", failure_read).message, kDenied);
  TxnRequest range_past_grant = allowed;
  *range_past_grant.add_success() = RangeOp("/a/", "/b");
  EXPECT_EQ(Txn("u", "success reads past /a/", range_past_grant).message, kDenied);

  // Nested txns: permitted ones run.
  TxnRequest inner;
  *inner.add_success() = PutOp("/a/nested", "1");
  TxnRequest outer;
  *outer.add_compare() = Holds("/a/k");
  *outer.add_success() = TxnOp(inner);
  EXPECT_EQ(Txn("u", "nested allowed", outer).code, grpc::OK);

  // No identity, or a bad one.
  EXPECT_EQ(Txn("", "no token", allowed).message, kNoUser);
  EXPECT_EQ(Txn("bogus", "bogus token", allowed).message, kBadToken);
  EXPECT_EQ(Txn("root", "root", put_forbidden).code, grpc::OK);

  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Keys(i, "/b/"), (std::vector<std::string>{"/b/k", "/b/x"})) << i;
  }
}

// etcd 3.4.23 checks only the top level of a txn and only the write of a
// put inside one; later etcd releases (and capstan) check nested txns and a
// put's prev_kv and lease as for a plain Put.
TEST_F(AuthPermTest, TxnChecksNestedOpsAndPutPrevKvAndLease) {
  ASSERT_EQ(Put("root", "/w/k", 0).code, grpc::OK);
  // A forbidden put two levels down, in the branch that runs.
  TxnRequest deep;
  *deep.add_success() = PutOp("/b/deep", "1");
  TxnRequest middle;
  *middle.add_success() = TxnOp(deep);
  TxnRequest outer;
  *outer.add_compare() = Holds("/a/k");
  *outer.add_success() = TxnOp(middle);
  {
    auto [e, c] = Each("u", [&](int i, grpc::ClientContext* ctx) {
      TxnResponse resp;
      return Kv(i)->Txn(ctx, outer, &resp);
    });
    EXPECT_EQ(c.message, kDenied);
    if (e.code == grpc::OK) {
      // etcd 3.4.23 let it through and wrote the key.
      EXPECT_EQ(Keys(0, "/b/"), std::vector<std::string>{"/b/deep"});
    } else {
      EXPECT_EQ(e, c);
    }
    EXPECT_TRUE(Keys(1, "/b/").empty());
  }
  // A forbidden read nested in the failure branch.
  TxnRequest read;
  *read.add_success() = RangeOp("/b/", "/b0");
  TxnRequest failure_nested;
  *failure_nested.add_compare() = Holds("/a/k");
  *failure_nested.add_failure() = TxnOp(read);
  {
    auto [e, c] = Each("u", [&](int i, grpc::ClientContext* ctx) {
      TxnResponse resp;
      return Kv(i)->Txn(ctx, failure_nested, &resp);
    });
    EXPECT_EQ(c.message, kDenied) << "etcd: " << e.ToString();
  }

  // w may write /w/ but not read it: prev_kv would reveal the old value.
  EXPECT_EQ(Put("w", "/w/k", 0).code, grpc::OK);
  EXPECT_EQ(Put("w", "/w/k", 0, /*prev_kv=*/true).message, kDenied);
  TxnRequest prev;
  *prev.add_success() = PutOp("/w/k", "2", 0, /*prev_kv=*/true);
  {
    auto [e, c] = Each("w", [&](int i, grpc::ClientContext* ctx) {
      TxnResponse resp;
      grpc::Status s = Kv(i)->Txn(ctx, prev, &resp);
      if (s.ok() && i == 0) {
        // What etcd 3.4.23 hands out.
        EXPECT_EQ(resp.responses(0).response_put().prev_kv().value(), "v");
      }
      return s;
    });
    EXPECT_EQ(c.message, kDenied) << "etcd: " << e.ToString();
  }
  TxnRequest plain;
  *plain.add_success() = PutOp("/w/k", "3");
  EXPECT_EQ(Txn("w", "txn put without prev_kv", plain).code, grpc::OK);

  // A lease holding a key u can't write can't get more keys from u, in a
  // txn as in a Put.
  ASSERT_EQ(Grant("root", 201).code, grpc::OK);
  ASSERT_EQ(Put("root", "/b/held", 201).code, grpc::OK);
  EXPECT_EQ(Put("u", "/a/l", 201).message, kDenied);
  TxnRequest attach;
  *attach.add_success() = PutOp("/a/l", "1", 201);
  {
    auto [e, c] = Each("u", [&](int i, grpc::ClientContext* ctx) {
      TxnResponse resp;
      return Kv(i)->Txn(ctx, attach, &resp);
    });
    EXPECT_EQ(c.message, kDenied) << "etcd: " << e.ToString();
  }
  TxnRequest no_lease;
  *no_lease.add_success() = PutOp("/a/l", "1", 999);
  EXPECT_EQ(Txn("u", "txn put with an unknown lease", no_lease).message, kNoLease);
}

// etcd keeps a role's permissions sorted by key with Go's sort.Sort, which
// is not stable: past 12 permissions, those on one key (a point and ranges
// from it) come out in the order its pattern-defeating quicksort leaves.
TEST_F(AuthPermTest, RoleGetListsPermissionsInEtcdsOrder) {
  auto auth = [&](int i) { return etcdserverpb::Auth::NewStub(channels_[i]); };
  ASSERT_EQ(Both("root", "RoleAdd many", [&](int i, grpc::ClientContext* ctx) {
              etcdserverpb::AuthRoleAddRequest req;
              req.set_name("many");
              etcdserverpb::AuthRoleAddResponse resp;
              return auth(i)->RoleAdd(ctx, req, &resp);
            }).code,
            grpc::OK);
  // 30 grants over 8 keys, each key as a point, up to "\0" and as a prefix,
  // in an order that is neither sorted nor reversed.
  const std::vector<std::string> keys = {"/p/d", "/p/a", "/p/g", "/p/b", "/p/h", "/p/c", "/p/f", "/p/e"};
  const std::vector<std::string> ends = {"", std::string(1, '\0'), "prefix"};
  for (int n = 0; n < 30; ++n) {
    const std::string& key = keys[(n * 5) % keys.size()];
    std::string end = ends[(n * 7 / 3) % ends.size()];
    if (end == "prefix") end = key + "0";
    Reply r = Both("root", absl::StrCat("RoleGrantPermission ", n), [&](int i, grpc::ClientContext* ctx) {
      etcdserverpb::AuthRoleGrantPermissionRequest req;
      req.set_name("many");
      req.mutable_perm()->set_key(key);
      req.mutable_perm()->set_range_end(end);
      req.mutable_perm()->set_permtype(static_cast<authpb::Permission::Type>(n % 3));
      etcdserverpb::AuthRoleGrantPermissionResponse resp;
      return auth(i)->RoleGrantPermission(ctx, req, &resp);
    });
    ASSERT_EQ(r.code, grpc::OK) << r.message;
  }
  etcdserverpb::AuthRoleGetResponse got[2];
  Both("root", "RoleGet many", [&](int i, grpc::ClientContext* ctx) {
    etcdserverpb::AuthRoleGetRequest req;
    req.set_role("many");
    return auth(i)->RoleGet(ctx, req, &got[i]);
  });
  got[0].clear_header();
  got[1].clear_header();
  EXPECT_GT(got[1].perm_size(), 12);
  EXPECT_EQ(got[0].DebugString(), got[1].DebugString());
}

// A watch etcd refuses is created and canceled at once, with watch id -1
// whatever id was asked for, and a reason naming its own error for no user
// or a bad token, "permission denied" for the rest.
TEST_F(AuthPermTest, RefusedWatchesAsEtcd) {
  struct Case {
    std::string who, key, end;
    int64_t watch_id;
    std::string reason;  // empty: the watch is created
  };
  const std::string denied = "rpc error: code = PermissionDenied desc = etcdserver: permission denied";
  for (const Case& c : std::vector<Case>{
           {"u", "/b/", "/b0", 0, denied},
           {"u", "/b/", "/b0", 7, denied},
           {"w", "/w/", "/w0", 0, denied},  // w may write /w/, not read it
           {"", "/a/", "/a0", 0,
            "rpc error: code = InvalidArgument desc = etcdserver: user name is empty"},
           {"bogus", "/a/", "/a0", 3,
            "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"},
           {"u", "/a/", "/a0", 5, ""}}) {
    SCOPED_TRACE(c.who + " " + c.key + " id " + std::to_string(c.watch_id));
    etcdserverpb::WatchResponse got[2];
    Each(c.who, [&](int i, grpc::ClientContext* ctx) {
      auto stub = etcdserverpb::Watch::NewStub(channels_[i]);
      auto stream = stub->Watch(ctx);
      etcdserverpb::WatchRequest req;
      req.mutable_create_request()->set_key(c.key);
      req.mutable_create_request()->set_range_end(c.end);
      req.mutable_create_request()->set_watch_id(c.watch_id);
      EXPECT_TRUE(stream->Write(req) && stream->Read(&got[i])) << i;
      ctx->TryCancel();
      got[i].clear_header();
      return grpc::Status::OK;
    });
    EXPECT_EQ(got[0].DebugString(), got[1].DebugString());
    EXPECT_TRUE(got[1].created());
    EXPECT_EQ(got[1].canceled(), !c.reason.empty());
    EXPECT_EQ(got[1].cancel_reason(), c.reason);
    EXPECT_EQ(got[1].watch_id(), c.reason.empty() ? c.watch_id : -1);
  }
}

// A watch from a key on needs read permission on every key from there, as
// a Range from that key does. etcd checks only the key itself (its watch
// server turns "\0" into an empty range end first): Capstan does not copy
// that (docs/COMPATIBILITY.md).
TEST_F(AuthPermTest, WatchFromKeyNeedsEveryKeyFromThere) {
  etcdserverpb::WatchResponse got[2];
  Each("u", [&](int i, grpc::ClientContext* ctx) {
    auto stream = etcdserverpb::Watch::NewStub(channels_[i])->Watch(ctx);
    etcdserverpb::WatchRequest req;
    req.mutable_create_request()->set_key("/a/x");
    req.mutable_create_request()->set_range_end(std::string(1, '\0'));
    EXPECT_TRUE(stream->Write(req) && stream->Read(&got[i])) << i;
    ctx->TryCancel();
    return grpc::Status::OK;
  });
  EXPECT_FALSE(got[0].canceled()) << "etcd 3.4 lets u watch /b/ and beyond";
  EXPECT_TRUE(got[1].created());
  EXPECT_TRUE(got[1].canceled());
  EXPECT_EQ(got[1].cancel_reason(),
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied");
  // The Range over the same keys is refused by both.
  Reply range = Both("u", "Range from /a/x on", [&](int i, grpc::ClientContext* ctx) {
    etcdserverpb::RangeRequest req;
    req.set_key("/a/x");
    req.set_range_end(std::string(1, '\0'));
    etcdserverpb::RangeResponse resp;
    return Kv(i)->Range(ctx, req, &resp);
  });
  EXPECT_EQ(range.message, kDenied);
}

// Permissions are checked when a watcher is created, not on each event: a
// watcher whose user loses the permission afterwards still gets the events,
// in etcd as in Capstan.
TEST_F(AuthPermTest, WatcherKeepsItsEventsAfterThePermissionGoes) {
  std::unique_ptr<grpc::ClientContext> ctx[2];
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>
      stream[2];
  for (int i = 0; i < 2; ++i) {
    ctx[i] = std::make_unique<grpc::ClientContext>();
    ctx[i]->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx[i]->AddMetadata("token", tokens_[i].at("u"));
    stream[i] = etcdserverpb::Watch::NewStub(channels_[i])->Watch(ctx[i].get());
    etcdserverpb::WatchRequest req;
    req.mutable_create_request()->set_key("/a/");
    req.mutable_create_request()->set_range_end("/a0");
    etcdserverpb::WatchResponse created;
    ASSERT_TRUE(stream[i]->Write(req) && stream[i]->Read(&created)) << i;
    ASSERT_TRUE(created.created() && !created.canceled()) << i;
  }
  Reply revoke = Both("root", "UserRevokeRole u ra", [&](int i, grpc::ClientContext* c) {
    etcdserverpb::AuthUserRevokeRoleRequest req;
    req.set_name("u");
    req.set_role("ra");
    etcdserverpb::AuthUserRevokeRoleResponse resp;
    return etcdserverpb::Auth::NewStub(channels_[i])->UserRevokeRole(c, req, &resp);
  });
  ASSERT_EQ(revoke.code, grpc::OK) << revoke.message;
  EXPECT_EQ(Put("u", "/a/k", 0).message, kDenied);  // u's requests are refused now
  ASSERT_EQ(Put("root", "/a/k", 0).code, grpc::OK);
  for (int i = 0; i < 2; ++i) {
    etcdserverpb::WatchResponse event;
    ASSERT_TRUE(stream[i]->Read(&event)) << i;
    ASSERT_EQ(event.events_size(), 1) << i;
    EXPECT_EQ(event.events(0).kv().key(), "/a/k") << i;
    ctx[i]->TryCancel();
  }
}

// etcd's gRPC layer checks a request's shape before the server looks at its
// token or permissions: a malformed request gets its own error, whoever sends
// it.
TEST_F(AuthPermTest, MalformedRequestsGetTheirOwnErrorBeforeAuthErrors) {
  TxnRequest twice;  // /b/ is not u's, and no one may put a key twice
  *twice.add_success() = PutOp("/b/x", "1");
  *twice.add_success() = PutOp("/b/x", "2");
  TxnRequest empty_compare;
  *empty_compare.add_compare() = Holds("");
  *empty_compare.add_success() = PutOp("/b/x", "1");
  etcdserverpb::PutRequest no_key;
  no_key.set_value("v");
  etcdserverpb::PutRequest value_and_ignore;
  value_and_ignore.set_key("/b/x");
  value_and_ignore.set_value("v");
  value_and_ignore.set_ignore_value(true);
  for (const std::string who : {"u", "w", "", "bogus"}) {
    EXPECT_EQ(Txn(who, "a key put twice", twice).message,
              "etcdserver: duplicate key given in txn request")
        << who;
    EXPECT_EQ(Txn(who, "a compare without a key", empty_compare).message,
              "etcdserver: key is not provided")
        << who;
    EXPECT_EQ(Put(who, "Put without a key", no_key).message, "etcdserver: key is not provided")
        << who;
    EXPECT_EQ(Put(who, "Put with ignore_value and a value", value_and_ignore).message,
              "etcdserver: value is provided")
        << who;
    Reply del = Both(who, "DeleteRange without a key", [&](int i, grpc::ClientContext* ctx) {
      etcdserverpb::DeleteRangeRequest req;
      etcdserverpb::DeleteRangeResponse resp;
      return Kv(i)->DeleteRange(ctx, req, &resp);
    });
    EXPECT_EQ(del.message, "etcdserver: key is not provided") << who;
    Reply range = Both(who, "Range without a key", [&](int i, grpc::ClientContext* ctx) {
      etcdserverpb::RangeRequest req;
      req.set_range_end("/b0");
      etcdserverpb::RangeResponse resp;
      return Kv(i)->Range(ctx, req, &resp);
    });
    EXPECT_EQ(range.message, "etcdserver: key is not provided") << who;
  }
}

// The Lock and Election services run their steps as the caller: each step
// needs the caller's permission on the keys it reads or writes, and a
// refusal reaches the client as code Unknown with the auth error's text.
TEST_F(AuthPermTest, LockAndElectionStepsAsTheCaller) {
  ASSERT_EQ(Grant("root", 0x100).code, grpc::OK);
  auto lock = [&](const std::string& who, const std::string& name, int64_t lease) {
    v3lockpb::LockResponse resp[2];
    Reply r = Both(who, absl::StrCat("Lock ", name, " lease ", lease),
                   [&](int i, grpc::ClientContext* ctx) {
                     v3lockpb::LockRequest req;
                     req.set_name(name);
                     req.set_lease(lease);
                     return v3lockpb::Lock::NewStub(channels_[i])->Lock(ctx, req, &resp[i]);
                   });
    if (lease != 0) {
      EXPECT_EQ(resp[0].key(), resp[1].key());
    }
    return r;
  };
  EXPECT_EQ(lock("u", "/a/l", 0x100).code, grpc::OK);
  EXPECT_EQ(lock("u", "/a/l", 0x100).code, grpc::OK);  // held already
  EXPECT_EQ(lock("u", "/a/fresh", 0).code, grpc::OK);  // a session lease for u
  EXPECT_EQ(lock("u", "/b/l", 0x100).message, kDenied);
  EXPECT_EQ(lock("w", "/w/l", 0x100).message, kDenied);  // w may not read /w/
  EXPECT_EQ(lock("", "/a/l2", 0x100).message, kNoUser);
  EXPECT_EQ(lock("bogus", "/a/l2", 0x100).message, kBadToken);
  EXPECT_EQ(lock("bogus", "/a/l2", 0).message, kBadToken);
  EXPECT_EQ(Keys(0, "/a/l/"), Keys(1, "/a/l/"));

  auto unlock = [&](const std::string& who, const std::string& key) {
    return Both(who, "Unlock " + key, [&](int i, grpc::ClientContext* ctx) {
      v3lockpb::UnlockRequest req;
      req.set_key(key);
      v3lockpb::UnlockResponse resp;
      return v3lockpb::Lock::NewStub(channels_[i])->Unlock(ctx, req, &resp);
    });
  };
  EXPECT_EQ(unlock("w", "/a/l/100").message, kDenied);
  EXPECT_EQ(unlock("u", "/a/l/100").code, grpc::OK);
  EXPECT_TRUE(Keys(1, "/a/l/").empty());

  auto election = [&](int i) { return v3electionpb::Election::NewStub(channels_[i]); };
  v3electionpb::LeaderKey leader[2];
  Reply campaign = Both("u", "Campaign /a/e", [&](int i, grpc::ClientContext* ctx) {
    v3electionpb::CampaignRequest req;
    req.set_name("/a/e");
    req.set_lease(0x100);
    req.set_value("u");
    v3electionpb::CampaignResponse resp;
    grpc::Status s = election(i)->Campaign(ctx, req, &resp);
    leader[i] = resp.leader();
    return s;
  });
  ASSERT_EQ(campaign.code, grpc::OK);
  EXPECT_EQ(leader[0].DebugString(), leader[1].DebugString());
  for (const std::string who : {"u", "w", "", "bogus"}) {
    Both(who, "Leader /a/e", [&](int i, grpc::ClientContext* ctx) {
      v3electionpb::LeaderRequest req;
      req.set_name("/a/e");
      v3electionpb::LeaderResponse resp;
      return election(i)->Leader(ctx, req, &resp);
    });
    Both(who, "Proclaim /a/e", [&](int i, grpc::ClientContext* ctx) {
      v3electionpb::ProclaimRequest req;
      *req.mutable_leader() = leader[i];
      req.set_value(who);
      v3electionpb::ProclaimResponse resp;
      return election(i)->Proclaim(ctx, req, &resp);
    });
  }
  // An observer that may not read the election ends at once, with OK and
  // nothing sent, as in etcd.
  for (const std::string who : {"w", ""}) {
    auto [e, c] = Each(who, [&](int i, grpc::ClientContext* ctx) {
      v3electionpb::LeaderRequest req;
      req.set_name("/a/e");
      auto reader = election(i)->Observe(ctx, req);
      v3electionpb::LeaderResponse resp;
      EXPECT_FALSE(reader->Read(&resp)) << who << " on " << i;
      return reader->Finish();
    });
    EXPECT_EQ(e, c) << who;
    EXPECT_EQ(c.code, grpc::OK) << who;
  }
  EXPECT_EQ(Both("u", "Resign /a/e", [&](int i, grpc::ClientContext* ctx) {
              v3electionpb::ResignRequest req;
              *req.mutable_leader() = leader[i];
              v3electionpb::ResignResponse resp;
              return election(i)->Resign(ctx, req, &resp);
            }).code,
            grpc::OK);
  EXPECT_TRUE(Keys(1, "/a/e/").empty());
}

// A waiter that gives up deletes its key as the caller. etcd's lock server
// deletes it with its own client's context, which carries no token, so with
// auth on the delete is refused and the key stays until its lease ends:
// Capstan does not copy that (docs/COMPATIBILITY.md).
TEST_F(AuthPermTest, CancelledLockWaiterRemovesItsKeyWithAuthOn) {
  ASSERT_EQ(Grant("root", 0x200).code, grpc::OK);
  ASSERT_EQ(Grant("root", 0x201).code, grpc::OK);
  std::unique_ptr<grpc::ClientContext> waiting[2];
  std::thread threads[2];
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("token", tokens_[i].at("u"));
    v3lockpb::LockRequest req;
    req.set_name("/a/c");
    req.set_lease(0x200);
    v3lockpb::LockResponse resp;
    ASSERT_TRUE(v3lockpb::Lock::NewStub(channels_[i])->Lock(&ctx, req, &resp).ok()) << i;
    waiting[i] = std::make_unique<grpc::ClientContext>();
    waiting[i]->AddMetadata("token", tokens_[i].at("u"));
    threads[i] = std::thread([this, i, ctx = waiting[i].get()] {
      v3lockpb::LockRequest req;
      req.set_name("/a/c");
      req.set_lease(0x201);
      v3lockpb::LockResponse resp;
      v3lockpb::Lock::NewStub(channels_[i])->Lock(ctx, req, &resp);
    });
  }
  for (int n = 0; n < 500 && (Keys(0, "/a/c/").size() < 2 || Keys(1, "/a/c/").size() < 2); ++n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::vector<std::string> both = {"/a/c/200", "/a/c/201"};
  ASSERT_EQ(Keys(0, "/a/c/"), both);
  ASSERT_EQ(Keys(1, "/a/c/"), both);
  for (int i = 0; i < 2; ++i) {
    waiting[i]->TryCancel();
    threads[i].join();
  }
  for (int n = 0; n < 500 && Keys(1, "/a/c/").size() > 1; ++n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Keys(1, "/a/c/"), (std::vector<std::string>{"/a/c/200"}));
  // etcd's clean-up has failed by now (it runs as soon as the call ends).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Keys(0, "/a/c/"), both) << "etcd keeps the waiter's key";
}

// Names and passwords that are not UTF-8 (Latin-1 here): etcd takes any
// bytes in its string fields, and so does Capstan's decoder. A user and a
// role made with etcdctl, then the user logs in and writes under the
// role's prefix, and root reads both back: the same on both servers.
TEST_F(AuthPermTest, NamesThatAreNotUtf8) {
  const std::string user = "b\xe9la", password = "\xe9t\xe9", role = "r\xe9";
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"user", "add", user, "--new-user-password=" + password},
           {"role", "add", role},
           {"role", "grant-permission", role, "readwrite", "/l/", "--prefix"},
           {"user", "grant-role", user, role}}) {
    std::string out[2];
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + servers_[i]->endpoint(),
                                       "--user=root:rootpw"};
      argv.insert(argv.end(), args.begin(), args.end());
      CommandResult r = RunCommand(argv, "", std::chrono::seconds(20));
      EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 0)
          << i << ": " << absl::StrJoin(args, " ") << r.out << r.err;
      out[i] = r.out;
    }
    EXPECT_EQ(out[1], out[0]) << absl::StrJoin(args, " ");
  }
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    etcdserverpb::AuthenticateRequest req;
    req.set_name(user);
    req.set_password(password);
    etcdserverpb::AuthenticateResponse resp;
    grpc::Status st = etcdserverpb::Auth::NewStub(channels_[i])->Authenticate(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << i << ": " << st.error_message();
    tokens_[i][user] = resp.token();
  }
  EXPECT_EQ(Put(user, "/l/x", 0), (Reply{0, ""}));
  EXPECT_EQ(Put(user, "/a/x", 0), (Reply{grpc::PERMISSION_DENIED, kDenied}));
  // Read raw: C++ protobuf would refuse the responses' strings too.
  std::string answers[2];
  for (int i = 0; i < 2; ++i) {
    auto as_root = [&](const std::string& method, const google::protobuf::Message& req) {
      grpc::GenericStub stub(channels_[i]);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      ctx.AddMetadata("token", tokens_[i].at("root"));
      grpc::Slice slice(req.SerializeAsString());
      grpc::ByteBuffer request(&slice, 1), response;
      grpc::CompletionQueue cq;
      auto call = stub.PrepareUnaryCall(&ctx, "/etcdserverpb.Auth/" + method, request, &cq);
      call->StartCall();
      grpc::Status status;
      call->Finish(&response, &status, nullptr);
      void* tag;
      bool ok;
      cq.Next(&tag, &ok);
      EXPECT_TRUE(status.ok()) << i << " " << method << ": " << status.error_message();
      std::vector<grpc::Slice> slices;
      std::string bytes;
      if (status.ok() && response.Dump(&slices).ok()) {
        for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
      google::protobuf::UnknownFieldSet fields;  // no schema: no UTF-8 check
      EXPECT_TRUE(fields.ParseFromString(bytes));
      fields.DeleteByNumber(1);  // the header
      std::string rest;
      fields.SerializeToString(&rest);
      return absl::CHexEscape(rest);
    };
    etcdserverpb::AuthUserGetRequest get;
    get.set_name(user);
    etcdserverpb::AuthRoleGetRequest role_get;
    role_get.set_role(role);
    answers[i] = absl::StrCat(as_root("UserGet", get), " | ", as_root("RoleGet", role_get), " | ",
                              as_root("UserList", etcdserverpb::AuthUserListRequest()));
  }
  EXPECT_EQ(answers[1], answers[0]);
  EXPECT_NE(answers[1].find("r\\xe9"), std::string::npos) << answers[1];
}

}  // namespace
}  // namespace capstan::testing
