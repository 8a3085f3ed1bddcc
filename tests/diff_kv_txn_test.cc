// Differential tests of KV.Txn: compares on every target with every result,
// ranges of compares, missing keys, nested txns, reads of the txn's own
// writes, one revision per txn, and the request checks (duplicate keys, too
// many operations, empty keys, empty ops).

#include <string>
#include <vector>

#include "diff_kv.h"

namespace capstan::testing {
namespace {

class DiffTxnTest : public DiffKvTest {
 protected:
  // then: put K("then") = "t"; else: put K("else") = "e"; plus a range of
  // K("") .. End() on both branches so that the response shows the branch.
  TxnRequest Branches(std::vector<Compare> cmps) {
    return Txn(std::move(cmps), {Op(PutR(K("then"), "t")), Op(Get(K(""), End()))},
               {Op(PutR(K("else"), "e")), Op(Get(K(""), End()))});
  }
  // Runs Branches(cmps) on both servers and compares; returns etcd's verdict.
  bool Check(std::vector<Compare> cmps) {
    auto p = Both(Branches(std::move(cmps)));
    EXPECT_SAME(p);
    EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
    return p.etcd.resp.succeeded();
  }
};

// --- Compares: every target x every result on an existing key --------------

// K("k"): version 2, create rX, mod rY, value "m", lease L.
class DiffTxnCompareTest : public DiffTxnTest {
 protected:
  void SetUp() override {
    DiffTxnTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    lease_ = GrantBoth(600, LeaseId());
    create_ = PutBoth(K("k"), "a");
    mod_ = PutBoth(K("k"), "m", lease_);
  }
  int64_t lease_ = 0, create_ = 0, mod_ = 0;
};

TEST_F(DiffTxnCompareTest, VersionEqual) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::VERSION, Compare::EQUAL, 2)}));
}
TEST_F(DiffTxnCompareTest, VersionEqualFalse) {
  EXPECT_FALSE(Check({Cmp(K("k"), Compare::VERSION, Compare::EQUAL, 1)}));
}
TEST_F(DiffTxnCompareTest, VersionGreater) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::VERSION, Compare::GREATER, 1)}));
}
TEST_F(DiffTxnCompareTest, VersionLess) {
  EXPECT_FALSE(Check({Cmp(K("k"), Compare::VERSION, Compare::LESS, 2)}));
}
TEST_F(DiffTxnCompareTest, VersionNotEqual) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::VERSION, Compare::NOT_EQUAL, 3)}));
}
TEST_F(DiffTxnCompareTest, CreateEqual) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::CREATE, Compare::EQUAL, create_)}));
}
TEST_F(DiffTxnCompareTest, CreateGreater) {
  EXPECT_FALSE(Check({Cmp(K("k"), Compare::CREATE, Compare::GREATER, create_)}));
}
TEST_F(DiffTxnCompareTest, CreateLess) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::CREATE, Compare::LESS, create_ + 1)}));
}
TEST_F(DiffTxnCompareTest, CreateNotEqual) {
  EXPECT_FALSE(Check({Cmp(K("k"), Compare::CREATE, Compare::NOT_EQUAL, create_)}));
}
TEST_F(DiffTxnCompareTest, ModEqual) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::MOD, Compare::EQUAL, mod_)}));
}
TEST_F(DiffTxnCompareTest, ModGreater) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::MOD, Compare::GREATER, create_)}));
}
TEST_F(DiffTxnCompareTest, ModLess) {
  EXPECT_FALSE(Check({Cmp(K("k"), Compare::MOD, Compare::LESS, mod_)}));
}
TEST_F(DiffTxnCompareTest, ModNotEqual) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::MOD, Compare::NOT_EQUAL, create_)}));
}
TEST_F(DiffTxnCompareTest, ValueEqual) {
  EXPECT_TRUE(Check({CmpValue(K("k"), Compare::EQUAL, "m")}));
}
TEST_F(DiffTxnCompareTest, ValueGreater) {
  EXPECT_TRUE(Check({CmpValue(K("k"), Compare::GREATER, "l")}));
}
TEST_F(DiffTxnCompareTest, ValueGreaterPrefix) {
  // "m" > "" and "mm" > "m": bytes order, shorter first.
  EXPECT_FALSE(Check({CmpValue(K("k"), Compare::GREATER, "mm")}));
}
TEST_F(DiffTxnCompareTest, ValueLess) {
  EXPECT_TRUE(Check({CmpValue(K("k"), Compare::LESS, "n")}));
}
TEST_F(DiffTxnCompareTest, ValueNotEqual) {
  EXPECT_FALSE(Check({CmpValue(K("k"), Compare::NOT_EQUAL, "m")}));
}
TEST_F(DiffTxnCompareTest, LeaseEqual) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::LEASE, Compare::EQUAL, lease_)}));
}
TEST_F(DiffTxnCompareTest, LeaseGreater) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::LEASE, Compare::GREATER, 0)}));
}
TEST_F(DiffTxnCompareTest, LeaseLess) {
  EXPECT_FALSE(Check({Cmp(K("k"), Compare::LEASE, Compare::LESS, lease_)}));
}
TEST_F(DiffTxnCompareTest, LeaseNotEqual) {
  EXPECT_FALSE(Check({Cmp(K("k"), Compare::LEASE, Compare::NOT_EQUAL, lease_)}));
}
TEST_F(DiffTxnCompareTest, AllComparesMustHold) {
  EXPECT_FALSE(Check({Cmp(K("k"), Compare::VERSION, Compare::EQUAL, 2),
                      CmpValue(K("k"), Compare::EQUAL, "other")}));
}
TEST_F(DiffTxnCompareTest, SeveralComparesHold) {
  EXPECT_TRUE(Check({Cmp(K("k"), Compare::VERSION, Compare::EQUAL, 2),
                     Cmp(K("k"), Compare::MOD, Compare::EQUAL, mod_),
                     CmpValue(K("k"), Compare::EQUAL, "m")}));
}
TEST_F(DiffTxnCompareTest, TargetUnionMismatch) {
  // target VERSION with a value in the union: etcd compares the version with 0.
  Compare c = CmpValue(K("k"), Compare::GREATER, "zzz");
  c.set_target(Compare::VERSION);
  EXPECT_TRUE(Check({c}));
}
TEST_F(DiffTxnCompareTest, UnsetUnionComparesWithZero) {
  Compare c;
  c.set_key(K("k"));
  c.set_target(Compare::MOD);
  c.set_result(Compare::GREATER);
  EXPECT_TRUE(Check({c}));
}

