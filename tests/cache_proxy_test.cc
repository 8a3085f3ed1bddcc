// capstan cache-proxy against a real etcd: the cache is fed over etcd's
// Watch API, serves capstan.v1.Cache, lists again when etcd compacted past
// it, and watches again after etcd restarts. Every List is compared with
// etcd's own Range at the same revision.

#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capstan/v1/cache.grpc.pb.h"
#include "cmd/cache_proxy.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "watchcache/errors.h"
#include "watchcache/k8s_test_objects.h"

namespace capstan::server {
namespace {

using capstan::testing::ServerOptions;
using capstan::testing::ServerProcess;

constexpr char kPods[] = "/registry/pods/";

class CacheProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = ServerProcess::Start(ServerOptions::Etcd());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
    kv_ = etcdserverpb::KV::NewStub(etcd_->NewChannel());
  }
  void TearDown() override {
    if (proxy_) proxy_->Shutdown();
  }

  void StartProxy() {
    CacheProxyOptions o;
    o.upstream = absl::StrCat("http://", etcd_->endpoint());
    o.listen_client_urls = {"http://127.0.0.1:0"};
    o.watch_cache_prefixes = {kPods};
    o.cache.wait_timeout = absl::Seconds(5);
    o.feed.min_backoff = absl::Milliseconds(50);
    o.feed.max_backoff = absl::Milliseconds(500);
    auto p = CacheProxy::Start(o);
    ASSERT_TRUE(p.ok()) << p.status();
    proxy_ = std::move(*p);
    ASSERT_TRUE(proxy_->cache()->WaitReady(absl::Seconds(10)));
    cache_ = capstan::v1::Cache::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", proxy_->ports()[0]), grpc::InsecureChannelCredentials()));
  }

