// Permission checks of Lease and Txn requests over raw gRPC, against a real
// etcd and capstan set up alike: user "u" may read and write the prefix /a/,
// user "w" may only write the prefix /w/, root may do anything. Each request
// is sent to both servers with the same identity (u, root, none, or a bogus
// token) and must get the same gRPC code and message.
//
// Here: Lease and Txn requests, and malformed requests. The fixture is in
// auth_perm.h; watches in auth_perm_watch_test.cc, Lock and Election in
// auth_perm_lock_test.cc, roles and names in auth_perm_roles_test.cc.

#include <string>
#include <vector>

#include "auth_perm.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"

namespace capstan::testing::auth_perm {
namespace {

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
  // etcd 3.5.13+ refuses to list a lease's keys unless the caller may read
  // them all, and wants a valid identity (3.4 listed every key of any lease).
  for (const auto& [who, want] : std::vector<std::pair<std::string, std::string>>{
           {"u", kDenied}, {"", kNoUser}, {"bogus", kBadToken}}) {
    auto [e, c] = TimeToLive(who, 102, /*keys=*/true, ttl);
    EXPECT_EQ(e, c) << who;
    EXPECT_EQ(e.message, want) << who;
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

// Capstan checks nested txns and a put's prev_kv and lease as for a plain
// Put, as etcd does since its April 2026 fixes (etcd-io/etcd#21677, #21689).
// The reference etcd 3.5.16 predates them: it checks only the top level of a
// txn and only the write of a put inside one, and is not compared here.
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
      // etcd 3.5.16 let it through and wrote the key.
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
    EXPECT_EQ(c.message, kDenied) << "etcd 3.5.16: " << e.ToString();
  }

  // w may write /w/ but not read it: prev_kv would reveal the old value.
  EXPECT_EQ(Put("w", "/w/k", 0).code, grpc::OK);
  EXPECT_EQ(Put("w", "/w/k", 0, /*prev_kv=*/true).message, kDenied);
  TxnRequest prev;
  *prev.add_success() = PutOp("/w/k", "2", 0, /*prev_kv=*/true);
  {
    auto [e, c] = Each("w", [&](int i, grpc::ClientContext* ctx) {
      TxnResponse resp;
      return Kv(i)->Txn(ctx, prev, &resp);
    });
    EXPECT_EQ(c.message, kDenied) << "etcd 3.5.16: " << e.ToString();
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
    EXPECT_EQ(c.message, kDenied) << "etcd 3.5.16: " << e.ToString();
  }
  TxnRequest no_lease;
  *no_lease.add_success() = PutOp("/a/l", "1", 999);
  EXPECT_EQ(Txn("u", "txn put with an unknown lease", no_lease).message, kNoLease);
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

}  // namespace
}  // namespace capstan::testing::auth_perm
