#include "mvcc/kv_store.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <functional>
#include <string_view>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store_test_fixture.h"
#include "mvcc/revision_key.h"

namespace capstan::mvcc {
namespace {

using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;

class KvStoreTest : public KvStoreInTempDir {
 protected:
  // Puts "key0".."key<n-1>", value i of i % 97 bytes, one revision each.
  void PutNumberedKeys(int n) {
    for (int i = 0; i < n; ++i) {
      Put("key" + std::to_string(i), std::string(static_cast<size_t>(i % 97), 'v'));
    }
  }

  RangeResponse Get(const std::string& k, const std::string& end = "", int64_t rev = 0,
                    absl::Status* status = nullptr) {
    RangeRequest req;
    req.set_key(k);
    req.set_range_end(end);
    req.set_revision(rev);
    RangeResult result;
    absl::Status s = store_->Range(req, &result);
    if (status) *status = s;
    RangeResponse resp;
    if (!s.ok()) return resp;
    EXPECT_TRUE(resp.ParseFromString(result.kvs_wire));
    resp.set_count(result.count);
    resp.set_more(result.more);
    resp.mutable_header()->set_revision(result.rev);
    return resp;
  }

};

TEST_F(KvStoreTest, PutAssignsRevisionsAndVersions) {
  EXPECT_EQ(Put("a", "1"), 2);  // the store starts at revision 1
  EXPECT_EQ(Put("a", "2"), 3);
  EXPECT_EQ(Put("b", "x"), 4);
  auto r = Get("a");
  ASSERT_EQ(r.kvs_size(), 1);
  EXPECT_EQ(r.kvs(0).value(), "2");
  EXPECT_EQ(r.kvs(0).create_revision(), 2);
  EXPECT_EQ(r.kvs(0).mod_revision(), 3);
  EXPECT_EQ(r.kvs(0).version(), 2);
  EXPECT_EQ(r.header().revision(), 4);
  auto old = Get("a", "", 2);
  ASSERT_EQ(old.kvs_size(), 1);
  EXPECT_EQ(old.kvs(0).value(), "1");
}

TEST_F(KvStoreTest, FutureAndCompactedRevisions) {
  Put("a", "1");
  Put("a", "2");
  Put("a", "3");
  absl::Status s;
  Get("a", "", 10, &s);
  EXPECT_TRUE(Is(s, Error::kFutureRev)) << s;
  etcdserverpb::CompactionRequest creq;
  creq.set_revision(3);
  creq.set_physical(true);
  ASSERT_TRUE(store_->Compact(creq).ok());
  Get("a", "", 2, &s);
  EXPECT_TRUE(Is(s, Error::kCompacted)) << s;
  auto at = Get("a", "", 3, &s);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(at.kvs_size(), 1);
  EXPECT_EQ(at.kvs(0).value(), "2");
  EXPECT_TRUE(Is(store_->Compact(creq).status(), Error::kCompacted));
  creq.set_revision(100);
  EXPECT_TRUE(Is(store_->Compact(creq).status(), Error::kFutureRev));
}

// etcd 3.5.16 keeps the tombstone at the compaction revision, in the index
// and in the key family, until the next compaction; reads at that revision
// still find no key, and hashes leave it out.
TEST_F(KvStoreTest, CompactionKeepsTheTombstoneAtItsRevision) {
  Put("a", "1");                                            // 2
  Put("b", "1");                                            // 3
  etcdserverpb::DeleteRangeRequest d;
  d.set_key("a");
  ASSERT_TRUE(store_->DeleteRange(d).ok());                 // 4
  Put("b", "2");                                            // 5
  uint32_t before;
  int64_t compact_rev, hash_rev;
  ASSERT_TRUE(store_->HashKV(4, &before, &compact_rev, &hash_rev).ok());
  etcdserverpb::CompactionRequest creq;
  creq.set_revision(4);
  creq.set_physical(true);
  ASSERT_TRUE(store_->Compact(creq).ok());
  EXPECT_EQ(StoredRevisions(), (std::vector<std::string>{"3", "4t", "5"}));
  absl::Status s;
  EXPECT_EQ(Get("a", "", 4, &s).kvs_size(), 0);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Get("a", std::string(1, '\0'), 4).count(), 1);
  // The hash the compaction stored: every revision up to 4, none compacted
  // before it.
  uint32_t at4;
  ASSERT_TRUE(store_->HashKV(4, &at4, &compact_rev, &hash_rev).ok());
  EXPECT_EQ(at4, before);
  EXPECT_EQ(compact_rev, -1);
  // A restart keeps the record (the index does not hold a tombstone whose
  // key history is gone, as etcd's restore).
  Reopen();
  EXPECT_EQ(StoredRevisions(), (std::vector<std::string>{"3", "4t", "5"}));
  EXPECT_EQ(Get("a", "", 4).kvs_size(), 0);
  // The next compaction removes it.
  creq.set_revision(5);
  ASSERT_TRUE(store_->Compact(creq).ok());
  EXPECT_EQ(StoredRevisions(), (std::vector<std::string>{"5"}));
}

// A txn that deletes a range ending at "\0" may put a key of that range
// again: compacting at its revision keeps the new value (etcd 3.5.16 loses
// it and then dies on the next read, etcd-io/etcd#22376).
TEST_F(KvStoreTest, CompactionKeepsAKeyRecreatedInItsRevision) {
  Put("f", "old");                                          // 2
  etcdserverpb::TxnRequest txn;
  auto* del = txn.add_success()->mutable_request_delete_range();
  del->set_key("b");
  del->set_range_end(std::string(1, '\0'));
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key("f");
  put->set_value("new");
  auto resp = store_->Txn(txn);
  ASSERT_TRUE(resp.ok()) << resp.status();
  const int64_t rev = resp->header().revision();            // 3
  etcdserverpb::CompactionRequest creq;
  creq.set_revision(rev);
  creq.set_physical(true);
  ASSERT_TRUE(store_->Compact(creq).ok());
  EXPECT_EQ(StoredRevisions(), (std::vector<std::string>{std::to_string(rev)}));
  for (int64_t at : {rev, int64_t{0}}) {
    auto got = Get("f", "", at);
    ASSERT_EQ(got.kvs_size(), 1) << at;
    EXPECT_EQ(got.kvs(0).value(), "new");
  }
  Reopen();
  auto got = Get("f");
  ASSERT_EQ(got.kvs_size(), 1);
  EXPECT_EQ(got.kvs(0).value(), "new");
}

TEST_F(KvStoreTest, DeleteRangeAndRecreate) {
  Put("a", "1");
  Put("b", "1");
  Put("c", "1");
  etcdserverpb::DeleteRangeRequest d;
  d.set_key("a");
  d.set_range_end("c");
  d.set_prev_kv(true);
  auto resp = store_->DeleteRange(d);
  ASSERT_TRUE(resp.ok());
  EXPECT_EQ(resp->deleted(), 2);
  EXPECT_EQ(resp->prev_kvs_size(), 2);
  EXPECT_EQ(resp->header().revision(), 5);
  auto none = store_->DeleteRange(d);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->deleted(), 0);
  EXPECT_EQ(none->header().revision(), 5);
  EXPECT_EQ(Get("a", std::string(1, '\0')).count(), 1);
  Put("a", "again");
  auto r = Get("a");
  ASSERT_EQ(r.kvs_size(), 1);
  EXPECT_EQ(r.kvs(0).create_revision(), 6);
  EXPECT_EQ(r.kvs(0).version(), 1);
}