// --- Compares on missing keys and on ranges ----------------------------------

TEST_F(DiffTxnTest, MissingKeyVersionZero) {
  EXPECT_TRUE(Check({Cmp(K("missing"), Compare::VERSION, Compare::EQUAL, 0)}));
}
TEST_F(DiffTxnTest, MissingKeyCreateZero) {
  EXPECT_TRUE(Check({Cmp(K("missing"), Compare::CREATE, Compare::EQUAL, 0)}));
}
TEST_F(DiffTxnTest, MissingKeyModLess) {
  EXPECT_TRUE(Check({Cmp(K("missing"), Compare::MOD, Compare::LESS, 5)}));
}
TEST_F(DiffTxnTest, MissingKeyLeaseZero) {
  EXPECT_TRUE(Check({Cmp(K("missing"), Compare::LEASE, Compare::EQUAL, 0)}));
}
TEST_F(DiffTxnTest, MissingKeyValueEqualEmptyFails) {
  // A value compare on a missing key always fails, even with "".
  EXPECT_FALSE(Check({CmpValue(K("missing"), Compare::EQUAL, "")}));
}
TEST_F(DiffTxnTest, MissingKeyValueNotEqualFails) {
  EXPECT_FALSE(Check({CmpValue(K("missing"), Compare::NOT_EQUAL, "x")}));
}
TEST_F(DiffTxnTest, DeletedKeyVersionZero) {
  PutBoth(K("d"), "1");
  DeleteBoth(K("d"));
  EXPECT_TRUE(Check({Cmp(K("d"), Compare::VERSION, Compare::EQUAL, 0)}));
}

