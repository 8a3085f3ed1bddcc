// KV.RangeStream (etcd 3.7) over a real gRPC server in process: every chunk
// against a plain Range at the same revision, chunk sizing as etcd's,
// the pinned revision under writes, compaction during a stream, values
// bigger than the chunk target, request checks and permissions, a client
// that stops reading (bounded chunks held), cancellation, empty ranges,
// keys_only, count_only and the watch cache path.

#include "server/api/range_stream.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "auth/auth_store.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mvcc/kv_range_stream.h"
#include "mvcc/watch_hub.h"
#include "server/api/auth_service.h"
#include "server/api/bulk_reads.h"
#include "server/api/cache_range.h"
#include "server/api/kv_service.h"
#include "watchcache/cache.h"

namespace capstan::server {
namespace {

using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::RangeStreamResponse;

// Polls cond until it holds or 20 s pass.
bool Eventually(const std::function<bool()>& cond) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return cond();
}

struct StreamResult {
  std::vector<RangeResponse> chunks;
  grpc::Status status;
  RangeResponse Merged() const {
    RangeResponse m;
    for (const auto& c : chunks) m.MergeFrom(c);
    return m;
  }
};

class RangeStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-rs-XXXXXX";
    dir_ = mkdtemp(tmpl);
    member_.cluster_id = 11;
    member_.member_id = 12;
    member_.raft_term = 3;
  }
  void TearDown() override {
    Stop();
    std::filesystem::remove_all(dir_);
  }

  // Opens the store (max_request_bytes: the chunk target) and serves KV
  // and Auth; with_cache caches the default Kubernetes prefixes.
  void Start(int64_t max_request_bytes = 1572864, bool with_cache = false) {
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    bo.sync = false;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    mvcc::KvStoreOptions o;
    o.max_request_bytes = max_request_bytes;
    auto store = mvcc::KvStore::Open(o, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    hub_ = std::make_unique<mvcc::WatchHub>(store_.get(), mvcc::WatchHubOptions{});
    store_->SetWatchHub(hub_.get());
    auto auth_store = auth::AuthStore::Open(store_.get(), auth::AuthStoreOptions{.bcrypt_cost = 4});
    ASSERT_TRUE(auth_store.ok()) << auth_store.status();
    auth_ = std::make_unique<AuthService>(std::move(*auth_store), false, &member_);
    bulk_ = std::make_unique<BulkReads>(BulkReads::Options{});
    kv_ = std::make_unique<KvService>(store_.get(), &member_, auth_->gate(), bulk_.get());
    if (with_cache) {
      auto c = watchcache::Cache::Start(watchcache::CacheOptions{}, store_.get(), hub_.get());
      ASSERT_TRUE(c.ok()) << c.status();
      cache_ = std::move(*c);
      ASSERT_TRUE(cache_->WaitReady(absl::Seconds(10)));
      auto ranges = std::make_unique<CacheRange>(store_.get(), cache_.get(), &member_);
      cache_range_ = ranges.get();
      kv_->ServeCachedRanges(std::move(ranges));
    }
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(kv_.get());
    b.RegisterService(auth_.get());
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                         grpc::InsecureChannelCredentials(), args);
    kv_stub_ = etcdserverpb::KV::NewStub(channel_);
    auth_stub_ = etcdserverpb::Auth::NewStub(channel_);
  }
  void Stop() {
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      server_->Wait();
    }
    server_.reset();
    kv_.reset();
    cache_.reset();
    bulk_.reset();
    auth_.reset();
    if (hub_) hub_->Stop();
    store_.reset();
    hub_.reset();
  }

  int64_t Put(const std::string& key, const std::string& value) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    auto r = store_->Put(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->header().revision() : 0;
  }
  void Compact(int64_t rev) {
    etcdserverpb::CompactionRequest req;
    req.set_revision(rev);
    req.set_physical(true);
    auto r = store_->Compact(req);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // n keys prefix%05d with values of value_bytes (each different).
  int64_t Fill(const std::string& prefix, int n, size_t value_bytes) {
    int64_t rev = 0;
    for (int i = 0; i < n; ++i) {
      std::string v(value_bytes, static_cast<char>('a' + i % 26));
      if (!v.empty()) v[0] = static_cast<char>('A' + i % 26);
      rev = Put(absl::StrFormat("%s%05d", prefix, i), v);
    }
    return rev;
  }

  StreamResult Stream(const RangeRequest& req, const std::string& token = "") {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("token", token);
    StreamResult out;
    auto reader = kv_stub_->RangeStream(&ctx, req);
    RangeStreamResponse r;
    while (reader->Read(&r)) out.chunks.push_back(r.range_response());
    out.status = reader->Finish();
    return out;
  }
  grpc::Status Range(const RangeRequest& req, RangeResponse* resp, const std::string& token = "") {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("token", token);
    return kv_stub_->Range(&ctx, req, resp);
  }

  // Checks the stream's shape (header, more and count on the last chunk
  // only; kvs on every chunk but maybe the last) and that it merges into
  // the Range at its pinned revision, with the stream's header.
  void ExpectStreamEqualsRange(const RangeRequest& req, const StreamResult& s,
                               const std::string& token = "") {
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    ASSERT_FALSE(s.chunks.empty());
    for (size_t i = 0; i + 1 < s.chunks.size(); ++i) {
      EXPECT_FALSE(s.chunks[i].has_header()) << i;
      EXPECT_FALSE(s.chunks[i].more()) << i;
      EXPECT_EQ(s.chunks[i].count(), 0) << i;
      EXPECT_GT(s.chunks[i].kvs_size(), 0) << i;
    }
    const RangeResponse& last = s.chunks.back();
    ASSERT_TRUE(last.has_header());
    EXPECT_EQ(last.header().cluster_id(), member_.cluster_id);
    EXPECT_EQ(last.header().member_id(), member_.member_id);
    EXPECT_EQ(last.header().raft_term(), member_.raft_term);
    RangeRequest at = req;
    if (at.revision() == 0) at.set_revision(last.header().revision());
    RangeResponse want;
    ASSERT_TRUE(Range(at, &want, token).ok());
    want.mutable_header()->set_revision(last.header().revision());
    RangeResponse got = s.Merged();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want))
        << "stream: " << got.kvs_size() << " kvs, more " << got.more() << ", count " << got.count()
        << "; range: " << want.kvs_size() << " kvs, more " << want.more() << ", count "
        << want.count();
  }

  std::string dir_;
  membership::MemberInfo member_;
  std::unique_ptr<mvcc::KvStore> store_;
  std::unique_ptr<mvcc::WatchHub> hub_;
  std::unique_ptr<AuthService> auth_;
  std::unique_ptr<BulkReads> bulk_;
  std::unique_ptr<KvService> kv_;
  std::unique_ptr<watchcache::Cache> cache_;
  CacheRange* cache_range_ = nullptr;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_stub_;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth_stub_;
};

