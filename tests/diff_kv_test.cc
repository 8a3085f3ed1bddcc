// Differential tests of KV.Range. The binary diff_kv_test also holds
// diff_kv_write_test.cc (Put, DeleteRange, keys with leases),
// diff_kv_txn_test.cc (Txn), diff_kv_compact_test.cc (Compact, request size
// limits) and diff_kv_etcdctl_test.cc (etcdctl).
//
// Every case sends the same requests to real etcd and to Capstan (DiffTest)
// and passes when Capstan answers exactly what etcd answers. Where a case also
// checks etcd's own answer (EXPECT_... on p.etcd), that documents what the
// case is about and guards against a case that silently tests nothing.
//
// etcd 3.5 vs 3.6: Capstan checks a Range's sort order and target as etcd
// 3.6 does (v3rpc checkRangeRequest: InvalidArgument "etcdserver: invalid
// sort option"). The reference etcd 3.5.16 has no such check: it answers an
// unknown order unsorted and panics on an unknown target. Those cases are
// sent to Capstan only (they are reads) and compared with 3.6's answer.

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "diff_kv.h"

namespace capstan::testing {
namespace {

// ===========================================================================
// Range

class DiffRangeTest : public DiffKvTest {
 protected:
  // Puts `count` keys "<letter>%05d" on both servers, 100 per txn (one
  // revision each), value i of min_size + i % spread bytes; returns the
  // revision after the last txn.
  int64_t LoadNumberedKeys(char letter, int count, int min_size, int spread) {
    for (int first = 0; first < count; first += 100) {
      std::vector<RequestOp> puts;
      for (int i = first; i < std::min(count, first + 100); ++i) {
        char key[16];
        std::snprintf(key, sizeof(key), "%c%05d", letter, i);
        puts.push_back(Op(PutR(K(key), std::string(min_size + i % spread, 'a' + i % 26))));
      }
      EXPECT_SAME(Both(Txn({}, std::move(puts))));
    }
    return Revision();
  }
};

TEST_F(DiffRangeTest, SingleKeyExists) {
  Seed({{"a", "1"}, {"b", "2"}});
  auto p = Both(Get(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 1);
}

TEST_F(DiffRangeTest, SingleKeyMissing) {
  Seed({{"a", "1"}});
  auto p = Both(Get(K("zz")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 0);
}

TEST_F(DiffRangeTest, SingleKeyIsNotAPrefix) {
  Seed({{"a", "1"}, {"ab", "2"}});
  auto p = Both(Get(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 1);
}

TEST_F(DiffRangeTest, EmptyKey) {
  auto p = Both(Get(""));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: key is not provided");
}

TEST_F(DiffRangeTest, EmptyKeyWithRangeEnd) {
  Seed({{"a", "1"}});
  auto p = Both(Get("", End()));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffRangeTest, Interval) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}});
  auto p = Both(Get(K("b"), K("d")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 2);
}

TEST_F(DiffRangeTest, IntervalEndBeforeKey) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  auto p = Both(Get(K("c"), K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 0);
}

TEST_F(DiffRangeTest, IntervalEndEqualsKey) {
  Seed({{"a", "1"}, {"b", "2"}});
  auto p = Both(Get(K("a"), K("a")));
  EXPECT_SAME(p);
}

TEST_F(DiffRangeTest, Prefix) {
  Seed({{"p/1", "1"}, {"p/2", "2"}, {"p0", "x"}, {"o", "y"}});
  auto p = Both(Get(K("p/"), PrefixEnd(K("p/"))));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 2);
}

TEST_F(DiffRangeTest, PrefixNoMatch) {
  Seed({{"a", "1"}});
  auto p = Both(Get(K("q/"), PrefixEnd(K("q/"))));
  EXPECT_SAME(p);
}

TEST_F(DiffRangeTest, FromKey) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  auto p = Both(Get(K("b"), kFromKey));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 2);  // later tests' keys don't exist yet
}

