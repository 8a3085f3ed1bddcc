// Differential test of Range served from the watch cache: random Range
// requests on cached prefixes (single keys and ranges, limit, count_only,
// keys_only, past revisions, sort options) between random writes,
// compactions and restarts of the store; every request the cache serves is
// compared byte for byte with the response the store gives (assembled as
// KvService assembles it), and requests the store refuses are never served.

#include "server/api/cache_range.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "mvcc/kv_codec.h"
#include "server/api/grpc_buffers.h"
#include "watchcache/k8s_test_objects.h"
#include "watchcache/test_store.h"

namespace capstan::server {
namespace {

constexpr char kPods[] = "/registry/pods/";

class CacheRangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    member_.cluster_id = 11;
    member_.member_id = 12;
    member_.raft_term = 3;
    ASSERT_NO_FATAL_FAILURE(Open());
  }
  void TearDown() override { Close(); }
  void Open() {
    ASSERT_NO_FATAL_FAILURE(env_.Open());
    store_ = env_.store();
    watchcache::CacheOptions o;
    o.ring_min_capacity = 32;
    o.ring_max_capacity = 128;
    auto c = watchcache::Cache::Start(o, store_, env_.hub());
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = std::move(*c);
    ASSERT_TRUE(cache_->WaitReady(absl::Seconds(10)));
    range_ = std::make_unique<CacheRange>(store_, cache_.get(), &member_);
  }
  void Close() {
    range_.reset();
    cache_.reset();
    env_.Close();
  }

