// capstan.v1.Cache end to end: a gRPC server on loopback serving an unfed
// Cache that the test feeds directly.

#include "server/api/cache_service.h"

#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "watchcache/k8s_test_objects.h"

namespace capstan::server {
namespace {

using watchcache::FeedChange;
using watchcache::ObjectRef;

class CacheServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    watchcache::CacheOptions o;
    o.resources = {watchcache::PodResource()};
    o.wait_timeout = absl::Milliseconds(300);
    o.ring_max_capacity = 64;
    auto c = watchcache::Cache::Create(o);
    ASSERT_TRUE(c.ok());
    cache_ = std::move(*c);
    pods_ = cache_->ResourceFor("/registry/pods/");
    std::vector<ObjectRef> objs;
    for (int i = 0; i < 10; ++i) objs.push_back(Pod(5, i, absl::StrCat("node-", i % 3), 3000 * (i % 2)));
    pods_->Reset(5, std::move(objs));
    member_.cluster_id = 7;
    member_.member_id = 9;
    service_ = std::make_unique<CacheService>(cache_.get(), &member_);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_);
    stub_ = capstan::v1::Cache::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
    service_.reset();
    cache_.reset();
  }
  ObjectRef Pod(int64_t rev, int i, const std::string& node, size_t padding = 100) {
    watchcache::testing::PodFields p{absl::StrCat("p", i), "default", node, "Running", {{"app", "web"}}, padding};
    return pods_->MakeObject(watchcache::testing::KvRecord(absl::StrCat("/registry/pods/default/p", i),
                                                           watchcache::testing::PodProtobuf(p), rev));
  }
  void Put(int64_t rev, int i, const std::string& node) {
    std::vector<FeedChange> c(1);
    c[0].rev = rev;
    c[0].object = Pod(rev, i, node, 2000);
    pods_->Apply(std::move(c), rev);
  }

  membership::MemberInfo member_;
  std::unique_ptr<watchcache::Cache> cache_;
  watchcache::ResourceCache* pods_ = nullptr;
  std::unique_ptr<CacheService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<capstan::v1::Cache::Stub> stub_;
};