TEST_F(KvStoreTest, TxnSeesItsOwnWritesAndUsesOneRevision) {
  Put("k", "v0");
  etcdserverpb::TxnRequest t;
  auto* c = t.add_compare();
  c->set_key("k");
  c->set_target(Compare::VALUE);
  c->set_result(Compare::EQUAL);
  c->set_value("v0");
  auto* p = t.add_success()->mutable_request_put();
  p->set_key("k");
  p->set_value("v1");
  auto* p2 = t.add_success()->mutable_request_put();
  p2->set_key("k2");
  p2->set_value("x");
  t.add_success()->mutable_request_range()->set_key("k");
  auto resp = store_->Txn(t);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_TRUE(resp->succeeded());
  EXPECT_EQ(resp->header().revision(), 3);
  ASSERT_EQ(resp->responses_size(), 3);
  const auto& rr = resp->responses(2).response_range();
  ASSERT_EQ(rr.kvs_size(), 1);
  EXPECT_EQ(rr.kvs(0).value(), "v1");
  EXPECT_EQ(rr.kvs(0).mod_revision(), 3);
  // Both puts share main revision 3 with sub revisions 0 and 1.
  auto k2 = Get("k2");
  ASSERT_EQ(k2.kvs_size(), 1);
  EXPECT_EQ(k2.kvs(0).mod_revision(), 3);
  // The compare now fails.
  auto again = store_->Txn(t);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->succeeded());
  EXPECT_EQ(again->header().revision(), 3);
}

TEST_F(KvStoreTest, TxnRejectsDuplicateKeysAndTooManyOps) {
  etcdserverpb::TxnRequest t;
  t.add_success()->mutable_request_put()->set_key("a");
  t.add_success()->mutable_request_put()->set_key("a");
  EXPECT_TRUE(Is(store_->Txn(t).status(), Error::kDuplicateKey));
  etcdserverpb::TxnRequest del;
  auto* d = del.add_success()->mutable_request_delete_range();
  d->set_key("a");
  d->set_range_end("c");
  del.add_success()->mutable_request_put()->set_key("b");
  EXPECT_TRUE(Is(store_->Txn(del).status(), Error::kDuplicateKey));
  etcdserverpb::TxnRequest many;
  for (int i = 0; i < 129; ++i) {
    many.add_success()->mutable_request_put()->set_key("k" + std::to_string(i));
  }
  EXPECT_TRUE(Is(store_->Txn(many).status(), Error::kTooManyOps));
  EXPECT_EQ(store_->Rev(), 1);
}