  int64_t Put(const std::string& key, const std::string& value, int64_t lease = 0) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    req.set_lease(lease);
    auto r = store_->Put(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->header().revision() : 0;
  }
  int64_t Delete(const std::string& key, const std::string& end = "") {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(key);
    req.set_range_end(end);
    auto r = store_->DeleteRange(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->header().revision() : 0;
  }

  // The response KvService sends for req from the store, or "" on error.
  std::string StoreResponse(const etcdserverpb::RangeRequest& req) {
    mvcc::RangeResult result;
    if (!store_->Range(req, &result).ok()) return "";
    etcdserverpb::ResponseHeader header;
    membership::FillHeader(member_, &header);
    header.set_revision(result.rev);
    std::string wire;
    util::AppendBytesField(1, header.SerializeAsString(), &wire);
    wire.append(result.kvs_wire);
    if (result.more) util::AppendVarintField(3, 1, &wire);
    util::AppendVarintField(4, static_cast<uint64_t>(result.count), &wire);
    return wire;
  }

  watchcache::testing::TestStore env_;
  membership::MemberInfo member_;
  mvcc::KvStore* store_ = nullptr;
  std::unique_ptr<watchcache::Cache> cache_;
  std::unique_ptr<CacheRange> range_;
};

TEST_F(CacheRangeTest, RandomRangesEqualTheStoresByteForByte) {
  std::mt19937 rng(17);
  const char* namespaces[] = {"a", "b", "c"};
  auto pod_key = [&](int ns, int i) { return absl::StrCat(kPods, namespaces[ns], "/p", i); };
  auto random_key = [&] { return pod_key(rng() % 3, rng() % 40); };
  std::vector<int64_t> revs = {store_->Rev()};
  int64_t compacted = 0;
  int served = 0, served_past = 0, served_lagging = 0, declined = 0, refused = 0;
  for (int round = 0; round < 60; ++round) {
    // Writes: pods (protobuf and undecodable values, with and without
    // leases), keys elsewhere, deletes of one pod and of a namespace.
    const int writes = 1 + rng() % 8;
    for (int w = 0; w < writes; ++w) {
      const int k = rng() % 100;
      if (k < 60) {
        watchcache::testing::PodFields p{absl::StrCat("p", rng() % 40), namespaces[rng() % 3],
                                         absl::StrCat("n", rng() % 4), "Running", {}, rng() % 600};
        revs.push_back(Put(pod_key(rng() % 3, rng() % 40),
                           rng() % 5 ? watchcache::testing::PodProtobuf(p) : std::string(rng() % 50, 'x')));
      } else if (k < 75) {
        revs.push_back(Delete(random_key()));
      } else if (k < 78) {
        const std::string ns = absl::StrCat(kPods, namespaces[rng() % 3], "/");
        revs.push_back(Delete(ns, watchcache::PrefixEnd(ns)));
      } else if (k < 95) {
        revs.push_back(Put(absl::StrCat("/registry/configmaps/c", rng() % 5), "v"));
      } else if (revs.size() > 20) {
        const int64_t at = revs[revs.size() - 1 - rng() % 15];
        if (at > compacted) {
          etcdserverpb::CompactionRequest req;
          req.set_revision(at);
          ASSERT_TRUE(store_->Compact(req).ok());
          compacted = at;
        }
      }
    }
    if (round % 20 == 19) {
      Close();  // restart: the store reopens, the cache lists again
      ASSERT_NO_FATAL_FAILURE(Open());
    }
    // Half the queries right after the writes (the cache may still be
    // behind), half once it has caught up.
    for (int phase = 0; phase < 2; ++phase) {
      if (phase == 1) {
        watchcache::ListOptions l;  // a consistent List waits for the store's revision
        l.prefix = kPods;
        ASSERT_TRUE(cache_->List(l).ok());
      }
      for (int q = 0; q < 25; ++q) {
        etcdserverpb::RangeRequest req;
        const int shape = rng() % 6;
        if (shape == 0) {
          req.set_key(random_key());  // one key
        } else if (shape == 1) {
          req.set_key(kPods);
          req.set_range_end(watchcache::PrefixEnd(kPods));
        } else if (shape == 2) {
          const std::string ns = absl::StrCat(kPods, namespaces[rng() % 3], "/");
          req.set_key(ns);
          req.set_range_end(watchcache::PrefixEnd(ns));
        } else if (shape == 3) {
          std::string a = random_key(), b = random_key();
          if (b < a) std::swap(a, b);
          req.set_key(a);
          req.set_range_end(b);
        } else if (shape == 4) {
          req.set_key(kPods);
          req.set_range_end(std::string(1, '\0'));  // from key: not all cached
        } else {
          req.set_key("/registry/");  // wider than the prefix
          req.set_range_end(watchcache::PrefixEnd(kPods));
        }
        if (rng() % 2) req.set_limit(rng() % 12);
        if (rng() % 6 == 0) req.set_count_only(true);
        if (rng() % 5 == 0) req.set_keys_only(true);
        if (rng() % 3 == 0) req.set_revision(revs[revs.size() - 1 - rng() % std::min<size_t>(revs.size(), 30)]);
        if (rng() % 15 == 0) req.set_revision(store_->Rev() + 1);
        if (rng() % 10 == 0) req.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
        if (rng() % 20 == 0) req.set_sort_order(etcdserverpb::RangeRequest::DESCEND);
        if (rng() % 20 == 0) req.set_min_mod_revision(2);

        const std::string want = StoreResponse(req);
        const int64_t cache_rev = cache_->ResourceFor(kPods)->rev();
        grpc::ByteBuffer buf;
        if (!range_->TryServeRange(req, &buf)) {
          ++declined;
          continue;
        }
        std::string got;
        ASSERT_TRUE(FlattenBuffer(buf, &got));
        ASSERT_FALSE(want.empty()) << "served a request the store refuses: " << req.ShortDebugString();
        ASSERT_EQ(got, want) << req.ShortDebugString() << " store rev " << store_->Rev() << " cache rev "
                             << cache_rev;
        ++served;
        if (req.revision() > 0 && req.revision() < store_->Rev()) ++served_past;
        if (cache_rev < (req.revision() > 0 ? req.revision() : store_->Rev())) ++served_lagging;
      }
    }
    // Requests the store refuses are declined.
    etcdserverpb::RangeRequest bad;
    bad.set_key(kPods);
    bad.set_range_end(watchcache::PrefixEnd(kPods));
    bad.set_revision(compacted > 1 ? compacted - 1 : store_->Rev() + 5);
    if (StoreResponse(bad).empty()) {
      grpc::ByteBuffer buf;
      EXPECT_FALSE(range_->TryServeRange(bad, &buf)) << bad.ShortDebugString();
      ++refused;
    }
  }
  EXPECT_GT(served, 800);
  EXPECT_GT(served_past, 100);
  EXPECT_GT(served_lagging, 10);
  EXPECT_GT(refused, 30);
  EXPECT_GT(declined, 300);
  std::printf("served %d (past revisions %d, cache behind %d), declined %d, refused %d\n", served,
              served_past, served_lagging, declined, refused);
}

}  // namespace
}  // namespace capstan::server