RangeRequest Req(const std::string& key, const std::string& end) {
  RangeRequest r;
  r.set_key(key);
  r.set_range_end(end);
  return r;
}

// Chunk key counts etcd 3.7 would send for n uniform records of rec bytes
// each (encoded field size) with target bytes: 10, then doubled below half
// the target and halved above twice it.
std::vector<int> EtcdChunks(int n, size_t rec, int64_t target) {
  std::vector<int> out;
  int64_t limit = 10;
  int sent = 0;
  while (true) {
    const int take = static_cast<int>(std::min<int64_t>(limit, n - sent));
    const int64_t fetched = std::min<int64_t>(limit + 1, n - sent);
    const bool more = fetched > limit;
    out.push_back(take);
    sent += take;
    if (!more) break;
    const auto size = static_cast<int64_t>(take * rec);  // ~ the response
    if (size < target / 2) limit *= 2;
    else if (size > target * 2) limit /= 2;
    if (limit == 0) limit = 1;
  }
  return out;
}

TEST_F(RangeStreamTest, ChunksMergeIntoTheRangeAndGrowAsEtcds) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Fill("k", 3000, 1000);
  Put("l", "outside");
  for (const RangeRequest& req :
       {Req("k", "l"), Req("k", std::string(1, '\0')), Req("k00100", "k02000"), Req("k00007", "")}) {
    SCOPED_TRACE(req.ShortDebugString());
    StreamResult s = Stream(req);
    ExpectStreamEqualsRange(req, s);
  }
  // Chunk sizes: 10, 20, 40, ... keys while a chunk is under half of the
  // 1.5 MiB target, then steady.
  StreamResult s = Stream(Req("k", "l"));
  std::vector<int> sizes;
  for (const auto& c : s.chunks) sizes.push_back(c.kvs_size());
  const size_t rec = s.chunks[0].kvs(0).ByteSizeLong() + 3;
  EXPECT_EQ(sizes, EtcdChunks(3000, rec, 1572864));
  EXPECT_EQ(sizes.front(), 10);
  EXPECT_GE(sizes.size(), 5u);
}