TEST_F(KvStoreTest, PutErrors) {
  etcdserverpb::PutRequest p;
  EXPECT_TRUE(Is(store_->Put(p).status(), Error::kEmptyKey));
  p.set_key("k");
  p.set_lease(42);
  EXPECT_TRUE(Is(store_->Put(p).status(), Error::kLeaseNotFound));
  p.set_lease(0);
  p.set_ignore_value(true);
  EXPECT_TRUE(Is(store_->Put(p).status(), Error::kKeyNotFound));
  p.set_value("v");
  EXPECT_TRUE(Is(store_->Put(p).status(), Error::kValueProvided));
}

TEST_F(KvStoreTest, StateSurvivesReopen) {
  Put("a", "1");
  Put("a", "2");
  Put("b", "1");
  etcdserverpb::DeleteRangeRequest d;
  d.set_key("b");
  ASSERT_TRUE(store_->DeleteRange(d).ok());
  etcdserverpb::CompactionRequest c;
  c.set_revision(3);
  c.set_physical(true);
  ASSERT_TRUE(store_->Compact(c).ok());
  Reopen();
  EXPECT_EQ(store_->Rev(), 5);
  EXPECT_EQ(store_->CompactRev(), 3);
  auto r = Get("a");
  ASSERT_EQ(r.kvs_size(), 1);
  EXPECT_EQ(r.kvs(0).version(), 2);
  EXPECT_EQ(r.kvs(0).create_revision(), 2);
  EXPECT_EQ(Get("b").kvs_size(), 0);
  EXPECT_EQ(Put("a", "3"), 6);
  EXPECT_EQ(Get("a").kvs(0).version(), 3);
}

TEST_F(KvStoreTest, LimitCountMoreAndSort) {
  for (int i = 0; i < 10; ++i) Put("key" + std::to_string(i), std::to_string(9 - i));
  RangeRequest req;
  req.set_key("key");
  req.set_range_end("kez");
  req.set_limit(3);
  RangeResult result;
  ASSERT_TRUE(store_->Range(req, &result).ok());
  EXPECT_EQ(result.count, 10);
  EXPECT_TRUE(result.more);
  EXPECT_EQ(result.num_kvs, 3);
  req.set_sort_target(RangeRequest::VALUE);
  req.set_sort_order(RangeRequest::ASCEND);
  ASSERT_TRUE(store_->Range(req, &result).ok());
  RangeResponse resp;
  ASSERT_TRUE(resp.ParseFromString(result.kvs_wire));
  ASSERT_EQ(resp.kvs_size(), 3);
  EXPECT_EQ(resp.kvs(0).key(), "key9");
  req.set_sort_order(static_cast<RangeRequest::SortOrder>(7));
  EXPECT_TRUE(Is(store_->Range(req, &result), Error::kInvalidSortOption));
}

// A sink that keeps every byte it is given.
struct StringSink : ByteSink {
  void Append(std::string_view bytes) override { out.append(bytes); }
  std::string out;
};

// A big read hands Range a sink; the bytes that reach it must be exactly the
// kvs_wire that Range builds without one, for every shape of request.
TEST_F(KvStoreTest, RangeIntoASinkWritesTheSameBytes) {
  PutNumberedKeys(1200);
  std::vector<RangeRequest> requests(6);
  for (auto& r : requests) {
    r.set_key("key");
    r.set_range_end("kez");
  }
  requests[1].set_limit(700);
  requests[2].set_keys_only(true);
  requests[3].set_sort_target(RangeRequest::VALUE);
  requests[3].set_sort_order(RangeRequest::DESCEND);
  requests[4].set_min_mod_revision(300);
  requests[5].set_revision(900);
  for (const auto& req : requests) {
    RangeResult plain;
    ASSERT_TRUE(store_->Range(req, &plain).ok());
    RangeResult sunk;
    StringSink sink;
    sunk.kvs_sink = &sink;
    ASSERT_TRUE(store_->Range(req, &sunk).ok());
    EXPECT_TRUE(sunk.kvs_wire.empty());
    EXPECT_EQ(sunk.num_kvs, plain.num_kvs) << req.ShortDebugString();
    EXPECT_EQ(sunk.count, plain.count);
    EXPECT_EQ(sunk.more, plain.more);
    EXPECT_GT(plain.kvs_wire.size(), 0u);
    EXPECT_TRUE(sink.out == plain.kvs_wire) << req.ShortDebugString();
  }
}