TEST_F(CacheServiceTest, List) {
  grpc::ClientContext ctx;
  capstan::v1::ListRequest req;
  req.set_prefix("/registry/pods/");
  req.set_field_selector("spec.nodeName=node-1");
  req.set_resource_version("0");
  capstan::v1::ListResponse resp;
  ASSERT_TRUE(stub_->List(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.kvs_size(), 3);  // p1, p4, p7
  EXPECT_EQ(resp.kvs(0).key(), "/registry/pods/default/p1");
  EXPECT_EQ(resp.kvs(1).key(), "/registry/pods/default/p4");
  EXPECT_EQ(resp.resource_version(), 5);
  EXPECT_EQ(resp.header().revision(), 5);
  EXPECT_EQ(resp.header().cluster_id(), 7u);
  // The records are the cached bytes, large (zero-copy) or small.
  EXPECT_EQ(resp.kvs(0).mod_revision(), 5);
  EXPECT_GT(resp.kvs(0).value().size(), 3000u);

  // Pagination.
  capstan::v1::ListRequest page;
  page.set_prefix("/registry/pods/");
  page.set_limit(4);
  page.set_resource_version("0");
  int total = 0;
  for (;;) {
    grpc::ClientContext c;
    capstan::v1::ListResponse r;
    ASSERT_TRUE(stub_->List(&c, page, &r).ok());
    total += r.kvs_size();
    if (r.continue_().empty()) break;
    EXPECT_TRUE(r.has_remaining_item_count());
    page.set_continue_(r.continue_());
    page.clear_resource_version();
  }
  EXPECT_EQ(total, 10);
}

TEST_F(CacheServiceTest, ListErrors) {
  auto call = [this](const std::string& prefix, const std::string& rv, capstan::v1::ResourceVersionMatch m,
                     const std::string& fields = "") {
    grpc::ClientContext ctx;
    capstan::v1::ListRequest req;
    req.set_prefix(prefix);
    req.set_resource_version(rv);
    req.set_resource_version_match(m);
    req.set_field_selector(fields);
    capstan::v1::ListResponse resp;
    return stub_->List(&ctx, req, &resp);
  };
  auto s = call("/registry/pods/", "2", capstan::v1::EXACT);
  EXPECT_EQ(s.error_code(), grpc::OUT_OF_RANGE);
  EXPECT_EQ(s.error_message(), "too old resource version: 2 (5)");
  s = call("/registry/pods/", "50", capstan::v1::NOT_OLDER_THAN);
  EXPECT_EQ(s.error_code(), grpc::DEADLINE_EXCEEDED);
  EXPECT_EQ(s.error_message(), "Too large resource version: 50, current: 5");
  EXPECT_EQ(call("/registry/secrets/", "0", capstan::v1::RESOURCE_VERSION_MATCH_UNSET).error_code(),
            grpc::NOT_FOUND);
  EXPECT_EQ(call("/registry/pods/", "0", capstan::v1::RESOURCE_VERSION_MATCH_UNSET, "spec.x=1").error_code(),
            grpc::INVALID_ARGUMENT);
}

TEST_F(CacheServiceTest, WatchWithInitialEventsAndTransitions) {
  grpc::ClientContext ctx;
  capstan::v1::WatchRequest req;
  req.set_prefix("/registry/pods/");
  req.set_field_selector("spec.nodeName=node-2");
  req.set_send_initial_events(true);
  req.set_allow_bookmarks(true);
  req.set_prev_kv(true);
  auto reader = stub_->Watch(&ctx, req);
  std::vector<capstan::v1::Event> evs;
  capstan::v1::WatchResponse resp;
  while (evs.size() < 4 && reader->Read(&resp)) {
    for (const auto& e : resp.events()) evs.push_back(e);
  }
  ASSERT_EQ(evs.size(), 4u);  // p2, p5, p8 and the end of the initial events
  EXPECT_EQ(evs[0].kv().key(), "/registry/pods/default/p2");
  EXPECT_EQ(evs[3].type(), capstan::v1::Event::BOOKMARK);
  EXPECT_TRUE(evs[3].initial_events_end());
  EXPECT_EQ(evs[3].revision(), 5);
  Put(6, 2, "node-0");  // leaves node-2
  Put(7, 0, "node-2");  // arrives
  Put(8, 0, "node-2");  // stays
  evs.clear();
  while (evs.size() < 3 && reader->Read(&resp)) {
    for (const auto& e : resp.events()) evs.push_back(e);
  }
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_EQ(evs[0].type(), capstan::v1::Event::DELETED);
  EXPECT_EQ(evs[0].revision(), 6);
  EXPECT_EQ(evs[0].kv().key(), "/registry/pods/default/p2");
  EXPECT_EQ(evs[1].type(), capstan::v1::Event::ADDED);
  EXPECT_EQ(evs[2].type(), capstan::v1::Event::MODIFIED);
  EXPECT_EQ(evs[2].prev_kv().mod_revision(), 7);
  EXPECT_EQ(evs[2].kv().mod_revision(), 8);
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  reader->Finish().ok();  // cancelled
}

TEST_F(CacheServiceTest, WatchTooOld) {
  for (int r = 6; r < 400; ++r) Put(r, r % 10, "node-1");
  grpc::ClientContext ctx;
  capstan::v1::WatchRequest req;
  req.set_prefix("/registry/pods/");
  req.set_resource_version("5");
  auto reader = stub_->Watch(&ctx, req);
  capstan::v1::WatchResponse resp;
  EXPECT_FALSE(reader->Read(&resp));
  auto s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::OUT_OF_RANGE);
  EXPECT_TRUE(s.error_message().rfind("too old resource version: 5", 0) == 0) << s.error_message();
}

}  // namespace
}  // namespace capstan::server