TEST_F(RangeStreamTest, LimitsKeysOnlyCountOnlyAndEmpty) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Fill("k", 25, 10);
  for (int64_t limit : {0, 1, 5, 10, 11, 24, 25, 26, 100, -1}) {
    for (bool keys_only : {false, true}) {
      for (bool count_only : {false, true}) {
        RangeRequest req = Req("k", "l");
        req.set_limit(limit);
        req.set_keys_only(keys_only);
        req.set_count_only(count_only);
        SCOPED_TRACE(req.ShortDebugString());
        StreamResult s = Stream(req);
        ExpectStreamEqualsRange(req, s);
        if (count_only) {
          EXPECT_EQ(s.chunks.size(), 1u);
        }
      }
    }
  }
  // limit 5 of 25: one chunk, more, the count of the whole range.
  RangeRequest req = Req("k", "l");
  req.set_limit(5);
  StreamResult s = Stream(req);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_TRUE(s.chunks[0].more());
  EXPECT_EQ(s.chunks[0].count(), 25);
  // Unlimited: 10 then 15 keys.
  s = Stream(Req("k", "l"));
  ASSERT_EQ(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks[0].kvs_size(), 10);
  EXPECT_EQ(s.chunks[1].kvs_size(), 15);
  EXPECT_EQ(s.chunks[1].count(), 25);
  // Nothing in the range: one chunk with the header alone.
  s = Stream(Req("x", "y"));
  ExpectStreamEqualsRange(Req("x", "y"), s);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].kvs_size(), 0);
  EXPECT_EQ(s.chunks[0].count(), 0);
  EXPECT_EQ(s.chunks[0].header().revision(), store_->Rev());
}