TEST_F(DiffTxnTest, RangeCompareAllHold) {
  Seed({{"r/a", "1"}, {"r/b", "2"}, {"r/c", "3"}});
  Compare c = Cmp(K("r/"), Compare::VERSION, Compare::GREATER, 0);
  c.set_range_end(PrefixEnd(K("r/")));
  EXPECT_TRUE(Check({c}));
}
TEST_F(DiffTxnTest, RangeCompareOneFails) {
  Seed({{"r/a", "1"}, {"r/b", "2"}, {"r/b", "2b"}});
  Compare c = Cmp(K("r/"), Compare::VERSION, Compare::EQUAL, 1);
  c.set_range_end(PrefixEnd(K("r/")));
  EXPECT_FALSE(Check({c}));
}
TEST_F(DiffTxnTest, RangeCompareValue) {
  Seed({{"r/a", "x"}, {"r/b", "x"}});
  Compare c = CmpValue(K("r/"), Compare::EQUAL, "x");
  c.set_range_end(PrefixEnd(K("r/")));
  EXPECT_TRUE(Check({c}));
}
TEST_F(DiffTxnTest, RangeCompareEmptyRange) {
  // No key in the range: compared as one missing key.
  Compare c = Cmp(K("r/"), Compare::CREATE, Compare::EQUAL, 0);
  c.set_range_end(PrefixEnd(K("r/")));
  EXPECT_TRUE(Check({c}));
}
TEST_F(DiffTxnTest, RangeCompareEmptyRangeValue) {
  Compare c = CmpValue(K("r/"), Compare::EQUAL, "");
  c.set_range_end(PrefixEnd(K("r/")));
  EXPECT_FALSE(Check({c}));
}
TEST_F(DiffTxnTest, RangeCompareFromKey) {
  Seed({{"a", "1"}, {"b", "2"}});
  Compare c = Cmp(K("a"), Compare::MOD, Compare::GREATER, 0);
  c.set_range_end(kFromKey);
  EXPECT_TRUE(Check({c}));
}
TEST_F(DiffTxnTest, RangeCompareModLess) {
  Seed({{"r/a", "1"}});
  const int64_t rev = Revision();
  Seed({{"r/b", "2"}});
  Compare c = Cmp(K("r/"), Compare::MOD, Compare::LESS, rev + 1);
  c.set_range_end(PrefixEnd(K("r/")));
  EXPECT_FALSE(Check({c}));
}

TEST_F(DiffTxnTest, NoComparesTakesThen) { EXPECT_TRUE(Check({})); }

TEST_F(DiffTxnTest, EmptyTxn) {
  const int64_t rev = Revision();
  auto p = Both(TxnRequest());
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.header().revision(), rev);
}

// --- Operations inside a txn ---------------------------------------------

