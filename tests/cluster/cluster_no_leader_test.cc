// A member that has lost its quorum, as its clients and probes see it,
// against etcd 3.5 (the same test, the same expectations):
//
//   - a watch or a keep-alive stream that asks for a leader
//     (clientv3.WithRequireLeader, as etcdctl's and the kube-apiserver's
//     watches and clientv3's keep-alives do) is ended with "etcdserver: no
//     leader" once the member has had none for a while, and a new one is
//     refused at once, so that clients move to a member that has one;
//   - /health answers 503 {"health":"false","reason":"RAFT NO LEADER"}
//     (200 with ?serializable=true); /readyz fails its linearizable read;
//   - Status lists "etcdserver: no leader" among its errors (etcdctl
//     endpoint status's ERRORS column);
//   - a member addition is refused at once ("etcdserver: unhealthy
//     cluster"), not left to time out;
//   - a write, and an auth read (which etcd proposes as it does writes),
//     end at the request timeout with the context's error.
//
//   build/<dir>/tests/cluster/cluster_no_leader_test

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/cluster_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "http_client.h"
#include "reference.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

class NoLeaderTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
    ClusterOptions o =
        GetParam() == ServerFlavor::kCapstan ? ClusterOptions::Capstan(3) : ClusterOptions::Etcd(3);
    o.election_timeout_ms = 1000;
    auto started = Cluster::Start(o);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(*started);
    ASSERT_TRUE(cluster_->WaitForLeader(seconds(10)).ok());
  }

  HttpAnswer Get(int i, const std::string& path, milliseconds timeout = seconds(15)) const {
    const std::string ep = cluster_->endpoint(i);
    int port = 0;
    EXPECT_TRUE(absl::SimpleAtoi(ep.substr(ep.rfind(':') + 1), &port)) << ep;
    HttpClient http(port);
    return http.Request("GET", path, "", {}, timeout);
  }

  etcdserverpb::StatusResponse Status(int i) const {
    auto stub = etcdserverpb::Maintenance::NewStub(cluster_->NewChannel(i));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    etcdserverpb::StatusResponse resp;
    grpc::Status s = stub->Status(&ctx, etcdserverpb::StatusRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  std::unique_ptr<Cluster> cluster_;
};

using WatchStream = grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>;

// A watch of `key` on member i's stream that asks for a leader: the stream
// (nullptr when its create was not answered) and its context.
std::unique_ptr<WatchStream> OpenWatch(const Cluster& cluster, int i, grpc::ClientContext* ctx,
                                       std::unique_ptr<etcdserverpb::Watch::Stub>* stub) {
  ctx->AddMetadata("hasleader", "true");  // clientv3.WithRequireLeader
  *stub = etcdserverpb::Watch::NewStub(cluster.NewChannel(i));
  std::unique_ptr<WatchStream> stream = (*stub)->Watch(ctx);
  etcdserverpb::WatchRequest req;
  req.mutable_create_request()->set_key("k");
  if (!stream->Write(req)) return nullptr;  // refused before the create was sent
  etcdserverpb::WatchResponse resp;
  if (!stream->Read(&resp) || !resp.created()) return nullptr;
  return stream;
}

TEST_P(NoLeaderTest, AMemberWithoutQuorumEndsLeaderBoundWatchesAndFailsItsProbes) {
  const int survivor = 0;
  grpc::ClientContext watch_ctx;
  // A member that never ends the stream fails the test, not hangs it.
  watch_ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_stub;
  std::unique_ptr<WatchStream> watch = OpenWatch(*cluster_, survivor, &watch_ctx, &watch_stub);
  ASSERT_NE(watch, nullptr) << "the watch was created";
  EXPECT_EQ(Get(survivor, "/health").status, 200);

  // A keep-alive stream that asks for a leader, as clientv3's do, with one
  // renewal answered.
  auto lease_stub = etcdserverpb::Lease::NewStub(cluster_->NewChannel(survivor));
  etcdserverpb::LeaseGrantResponse granted;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    etcdserverpb::LeaseGrantRequest grant;
    grant.set_ttl(60);
    ASSERT_TRUE(lease_stub->LeaseGrant(&ctx, grant, &granted).ok());
  }
  grpc::ClientContext keep_alive_ctx;
  keep_alive_ctx.AddMetadata("hasleader", "true");
  keep_alive_ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
  auto keep_alive = lease_stub->LeaseKeepAlive(&keep_alive_ctx);
  {
    etcdserverpb::LeaseKeepAliveRequest renew;
    renew.set_id(granted.id());
    ASSERT_TRUE(keep_alive->Write(renew));
    etcdserverpb::LeaseKeepAliveResponse renewed;
    ASSERT_TRUE(keep_alive->Read(&renewed));
    EXPECT_EQ(renewed.ttl(), 60);
  }

  cluster_->Kill(1);
  cluster_->Kill(2);
  const auto killed = Clock::now();

  // The open watch ends with etcd's error: the member loses its leader
  // within an election timeout or two (check-quorum, or a follower's
  // election), and ends the streams once it has seen no leader at three
  // looks an election timeout apart: two timeouts after the first.
  etcdserverpb::WatchResponse resp;
  while (watch->Read(&resp)) {
  }
  const grpc::Status ended = watch->Finish();
  const auto took = Clock::now() - killed;
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_EQ(ended.error_message(), "etcdserver: no leader");
  EXPECT_GE(took, seconds(2)) << "ended only after three looks without a leader";
  EXPECT_LT(took, seconds(15));

  // So does the keep-alive stream, which waits for its next renewal.
  {
    etcdserverpb::LeaseKeepAliveResponse rest;
    while (keep_alive->Read(&rest)) {
    }
    const grpc::Status keep_alive_ended = keep_alive->Finish();
    EXPECT_EQ(keep_alive_ended.error_code(), grpc::StatusCode::UNAVAILABLE)
        << keep_alive_ended.error_message();
    EXPECT_EQ(keep_alive_ended.error_message(), "etcdserver: no leader");
    EXPECT_LT(Clock::now() - killed, seconds(15));
  }

  // The member knows no leader now: a new leader-bound watch is refused.
  EXPECT_EQ(Status(survivor).leader(), 0u);
  {
    grpc::ClientContext ctx;
    std::unique_ptr<etcdserverpb::Watch::Stub> stub;
    std::unique_ptr<WatchStream> refused = OpenWatch(*cluster_, survivor, &ctx, &stub);
    ASSERT_TRUE(refused == nullptr) << "a watch was created on a member without a leader";
  }

  // So is a keep-alive stream (clientv3's ask for a leader too).
  {
    bool answered = true;
    const grpc::Status refused =
        cluster_->KeepAliveOnce(survivor, 1, /*require_leader=*/true, &answered, seconds(20));
    EXPECT_FALSE(answered) << "a renewal was answered without a leader";
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_EQ(refused.error_message(), "etcdserver: no leader");
  }

  // A member addition is refused at once: the member is not connected to
  // every voter (etcd's mayAddMember, before any proposal).
  {
    auto stub = etcdserverpb::Cluster::NewStub(cluster_->NewChannel(survivor));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    etcdserverpb::MemberAddRequest req;
    req.add_peerurls("http://127.0.0.1:1");
    etcdserverpb::MemberAddResponse resp;
    const auto asked = Clock::now();
    const grpc::Status refused = stub->MemberAdd(&ctx, req, &resp);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_EQ(refused.error_message(), "etcdserver: unhealthy cluster");
    EXPECT_LT(Clock::now() - asked, seconds(2));
  }

  // A write, and an auth read (etcd proposes those too), wait for a leader
  // until the request timeout (7 s with a 1 s election timeout) and end
  // with the context's error: they were never proposed.
  {
    struct Outcome {
      grpc::Status status;
      Clock::duration took{};
    };
    auto timed = [](auto call) {
      const auto asked = Clock::now();
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + seconds(20));
      Outcome o;
      o.status = call(&ctx);
      o.took = Clock::now() - asked;
      return o;
    };
    Outcome put, auth_status, user_list;
    std::thread put_thread([&] {
      put = timed([&](grpc::ClientContext* ctx) {
        auto stub = etcdserverpb::KV::NewStub(cluster_->NewChannel(survivor));
        etcdserverpb::PutRequest req;
        req.set_key("lost");
        etcdserverpb::PutResponse resp;
        return stub->Put(ctx, req, &resp);
      });
    });
    std::thread status_thread([&] {
      auth_status = timed([&](grpc::ClientContext* ctx) {
        auto stub = etcdserverpb::Auth::NewStub(cluster_->NewChannel(survivor));
        etcdserverpb::AuthStatusResponse resp;
        return stub->AuthStatus(ctx, etcdserverpb::AuthStatusRequest(), &resp);
      });
    });
    user_list = timed([&](grpc::ClientContext* ctx) {
      auto stub = etcdserverpb::Auth::NewStub(cluster_->NewChannel(survivor));
      etcdserverpb::AuthUserListResponse resp;
      return stub->UserList(ctx, etcdserverpb::AuthUserListRequest(), &resp);
    });
    put_thread.join();
    status_thread.join();
    for (const auto& [what, o] : {std::pair<const char*, const Outcome*>{"put", &put},
                                  {"auth status", &auth_status},
                                  {"user list", &user_list}}) {
      EXPECT_EQ(o->status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
          << what << ": " << o->status.error_message();
      EXPECT_EQ(o->status.error_message(), "context deadline exceeded") << what;
      EXPECT_GE(o->took, seconds(6)) << what << ": the request timeout, not the client's deadline";
      EXPECT_LT(o->took, seconds(15)) << what;
    }
  }

  // Status's errors, as etcdctl endpoint status shows them.
  const etcdserverpb::StatusResponse status = Status(survivor);
  ASSERT_GE(status.errors_size(), 1);
  EXPECT_EQ(status.errors(0), "etcdserver: no leader");

  // /health: no leader, unless a local read is asked for.
  HttpAnswer health = Get(survivor, "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_TRUE(absl::StrContains(health.body, R"({"health":"false","reason":"RAFT NO LEADER"})"))
      << health.body;
  health = Get(survivor, "/health?serializable=true");
  EXPECT_EQ(health.status, 200) << health.body;
  EXPECT_TRUE(absl::StrContains(health.body, R"({"health":"true","reason":""})")) << health.body;
  // /readyz: the linearizable read times out (etcd's request timeout, 7 s
  // with a 1 s election timeout); the serializable one passes.
  const HttpAnswer ready = Get(survivor, "/readyz?verbose", seconds(20));
  EXPECT_EQ(ready.status, 503) << ready.body;
  EXPECT_TRUE(absl::StrContains(ready.body, "[+]serializable_read ok")) << ready.body;
  EXPECT_TRUE(
      absl::StrContains(ready.body, "[-]linearizable_read failed: etcdserver: request timed out"))
      << ready.body;
  EXPECT_EQ(Get(survivor, "/livez").status, 200);
}

INSTANTIATE_TEST_SUITE_P(Servers, NoLeaderTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

}  // namespace
}  // namespace capstan::testing::cluster