TEST_F(DiffRangeTest, AllKeysCountOnly) {
  Seed({{"a", "1"}});
  RangeRequest r = Get(kFromKey, kFromKey);
  r.set_count_only(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_GE(p.etcd.resp.count(), 1);
}

TEST_F(DiffRangeTest, NulKeyAlone) {
  Seed({{"a", "1"}});
  auto p = Both(Get(kFromKey));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 0);
}

TEST_F(DiffRangeTest, BinaryKeysAndValues) {
  Seed({{"\x00\x01"s, "\xff\x00v"s}, {"\x80\xfe"s, ""}, {"\xff\xff"s, "\x00"s}});
  auto p = Both(Get(K(""), End()));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 3);
}

TEST_F(DiffRangeTest, LimitWithMore) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  RangeRequest r = Get(K(""), End());
  r.set_limit(2);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.resp.more());
  EXPECT_EQ(p.etcd.resp.count(), 3);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 2);
}

TEST_F(DiffRangeTest, LimitEqualsCount) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  RangeRequest r = Get(K(""), End());
  r.set_limit(3);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.resp.more());
}

TEST_F(DiffRangeTest, LimitAboveCount) {
  Seed({{"a", "1"}, {"b", "2"}});
  RangeRequest r = Get(K(""), End());
  r.set_limit(100);
  auto p = Both(r);
  EXPECT_SAME(p);
}

TEST_F(DiffRangeTest, LimitOne) {
  Seed({{"a", "1"}, {"b", "2"}});
  RangeRequest r = Get(K(""), End());
  r.set_limit(1);
  auto p = Both(r);
  EXPECT_SAME(p);
}

TEST_F(DiffRangeTest, LimitNegative) {
  Seed({{"a", "1"}, {"b", "2"}});
  RangeRequest r = Get(K(""), End());
  r.set_limit(-1);
  auto p = Both(r);
  EXPECT_SAME(p);
}

TEST_F(DiffRangeTest, LimitOnSingleKey) {
  Seed({{"a", "1"}});
  RangeRequest r = Get(K("a"));
  r.set_limit(1);
  auto p = Both(r);
  EXPECT_SAME(p);
}

TEST_F(DiffRangeTest, LimitWithCountOnly) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  RangeRequest r = Get(K(""), End());
  r.set_limit(1);
  r.set_count_only(true);
  auto p = Both(r);
  EXPECT_SAME(p);
}

TEST_F(DiffRangeTest, LimitWithKeysOnly) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  RangeRequest r = Get(K(""), End());
  r.set_limit(2);
  r.set_keys_only(true);
  auto p = Both(r);
  EXPECT_SAME(p);
}

TEST_F(DiffRangeTest, PaginateLikeKubernetes) {
  // kube-apiserver lists with limit, then continues from last key + "\0" at
  // the first page's revision.
  for (int i = 0; i < 25; ++i) PutBoth(K(absl::StrFormat("k%03d", i)), std::to_string(i));
  RangeRequest r = Get(K(""), End());
  r.set_limit(10);
  auto first = Both(r);
  ASSERT_SAME(first);
  int64_t rev = first.etcd.resp.header().revision();
  PutBoth(K("k005"), "changed after the first page");
  std::string next = first.etcd.resp.kvs(9).key() + "\0"s;
  for (int page = 0; page < 3; ++page) {
    RangeRequest c = Get(next, End());
    c.set_limit(10);
    c.set_revision(rev);
    auto p = Both(c);
    ASSERT_SAME(p);
    if (!p.etcd.resp.more()) break;
    next = p.etcd.resp.kvs(p.etcd.resp.kvs_size() - 1).key() + "\0"s;
  }
}

TEST_F(DiffRangeTest, ManyKeys) {
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<RequestOp> ops;
    for (int i = 0; i < 100; ++i) {
      ops.push_back(Op(PutR(K(absl::StrFormat("m%05d", batch * 100 + i)), std::string(i, 'v'))));
    }
    ASSERT_SAME(Both(Txn({}, ops)));
  }
  auto p = Both(Get(K(""), End()));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 300);
  RangeRequest r = Get(K("m00150"), End());
  r.set_limit(7);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeTest, RevisionCurrent) {
  int64_t rev = PutBoth(K("a"), "1");
  RangeRequest r = Get(K("a"));
  r.set_revision(rev);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeTest, RevisionPastSeesOldValue) {
  int64_t rev1 = PutBoth(K("a"), "old");
  PutBoth(K("a"), "new");
  RangeRequest r = Get(K("a"));
  r.set_revision(rev1);
  auto p = Both(r);
  EXPECT_SAME(p);
  ASSERT_EQ(p.etcd.resp.kvs_size(), 1);
  EXPECT_EQ(p.etcd.resp.kvs(0).value(), "old");
}