TEST_F(RangeStreamTest, RefusesWhatEtcdRefuses) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const int64_t rev = Fill("k", 30, 10);
  auto expect = [&](const RangeRequest& req, grpc::StatusCode code, const std::string& text) {
    SCOPED_TRACE(req.ShortDebugString());
    StreamResult s = Stream(req);
    EXPECT_TRUE(s.chunks.empty());
    EXPECT_EQ(s.status.error_code(), code);
    EXPECT_EQ(s.status.error_message(), text);
  };
  RangeRequest req = Req("", "l");
  expect(req, grpc::INVALID_ARGUMENT, "etcdserver: key is not provided");
  req = Req("k", "l");
  req.set_sort_order(RangeRequest::DESCEND);
  expect(req, grpc::UNIMPLEMENTED, "RangeStream does not support custom sort orders");
  req.set_sort_order(RangeRequest::ASCEND);
  req.set_sort_target(RangeRequest::MOD);
  expect(req, grpc::UNIMPLEMENTED, "RangeStream does not support custom sort orders");
  req.set_sort_order(static_cast<RangeRequest::SortOrder>(7));
  expect(req, grpc::INVALID_ARGUMENT, "etcdserver: invalid sort option");
  for (int f = 0; f < 4; ++f) {
    req = Req("k", "l");
    if (f == 0) req.set_min_mod_revision(1);
    if (f == 1) req.set_max_mod_revision(1);
    if (f == 2) req.set_min_create_revision(1);
    if (f == 3) req.set_max_create_revision(1);
    expect(req, grpc::UNIMPLEMENTED, "RangeStream does not support revision filters");
  }
  req = Req("k", "l");
  req.set_revision(rev + 1);
  expect(req, grpc::OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision");
  Compact(rev - 5);
  req.set_revision(rev - 6);
  expect(req, grpc::OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted");
  // Ascending by key is no sort; a target with no order sorts each chunk
  // (as Range sorts what its limit fetched) and is served.
  req = Req("k", "l");
  req.set_sort_order(RangeRequest::ASCEND);
  ExpectStreamEqualsRange(req, Stream(req));
  req.set_sort_order(RangeRequest::NONE);
  req.set_sort_target(RangeRequest::MOD);
  StreamResult s = Stream(req);
  ASSERT_TRUE(s.status.ok());
  EXPECT_EQ(s.Merged().count(), 30);
}

TEST_F(RangeStreamTest, PinnedRevisionHoldsUnderWrites) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const int64_t pinned = Fill("k", 2000, 2000);
  grpc::ClientContext ctx;
  auto reader = kv_stub_->RangeStream(&ctx, Req("k", "l"));
  RangeStreamResponse r;
  ASSERT_TRUE(reader->Read(&r));
  StreamResult s;
  s.chunks.push_back(r.range_response());
  // Overwrite, delete and add keys in the range after the first chunk.
  for (int i = 0; i < 2000; i += 7) Put(absl::StrFormat("k%05d", i), "changed");
  Put("k00001x", "new");
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("k01000");
  del.set_range_end("k01500");
  ASSERT_TRUE(store_->DeleteRange(del).ok());
  while (reader->Read(&r)) s.chunks.push_back(r.range_response());
  s.status = reader->Finish();
  ASSERT_GT(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks.back().header().revision(), pinned);
  EXPECT_EQ(s.chunks.back().count(), 2000);
  ExpectStreamEqualsRange(Req("k", "l"), s);
}

TEST_F(RangeStreamTest, CompactionPastThePinnedRevisionEndsTheStream) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Fill("s", 1000, 10 * 1024);
  grpc::ClientContext ctx;
  auto reader = kv_stub_->RangeStream(&ctx, Req("s", "t"));
  RangeStreamResponse r;
  int received = 0;
  while (received < 10 && reader->Read(&r)) received += r.range_response().kvs_size();
  ASSERT_GE(received, 10);
  // Compacting at the pinned revision itself keeps it readable; past it,
  // the next chunk read fails.
  const int64_t advance = Put("zz", "x");
  Compact(advance);
  bool ended_early = false;
  while (reader->Read(&r)) {
    received += r.range_response().kvs_size();
    EXPECT_FALSE(r.range_response().has_header());
  }
  grpc::Status st = reader->Finish();
  ended_early = received < 1000;
  EXPECT_TRUE(ended_early);
  EXPECT_EQ(st.error_code(), grpc::OUT_OF_RANGE);
  EXPECT_EQ(st.error_message(), "etcdserver: mvcc: required revision has been compacted");
  EXPECT_TRUE(Eventually([] { return GetRangeStreamStats().active == 0; }));
}

