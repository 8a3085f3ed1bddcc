// Differential tests of KV.Compact and of the request size limit.
//
// Compaction is global per server, so every case here works relative to the
// revisions of its own writes and compacts at or above them.

#include <string>

#include "diff_kv.h"

namespace capstan::testing {
namespace {

constexpr char kCompacted[] = "etcdserver: mvcc: required revision has been compacted";
constexpr char kFutureRev[] = "etcdserver: mvcc: required revision is a future revision";

CompactionRequest Compaction(int64_t rev, bool physical = false) {
  CompactionRequest c;
  c.set_revision(rev);
  c.set_physical(physical);
  return c;
}

RangeRequest GetAt(const std::string& key, const std::string& end, int64_t rev) {
  RangeRequest r = Get(key, end);
  r.set_revision(rev);
  return r;
}

class DiffCompactTest : public DiffKvTest {};

TEST_F(DiffCompactTest, CompactCurrentRevision) {
  PutBoth(K("a"), "1");
  const int64_t rev = PutBoth(K("a"), "2");
  auto p = Both(Compaction(rev));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  EXPECT_EQ(p.etcd.resp.header().revision(), rev);
}

TEST_F(DiffCompactTest, CompactPhysical) {
  PutBoth(K("a"), "1");
  const int64_t rev = PutBoth(K("a"), "2");
  PutBoth(K("a"), "3");
  auto p = Both(Compaction(rev, /*physical=*/true));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  EXPECT_SAME(Both(GetAt(K("a"), "", rev)));
  EXPECT_SAME(Both(GetAt(K("a"), "", rev - 1)));
}

// keys_only Ranges (answered from the key index) after a compaction: a
// leased key detached before it and re-leased after it.
TEST_F(DiffCompactTest, KeysOnlyAfterCompaction) {
  const int64_t lease = GrantBoth(600, LeaseId());
  PutBoth(K("a"), "1", lease);
  const int64_t detached = PutBoth(K("a"), "2");
  PutBoth(K("b"), "1", lease);
  const int64_t released = PutBoth(K("a"), "3", lease);
  ASSERT_SAME(Both(Compaction(detached, /*physical=*/true)));
  for (int64_t rev : {detached, released, int64_t{0}}) {
    RangeRequest r = GetAt(K("a"), K("c"), rev);
    r.set_keys_only(true);
    EXPECT_SAME(Both(r)) << "at " << rev;
    r.set_keys_only(false);
    r.set_count_only(true);
    EXPECT_SAME(Both(r)) << "at " << rev;
  }
}

TEST_F(DiffCompactTest, RangeBelowCompactedRevision) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  ASSERT_SAME(Both(Compaction(r2)));
  auto p = Both(GetAt(K("a"), "", r1));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(p.etcd.status.error_message(), kCompacted);
}

TEST_F(DiffCompactTest, RangeAtExactlyCompactedRevision) {
  PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  PutBoth(K("a"), "3");
  ASSERT_SAME(Both(Compaction(r2)));
  auto p = Both(GetAt(K("a"), "", r2));
  EXPECT_SAME(p);
  ASSERT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  EXPECT_EQ(p.etcd.resp.kvs(0).value(), "2");
}

TEST_F(DiffCompactTest, RangeAboveCompactedRevision) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("b"), "2");
  PutBoth(K("a"), "3");
  ASSERT_SAME(Both(Compaction(r1)));
  EXPECT_SAME(Both(GetAt(K(""), End(), r1 + 1)));
}

TEST_F(DiffCompactTest, RangeCountOnlyBelowCompacted) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("b"), "2");
  ASSERT_SAME(Both(Compaction(r2)));
  RangeRequest r = GetAt(K(""), End(), r1);
  r.set_count_only(true);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffCompactTest, RangeCurrentAfterCompaction) {
  Seed({{"a", "1"}, {"b", "2"}, {"a", "3"}});
  const int64_t rev = Revision();
  ASSERT_SAME(Both(Compaction(rev)));
  EXPECT_SAME(Both(Get(K(""), End())));
  EXPECT_SAME(Both(GetAt(K(""), End(), 0)));
}

TEST_F(DiffCompactTest, HistoryKeptAcrossCompaction) {
  // create_revision and version survive the compaction of older revisions.
  PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  const int64_t r3 = PutBoth(K("a"), "3");
  PutBoth(K("a"), "4");
  ASSERT_SAME(Both(Compaction(r3, true)));
  auto p = Both(Get(K("a")));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs(0).version(), 4);
  EXPECT_SAME(Both(GetAt(K("a"), "", r3)));
}

TEST_F(DiffCompactTest, DeletedKeyGoneAfterCompaction) {
  PutBoth(K("a"), "1");
  PutBoth(K("b"), "1");
  DeleteBoth(K("a"));
  const int64_t rev = Revision();
  ASSERT_SAME(Both(Compaction(rev, true)));
  EXPECT_SAME(Both(GetAt(K(""), End(), rev)));
  EXPECT_SAME(Both(Get(K(""), End())));
  // Recreated after its tombstone was compacted: a new generation.
  PutBoth(K("a"), "again");
  EXPECT_SAME(Both(Get(K("a"))));
}