TEST_F(DiffRangeTest, RevisionBeforeKeyExisted) {
  int64_t rev0 = Revision();
  PutBoth(K("a"), "1");
  RangeRequest r = Get(K("a"));
  r.set_revision(rev0);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 0);
}

TEST_F(DiffRangeTest, RevisionPastOfRange) {
  Seed({{"a", "1"}, {"b", "2"}});
  int64_t rev = Revision();
  Seed({{"c", "3"}, {"a", "1b"}});
  DeleteBoth(K("b"));
  RangeRequest r = Get(K(""), End());
  r.set_revision(rev);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 2);
}

TEST_F(DiffRangeTest, RevisionPastSeesDeletedKey) {
  int64_t rev = PutBoth(K("a"), "1");
  DeleteBoth(K("a"));
  RangeRequest r = Get(K("a"));
  r.set_revision(rev);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 1);
  EXPECT_SAME(Both(Get(K("a"))));
}

TEST_F(DiffRangeTest, RevisionFuture) {
  int64_t rev = PutBoth(K("a"), "1");
  RangeRequest r = Get(K("a"));
  r.set_revision(rev + 1);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(p.etcd.status.error_message(),
            "etcdserver: mvcc: required revision is a future revision");
}

TEST_F(DiffRangeTest, RevisionFarFuture) {
  PutBoth(K("a"), "1");
  RangeRequest r = Get(K("a"));
  r.set_revision(int64_t{1} << 62);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeTest, RevisionNegative) {
  PutBoth(K("a"), "1");
  RangeRequest r = Get(K("a"));
  r.set_revision(-5);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeTest, RevisionPastWithCountOnly) {
  Seed({{"a", "1"}, {"b", "2"}});
  int64_t rev = Revision();
  Seed({{"c", "3"}});
  RangeRequest r = Get(K(""), End());
  r.set_revision(rev);
  r.set_count_only(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 2);
}

TEST_F(DiffRangeTest, Serializable) {
  Seed({{"a", "1"}, {"b", "2"}});
  RangeRequest r = Get(K(""), End());
  r.set_serializable(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeTest, SerializableAtRevision) {
  int64_t rev = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  RangeRequest r = Get(K("a"));
  r.set_serializable(true);
  r.set_revision(rev);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeTest, KeysOnly) {
  Seed({{"a", "1"}, {"b", "2"}});
  RangeRequest r = Get(K(""), End());
  r.set_keys_only(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  ASSERT_EQ(p.etcd.resp.kvs_size(), 2);
  EXPECT_EQ(p.etcd.resp.kvs(0).value(), "");
}

TEST_F(DiffRangeTest, CountOnly) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  RangeRequest r = Get(K(""), End());
  r.set_count_only(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 3);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 0);
}

TEST_F(DiffRangeTest, CountOnlyAndKeysOnly) {
  Seed({{"a", "1"}, {"b", "2"}});
  RangeRequest r = Get(K(""), End());
  r.set_count_only(true);
  r.set_keys_only(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeTest, CountOnlyMissing) {
  RangeRequest r = Get(K("none"));
  r.set_count_only(true);
  EXPECT_SAME(Both(r));
}

// Keys written so that each filter keeps a different subset:
// a: create r1, mod r5; b: create r2, mod r2; c: create r3, mod r4.
class DiffRangeFilterTest : public DiffKvTest {
 protected:
  void SetUp() override {
    DiffKvTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    r1_ = PutBoth(K("a"), "a1");
    r2_ = PutBoth(K("b"), "b1");
    r3_ = PutBoth(K("c"), "c1");
    r4_ = PutBoth(K("c"), "c2");
    r5_ = PutBoth(K("a"), "a2");
  }
  RangeRequest All() const { return Get(K(""), End()); }
  int64_t r1_ = 0, r2_ = 0, r3_ = 0, r4_ = 0, r5_ = 0;
};

TEST_F(DiffRangeFilterTest, MinModRevision) {
  RangeRequest r = All();
  r.set_min_mod_revision(r4_);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 2);
}