TEST_F(RangeStreamTest, ValuesBiggerThanTheChunkTarget) {
  // 64 KiB target, values of 100 KiB: a chunk never holds less than one
  // key, and the limit falls to one key as etcd's does.
  ASSERT_NO_FATAL_FAILURE(Start(/*max_request_bytes=*/1 << 20));
  Fill("b", 40, 100 << 10);
  Stop();
  ASSERT_NO_FATAL_FAILURE(Start(/*max_request_bytes=*/64 << 10));
  StreamResult s = Stream(Req("b", "c"));
  ExpectStreamEqualsRange(Req("b", "c"), s);
  std::vector<int> sizes;
  for (const auto& c : s.chunks) sizes.push_back(c.kvs_size());
  // 10 keys (1000 KiB > 128 KiB) -> 5 -> 2 -> 1 -> 1 ...
  ASSERT_GE(sizes.size(), 4u);
  EXPECT_EQ(sizes[0], 10);
  EXPECT_EQ(sizes[1], 5);
  EXPECT_EQ(sizes[2], 2);
  for (size_t i = 3; i < sizes.size(); ++i) EXPECT_EQ(sizes[i], 1) << i;
  // With the default target every chunk stays under twice it plus one value.
  Stop();
  ASSERT_NO_FATAL_FAILURE(Start());
  s = Stream(Req("b", "c"));
  ExpectStreamEqualsRange(Req("b", "c"), s);
  for (size_t i = 1; i < s.chunks.size(); ++i) {
    EXPECT_LE(s.chunks[i].ByteSizeLong(), 2 * 1572864u + (110u << 10)) << i;
  }
}

TEST_F(RangeStreamTest, AClientThatStopsReadingHoldsAFewChunks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Fill("k", 8000, 8 << 10);  // 64 MiB
  ASSERT_TRUE(Eventually([] { return GetRangeStreamStats().active == 0; }));
  const uint64_t chunks_before = GetRangeStreamStats().chunks;
  grpc::ClientContext ctx;
  auto reader = kv_stub_->RangeStream(&ctx, Req("k", "l"));
  RangeStreamResponse r;
  ASSERT_TRUE(reader->Read(&r));
  // The client stops reading. The server fills gRPC's flow-control window,
  // then the chunk in flight and the queue, and reads no more.
  ASSERT_TRUE(Eventually([] {
    return GetRangeStreamStats().buffered_chunks == kQueuedChunks + 1;
  })) << GetRangeStreamStats().buffered_chunks;
  const uint64_t read_so_far = GetRangeStreamStats().chunks - chunks_before;
  // Of about 45 chunks of 1.5 MiB: what gRPC's flow-control windows take
  // and the few held here, not the whole range.
  EXPECT_LT(read_so_far, 20u);
  RecordProperty("chunks_read_while_stalled", static_cast<int>(read_so_far));
  EXPECT_LE(GetRangeStreamStats().buffered_bytes, int64_t{3} * 2 * 1572864 + (64 << 10));
  EXPECT_LE(bulk_->held_bytes(), size_t{80} << 20);
  // Nothing more is read while the client waits.
  int64_t still = 0;
  for (int i = 0; i < 50; ++i) {
    still = std::max<int64_t>(still, GetRangeStreamStats().buffered_chunks);
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_LE(still, kQueuedChunks + 1);
  // Then it reads the rest: everything arrives, and nothing stays held.
  StreamResult s;
  s.chunks.push_back(r.range_response());
  while (reader->Read(&r)) s.chunks.push_back(r.range_response());
  s.status = reader->Finish();
  ExpectStreamEqualsRange(Req("k", "l"), s);
  EXPECT_TRUE(Eventually([] {
    auto st = GetRangeStreamStats();
    return st.active == 0 && st.buffered_chunks == 0 && st.buffered_bytes == 0;
  }));
}

TEST_F(RangeStreamTest, ClientsThatStopReadingEachKeepTheirQueueFull) {
  // Several streams whose clients stop reading: each fills gRPC's window,
  // has a chunk in flight and its queue full, whatever order its writes
  // and reads complete in. (A write completing on a full queue once left
  // the stream one chunk short and reading nothing more until the client
  // read again.)
  ASSERT_NO_FATAL_FAILURE(Start());
  Fill("k", 4000, 8 << 10);  // 32 MiB
  ASSERT_TRUE(Eventually([] { return GetRangeStreamStats().active == 0; }));
  constexpr int kStreams = 4;
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReader<RangeStreamResponse>>> readers;
  std::vector<StreamResult> results(kStreams);
  RangeStreamResponse r;
  for (int i = 0; i < kStreams; ++i) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(kv_stub_->RangeStream(ctxs.back().get(), Req("k", "l")));
    ASSERT_TRUE(readers.back()->Read(&r));
    results[i].chunks.push_back(r.range_response());
  }
  EXPECT_TRUE(Eventually([] {
    return GetRangeStreamStats().buffered_chunks == kStreams * (kQueuedChunks + 1);
  })) << GetRangeStreamStats().buffered_chunks;
  for (int i = 0; i < kStreams; ++i) {
    while (readers[i]->Read(&r)) results[i].chunks.push_back(r.range_response());
    results[i].status = readers[i]->Finish();
    ExpectStreamEqualsRange(Req("k", "l"), results[i]);
  }
  EXPECT_TRUE(Eventually([] {
    auto st = GetRangeStreamStats();
    return st.active == 0 && st.buffered_chunks == 0 && st.buffered_bytes == 0;
  }));
}

