// Watches with auth on, against etcd: refused watches, from-key watches,
// a watcher whose permission goes (the AuthPermTest fixture: auth_perm.h).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "auth_perm.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"

namespace capstan::testing::auth_perm {
namespace {

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
  EXPECT_FALSE(got[0].canceled()) << "etcd lets u watch /b/ and beyond";
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

}  // namespace
}  // namespace capstan::testing::auth_perm