TEST_F(DiffRangeFilterTest, MaxModRevision) {
  RangeRequest r = All();
  r.set_max_mod_revision(r4_);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 2);
}

TEST_F(DiffRangeFilterTest, MinCreateRevision) {
  RangeRequest r = All();
  r.set_min_create_revision(r2_);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 2);
}

TEST_F(DiffRangeFilterTest, MaxCreateRevision) {
  RangeRequest r = All();
  r.set_max_create_revision(r2_);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 2);
}

TEST_F(DiffRangeFilterTest, ModWindow) {
  RangeRequest r = All();
  r.set_min_mod_revision(r2_);
  r.set_max_mod_revision(r4_);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 2);
}

TEST_F(DiffRangeFilterTest, CreateAndModCombined) {
  RangeRequest r = All();
  r.set_min_create_revision(r2_);
  r.set_max_mod_revision(r2_);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 1);
}

TEST_F(DiffRangeFilterTest, FilterExcludesAllCountUnfiltered) {
  // count is the number of keys in the range before the filters.
  RangeRequest r = All();
  r.set_min_mod_revision(r5_ + 100);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 0);
}

TEST_F(DiffRangeFilterTest, FilterWithLimit) {
  RangeRequest r = All();
  r.set_min_create_revision(r1_);
  r.set_limit(1);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.resp.more());
}

TEST_F(DiffRangeFilterTest, FilterWithLimitNoMore) {
  RangeRequest r = All();
  r.set_min_mod_revision(r5_);
  r.set_limit(1);
  auto p = Both(r);
  EXPECT_SAME(p);
}

TEST_F(DiffRangeFilterTest, FilterWithCountOnly) {
  RangeRequest r = All();
  r.set_max_create_revision(r1_);
  r.set_count_only(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeFilterTest, FilterAtPastRevision) {
  RangeRequest r = All();
  r.set_revision(r3_);
  r.set_min_mod_revision(r2_);
  auto p = Both(r);
  EXPECT_SAME(p);
}

TEST_F(DiffRangeFilterTest, FilterWithKeysOnlyAndSort) {
  RangeRequest r = All();
  r.set_min_create_revision(r1_);
  r.set_keys_only(true);
  r.set_sort_order(RangeRequest::DESCEND);
  r.set_sort_target(RangeRequest::MOD);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeFilterTest, NegativeFiltersIgnored) {
  RangeRequest r = All();
  r.set_min_mod_revision(-1);
  r.set_max_create_revision(-1);
  EXPECT_SAME(Both(r));
}

// ===========================================================================
// Range sorting: every order x every target on data where each target orders
// the keys differently.
//   key:     a b c d
//   create:  c a d b
//   mod:     d a b c
//   version: b c d a
//   value:   b d a c

class DiffSortTest : public DiffKvTest,
                     public ::testing::WithParamInterface<
                         std::tuple<RangeRequest::SortOrder, RangeRequest::SortTarget>> {
 protected:
  void SeedSortData() {
    Seed({{"c", "c1"},
          {"a", "a1"},
          {"d", "d1"},
          {"a", "a2"},
          {"d", "d2"},
          {"a", "a3"},
          {"d", "v2"},
          {"a", "v3"},
          {"b", "v1"},
          {"c", "v4"}});
  }
};

TEST_P(DiffSortTest, Sort) {
  SeedSortData();
  RangeRequest r = Get(K(""), End());
  r.set_sort_order(std::get<0>(GetParam()));
  r.set_sort_target(std::get<1>(GetParam()));
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 4);
}

TEST_P(DiffSortTest, SortWithLimit) {
  SeedSortData();
  RangeRequest r = Get(K(""), End());
  r.set_sort_order(std::get<0>(GetParam()));
  r.set_sort_target(std::get<1>(GetParam()));
  r.set_limit(2);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.resp.more());
}