TEST_F(DiffCompactTest, CompactTwiceSameRevision) {
  const int64_t rev = PutBoth(K("a"), "1");
  ASSERT_SAME(Both(Compaction(rev)));
  auto p = Both(Compaction(rev));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(p.etcd.status.error_message(), kCompacted);
}

TEST_F(DiffCompactTest, CompactOlderRevision) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  ASSERT_SAME(Both(Compaction(r2)));
  auto p = Both(Compaction(r1));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffCompactTest, CompactPhysicalTwice) {
  const int64_t rev = PutBoth(K("a"), "1");
  ASSERT_SAME(Both(Compaction(rev, true)));
  EXPECT_SAME(Both(Compaction(rev, true)));
}

TEST_F(DiffCompactTest, CompactFutureRevision) {
  const int64_t rev = PutBoth(K("a"), "1");
  auto p = Both(Compaction(rev + 1));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(p.etcd.status.error_message(), kFutureRev);
}

TEST_F(DiffCompactTest, CompactFarFutureRevision) {
  PutBoth(K("a"), "1");
  EXPECT_SAME(Both(Compaction(int64_t{1} << 60, true)));
}

TEST_F(DiffCompactTest, CompactZeroAfterCompaction) {
  const int64_t rev = PutBoth(K("a"), "1");
  ASSERT_SAME(Both(Compaction(rev)));
  EXPECT_SAME(Both(Compaction(0)));
}

TEST_F(DiffCompactTest, CompactNegativeAfterCompaction) {
  const int64_t rev = PutBoth(K("a"), "1");
  ASSERT_SAME(Both(Compaction(rev)));
  EXPECT_SAME(Both(Compaction(-3)));
}

TEST_F(DiffCompactTest, CompactDoesNotChangeRevision) {
  const int64_t rev = PutBoth(K("a"), "1");
  ASSERT_SAME(Both(Compaction(rev)));
  EXPECT_EQ(Revision(), rev);
  const int64_t next = PutBoth(K("a"), "2");
  EXPECT_EQ(next, rev + 1);
}

TEST_F(DiffCompactTest, TxnRangeBelowCompacted) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  ASSERT_SAME(Both(Compaction(r2)));
  auto p = Both(Txn({}, {Op(GetAt(K("a"), "", r1)), Op(PutR(K("b"), "1"))}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), kCompacted);
}

TEST_F(DiffCompactTest, TxnComparesAfterCompaction) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  ASSERT_SAME(Both(Compaction(r2, true)));
  auto p = Both(Txn({Cmp(K("a"), Compare::CREATE, Compare::EQUAL, r1),
                     Cmp(K("a"), Compare::VERSION, Compare::EQUAL, 2)},
                    {Op(Get(K("a")))}));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.resp.succeeded());
}

// --- Request size ----------------------------------------------------------
// etcd's default --max-request-bytes is 1.5 MiB; its gRPC server accepts
// messages up to that plus 512 KiB, so bigger requests fail in gRPC itself.

TEST_F(DiffCompactTest, PutJustUnderRequestLimit) {
  auto p = Both(PutR(K("a"), std::string(1400 * 1024, 'v')));
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
}

TEST_F(DiffCompactTest, PutTooLarge) {
  const int64_t rev = Revision();
  auto p = Both(PutR(K("a"), std::string(1536 * 1024 + 1024, 'v')));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: request is too large");
  EXPECT_EQ(Revision(), rev);
}

TEST_F(DiffCompactTest, TxnTooLarge) {
  const std::string v(800 * 1024, 'v');
  auto p = Both(Txn({}, {Op(PutR(K("a"), v)), Op(PutR(K("b"), v))}));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.status.error_message(), "etcdserver: request is too large");
}

TEST_F(DiffCompactTest, PutAboveGrpcLimit) {
  // Rejected by gRPC before etcd sees it (2 MiB = 1.5 MiB + 512 KiB).
  // The texts differ by gRPC implementation: Go's "grpc: received message
  // larger than max (A vs. B)" against C++'s "Received message larger than
  // max (A vs. B)" (docs/COMPATIBILITY.md). Code and sizes must agree.
  auto p = Both(PutR(K("a"), std::string(2560 * 1024, 'v')));
  EXPECT_EQ(p.etcd.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(p.capstan.status.error_code(), p.etcd.status.error_code());
  const std::string& want = p.etcd.status.error_message();
  const std::string sizes = want.substr(want.find("larger than max"));
  EXPECT_NE(p.capstan.status.error_message().find(sizes), std::string::npos)
      << "etcd: " << want << "\ncapstan: " << p.capstan.status.error_message();
}

TEST_F(DiffCompactTest, RangeResponseAboveRequestLimit) {
  // Responses are not limited by --max-request-bytes.
  const std::string v(1024 * 1024, 'v');
  PutBoth(K("a"), v);
  PutBoth(K("b"), v);
  auto p = Both(Get(K(""), End()));
  EXPECT_SAME(p);
  EXPECT_EQ(p.etcd.resp.kvs_size(), 2);
}

TEST_F(DiffCompactTest, RangeRequestWithHugeKeyTooLarge) {
  EXPECT_SAME(Both(Get(K(std::string(1600 * 1024, 'k')))));
}

}  // namespace
}  // namespace capstan::testing
