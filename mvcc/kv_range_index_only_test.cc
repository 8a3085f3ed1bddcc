// keys_only and count_only Ranges answered from the key index: the same bytes
// as a Range that reads every record and drops its value, with no record read
// (the test backend counts, and can forbid, reads of the key family), except
// for a keys_only key read at a revision before its lease last changed.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "etcdserverpb/rpc.pb.h"
#include "gtest/gtest.h"
#include "lease/clock.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "mvcc/test_backend.h"

namespace capstan::mvcc {
namespace {

using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;

constexpr int64_t kLeaseA = 0x1111;
constexpr int64_t kLeaseB = 0x7fff000022223333;  // a 9-byte varint

struct StringSink : ByteSink {
  void Append(std::string_view bytes) override { out.append(bytes); }
  std::string out;
};

class IndexOnlyRangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-kvio-XXXXXX";
    dir_ = mkdtemp(tmpl);
    Reopen();
    Grant(kLeaseA);
    Grant(kLeaseB);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Reopen() {
    store_.reset();
    backend_ = nullptr;
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    bo.block_cache_bytes = 8 << 20;
    bo.write_buffer_bytes = 8 << 20;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto test_backend = std::make_unique<TestBackend>(std::move(*backend));
    backend_ = test_backend.get();
    KvStoreOptions options;
    options.lease_clock = &clock_;  // leases never expire
    auto store = KvStore::Open(options, std::move(test_backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  void Grant(int64_t id) {
    etcdserverpb::LeaseGrantRequest req;
    req.set_id(id);
    req.set_ttl(3600);
    ASSERT_TRUE(store_->LeaseGrant(req).ok());
  }

  int64_t Put(const std::string& k, int64_t lease, size_t value_size = 100) {
    etcdserverpb::PutRequest req;
    req.set_key(k);
    req.set_value(std::string(value_size, 'v'));
    req.set_lease(lease);
    auto resp = store_->Put(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }

  int64_t Delete(const std::string& k) {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(k);
    auto resp = store_->DeleteRange(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }

  void Compact(int64_t rev) {
    etcdserverpb::CompactionRequest req;
    req.set_revision(rev);
    req.set_physical(true);
    ASSERT_TRUE(store_->Compact(req).ok());
    store_->WaitCompactionDone();
  }

  // The kvs a Range that reads every record returns for req, values
  // dropped, encoded as kvs_wire is; and its count and more.
  RangeResult Expected(RangeRequest req) {
    req.set_keys_only(false);
    RangeResult full;
    EXPECT_TRUE(store_->Range(req, &full).ok());
    RangeResponse parsed;
    EXPECT_TRUE(parsed.ParseFromString(full.kvs_wire));
    for (auto& kv : *parsed.mutable_kvs()) kv.clear_value();
    RangeResult want;
    want.count = full.count;
    want.more = full.more;
    want.num_kvs = full.num_kvs;
    want.kvs_wire = parsed.SerializeAsString();
    return want;
  }

  // Checks the keys_only Range of req against Expected, with the key family
  // read `reads` times (0: with such reads forbidden).
  void ExpectKeysOnly(RangeRequest req, int64_t reads, const std::string& ctx) {
    SCOPED_TRACE(ctx + ": " + req.ShortDebugString());
    const RangeResult want = Expected(req);
    req.set_keys_only(true);
    backend_->key_reads = 0;
    backend_->fail_key_reads = reads == 0;
    RangeResult got;
    const absl::Status s = store_->Range(req, &got);
    backend_->fail_key_reads = false;
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(backend_->key_reads.load(), reads);
    EXPECT_EQ(got.count, want.count);
    EXPECT_EQ(got.more, want.more);
    EXPECT_EQ(got.num_kvs, want.num_kvs);
    EXPECT_TRUE(got.kvs_wire == want.kvs_wire)
        << "got " << got.kvs_wire.size() << " bytes, want " << want.kvs_wire.size();

    // The same bytes into a caller's sink.
    StringSink sink;
    RangeResult sunk;
    sunk.kvs_sink = &sink;
    ASSERT_TRUE(store_->Range(req, &sunk).ok());
    EXPECT_TRUE(sink.out == want.kvs_wire);
    EXPECT_TRUE(sunk.kvs_wire.empty());
  }

  // count_only at req's revision reads nothing and counts what a full Range
  // counts.
  void ExpectCountOnly(RangeRequest req, const std::string& ctx) {
    SCOPED_TRACE(ctx + ": " + req.ShortDebugString());
    const RangeResult want = Expected(req);
    req.set_count_only(true);
    backend_->key_reads = 0;
    backend_->fail_key_reads = true;
    RangeResult got;
    const absl::Status s = store_->Range(req, &got);
    backend_->fail_key_reads = false;
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(backend_->key_reads.load(), 0);
    EXPECT_EQ(got.count, want.count);
    EXPECT_EQ(got.num_kvs, 0);
    EXPECT_TRUE(got.kvs_wire.empty());
  }

  static RangeRequest All(int64_t rev = 0) {
    RangeRequest req;
    req.set_key("k");
    req.set_range_end("l");
    req.set_revision(rev);
    return req;
  }

  static std::string Key(int i) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "k%05d", i);
    return buf;
  }

  std::string dir_;
  lease::ManualClock clock_;
  TestBackend* backend_ = nullptr;  // owned by store_
  std::unique_ptr<KvStore> store_;
};

// Many keys (several fetch chunks), some with leases, read at the current
// revision with every option a keys_only Range may take: no record read.
TEST_F(IndexOnlyRangeTest, ManyKeysReadNoRecord) {
  constexpr int kKeys = 1500;
  for (int i = 0; i < kKeys; ++i) {
    Put(Key(i), i % 3 == 0 ? kLeaseA : i % 5 == 0 ? kLeaseB : 0, static_cast<size_t>(i % 300));
  }
  for (int i = 0; i < kKeys; i += 7) Put(Key(i), i % 2 == 0 ? kLeaseB : 0);  // versions, leases
  for (int i = 3; i < kKeys; i += 11) Delete(Key(i));
  const int64_t mid = Put("k-mid", kLeaseA);

  ExpectKeysOnly(All(), 0, "all");
  ExpectCountOnly(All(), "all");
  RangeRequest single;
  single.set_key(Key(21));
  ExpectKeysOnly(single, 0, "one key");
  RangeRequest missing;
  missing.set_key("nope");
  ExpectKeysOnly(missing, 0, "missing key");
  RangeRequest from_key = All();
  from_key.set_range_end(std::string(1, '\0'));
  ExpectKeysOnly(from_key, 0, "from key");

  for (int64_t limit : {1, 511, 512, 513, 700, kKeys - 1, kKeys + 10}) {
    RangeRequest req = All();
    req.set_limit(limit);
    ExpectKeysOnly(req, 0, "limit " + std::to_string(limit));
  }
  const RangeRequest::SortTarget targets[] = {RangeRequest::KEY, RangeRequest::VERSION,
                                              RangeRequest::CREATE, RangeRequest::MOD};
  const RangeRequest::SortOrder orders[] = {RangeRequest::NONE, RangeRequest::ASCEND,
                                            RangeRequest::DESCEND};
  for (auto target : targets) {
    for (auto order : orders) {
      RangeRequest req = All();
      req.set_sort_target(target);
      req.set_sort_order(order);
      req.set_limit(order == RangeRequest::NONE ? 0 : 600);
      ExpectKeysOnly(req, 0, "sorted");
    }
  }
  RangeRequest filtered = All();
  filtered.set_min_mod_revision(mid - 300);
  ExpectKeysOnly(filtered, 0, "min mod");
  filtered = All();
  filtered.set_max_create_revision(700);
  filtered.set_min_create_revision(100);
  filtered.set_sort_target(RangeRequest::MOD);
  filtered.set_sort_order(RangeRequest::DESCEND);
  filtered.set_limit(50);
  ExpectKeysOnly(filtered, 0, "create window, sorted, limited");
  filtered = All();
  filtered.set_max_mod_revision(mid - 1000);
  ExpectKeysOnly(filtered, 0, "max mod");

  // A big read offered to the bulk threads is not split: it reads nothing.
  ParallelRead parallel;
  parallel.part_records = 100;
  parallel.new_sink = [] { return std::make_unique<StringSink>(); };
  parallel.run = [](std::function<void()> task) { task(); };
  RangeRequest req = All();
  req.set_keys_only(true);
  RangeResult split;
  split.parallel = &parallel;
  backend_->fail_key_reads = true;
  ASSERT_TRUE(store_->Range(req, &split).ok());
  backend_->fail_key_reads = false;
  EXPECT_TRUE(split.kvs_parts.empty());
  EXPECT_TRUE(split.kvs_wire == Expected(req).kvs_wire);

  // Sorting by value needs the values: every record is read.
  RangeRequest by_value = All();
  by_value.set_sort_target(RangeRequest::VALUE);
  by_value.set_sort_order(RangeRequest::DESCEND);
  by_value.set_limit(20);
  ExpectKeysOnly(by_value, Expected(by_value).count, "by value");
}

// One key's lease attached, detached, changed and kept, across a delete:
// every historical revision returns the lease of the put it reads; a record
// is read only for a revision before the lease last changed.
TEST_F(IndexOnlyRangeTest, LeaseHistoryAtEveryRevision) {
  const int64_t r1 = Put("k1", kLeaseA);
  const int64_t r2 = Put("k1", 0);  // detached
  const int64_t r3 = Put("k1", kLeaseB);
  const int64_t r4 = Put("k1", kLeaseB);
  const int64_t r5 = Delete("k1");
  const int64_t r6 = Put("k1", kLeaseB);  // re-created with the same lease
  const int64_t r7 = Put("k2", 0);        // never leased
  struct Case {
    int64_t rev;
    int64_t reads;
  };
  for (const Case& c : {Case{r1, 1}, Case{r2, 1}, Case{r3, 0}, Case{r4, 0}, Case{r5, 0},
                        Case{r6, 0}, Case{r7, 0}, Case{0, 0}}) {
    ExpectKeysOnly(All(c.rev), c.reads, "at " + std::to_string(c.rev));
    ExpectCountOnly(All(c.rev), "at " + std::to_string(c.rev));
  }
  // Back to no lease: only the revisions before r8 are read from records.
  const int64_t r8 = Put("k1", 0);
  ExpectKeysOnly(All(r8), 0, "detached again");
  ExpectKeysOnly(All(r6), 1, "before detaching");
  ExpectKeysOnly(All(r2), 1, "no lease, but before the lease changed");

  // After a restart the index is rebuilt from the records, leases included.
  Reopen();
  ExpectKeysOnly(All(), 0, "reopened");
  ExpectKeysOnly(All(r6), 1, "reopened, before detaching");
}

// Many keys whose lease changed since: a historical read reads each of their
// records (in chunks), the current one none.
TEST_F(IndexOnlyRangeTest, ManyKeysDetachedSince) {
  constexpr int kKeys = 1200;
  for (int i = 0; i < kKeys; ++i) Put(Key(i), kLeaseA, 64);
  const int64_t leased = Put("k-last", 0);
  for (int i = 0; i < kKeys; i += 2) Put(Key(i), 0, 64);  // half detached
  ExpectKeysOnly(All(), 0, "current");
  ExpectKeysOnly(All(leased), kKeys / 2, "before the detach");
  RangeRequest limited = All(leased);
  limited.set_limit(100);
  ExpectKeysOnly(limited, 50, "before the detach, limited");
  RangeRequest sorted = All(leased);
  sorted.set_sort_target(RangeRequest::CREATE);
  sorted.set_sort_order(RangeRequest::DESCEND);
  sorted.set_limit(10);  // the 10 newest: k-last and 9 keys, 5 of them detached since
  ExpectKeysOnly(sorted, 4, "before the detach, newest first");
  ExpectCountOnly(All(leased), "before the detach");
}

// After a compaction the kept revisions read as before; a restart rebuilds
// the lease marks from what compaction kept.
TEST_F(IndexOnlyRangeTest, AfterCompactionAndRestart) {
  Put("k1", kLeaseA);
  const int64_t r2 = Put("k1", 0);
  Put("k2", kLeaseB);
  const int64_t r4 = Put("k1", kLeaseB);
  Put("k3", kLeaseA);
  Delete("k3");
  const int64_t r7 = Put("k2", kLeaseB);
  Compact(r2);
  ExpectKeysOnly(All(r2), 1, "at the compaction revision");
  ExpectKeysOnly(All(r4), 0, "after it");
  ExpectCountOnly(All(r2), "at the compaction revision");
  Compact(r4 + 1);
  ExpectKeysOnly(All(r4 + 1), 0, "compacted again");
  ExpectKeysOnly(All(r7), 0, "current");
  Reopen();
  ExpectKeysOnly(All(r4 + 1), 0, "reopened, at the compaction revision");
  ExpectKeysOnly(All(), 0, "reopened");
  ExpectCountOnly(All(r4 + 1), "reopened");
}

// A keys_only Range inside a txn sees the txn's own puts, leases included.
TEST_F(IndexOnlyRangeTest, InsideTxn) {
  Put("k1", kLeaseA);
  etcdserverpb::TxnRequest txn;
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key("k2");
  put->set_value("v");
  put->set_lease(kLeaseB);
  auto* range = txn.add_success()->mutable_request_range();
  range->set_key("k");
  range->set_range_end("l");
  range->set_keys_only(true);
  backend_->fail_key_reads = true;
  auto resp = store_->Txn(txn);
  backend_->fail_key_reads = false;
  ASSERT_TRUE(resp.ok()) << resp.status();
  const RangeResponse& got = resp->responses(1).response_range();
  ASSERT_EQ(got.kvs_size(), 2);
  EXPECT_EQ(got.kvs(0).lease(), kLeaseA);
  EXPECT_EQ(got.kvs(1).lease(), kLeaseB);
  EXPECT_EQ(got.kvs(1).version(), 1);
  EXPECT_TRUE(got.kvs(1).value().empty());
  ExpectKeysOnly(All(), 0, "after the txn");
}

// The codec's keys_only KeyValue is the stored record without its value.
TEST(KeysOnlyCodecTest, EqualsTheStrippedRecord) {
  for (int64_t lease : {int64_t{0}, int64_t{1}, kLeaseB, int64_t{-1}}) {
    for (int64_t version : {int64_t{1}, int64_t{300}}) {
      KeyValueView kv;
      kv.key = "/registry/pods/default/p";
      kv.create_revision = 5;
      kv.mod_revision = 1 << 20;
      kv.version = version;
      kv.value = "some value";
      kv.lease = lease;
      std::string want, got;
      AppendRecordField(2, EncodeKeyValue(kv), /*strip_value=*/true, &want);
      AppendKeysOnlyField(2, kv, &got);
      EXPECT_EQ(got, want) << lease << " " << version;
    }
  }
}

}  // namespace
}  // namespace capstan::mvcc