INSTANTIATE_TEST_SUITE_P(
    OrderTarget, DiffSortTest,
    ::testing::Combine(::testing::Values(RangeRequest::NONE, RangeRequest::ASCEND,
                                         RangeRequest::DESCEND),
                       ::testing::Values(RangeRequest::KEY, RangeRequest::VERSION,
                                         RangeRequest::CREATE, RangeRequest::MOD,
                                         RangeRequest::VALUE)),
    [](const auto& info) {
      return RangeRequest::SortOrder_Name(std::get<0>(info.param)) + "_" +
             RangeRequest::SortTarget_Name(std::get<1>(info.param));
    });

TEST_F(DiffRangeTest, SortDescendByKeyWithRevision) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  int64_t rev = Revision();
  Seed({{"d", "4"}});
  RangeRequest r = Get(K(""), End());
  r.set_sort_order(RangeRequest::DESCEND);
  r.set_revision(rev);
  r.set_limit(2);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffRangeTest, SortDescendCountOnly) {
  Seed({{"a", "1"}, {"b", "2"}});
  RangeRequest r = Get(K(""), End());
  r.set_sort_order(RangeRequest::DESCEND);
  r.set_count_only(true);
  EXPECT_SAME(Both(r));
}

// InvalidArgument "etcdserver: invalid sort option", as etcd 3.6 answers
// (see the file comment).
TEST_F(DiffRangeTest, InvalidSortOrder) {
  RangeRequest r = Get(K("a"));
  r.set_sort_order(static_cast<RangeRequest::SortOrder>(7));
  ExpectCapstanAnswersAs36(r, grpc::StatusCode::INVALID_ARGUMENT, "etcdserver: invalid sort option");
}

TEST_F(DiffRangeTest, InvalidSortTarget) {
  RangeRequest r = Get(K("a"));
  r.set_sort_target(static_cast<RangeRequest::SortTarget>(9));
  ExpectCapstanAnswersAs36(r, grpc::StatusCode::INVALID_ARGUMENT, "etcdserver: invalid sort option");
}

TEST_F(DiffRangeTest, InvalidSortTargetWithAscend) {
  RangeRequest r = Get(K("a"), End());
  r.set_sort_order(RangeRequest::ASCEND);
  r.set_sort_target(static_cast<RangeRequest::SortTarget>(-1));
  ExpectCapstanAnswersAs36(r, grpc::StatusCode::INVALID_ARGUMENT, "etcdserver: invalid sort option");
}

TEST_F(DiffRangeTest, InvalidSortInTxn) {
  RangeRequest r = Get(K("a"));
  r.set_sort_order(static_cast<RangeRequest::SortOrder>(3));
  ExpectCapstanAnswersAs36(Txn({}, {Op(r)}), grpc::StatusCode::INVALID_ARGUMENT,
                         "etcdserver: invalid sort option");
}

TEST_F(DiffRangeTest, EmptyKeyBeatsInvalidSort) {
  RangeRequest r = Get("");
  r.set_sort_order(static_cast<RangeRequest::SortOrder>(3));
  ExpectCapstanAnswersAs36(r, grpc::StatusCode::INVALID_ARGUMENT, "etcdserver: key is not provided");
}

// ===========================================================================
// More Range edge cases

TEST_F(DiffRangeTest, CountSkipsDeletedKeys) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  DeleteBoth(K("b"));
  RangeRequest r = Get(K(""), End());
  r.set_limit(1);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 2);
}

TEST_F(DiffRangeTest, LimitAtPastRevisionWithLaterDeletes) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  const int64_t rev = Revision();
  DeleteBoth(K("a"));
  DeleteBoth(K("b"));
  RangeRequest r = GetAll(rev);
  r.set_limit(2);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.resp.more());
}

