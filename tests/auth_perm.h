// Permission checks of Lease and Txn requests over raw gRPC, against a real
// etcd and capstan set up alike: user "u" may read and write the prefix /a/,
// user "w" may only write the prefix /w/, root may do anything. Each request
// is sent to both servers with the same identity (u, root, none, or a bogus
// token) and must get the same gRPC code and message; where etcd 3.5 (or a
// later fix) differs from the installed 3.4, the test says so and checks
// capstan against the newer rule (docs/COMPATIBILITY.md).
//
// This header holds the AuthPermTest fixture (both servers, the users, the
// tokens, a request sent to both as one identity) shared by
// auth_perm_test.cc (Lease and Txn checks, malformed requests),
// auth_perm_watch_test.cc, auth_perm_lock_test.cc (Lock and Election) and
// auth_perm_roles_test.cc (roles and names). Test code only.

#ifndef CAPSTAN_TESTS_AUTH_PERM_H_
#define CAPSTAN_TESTS_AUTH_PERM_H_

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
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

namespace capstan::testing::auth_perm {

using etcdserverpb::RequestOp;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;

constexpr char kDenied[] = "etcdserver: permission denied";
constexpr char kBadToken[] = "etcdserver: invalid auth token";
constexpr char kNoUser[] = "etcdserver: user name is empty";
constexpr char kNoLease[] = "etcdserver: requested lease not found";

// The response headers (cluster and member ids differ) cleared, recursively.
inline void ClearHeaders(TxnResponse* t) {
  t->clear_header();
  for (auto& r : *t->mutable_responses()) {
    if (r.has_response_range()) r.mutable_response_range()->clear_header();
    if (r.has_response_put()) r.mutable_response_put()->clear_header();
    if (r.has_response_delete_range()) r.mutable_response_delete_range()->clear_header();
    if (r.has_response_txn()) ClearHeaders(r.mutable_response_txn());
  }
}

inline RequestOp PutOp(const std::string& key, const std::string& value, int64_t lease = 0,
                       bool prev_kv = false) {
  RequestOp op;
  op.mutable_request_put()->set_key(key);
  op.mutable_request_put()->set_value(value);
  op.mutable_request_put()->set_lease(lease);
  op.mutable_request_put()->set_prev_kv(prev_kv);
  return op;
}

inline RequestOp RangeOp(const std::string& key, const std::string& range_end = "") {
  RequestOp op;
  op.mutable_request_range()->set_key(key);
  op.mutable_request_range()->set_range_end(range_end);
  return op;
}

inline RequestOp DeleteOp(const std::string& key) {
  RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  return op;
}

inline RequestOp TxnOp(const TxnRequest& t) {
  RequestOp op;
  *op.mutable_request_txn() = t;
  return op;
}

// A compare that holds whether or not key exists: version(key) > -1.
inline etcdserverpb::Compare Holds(const std::string& key) {
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
    CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", EtcdctlBinary());
    CAPSTAN_REQUIRE_REFERENCE("capstan", CapstanBinary());
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

}  // namespace capstan::testing::auth_perm

#endif  // CAPSTAN_TESTS_AUTH_PERM_H_