// A big read split into parts: whatever thread reads a part, and whether a
// helper comes at once, late (after the Range is over) or never, the parts
// hold exactly kvs_wire's bytes, in order (a keys_only read is not split).
TEST_F(KvStoreTest, RangeInPartsWritesTheSameBytes) {
  PutNumberedKeys(1200);
  std::vector<std::function<void()>> late;  // tasks run after the Range returned
  std::vector<std::thread> helpers;
  enum Helping { kAtOnce, kLate, kNever };
  for (Helping helping : {kAtOnce, kLate, kNever}) {
    ParallelRead parallel;
    parallel.part_records = 100;
    parallel.helpers = 2;
    parallel.new_sink = [] { return std::make_unique<StringSink>(); };
    parallel.run = [&](std::function<void()> task) {
      if (helping == kAtOnce) helpers.emplace_back(std::move(task));
      if (helping == kLate) late.push_back(std::move(task));
    };
    for (int variant = 0; variant < 3; ++variant) {
      RangeRequest req;
      req.set_key("key");
      req.set_range_end("kez");
      if (variant == 1) req.set_limit(777);
      if (variant == 2) req.set_keys_only(true);
      RangeResult plain;
      ASSERT_TRUE(store_->Range(req, &plain).ok());
      RangeResult split;
      split.parallel = &parallel;
      ASSERT_TRUE(store_->Range(req, &split).ok());
      for (auto& t : helpers) t.join();
      helpers.clear();
      for (auto& task : late) task();  // finds no part left
      late.clear();
      // A keys_only range reads no record: it is built from the index in
      // one piece, not in parts.
      EXPECT_EQ(split.kvs_wire.empty(), variant != 2);
      EXPECT_EQ(split.kvs_parts.size(), variant == 1 ? 8u : variant == 2 ? 0u : 12u);
      std::string joined = split.kvs_wire;
      for (const auto& part : split.kvs_parts) joined += static_cast<StringSink&>(*part).out;
      EXPECT_TRUE(joined == plain.kvs_wire) << req.ShortDebugString() << " helping " << helping;
      EXPECT_EQ(split.num_kvs, plain.num_kvs);
      EXPECT_EQ(split.count, plain.count);
      EXPECT_EQ(split.more, plain.more);
    }
  }
  // At most part_records records: not split.
  ParallelRead parallel;
  parallel.part_records = 5000;
  parallel.new_sink = [] { return std::make_unique<StringSink>(); };
  parallel.run = [](std::function<void()> task) { task(); };
  RangeRequest req;
  req.set_key("key");
  req.set_range_end("kez");
  RangeResult whole;
  whole.parallel = &parallel;
  ASSERT_TRUE(store_->Range(req, &whole).ok());
  EXPECT_TRUE(whole.kvs_parts.empty());
  EXPECT_EQ(whole.num_kvs, 1200);
}

// --backend-batch-interval lets a group grow for at most that long; a group
// that reaches --backend-batch-limit is committed at once. The first write
// arrives alone; the other three arrive while the committer waits for the
// group to fill. With an interval of an hour, a full group answered within
// the test's bound proves the committer woke for it.
TEST_F(KvStoreTest, FullGroupIsCommittedWithoutWaitingOutTheBatchInterval) {
  KvStoreOptions options;
  options.batch_limit = 4;
  options.batch_interval = absl::Hours(1);
  Reopen(options);
  std::promise<void> committer_waits;
  bool hooked = false;  // the hook runs on the committer, under its lock
  store_->TEST_SetGroupWaitHook([&] {
    if (!hooked) committer_waits.set_value();
    hooked = true;
  });
  std::vector<etcdserverpb::PutRequest> reqs(4);
  std::vector<etcdserverpb::PutResponse> resps(4);
  std::promise<void> all_done;
  std::atomic<int> done{0};
  auto submit = [&](int i) {
    reqs[i].set_key("k" + std::to_string(i));
    store_->Submit({PutOp{&reqs[i], &resps[i]}, [&](absl::Status s) {
                      EXPECT_TRUE(s.ok()) << s;
                      if (done.fetch_add(1) + 1 == 4) all_done.set_value();
                    }});
  };
  submit(0);
  committer_waits.get_future().wait();
  for (int i = 1; i < 4; ++i) submit(i);
  // The bound only limits how long a failure takes to show.
  const bool answered =
      all_done.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  if (!answered) store_.reset();  // answers the writes while their state lives
  ASSERT_TRUE(answered) << "a full group waited for --backend-batch-interval";
  EXPECT_EQ(store_->Rev(), 5);
  // One group: the four writes took consecutive revisions in submission order.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(resps[i].header().revision(), 2 + i);
}

}  // namespace
}  // namespace capstan::mvcc