  int64_t PutPod(const std::string& name, const std::string& node) {
    watchcache::testing::PodFields p{name, "default", node, "Running", {{"app", "web"}}, 300};
    etcdserverpb::PutRequest req;
    req.set_key(absl::StrCat(kPods, "default/", name));
    req.set_value(watchcache::testing::PodProtobuf(p));
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(kv_->Put(&ctx, req, &resp).ok());
    return resp.header().revision();
  }
  int64_t DeletePod(const std::string& name) {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(absl::StrCat(kPods, "default/", name));
    etcdserverpb::DeleteRangeResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(kv_->DeleteRange(&ctx, req, &resp).ok());
    return resp.header().revision();
  }
  void Compact(int64_t rev) {
    etcdserverpb::CompactionRequest req;
    req.set_revision(rev);
    req.set_physical(true);
    etcdserverpb::CompactionResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kv_->Compact(&ctx, req, &resp).ok());
  }

  // etcd's records of the pods at rev, optionally only those on node.
  std::vector<std::string> EtcdPods(int64_t rev, const std::string& node = "") {
    etcdserverpb::RangeRequest req;
    req.set_key(kPods);
    req.set_range_end("/registry/pods0");
    req.set_revision(rev);
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = kv_->Range(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> out;
    for (const auto& kv : resp.kvs()) {
      if (!node.empty() && kv.value().find(node) == std::string::npos) continue;
      out.push_back(kv.SerializeAsString());
    }
    return out;
  }
  // A consistent List through the proxy's gRPC service.
  capstan::v1::ListResponse ProxyList(const std::string& field_selector = "") {
    capstan::v1::ListRequest req;
    req.set_prefix(kPods);
    req.set_field_selector(field_selector);
    capstan::v1::ListResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = cache_->List(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  static std::vector<std::string> Records(const capstan::v1::ListResponse& r) {
    std::vector<std::string> out;
    for (const auto& kv : r.kvs()) out.push_back(kv.SerializeAsString());
    return out;
  }

  std::unique_ptr<ServerProcess> etcd_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<CacheProxy> proxy_;
  std::unique_ptr<capstan::v1::Cache::Stub> cache_;
};

TEST_F(CacheProxyTest, EtcdWritesAppearInListAndWatch) {
  for (int i = 0; i < 30; ++i) PutPod(absl::StrCat("p", i), absl::StrCat("node-", i % 3));
  StartProxy();
  auto first = ProxyList();
  ASSERT_EQ(first.kvs_size(), 30);
  EXPECT_EQ(Records(first), EtcdPods(first.resource_version()));
  EXPECT_NE(first.header().cluster_id(), 0u);  // the upstream's identity

  // A watcher of node-1 from the listed revision, through gRPC.
  capstan::v1::WatchRequest wreq;
  wreq.set_prefix(kPods);
  wreq.set_field_selector("spec.nodeName=node-1");
  wreq.set_resource_version(absl::StrCat(first.resource_version()));
  grpc::ClientContext wctx;
  wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto watch = cache_->Watch(&wctx, wreq);

  // Random writes in etcd; every consistent List equals etcd at its revision.
  std::mt19937 rng(3);
  std::vector<std::pair<int64_t, int>> want;  // (revision, event type) for node-1
  std::map<std::string, std::string> node_of;
  for (int i = 0; i < 30; ++i) node_of[absl::StrCat("p", i)] = absl::StrCat("node-", i % 3);
  for (int op = 0; op < 120; ++op) {
    const std::string name = absl::StrCat("p", rng() % 40);
    const bool was = node_of.count(name) && node_of[name] == "node-1";
    if (rng() % 4 == 0) {
      const int64_t rev = DeletePod(name);
      if (was) want.push_back({rev, capstan::v1::Event::DELETED});
      node_of.erase(name);
    } else {
      const std::string node = absl::StrCat("node-", rng() % 3);
      const int64_t rev = PutPod(name, node);
      const bool is = node == "node-1";
      if (was && is) want.push_back({rev, capstan::v1::Event::MODIFIED});
      if (!was && is) want.push_back({rev, capstan::v1::Event::ADDED});
      if (was && !is) want.push_back({rev, capstan::v1::Event::DELETED});
      node_of[name] = node;
    }
    if (op % 20 == 19) {
      auto l = ProxyList();
      ASSERT_EQ(Records(l), EtcdPods(l.resource_version())) << "at " << l.resource_version();
      auto n1 = ProxyList("spec.nodeName=node-1");
      ASSERT_EQ(Records(n1), EtcdPods(n1.resource_version(), "node-1"));
    }
  }
  std::vector<std::pair<int64_t, int>> got;
  capstan::v1::WatchResponse resp;
  while (got.size() < want.size() && watch->Read(&resp)) {
    for (const auto& e : resp.events()) got.push_back({e.revision(), e.type()});
  }
  EXPECT_EQ(got, want);
  wctx.TryCancel();
  EXPECT_EQ(proxy_->feeds()[0]->lists(), 1u);
  EXPECT_EQ(proxy_->cache()->ResourceFor(kPods)->GetStats().feed_mismatches, 0u);
}

TEST_F(CacheProxyTest, CompactionForcesRelistAndCacheStaysCorrect) {
  for (int i = 0; i < 20; ++i) PutPod(absl::StrCat("p", i), "node-0");
  StartProxy();
  watchcache::WatchOptions wo;
  wo.prefix = kPods;
  wo.resource_version = absl::StrCat(proxy_->cache()->ResourceFor(kPods)->rev());
  auto watcher = proxy_->cache()->Watch(wo);
  ASSERT_TRUE(watcher.ok()) << watcher.status();

  // The feed is away while etcd changes and compacts past it.
  auto* feed = proxy_->feeds()[0].get();
  feed->TEST_Pause(true);
  for (int i = 0; i < 10; ++i) PutPod(absl::StrCat("p", i), "node-2");
  for (int i = 10; i < 15; ++i) DeletePod(absl::StrCat("p", i));
  const int64_t last = PutPod("new", "node-1");
  Compact(last);
  feed->TEST_Pause(false);

  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (feed->lists() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(feed->lists(), 2u) << "no re-list after compaction";
  auto l = ProxyList();
  EXPECT_GE(l.resource_version(), last);
  EXPECT_EQ(l.kvs_size(), 16);
  EXPECT_EQ(Records(l), EtcdPods(l.resource_version()));
  // Watchers of the old state must start again, as after kube-apiserver's re-list.
  std::vector<watchcache::WatchEvent> evs;
  while (!(*watcher)->done() && absl::Now() < deadline) {
    (*watcher)->Pop(&evs, 100);
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(watchcache::Is((*watcher)->status(), watchcache::CacheError::kCacheReinitialized))
      << (*watcher)->status();
  // And the cache follows etcd again afterwards.
  const int64_t after = PutPod("later", "node-1");
  auto l2 = ProxyList();
  EXPECT_GE(l2.resource_version(), after);
  EXPECT_EQ(Records(l2), EtcdPods(l2.resource_version()));
}

TEST(RemoteFeedVersionTest, AnswersProgressEarlyBefore3431And3513) {
  EXPECT_TRUE(watchcache::AnswersProgressEarly("3.4.23"));  // Debian 12's
  EXPECT_TRUE(watchcache::AnswersProgressEarly("3.4.30"));
  EXPECT_FALSE(watchcache::AnswersProgressEarly("3.4.31"));
  EXPECT_TRUE(watchcache::AnswersProgressEarly("3.5.0"));
  EXPECT_TRUE(watchcache::AnswersProgressEarly("3.5.12"));
  EXPECT_FALSE(watchcache::AnswersProgressEarly("3.5.13"));
  EXPECT_FALSE(watchcache::AnswersProgressEarly("3.6.0"));
  EXPECT_TRUE(watchcache::AnswersProgressEarly("3.3.27"));
  EXPECT_FALSE(watchcache::AnswersProgressEarly("not a version"));
}

TEST_F(CacheProxyTest, WatchesAgainAfterUpstreamRestart) {
  for (int i = 0; i < 5; ++i) PutPod(absl::StrCat("p", i), "node-0");
  StartProxy();
  auto* feed = proxy_->feeds()[0].get();
  etcd_->Stop();
  ASSERT_TRUE(etcd_->Restart().ok());
  const int64_t rev = PutPod("after-restart", "node-1");
  auto l = ProxyList();
  EXPECT_GE(l.resource_version(), rev);
  EXPECT_EQ(Records(l), EtcdPods(l.resource_version()));
  EXPECT_EQ(l.kvs_size(), 6);
  EXPECT_GE(feed->reconnects(), 1u);
  EXPECT_EQ(feed->lists(), 1u);  // resumed from its revision, no re-list
}

}  // namespace
}  // namespace capstan::server
