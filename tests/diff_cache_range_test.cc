// Range on a prefix Capstan's watch cache holds (/registry/pods/), answered
// from the cache where it can (server/api/cache_range.h), against real etcd:
// random single-key and range reads with limit, count_only, keys_only, past
// revisions and sort orders, between random pod writes, deletes, writes
// elsewhere and compactions; and lists of more than a thousand pods, which
// the cache answers on the bulk-read threads. Its own binary: its keys are
// not under a per-test prefix.

#include <random>

#include "absl/strings/str_cat.h"
#include "diff_fixture.h"
#include "diff_kv.h"
#include "watchcache/k8s_test_objects.h"

namespace capstan::testing {
namespace {

using etcdserverpb::RangeRequest;

constexpr char kPods[] = "/registry/pods/";

class DiffCacheRangeTest : public DiffTest {};

TEST_F(DiffCacheRangeTest, RandomRangesOnCachedPodsMatchEtcd) {
  std::mt19937 rng(5);
  const char* namespaces[] = {"a", "b"};
  auto pod_key = [&] { return absl::StrCat(kPods, namespaces[rng() % 2], "/p", rng() % 20); };
  std::vector<int64_t> revs;
  int64_t compacted = 0;
  int reads = 0;
  for (int round = 0; round < 12; ++round) {
    for (int w = 0; w < 6; ++w) {
      const int k = rng() % 10;
      if (k < 6) {
        watchcache::testing::PodFields p{absl::StrCat("p", rng() % 20), "a", absl::StrCat("n", rng() % 3),
                                         "Running", {}, rng() % 300};
        revs.push_back(PutBoth(pod_key(), watchcache::testing::PodProtobuf(p)));
      } else if (k < 8) {
        etcdserverpb::DeleteRangeRequest d;
        d.set_key(pod_key());
        auto p = Both(d);
        ASSERT_SAME(p);
        revs.push_back(p.etcd.resp.header().revision());
      } else {
        revs.push_back(PutBoth(K("elsewhere"), "v"));
      }
    }
    if (round % 4 == 3) {
      etcdserverpb::CompactionRequest c;
      c.set_revision(revs[revs.size() - 4]);
      auto p = Both(c);
      ASSERT_SAME(p);
      compacted = c.revision();
    }
    for (int q = 0; q < 20; ++q) {
      RangeRequest r;
      switch (rng() % 4) {
        case 0: r.set_key(pod_key()); break;
        case 1:
          r.set_key(kPods);
          r.set_range_end("/registry/pods0");
          break;
        case 2:
          r.set_key(absl::StrCat(kPods, "b/"));
          r.set_range_end(absl::StrCat(kPods, "b0"));
          break;
        default: {
          std::string a = pod_key(), b = pod_key();
          if (b < a) std::swap(a, b);
          r.set_key(a);
          r.set_range_end(b);
        }
      }
      if (rng() % 2) r.set_limit(rng() % 6);
      if (rng() % 5 == 0) r.set_count_only(true);
      if (rng() % 5 == 0) r.set_keys_only(true);
      if (rng() % 3 == 0) r.set_revision(revs[revs.size() - 1 - rng() % std::min<size_t>(revs.size(), 20)]);
      if (rng() % 8 == 0) r.set_sort_order(rng() % 2 ? RangeRequest::ASCEND : RangeRequest::DESCEND);
      auto p = Both(r);
      ASSERT_SAME(p) << r.ShortDebugString() << " (compacted at " << compacted << ")";
      ++reads;
    }
  }
  EXPECT_EQ(reads, 240);
}

// More than a thousand pods in a namespace: a list of them is a bulk range,
// served from the cache on a bulk-read thread. Every form of it, now and at
// a past revision, matches etcd.
TEST_F(DiffCacheRangeTest, BigListsOnCachedPodsMatchEtcd) {
  constexpr int kPodsInNamespace = 1200;
  int64_t half = 0;
  for (int first = 0; first < kPodsInNamespace; first += 100) {
    std::vector<RequestOp> puts;
    for (int i = first; i < first + 100; ++i) {
      watchcache::testing::PodFields p{absl::StrCat("p", i), "big", absl::StrCat("n", i % 7),
                                       "Running", {}, static_cast<size_t>(i % 300)};
      puts.push_back(Op(PutR(absl::StrCat(kPods, "big/p", 10000 + i),
                             watchcache::testing::PodProtobuf(p))));
    }
    auto p = Both(Txn({}, std::move(puts)));
    ASSERT_SAME(p);
    if (first + 100 == kPodsInNamespace / 2) half = p.etcd.resp.header().revision();
  }
  RangeRequest all;
  all.set_key(absl::StrCat(kPods, "big/"));
  all.set_range_end(absl::StrCat(kPods, "big0"));
  auto p = Both(all);
  ASSERT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), kPodsInNamespace);

  RangeRequest limited = all;
  limited.set_limit(1100);
  EXPECT_SAME(Both(limited));
  RangeRequest keys_only = all;
  keys_only.set_keys_only(true);
  EXPECT_SAME(Both(keys_only));
  RangeRequest past = all;
  past.set_revision(half);
  auto at_half = Both(past);
  EXPECT_SAME(at_half);
  EXPECT_EQ(at_half.etcd.resp.kvs_size(), kPodsInNamespace / 2);
  RangeRequest every_pod;
  every_pod.set_key(kPods);
  every_pod.set_range_end("/registry/pods0");
  EXPECT_SAME(Both(every_pod));
}

}  // namespace
}  // namespace capstan::testing
