// Differential tests of KV.Put and KV.DeleteRange, and of keys attached to
// leases (LeaseRevoke deletes them in one revision).

#include <string>

#include "diff_kv.h"

namespace capstan::testing {
namespace {

// ===========================================================================
// Put

class DiffPutTest : public DiffKvTest {};

TEST_F(DiffPutTest, NewKey) {
  auto p = Both(PutR(K("a"), "1"));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.resp.has_prev_kv());
  EXPECT_SAME(Both(Get(K("a"))));
}

TEST_F(DiffPutTest, Overwrite) {
  PutBoth(K("a"), "1");
  EXPECT_SAME(Both(PutR(K("a"), "2")));
  auto p = Both(Get(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs(0).version(), 2);
}

TEST_F(DiffPutTest, PrevKvOnOverwrite) {
  PutBoth(K("a"), "old");
  PutRequest r = PutR(K("a"), "new");
  r.set_prev_kv(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.prev_kv().value(), "old");
}

TEST_F(DiffPutTest, PrevKvOnNewKey) {
  PutRequest r = PutR(K("a"), "new");
  r.set_prev_kv(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.resp.has_prev_kv());
}

TEST_F(DiffPutTest, PrevKvAfterDelete) {
  PutBoth(K("a"), "1");
  DeleteBoth(K("a"));
  PutRequest r = PutR(K("a"), "2");
  r.set_prev_kv(true);
  EXPECT_SAME(Both(r));
  auto p = Both(Get(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs(0).version(), 1);
}

TEST_F(DiffPutTest, EmptyKey) {
  auto p = Both(PutR("", "v"));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: key is not provided");
}

TEST_F(DiffPutTest, EmptyValue) {
  EXPECT_SAME(Both(PutR(K("a"), "")));
  EXPECT_SAME(Both(Get(K("a"))));
}

TEST_F(DiffPutTest, BinaryKeyAndValue) {
  EXPECT_SAME(Both(PutR(K("\x00\xff\x01"s), "\x00\x00\xfe"s)));
  EXPECT_SAME(Both(Get(K("\x00\xff\x01"s))));
}

TEST_F(DiffPutTest, LongKey) {
  const std::string key = K(std::string(10 * 1024, 'k'));
  EXPECT_SAME(Both(PutR(key, "v")));
  EXPECT_SAME(Both(Get(key)));
}

TEST_F(DiffPutTest, OneMebibyteValue) {
  const std::string value(1 << 20, 'x');
  EXPECT_SAME(Both(PutR(K("big"), value)));
  EXPECT_SAME(Both(Get(K("big"))));
}

TEST_F(DiffPutTest, UnknownLease) {
  auto p = Both(PutR(K("a"), "v", 0x7e57));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: requested lease not found");
}

TEST_F(DiffPutTest, UnknownLeaseLeavesKeyAlone) {
  PutBoth(K("a"), "1");
  EXPECT_SAME(Both(PutR(K("a"), "2", 0x7e58)));
  EXPECT_SAME(Both(Get(K("a"))));
}

TEST_F(DiffPutTest, WithLease) {
  const int64_t lease = GrantBoth(600, LeaseId());
  auto p = Both(PutR(K("a"), "v", lease));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  auto g = Both(Get(K("a")));
  EXPECT_SAME(g);
  EXPECT_EQ(g.etcd.resp.kvs(0).lease(), lease);
}

TEST_F(DiffPutTest, PutWithoutLeaseDetaches) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "1", lease);
  EXPECT_SAME(Both(PutR(K("a"), "2")));
  auto g = Both(Get(K("a")));
  EXPECT_SAME(g);
  EXPECT_EQ(g.etcd.resp.kvs(0).lease(), 0);
}

TEST_F(DiffPutTest, IgnoreValueKeepsValue) {
  PutBoth(K("a"), "kept");
  PutRequest r = PutR(K("a"), "");
  r.set_ignore_value(true);
  EXPECT_SAME(Both(r));
  auto g = Both(Get(K("a")));
  EXPECT_SAME(g);
  EXPECT_EQ(g.etcd.resp.kvs(0).value(), "kept");
  EXPECT_EQ(g.etcd.resp.kvs(0).version(), 2);
}

TEST_F(DiffPutTest, IgnoreValueWithPrevKv) {
  PutBoth(K("a"), "kept");
  PutRequest r = PutR(K("a"), "");
  r.set_ignore_value(true);
  r.set_prev_kv(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffPutTest, IgnoreValueMissingKey) {
  PutRequest r = PutR(K("missing"), "");
  r.set_ignore_value(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: key not found");
}

TEST_F(DiffPutTest, IgnoreValueDeletedKey) {
  PutBoth(K("a"), "1");
  DeleteBoth(K("a"));
  PutRequest r = PutR(K("a"), "");
  r.set_ignore_value(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffPutTest, IgnoreValueWithValue) {
  PutBoth(K("a"), "1");
  PutRequest r = PutR(K("a"), "not allowed");
  r.set_ignore_value(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: value is provided");
}

TEST_F(DiffPutTest, IgnoreValueWithValueOnMissingKey) {
  // Validation comes before the key lookup.
  PutRequest r = PutR(K("missing"), "not allowed");
  r.set_ignore_value(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffPutTest, IgnoreValueChangesLease) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "kept");
  PutRequest r = PutR(K("a"), "", lease);
  r.set_ignore_value(true);
  EXPECT_SAME(Both(r));
  EXPECT_SAME(Both(Get(K("a"))));
}

TEST_F(DiffPutTest, IgnoreLeaseKeepsLease) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "1", lease);
  PutRequest r = PutR(K("a"), "2");
  r.set_ignore_lease(true);
  EXPECT_SAME(Both(r));
  auto g = Both(Get(K("a")));
  EXPECT_SAME(g);
  EXPECT_EQ(g.etcd.resp.kvs(0).lease(), lease);
  EXPECT_EQ(g.etcd.resp.kvs(0).value(), "2");
}

TEST_F(DiffPutTest, IgnoreLeaseWithoutLease) {
  PutBoth(K("a"), "1");
  PutRequest r = PutR(K("a"), "2");
  r.set_ignore_lease(true);
  EXPECT_SAME(Both(r));
  EXPECT_SAME(Both(Get(K("a"))));
}

TEST_F(DiffPutTest, IgnoreLeaseMissingKey) {
  PutRequest r = PutR(K("missing"), "v");
  r.set_ignore_lease(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: key not found");
}

TEST_F(DiffPutTest, IgnoreLeaseWithLease) {
  PutBoth(K("a"), "1");
  PutRequest r = PutR(K("a"), "2", 0x7e59);
  r.set_ignore_lease(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: lease is provided");
}

TEST_F(DiffPutTest, IgnoreValueAndLease) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "kept", lease);
  PutRequest r = PutR(K("a"), "");
  r.set_ignore_value(true);
  r.set_ignore_lease(true);
  r.set_prev_kv(true);
  EXPECT_SAME(Both(r));
  EXPECT_SAME(Both(Get(K("a"))));
}

TEST_F(DiffPutTest, IgnoreValueAndLeaseMissingKey) {
  PutRequest r = PutR(K("missing"), "");
  r.set_ignore_value(true);
  r.set_ignore_lease(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffPutTest, EmptyKeyBeatsIgnoreValueCheck) {
  PutRequest r = PutR("", "v");
  r.set_ignore_value(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffPutTest, VersionsAndRevisionsOverManyPuts) {
  for (int i = 0; i < 10; ++i) PutBoth(K("a"), std::to_string(i));
  PutBoth(K("b"), "b");
  EXPECT_SAME(Both(Get(K(""), End())));
}

// ===========================================================================
// DeleteRange

class DiffDeleteTest : public DiffKvTest {};

TEST_F(DiffDeleteTest, SingleExisting) {
  Seed({{"a", "1"}, {"b", "2"}});
  auto p = Both(DelR(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.deleted(), 1);
  EXPECT_SAME(Both(Get(K(""), End())));
}

TEST_F(DiffDeleteTest, SingleMissingKeepsRevision) {
  const int64_t rev = PutBoth(K("a"), "1");
  auto p = Both(DelR(K("zz")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.deleted(), 0);
  EXPECT_EQ(p.etcd.resp.header().revision(), rev);
}

TEST_F(DiffDeleteTest, AlreadyDeletedKeepsRevision) {
  PutBoth(K("a"), "1");
  DeleteBoth(K("a"));
  auto p = Both(DelR(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.deleted(), 0);
}

TEST_F(DiffDeleteTest, Interval) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}});
  auto p = Both(DelR(K("b"), K("d")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.deleted(), 2);
  EXPECT_SAME(Both(Get(K(""), End())));
}

TEST_F(DiffDeleteTest, IntervalEndBeforeKey) {
  Seed({{"a", "1"}, {"b", "2"}});
  auto p = Both(DelR(K("b"), K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.deleted(), 0);
}

TEST_F(DiffDeleteTest, Prefix) {
  Seed({{"p/1", "1"}, {"p/2", "2"}, {"p0", "x"}});
  auto p = Both(DelR(K("p/"), PrefixEnd(K("p/"))));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.deleted(), 2);
  EXPECT_SAME(Both(Get(K(""), End())));
}

TEST_F(DiffDeleteTest, FromKey) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  auto p = Both(DelR(K("b"), kFromKey));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.deleted(), 2);
  EXPECT_SAME(Both(Get(K(""), End())));
}

TEST_F(DiffDeleteTest, PrevKvSingle) {
  Seed({{"a", "1"}});
  DeleteRangeRequest r = DelR(K("a"));
  r.set_prev_kv(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.prev_kvs_size(), 1);
}

TEST_F(DiffDeleteTest, PrevKvRange) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}, {"b", "2b"}});
  DeleteRangeRequest r = DelR(K("a"), K("c"));
  r.set_prev_kv(true);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.prev_kvs_size(), 2);
}