TEST_F(RangeStreamTest, CancellationFreesEverything) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Fill("k", 4000, 8 << 10);
  for (int round = 0; round < 5; ++round) {
    grpc::ClientContext ctx;
    auto reader = kv_stub_->RangeStream(&ctx, Req("k", "l"));
    RangeStreamResponse r;
    for (int i = 0; i <= round; ++i) ASSERT_TRUE(reader->Read(&r));
    ctx.TryCancel();
    while (reader->Read(&r)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::CANCELLED);
  }
  EXPECT_TRUE(Eventually([this] {
    auto st = GetRangeStreamStats();
    return st.active == 0 && st.buffered_chunks == 0 && st.buffered_bytes == 0 &&
           bulk_->held_bytes() == 0;
  })) << GetRangeStreamStats().active << " " << GetRangeStreamStats().buffered_chunks << " "
      << bulk_->held_bytes();
}

TEST_F(RangeStreamTest, PermissionsAsRange) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Fill("a", 30, 10);
  Fill("b", 30, 10);
  auto call = [](auto fn) {
    grpc::ClientContext ctx;
    return fn(&ctx);
  };
  auto ok = [](const grpc::Status& s) { return s.ok(); };
  etcdserverpb::AuthUserAddRequest ua;
  etcdserverpb::AuthUserAddResponse uar;
  ua.set_name("root");
  ua.set_password("rootpw");
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->UserAdd(c, ua, &uar); })));
  ua.set_name("alice");
  ua.set_password("alicepw");
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->UserAdd(c, ua, &uar); })));
  etcdserverpb::AuthRoleAddRequest ra;
  etcdserverpb::AuthRoleAddResponse rar;
  ra.set_name("root");
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->RoleAdd(c, ra, &rar); })));
  ra.set_name("reader");
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->RoleAdd(c, ra, &rar); })));
  etcdserverpb::AuthRoleGrantPermissionRequest gp;
  etcdserverpb::AuthRoleGrantPermissionResponse gpr;
  gp.set_name("reader");
  gp.mutable_perm()->set_permtype(authpb::Permission::READ);
  gp.mutable_perm()->set_key("a");
  gp.mutable_perm()->set_range_end("b");
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->RoleGrantPermission(c, gp, &gpr); })));
  etcdserverpb::AuthUserGrantRoleRequest gr;
  etcdserverpb::AuthUserGrantRoleResponse grr;
  gr.set_user("root");
  gr.set_role("root");
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->UserGrantRole(c, gr, &grr); })));
  gr.set_user("alice");
  gr.set_role("reader");
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->UserGrantRole(c, gr, &grr); })));
  etcdserverpb::AuthEnableRequest en;
  etcdserverpb::AuthEnableResponse enr;
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->AuthEnable(c, en, &enr); })));
  etcdserverpb::AuthenticateRequest at;
  etcdserverpb::AuthenticateResponse atr;
  at.set_name("alice");
  at.set_password("alicepw");
  ASSERT_TRUE(ok(call([&](auto* c) { return auth_stub_->Authenticate(c, at, &atr); })));
  const std::string alice = atr.token();

  // Within the permission: served. Partly or wholly outside it, or with no
  // or a bad token: the stream fails as Range does, before any chunk.
  ExpectStreamEqualsRange(Req("a", "b"), Stream(Req("a", "b"), alice), alice);
  for (const auto& [req, token] :
       std::vector<std::pair<RangeRequest, std::string>>{{Req("a", "c"), alice},
                                                         {Req("a00010", "b00001"), alice},
                                                         {Req("b", "c"), alice},
                                                         {Req("b00001", ""), alice},
                                                         {Req("a", "b"), ""},
                                                         {Req("a", "b"), "bogus.1"}}) {
    SCOPED_TRACE(req.ShortDebugString() + " token " + token);
    RangeResponse resp;
    grpc::Status want = Range(req, &resp, token);
    ASSERT_FALSE(want.ok());
    StreamResult s = Stream(req, token);
    EXPECT_TRUE(s.chunks.empty());
    EXPECT_EQ(s.status.error_code(), want.error_code());
    EXPECT_EQ(s.status.error_message(), want.error_message());
  }
}