TEST_F(DiffRangeTest, SameValueTwiceBumpsVersion) {
  PutBoth(K("a"), "same");
  PutBoth(K("a"), "same");
  auto p = Both(Get(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs(0).version(), 2);
}

TEST_F(DiffRangeTest, PrefixOfFFBytes) {
  // The prefix end of "\xff\xff" under our prefix carries into the prefix.
  Seed({{"\xff\xff"s, "1"}, {"\xff\xff\x00"s, "2"}, {"\xff"s, "3"}});
  auto p = Both(Get(K("\xff\xff"s), PrefixEnd(K("\xff\xff"s))));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), 2);
}

TEST_F(DiffRangeTest, KeysOnlyWithRevisionAndSort) {
  Seed({{"b", "2"}, {"a", "1"}, {"c", "0"}});
  const int64_t rev = Revision();
  PutBoth(K("a"), "changed");
  RangeRequest r = GetAll(rev);
  r.set_keys_only(true);
  r.set_sort_order(RangeRequest::ASCEND);
  r.set_sort_target(RangeRequest::VALUE);
  EXPECT_SAME(Both(r));
}

// keys_only and count_only answered from the key index: leases attached,
// detached and changed, across a delete, read at every revision, with sort,
// filter and limit options.
TEST_F(DiffRangeTest, KeysOnlyLeaseHistory) {
  const int64_t lease = GrantBoth(600, LeaseId());
  const int64_t other = GrantBoth(600, LeaseId() + 2);
  const int64_t first = PutBoth(K("a"), "1", lease);
  PutBoth(K("a"), "2");  // detached
  PutBoth(K("b"), "x", other);
  PutBoth(K("a"), "3", other);
  DeleteBoth(K("b"));
  PutBoth(K("b"), "y", other);  // re-created with the same lease
  PutBoth(K("c"), "z");
  PutBoth(K("b"), "w");  // detached
  const int64_t last = Revision();
  for (int64_t rev = first; rev <= last; ++rev) {
    RangeRequest r = GetAll(rev);
    r.set_keys_only(true);
    auto p = Both(r);
    EXPECT_SAME(p) << "at " << rev;
    RangeRequest sorted = r;
    sorted.set_sort_target(RangeRequest::MOD);
    sorted.set_sort_order(RangeRequest::DESCEND);
    sorted.set_limit(2);
    EXPECT_SAME(Both(sorted)) << "at " << rev;
    RangeRequest filtered = r;
    filtered.set_min_create_revision(first + 1);
    EXPECT_SAME(Both(filtered)) << "at " << rev;
    RangeRequest counted = GetAll(rev);
    counted.set_count_only(true);
    EXPECT_SAME(Both(counted)) << "at " << rev;
  }
  RangeRequest at_first = GetAll(first);
  at_first.set_keys_only(true);
  auto p = Both(at_first);
  ASSERT_EQ(p.etcd.resp.kvs_size(), 1);
  EXPECT_EQ(p.etcd.resp.kvs(0).lease(), lease);  // etcd 3.5 returns the lease
  EXPECT_TRUE(p.etcd.resp.kvs(0).value().empty());
}

// Many keys, a third of them leased, half of those detached later: keys_only
// at both revisions, whole, limited and sorted.
TEST_F(DiffRangeTest, KeysOnlyManyLeasedKeys) {
  const int64_t lease = GrantBoth(600, LeaseId());
  auto load = [&](bool detach) {
    for (int first = 0; first < 600; first += 100) {
      std::vector<RequestOp> puts;
      for (int i = first; i < first + 100; ++i) {
        if (i % 3 != 0 || (detach && i % 2 != 0)) continue;
        char key[16];
        std::snprintf(key, sizeof(key), "k%05d", i);
        puts.push_back(Op(PutR(K(key), std::string(50 + i % 70, 'v'), detach ? 0 : lease)));
      }
      EXPECT_SAME(Both(Txn({}, std::move(puts))));
    }
    return Revision();
  };
  LoadNumberedKeys('j', 300, 10, 40);
  const int64_t leased = load(false);
  load(true);
  for (int64_t rev : {leased, int64_t{0}}) {
    RangeRequest r = GetAll(rev);
    r.set_keys_only(true);
    EXPECT_SAME(Both(r)) << "at " << rev;
    RangeRequest limited = r;
    limited.set_limit(333);
    EXPECT_SAME(Both(limited)) << "at " << rev;
    RangeRequest sorted = r;
    sorted.set_sort_target(RangeRequest::VERSION);
    sorted.set_sort_order(RangeRequest::DESCEND);
    sorted.set_limit(150);
    EXPECT_SAME(Both(sorted)) << "at " << rev;
  }
}