TEST_F(DiffDeleteTest, PrevKvNothing) {
  DeleteRangeRequest r = DelR(K("none"));
  r.set_prev_kv(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffDeleteTest, EmptyKey) {
  auto p = Both(DelR(""));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: key is not provided");
}

TEST_F(DiffDeleteTest, OneRevisionForManyKeys) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  const int64_t before = Revision();
  auto p = Both(DelR(K(""), End()));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.header().revision(), before + 1);
  RangeRequest r = Get(K(""), End());
  r.set_revision(before);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffDeleteTest, RecreateAfterDelete) {
  PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  DeleteBoth(K("a"));
  PutBoth(K("a"), "3");
  auto p = Both(Get(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs(0).version(), 1);
}

TEST_F(DiffDeleteTest, DeletedKeyVisibleAtOldRevisions) {
  const int64_t r1 = PutBoth(K("a"), "1");
  DeleteBoth(K("a"));
  const int64_t r3 = PutBoth(K("a"), "3");
  for (int64_t rev : {r1, r1 + 1, r3}) {
    RangeRequest g = Get(K("a"));
    g.set_revision(rev);
    EXPECT_SAME(Both(g)) << "at revision " << rev;
  }
}

TEST_F(DiffDeleteTest, KeyWithLease) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "1", lease);
  DeleteRangeRequest r = DelR(K("a"));
  r.set_prev_kv(true);
  EXPECT_SAME(Both(r));
}