TEST_F(RangeStreamTest, CachedPrefixesStreamFromTheWatchCacheAsFromTheStore) {
  ASSERT_NO_FATAL_FAILURE(Start(1572864, /*with_cache=*/true));
  const int64_t rev = Fill("/registry/pods/default/p", 3000, 1500);
  // A few writes elsewhere: the cache, behind by them, still answers.
  Fill("/registry/configmaps/default/c", 5, 10);
  ASSERT_TRUE(Eventually([&] {
    RangeRequest probe = Req("/registry/pods/", "/registry/pods0");
    probe.set_count_only(true);
    watchcache::ResourceCache* rc = cache_->ResourceFor("/registry/pods/");
    int64_t cache_rev = 0;
    return rc != nullptr && rc->SnapshotAt(rev, &cache_rev).has_value();
  }));
  for (int64_t limit : {0, 7, 500, 2999, 3000}) {
    for (bool keys_only : {false, true}) {
      RangeRequest req = Req("/registry/pods/", "/registry/pods0");
      req.set_limit(limit);
      req.set_keys_only(keys_only);
      SCOPED_TRACE(req.ShortDebugString());
      const uint64_t served = cache_range_->served();
      StreamResult s = Stream(req);
      EXPECT_GT(cache_range_->served(), served);  // the cache answered it
      ExpectStreamEqualsRange(req, s);
      // Cut as the store's reader cuts it.
      mvcc::RangeStreamReader store_reader(store_.get(), req);
      for (size_t i = 0; i < s.chunks.size(); ++i) {
        ASSERT_FALSE(store_reader.done()) << i;
        struct Null : mvcc::ByteSink {
          void Append(std::string_view) override {}
        } sink;
        mvcc::RangeStreamChunk c;
        ASSERT_TRUE(store_reader.Next(&sink, &c).ok());
        EXPECT_EQ(c.num_kvs, s.chunks[i].kvs_size()) << i;
      }
      EXPECT_TRUE(store_reader.done());
    }
  }
}

}  // namespace
}  // namespace capstan::server