TEST_F(DiffTxnTest, OneRevisionPerTxn) {
  const int64_t rev = Revision();
  auto p = Both(Txn({}, {Op(PutR(K("a"), "1")), Op(PutR(K("b"), "2")), Op(PutR(K("c"), "3"))}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.header().revision(), rev + 1);
  auto g = Both(Get(K(""), End()));
  EXPECT_SAME(g);
  for (const auto& kv : g.etcd.resp.kvs()) EXPECT_EQ(kv.mod_revision(), rev + 1);
}

TEST_F(DiffTxnTest, ReadsSeeOwnEarlierWrites) {
  Seed({{"a", "before"}, {"b", "doomed"}});
  auto p = Both(Txn({}, {Op(Get(K("a"))), Op(PutR(K("a"), "after")), Op(Get(K("a"))),
                         Op(DelR(K("b"))), Op(Get(K("b")))}));
  EXPECT_SAME(p);
  ASSERT_EQ(p.etcd.resp.responses_size(), 5);
  EXPECT_EQ(p.etcd.resp.responses(2).response_range().kvs(0).value(), "after");
  EXPECT_EQ(p.etcd.resp.responses(4).response_range().count(), 0);
}

TEST_F(DiffTxnTest, PutThenRangeSeesNewVersion) {
  PutBoth(K("a"), "1");
  auto p = Both(Txn({}, {Op(PutR(K("a"), "2")), Op(PutR(K("b"), "new")), Op(Get(K(""), End()))}));
  EXPECT_SAME(p);
}

TEST_F(DiffTxnTest, PutPrevKvInTxn) {
  PutBoth(K("a"), "old");
  PutRequest put = PutR(K("a"), "new");
  put.set_prev_kv(true);
  EXPECT_SAME(Both(Txn({}, {Op(put)})));
}

TEST_F(DiffTxnTest, DeletePrevKvInTxn) {
  Seed({{"a", "1"}, {"b", "2"}});
  DeleteRangeRequest del = DelR(K(""), End());
  del.set_prev_kv(true);
  auto p = Both(Txn({}, {Op(del)}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.responses(0).response_delete_range().deleted(), 2);
}

TEST_F(DiffTxnTest, DeleteNothingKeepsRevision) {
  const int64_t rev = PutBoth(K("a"), "1");
  auto p = Both(Txn({}, {Op(DelR(K("missing")))}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.header().revision(), rev);
}

TEST_F(DiffTxnTest, ReadOnlyTxnKeepsRevision) {
  const int64_t rev = PutBoth(K("a"), "1");
  auto p = Both(Txn({}, {Op(Get(K("a"))), Op(Get(K("b")))}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.header().revision(), rev);
}

TEST_F(DiffTxnTest, RangeAtPastRevisionInTxn) {
  const int64_t rev = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  RangeRequest r = Get(K("a"));
  r.set_revision(rev);
  EXPECT_SAME(Both(Txn({}, {Op(r), Op(PutR(K("b"), "x"))})));
}

TEST_F(DiffTxnTest, RangeAtFutureRevisionInTxn) {
  const int64_t rev = PutBoth(K("a"), "1");
  RangeRequest r = Get(K("a"));
  r.set_revision(rev + 10);
  auto p = Both(Txn({}, {Op(r)}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(),
            "etcdserver: mvcc: required revision is a future revision");
}

TEST_F(DiffTxnTest, RangeAtFutureRevisionInUntakenBranch) {
  const int64_t rev = PutBoth(K("a"), "1");
  RangeRequest r = Get(K("a"));
  r.set_revision(rev + 10);
  EXPECT_SAME(Both(Txn({Cmp(K("a"), Compare::VERSION, Compare::EQUAL, 1)}, {Op(PutR(K("b"), "1"))},
                       {Op(r)})));
}

TEST_F(DiffTxnTest, RangeOptionsInTxn) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  RangeRequest r = Get(K(""), End());
  r.set_limit(2);
  r.set_sort_order(RangeRequest::DESCEND);
  r.set_sort_target(RangeRequest::VALUE);
  RangeRequest c = Get(K(""), End());
  c.set_count_only(true);
  RangeRequest k = Get(K(""), End());
  k.set_keys_only(true);
  EXPECT_SAME(Both(Txn({}, {Op(r), Op(c), Op(k)})));
}

TEST_F(DiffTxnTest, PutUnknownLeaseInTxn) {
  auto p = Both(Txn({}, {Op(PutR(K("a"), "1", 0x7e5a))}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: requested lease not found");
}

TEST_F(DiffTxnTest, PutUnknownLeaseInUntakenBranch) {
  EXPECT_SAME(Both(Txn({CmpValue(K("nope"), Compare::EQUAL, "x")}, {Op(PutR(K("a"), "1", 0x7e5b))},
                       {Op(PutR(K("b"), "1"))})));
}

TEST_F(DiffTxnTest, IgnoreValueMissingKeyInTxn) {
  PutRequest put = PutR(K("missing"), "");
  put.set_ignore_value(true);
  auto p = Both(Txn({}, {Op(put)}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: key not found");
}

TEST_F(DiffTxnTest, IgnoreValueKeyPutEarlierInSameTxn) {
  PutRequest put = PutR(K("a"), "");
  put.set_ignore_value(true);
  EXPECT_SAME(Both(Txn({}, {Op(PutR(K("b"), "x")), Op(put)})));
}

TEST_F(DiffTxnTest, IgnoreLeaseExistingInTxn) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "1", lease);
  PutRequest put = PutR(K("a"), "2");
  put.set_ignore_lease(true);
  EXPECT_SAME(Both(Txn({}, {Op(put), Op(Get(K("a")))})));
}

// --- Nested txns ---------------------------------------------------------

TEST_F(DiffTxnTest, NestedThen) {
  PutBoth(K("a"), "1");
  TxnRequest inner = Txn({Cmp(K("a"), Compare::VERSION, Compare::EQUAL, 1)},
                         {Op(PutR(K("inner-then"), "x")), Op(Get(K("a")))},
                         {Op(PutR(K("inner-else"), "y"))});
  auto p = Both(Txn({}, {Op(PutR(K("outer"), "o")), Op(inner)}));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.resp.responses(1).response_txn().succeeded());
  EXPECT_SAME(Both(Get(K(""), End())));
}

TEST_F(DiffTxnTest, NestedElse) {
  TxnRequest inner = Txn({Cmp(K("a"), Compare::VERSION, Compare::EQUAL, 5)},
                         {Op(PutR(K("inner-then"), "x"))},
                         {Op(PutR(K("inner-else"), "y")), Op(Get(K(""), End()))});
  auto p = Both(Txn({}, {Op(inner)}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.resp.responses(0).response_txn().succeeded());
}

TEST_F(DiffTxnTest, NestedComparesSeeStateBeforeTxn) {
  // Nested compares are evaluated before any op of the txn is applied.
  TxnRequest inner = Txn({Cmp(K("a"), Compare::VERSION, Compare::EQUAL, 0)},
                         {Op(PutR(K("saw-missing"), "1"))}, {Op(PutR(K("saw-put"), "1"))});
  auto p = Both(Txn({}, {Op(PutR(K("a"), "1")), Op(inner)}));
  EXPECT_SAME(p);
  EXPECT_SAME(Both(Get(K(""), End())));
}

TEST_F(DiffTxnTest, DoublyNested) {
  TxnRequest innermost = Txn({}, {Op(PutR(K("deep"), "d")), Op(Get(K(""), End()))});
  TxnRequest inner = Txn({}, {Op(innermost), Op(PutR(K("mid"), "m"))});
  auto p = Both(Txn({}, {Op(inner), Op(PutR(K("top"), "t"))}));
  EXPECT_SAME(p);
}

TEST_F(DiffTxnTest, NestedInElseBranch) {
  TxnRequest inner = Txn({}, {Op(PutR(K("x"), "1"))});
  EXPECT_SAME(Both(Txn({CmpValue(K("none"), Compare::EQUAL, "v")}, {Op(PutR(K("y"), "1"))},
                       {Op(inner)})));
}

TEST_F(DiffTxnTest, NestedOneRevision) {
  const int64_t rev = Revision();
  TxnRequest inner = Txn({}, {Op(PutR(K("b"), "2"))});
  auto p = Both(Txn({}, {Op(PutR(K("a"), "1")), Op(inner)}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.header().revision(), rev + 1);
}

// --- Request checks --------------------------------------------------------

TEST_F(DiffTxnTest, DuplicatePut) {
  auto p = Both(Txn({}, {Op(PutR(K("a"), "1")), Op(PutR(K("a"), "2"))}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: duplicate key given in txn request");
}

TEST_F(DiffTxnTest, DuplicatePutAndDelete) {
  auto p = Both(Txn({}, {Op(PutR(K("a"), "1")), Op(DelR(K("a")))}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, DuplicateDeleteThenPut) {
  EXPECT_SAME(Both(Txn({}, {Op(DelR(K("a"))), Op(PutR(K("a"), "1"))})));
}

TEST_F(DiffTxnTest, DuplicatePutInsideDeletedRange) {
  auto p = Both(Txn({}, {Op(DelR(K("a"), K("c"))), Op(PutR(K("b"), "1"))}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, PutAtDeletedRangeEndIsFine) {
  auto p = Both(Txn({}, {Op(DelR(K("a"), K("c"))), Op(PutR(K("c"), "1"))}));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
}

TEST_F(DiffTxnTest, DuplicatePutInsideFromKeyDelete) {
  EXPECT_SAME(Both(Txn({}, {Op(DelR(K("a"), kFromKey)), Op(PutR(K("z"), "1"))})));
}

TEST_F(DiffTxnTest, TwoDeletesOfOneKeyAreFine) {
  PutBoth(K("a"), "1");
  auto p = Both(Txn({}, {Op(DelR(K("a"))), Op(DelR(K("a"), K("b")))}));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
}

TEST_F(DiffTxnTest, RangeAndPutOfOneKeyAreFine) {
  auto p = Both(Txn({}, {Op(Get(K("a"))), Op(PutR(K("a"), "1")), Op(Get(K("a")))}));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, SameKeyInThenAndElseIsFine) {
  auto p = Both(Txn({}, {Op(PutR(K("a"), "then"))}, {Op(PutR(K("a"), "else"))}));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, DuplicateInElseOnly) {
  auto p = Both(Txn({}, {Op(PutR(K("a"), "1"))}, {Op(PutR(K("b"), "1")), Op(PutR(K("b"), "2"))}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, DuplicateNestedAndOuterPut) {
  TxnRequest inner = Txn({}, {Op(PutR(K("a"), "inner"))});
  auto p = Both(Txn({}, {Op(inner), Op(PutR(K("a"), "outer"))}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, DuplicateNestedElseAndOuterPut) {
  TxnRequest inner = Txn({}, {Op(PutR(K("x"), "then"))}, {Op(PutR(K("a"), "else"))});
  auto p = Both(Txn({}, {Op(PutR(K("a"), "outer")), Op(inner)}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, NestedThenAndElseSameKeyIsFine) {
  TxnRequest inner = Txn({}, {Op(PutR(K("a"), "then"))}, {Op(PutR(K("a"), "else"))});
  auto p = Both(Txn({}, {Op(inner)}));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
}

TEST_F(DiffTxnTest, DuplicateAcrossTwoNestedTxns) {
  TxnRequest a = Txn({}, {Op(PutR(K("a"), "1"))});
  TxnRequest b = Txn({}, {Op(PutR(K("a"), "2"))});
  auto p = Both(Txn({}, {Op(a), Op(b)}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, DuplicateOuterDeleteCoversNestedPut) {
  TxnRequest inner = Txn({}, {Op(PutR(K("b"), "1"))});
  auto p = Both(Txn({}, {Op(DelR(K("a"), K("c"))), Op(inner)}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, DuplicateNestedDeleteCoversOuterPut) {
  TxnRequest inner = Txn({}, {Op(DelR(K("a"), K("c")))});
  auto p = Both(Txn({}, {Op(inner), Op(PutR(K("b"), "1"))}));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, TooManyOps) {
  std::vector<RequestOp> ops;
  for (int i = 0; i < 129; ++i) ops.push_back(Op(PutR(K(absl::StrFormat("k%03d", i)), "v")));
  auto p = Both(Txn({}, ops));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: too many operations in txn request");
}

TEST_F(DiffTxnTest, MaxOps) {
  std::vector<RequestOp> ops;
  for (int i = 0; i < 128; ++i) ops.push_back(Op(PutR(K(absl::StrFormat("k%03d", i)), "v")));
  auto p = Both(Txn({}, ops));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
}

TEST_F(DiffTxnTest, TooManyCompares) {
  std::vector<Compare> cmps;
  for (int i = 0; i < 129; ++i) cmps.push_back(Cmp(K("a"), Compare::VERSION, Compare::EQUAL, 0));
  EXPECT_SAME(Both(Txn(cmps, {Op(PutR(K("a"), "1"))})));
}

TEST_F(DiffTxnTest, TooManyOpsInElse) {
  std::vector<RequestOp> ops;
  for (int i = 0; i < 129; ++i) ops.push_back(Op(Get(K(absl::StrFormat("k%03d", i)))));
  EXPECT_SAME(Both(Txn({}, {Op(PutR(K("a"), "1"))}, ops)));
}

TEST_F(DiffTxnTest, NestedOpsCountAgainstOuterBudget) {
  // A nested txn may have at most max-txn-ops minus the outer op count.
  std::vector<RequestOp> outer;
  for (int i = 0; i < 99; ++i) outer.push_back(Op(Get(K(absl::StrFormat("o%03d", i)))));
  std::vector<RequestOp> inner_ops;
  for (int i = 0; i < 29; ++i) inner_ops.push_back(Op(Get(K(absl::StrFormat("i%03d", i)))));
  outer.push_back(Op(Txn({}, inner_ops)));
  auto p = Both(Txn({}, outer));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffTxnTest, NestedOpsWithinOuterBudget) {
  std::vector<RequestOp> outer;
  for (int i = 0; i < 99; ++i) outer.push_back(Op(Get(K(absl::StrFormat("o%03d", i)))));
  std::vector<RequestOp> inner_ops;
  for (int i = 0; i < 28; ++i) inner_ops.push_back(Op(Get(K(absl::StrFormat("i%03d", i)))));
  outer.push_back(Op(Txn({}, inner_ops)));
  auto p = Both(Txn({}, outer));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
}

TEST_F(DiffTxnTest, EmptyCompareKey) {
  auto p = Both(Txn({Cmp("", Compare::VERSION, Compare::EQUAL, 0)}, {Op(PutR(K("a"), "1"))}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: key is not provided");
}

TEST_F(DiffTxnTest, EmptyKeyInPutOp) {
  EXPECT_SAME(Both(Txn({}, {Op(PutR("", "1"))})));
}

TEST_F(DiffTxnTest, EmptyKeyInRangeOpOfElse) {
  EXPECT_SAME(Both(Txn({}, {Op(PutR(K("a"), "1"))}, {Op(Get(""))})));
}

TEST_F(DiffTxnTest, EmptyKeyInDeleteOfNestedTxn) {
  EXPECT_SAME(Both(Txn({}, {Op(Txn({}, {Op(DelR(""))}))})));
}

TEST_F(DiffTxnTest, EmptyRequestOp) {
  TxnRequest t = Txn({}, {Op(PutR(K("a"), "1"))});
  t.add_success();  // a RequestOp with no request set
  auto p = Both(t);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: key not found");
}

TEST_F(DiffTxnTest, ValueProvidedInTxnPut) {
  PutRequest put = PutR(K("a"), "v");
  put.set_ignore_value(true);
  EXPECT_SAME(Both(Txn({}, {Op(put)})));
}

TEST_F(DiffTxnTest, LeaseProvidedInTxnPut) {
  PutRequest put = PutR(K("a"), "v", 5);
  put.set_ignore_lease(true);
  EXPECT_SAME(Both(Txn({}, {Op(put)})));
}

TEST_F(DiffTxnTest, FailedTxnWritesNothing) {
  PutBoth(K("a"), "1");
  const int64_t rev = Revision();
  EXPECT_SAME(Both(Txn({}, {Op(PutR(K("a"), "2")), Op(PutR(K("b"), "1", 0x7e5c))})));
  EXPECT_EQ(Revision(), rev);
  EXPECT_SAME(Both(Get(K(""), End())));
}

}  // namespace
}  // namespace capstan::testing