// ===========================================================================
// KV and leases

class DiffLeaseKvTest : public DiffKvTest {};

TEST_F(DiffLeaseKvTest, RevokeDeletesAttachedKeysInOneRevision) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "1", lease);
  PutBoth(K("b"), "2", lease);
  PutBoth(K("c"), "3");
  const int64_t rev = Revision();
  LeaseRevokeRequest r;
  r.set_id(lease);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  EXPECT_EQ(Revision(), rev + 1);
  EXPECT_SAME(Both(Get(K(""), End())));
  EXPECT_SAME(Both(GetAll(rev)));
}

TEST_F(DiffLeaseKvTest, RevokeWithoutKeysKeepsRevision) {
  const int64_t lease = GrantBoth(600, LeaseId());
  const int64_t rev = Revision();
  LeaseRevokeRequest r;
  r.set_id(lease);
  EXPECT_SAME(Both(r));
  EXPECT_EQ(Revision(), rev);
}

TEST_F(DiffLeaseKvTest, RevokeUnknownLease) {
  LeaseRevokeRequest r;
  r.set_id(0x7e5e);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: requested lease not found");
}

TEST_F(DiffLeaseKvTest, PutAfterRevokeFails) {
  const int64_t lease = GrantBoth(600, LeaseId());
  LeaseRevokeRequest r;
  r.set_id(lease);
  ASSERT_SAME(Both(r));
  EXPECT_SAME(Both(PutR(K("a"), "1", lease)));
}

TEST_F(DiffLeaseKvTest, GrantExistingId) {
  const int64_t lease = GrantBoth(600, LeaseId());
  LeaseGrantRequest g;
  g.set_id(lease);
  g.set_ttl(600);
  auto p = Both(g);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: lease already exists");
}

TEST_F(DiffLeaseKvTest, GrantTtlTooLarge) {
  LeaseGrantRequest g;
  g.set_id(LeaseId());
  g.set_ttl(int64_t{9000000001});
  auto p = Both(g);
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: too large lease TTL");
}

TEST_F(DiffLeaseKvTest, GrantTtlBelowMinimumIsRaised) {
  LeaseGrantRequest g;
  g.set_id(LeaseId());
  g.set_ttl(1);
  auto p = Both(g);
  EXPECT_SAME(p);
}

TEST_F(DiffLeaseKvTest, TxnPutsWithLeaseThenRevoke) {
  const int64_t lease = GrantBoth(600, LeaseId());
  EXPECT_SAME(Both(Txn({}, {Op(PutR(K("a"), "1", lease)), Op(PutR(K("b"), "2", lease))})));
  DeleteRangeRequest del = DelR(K("a"));
  EXPECT_SAME(Both(del));
  LeaseRevokeRequest r;
  r.set_id(lease);
  EXPECT_SAME(Both(r));
  EXPECT_SAME(Both(Get(K(""), End())));
}

TEST_F(DiffLeaseKvTest, CompareLeaseAfterDetach) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "1", lease);
  PutBoth(K("a"), "2");
  EXPECT_SAME(Both(Txn({Cmp(K("a"), Compare::LEASE, Compare::EQUAL, 0)}, {Op(Get(K("a")))},
                       {Op(PutR(K("b"), "x"))})));
}

}  // namespace
}  // namespace capstan::testing