TEST_F(DiffRangeTest, RevisionOfDeletionItself) {
  PutBoth(K("a"), "1");
  DeleteBoth(K("a"));
  const int64_t rev = Revision();  // the delete's revision
  EXPECT_SAME(Both(GetAll(rev)));
  EXPECT_SAME(Both(GetAll(rev - 1)));
}

TEST_F(DiffRangeTest, HeaderRevisionIsCurrentForPastReads) {
  const int64_t rev = PutBoth(K("a"), "1");
  PutBoth(K("b"), "1");
  auto p = Both(GetAll(rev));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.header().revision(), rev + 1);
}

// Ranges over more than a thousand keys take the bulk-read path; their
// answers must not differ from the inline ones, nor from etcd's.
TEST_F(DiffRangeTest, BulkRangesMatch) {
  constexpr int kKeys = 1500;
  const int64_t loaded = LoadNumberedKeys('k', kKeys, 64, 50);
  DeleteBoth(K("k00100"), K("k00200"));
  PutBoth(K("k00007"), "changed");

  EXPECT_SAME(Both(GetAll(0)));
  EXPECT_SAME(Both(GetAll(loaded)));
  for (int64_t limit : {1001, 1200, 1400, 5000}) {
    RangeRequest r = GetAll(0);
    r.set_limit(limit);
    EXPECT_SAME(Both(r)) << "limit " << limit;
  }
  RangeRequest keys_only = GetAll(0);
  keys_only.set_keys_only(true);
  EXPECT_SAME(Both(keys_only));
  // Sorted with many ties (a txn's keys share their mod and create
  // revisions): etcd leaves equal keys where Go's unstable sort.Sort does.
  const std::vector<std::pair<RangeRequest::SortTarget, RangeRequest::SortOrder>> sorts = {
      {RangeRequest::KEY, RangeRequest::DESCEND},     {RangeRequest::MOD, RangeRequest::DESCEND},
      {RangeRequest::CREATE, RangeRequest::ASCEND},   {RangeRequest::VERSION, RangeRequest::NONE},
      {RangeRequest::VALUE, RangeRequest::DESCEND}};
  for (const auto& [target, order] : sorts) {
    RangeRequest sorted = GetAll(0);
    sorted.set_sort_target(target);
    sorted.set_sort_order(order);
    sorted.set_limit(1100);
    EXPECT_SAME(Both(sorted)) << "target " << target << " order " << order;
  }
  RangeRequest filtered = GetAll(0);
  filtered.set_min_mod_revision(loaded);
  EXPECT_SAME(Both(filtered));
  RangeRequest count_only = GetAll(0);
  count_only.set_count_only(true);
  auto p = Both(count_only);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.count(), kKeys - 100);
}

// More than 8,192 keys: a big Range's records are read in parts, on both
// bulk-read threads, and sent as the parts' blocks in order.
TEST_F(DiffRangeTest, BulkRangesReadInPartsMatch) {
  constexpr int kKeys = 20000;
  const int64_t loaded = LoadNumberedKeys('p', kKeys, 20, 90);
  DeleteBoth(K("p08000"), K("p08500"));
  PutBoth(K("p16385"), "changed");

  EXPECT_SAME(Both(GetAll(0)));
  EXPECT_SAME(Both(GetAll(loaded)));
  for (int64_t limit : {8193, 12345, 30000}) {
    RangeRequest r = GetAll(0);
    r.set_limit(limit);
    EXPECT_SAME(Both(r)) << "limit " << limit;
  }
  RangeRequest keys_only = GetAll(0);
  keys_only.set_keys_only(true);
  EXPECT_SAME(Both(keys_only));
  auto p = Both(GetAll(0));
  EXPECT_EQ(p.etcd.resp.kvs_size(), kKeys - 500);
}

}  // namespace
}  // namespace capstan::testing
