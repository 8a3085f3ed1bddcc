// Leases through the KV store: grants, attachments, revocations that delete
// keys in one revision, restarts and expiry. Every store runs on the test's
// lease::ManualClock: a lease expires when the test moves the clock past its
// deadline, never because time went by.

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lease/clock.h"
#include "lease/lessor.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"

namespace capstan::mvcc {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using lease::Lessor;

// ---------------------------------------------------------------------------
// Leases through the KV store.

// Collects the responses a watch stream hands out (one in flight; Pop
// after each).
class Collector {
 public:
  explicit Collector(std::shared_ptr<WatchStream> s) : stream_(std::move(s)) {
    stream_->SetDeliver([this](std::string m) {
      std::lock_guard<std::mutex> l(mu_);
      inflight_ = std::move(m);
      cv_.notify_all();
    });
  }
  ~Collector() { stream_->Close(); }
  WatchStream* stream() { return stream_.get(); }

  std::optional<etcdserverpb::WatchResponse> Next(milliseconds timeout = milliseconds(10000)) {
    std::string m;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (!cv_.wait_for(l, timeout, [this] { return inflight_.has_value(); })) return std::nullopt;
      m = std::move(*inflight_);
      inflight_.reset();
    }
    std::string next;
    if (stream_->Pop(&next)) {
      std::lock_guard<std::mutex> l(mu_);
      inflight_ = std::move(next);
    }
    etcdserverpb::WatchResponse resp;
    EXPECT_TRUE(resp.ParseFromString(m));
    return resp;
  }

  // Reads responses until n events arrived (a stream whose reader lags may
  // carry several revisions in one response). False if they did not.
  bool SkipEvents(int n) {
    while (n > 0) {
      auto resp = Next();
      if (!resp) return false;
      n -= resp->events_size();
    }
    return n == 0;
  }

 private:
  std::shared_ptr<WatchStream> stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::string> inflight_;
};

class LeaseStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-lease-XXXXXX";
    dir_ = mkdtemp(tmpl);
    Reopen();
  }
  void TearDown() override {
    Close();
    std::filesystem::remove_all(dir_);
  }
  void Close() {
    if (store_) store_->SetWatchHub(nullptr);
    if (hub_) hub_->Stop();
    store_.reset();
    collectors_.clear();
    hub_.reset();
  }
  // Opens the store again on the test's clock (options.lease_clock is
  // replaced).
  void Reopen(KvStoreOptions options = {}) {
    Close();
    options.lease_clock = &clock_;
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    bo.block_cache_bytes = 8 << 20;
    bo.write_buffer_bytes = 8 << 20;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto store = KvStore::Open(options, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  Collector* Watch(const std::string& key, const std::string& end) {
    if (!hub_) {
      hub_ = std::make_unique<WatchHub>(store_.get(), WatchHubOptions{});
      store_->SetWatchHub(hub_.get());
    }
    etcdserverpb::ResponseHeader h;
    collectors_.push_back(std::make_unique<Collector>(hub_->OpenStream(h)));
    etcdserverpb::WatchCreateRequest req;
    req.set_key(key);
    req.set_range_end(end);
    req.set_prev_kv(true);
    collectors_.back()->stream()->Create(req);
    auto created = collectors_.back()->Next();
    EXPECT_TRUE(created && created->created());
    return collectors_.back().get();
  }

  absl::StatusOr<etcdserverpb::LeaseGrantResponse> Grant(int64_t id, int64_t ttl) {
    etcdserverpb::LeaseGrantRequest req;
    req.set_id(id);
    req.set_ttl(ttl);
    return store_->LeaseGrant(req);
  }
  absl::StatusOr<etcdserverpb::LeaseRevokeResponse> Revoke(int64_t id) {
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(id);
    return store_->LeaseRevoke(req);
  }
  absl::StatusOr<etcdserverpb::PutResponse> Put(const std::string& k, const std::string& v,
                                                int64_t lease, bool ignore_lease = false) {
    etcdserverpb::PutRequest req;
    req.set_key(k);
    req.set_value(v);
    req.set_lease(lease);
    req.set_ignore_lease(ignore_lease);
    return store_->Put(req);
  }
  // The stored KeyValue of k, if it exists.
  std::optional<mvccpb::KeyValue> Get(const std::string& k) {
    etcdserverpb::RangeRequest req;
    req.set_key(k);
    RangeResult result;
    EXPECT_TRUE(store_->Range(req, &result).ok());
    etcdserverpb::RangeResponse resp;
    EXPECT_TRUE(resp.ParseFromString(result.kvs_wire));
    if (resp.kvs_size() == 0) return std::nullopt;
    return resp.kvs(0);
  }

  std::string dir_;
  // Declared before the store: it outlives every store the test opens.
  lease::ManualClock clock_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<WatchHub> hub_;
  std::vector<std::unique_ptr<Collector>> collectors_;
};

TEST_F(LeaseStoreTest, GrantPicksOrHonoursIdsAndClampsTtl) {
  const int64_t rev = store_->Rev();
  auto a = Grant(0, 60);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GT(a->id(), 0);
  EXPECT_EQ(a->ttl(), 60);
  EXPECT_EQ(a->header().revision(), rev);
  auto b = Grant(0, 60);
  ASSERT_TRUE(b.ok());
  EXPECT_GT(b->id(), 0);
  EXPECT_NE(a->id(), b->id());

  auto explicit_id = Grant(1234, 30);
  ASSERT_TRUE(explicit_id.ok());
  EXPECT_EQ(explicit_id->id(), 1234);
  EXPECT_TRUE(Is(Grant(1234, 30).status(), Error::kLeaseExists));
  EXPECT_TRUE(Is(Grant(a->id(), 30).status(), Error::kLeaseExists));

  auto short_ttl = Grant(55, 1);
  ASSERT_TRUE(short_ttl.ok());
  EXPECT_EQ(short_ttl->ttl(), Lessor::kMinTtlSeconds);
  EXPECT_EQ(store_->lessor()->Get(55, false)->granted_ttl, 2);
  auto zero_ttl = Grant(56, 0);
  ASSERT_TRUE(zero_ttl.ok());
  EXPECT_EQ(zero_ttl->ttl(), 2);
  EXPECT_TRUE(Is(Grant(57, Lessor::kMaxTtlSeconds + 1).status(), Error::kLeaseTtlTooLarge));
  EXPECT_FALSE(store_->lessor()->Exists(57));
  EXPECT_TRUE(Grant(58, Lessor::kMaxTtlSeconds).ok());

  EXPECT_EQ(store_->lessor()->size(), 6u);
  EXPECT_EQ(store_->Rev(), rev) << "a grant is not a revision";
}

TEST_F(LeaseStoreTest, PutAttachesIgnoreLeaseKeepsAndErrors) {
  ASSERT_TRUE(Grant(1, 60).ok());
  ASSERT_TRUE(Grant(2, 60).ok());
  ASSERT_TRUE(Put("a", "1", 1).ok());
  EXPECT_EQ(store_->lessor()->LeaseOf("a"), 1);
  EXPECT_EQ(Get("a")->lease(), 1);
  EXPECT_EQ(store_->lessor()->Get(1, true)->keys, std::vector<std::string>{"a"});

  // ignore_lease keeps the key's lease.
  ASSERT_TRUE(Put("a", "2", 0, /*ignore_lease=*/true).ok());
  EXPECT_EQ(store_->lessor()->LeaseOf("a"), 1);
  EXPECT_EQ(Get("a")->lease(), 1);
  EXPECT_EQ(Get("a")->value(), "2");
  // A put with another lease moves the key.
  ASSERT_TRUE(Put("a", "3", 2).ok());
  EXPECT_EQ(store_->lessor()->LeaseOf("a"), 2);
  EXPECT_TRUE(store_->lessor()->Get(1, true)->keys.empty());
  // A put without a lease detaches it.
  ASSERT_TRUE(Put("a", "4", 0).ok());
  EXPECT_EQ(store_->lessor()->LeaseOf("a"), 0);
  EXPECT_EQ(Get("a")->lease(), 0);
  EXPECT_TRUE(store_->lessor()->Get(2, true)->keys.empty());

  const int64_t rev = store_->Rev();
  EXPECT_TRUE(Is(Put("b", "1", 99).status(), Error::kLeaseNotFound));
  EXPECT_TRUE(Is(Put("a", "1", 1, true).status(), Error::kLeaseProvided));
  EXPECT_TRUE(Is(Put("nokey", "1", 0, true).status(), Error::kKeyNotFound));
  etcdserverpb::TxnRequest txn;
  auto* p = txn.add_success()->mutable_request_put();
  p->set_key("t");
  p->set_lease(99);
  EXPECT_TRUE(Is(store_->Txn(txn).status(), Error::kLeaseNotFound));
  EXPECT_TRUE(Is(Revoke(99).status(), Error::kLeaseNotFound));
  EXPECT_EQ(store_->Rev(), rev) << "refused requests change nothing";
  EXPECT_FALSE(Get("b").has_value());
  EXPECT_EQ(store_->lessor()->LeaseOf("b"), 0);

  // A key deleted by DeleteRange leaves its lease.
  ASSERT_TRUE(Put("d", "1", 1).ok());
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("d");
  ASSERT_TRUE(store_->DeleteRange(del).ok());
  EXPECT_EQ(store_->lessor()->LeaseOf("d"), 0);
  EXPECT_TRUE(store_->lessor()->Get(1, true)->keys.empty());
}

TEST_F(LeaseStoreTest, RevokeDeletesAttachedKeysInOneRevision) {
  Collector* w = Watch("l/", "l0");
  ASSERT_TRUE(Grant(7, 60).ok());
  ASSERT_TRUE(Grant(8, 60).ok());
  ASSERT_TRUE(Put("l/a", "1", 7).ok());
  ASSERT_TRUE(Put("l/b", "1", 7).ok());
  ASSERT_TRUE(Put("l/c", "1", 8).ok());
  ASSERT_TRUE(Put("l/d", "1", 7).ok());
  ASSERT_TRUE(w->SkipEvents(4));  // the puts
  const int64_t before = store_->Rev();

  auto resp = Revoke(7);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->header().revision(), before + 1);
  EXPECT_EQ(store_->Rev(), before + 1) << "all keys deleted in one revision";
  EXPECT_FALSE(store_->lessor()->Exists(7));
  EXPECT_FALSE(Get("l/a").has_value());
  EXPECT_FALSE(Get("l/b").has_value());
  EXPECT_FALSE(Get("l/d").has_value());
  EXPECT_TRUE(Get("l/c").has_value());
  EXPECT_EQ(store_->lessor()->LeaseOf("l/a"), 0);

  auto m = w->Next();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->header().revision(), before + 1);
  ASSERT_EQ(m->events_size(), 3) << "one response at one revision";
  std::vector<std::string> keys;
  for (const auto& e : m->events()) {
    EXPECT_EQ(e.type(), mvccpb::Event::DELETE);
    EXPECT_EQ(e.kv().mod_revision(), before + 1);
    EXPECT_EQ(e.prev_kv().lease(), 7);
    keys.push_back(e.kv().key());
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"l/a", "l/b", "l/d"}));

  // A lease without keys: revoked without a new revision.
  ASSERT_TRUE(Grant(9, 60).ok());
  auto empty = Revoke(9);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(store_->Rev(), before + 1);
  EXPECT_TRUE(Is(Revoke(7).status(), Error::kLeaseNotFound));
}

TEST_F(LeaseStoreTest, LeasesAndAttachmentsSurviveRestart) {
  ASSERT_TRUE(Grant(1, 100).ok());
  ASSERT_TRUE(Grant(2, 200).ok());
  ASSERT_TRUE(Grant(3, 300).ok());
  ASSERT_TRUE(Put("a", "1", 1).ok());
  ASSERT_TRUE(Put("b", "1", 1).ok());
  ASSERT_TRUE(Put("c", "1", 2).ok());
  ASSERT_TRUE(Put("b", "2", 2).ok());  // moved from 1 to 2
  ASSERT_TRUE(Put("e", "1", 2).ok());
  ASSERT_TRUE(Put("e", "2", 0).ok());  // detached
  ASSERT_TRUE(Put("f", "1", 3).ok());
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("f");
  ASSERT_TRUE(store_->DeleteRange(del).ok());  // deleted
  ASSERT_TRUE(Put("g", "1", 3).ok());
  ASSERT_TRUE(Revoke(3).ok());  // revoked (deletes g)
  const int64_t rev = store_->Rev();
  clock_.Advance(seconds(50));
  ASSERT_EQ(store_->lessor()->Get(2, false)->remaining_ttl, 150);

  Reopen();
  EXPECT_EQ(store_->Rev(), rev);
  EXPECT_EQ(store_->lessor()->List(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(store_->lessor()->Get(1, false)->granted_ttl, 100);
  EXPECT_EQ(store_->lessor()->Get(2, false)->granted_ttl, 200);
  EXPECT_EQ(store_->lessor()->Get(2, false)->remaining_ttl, 200) << "full TTL after restart";
  EXPECT_EQ(store_->lessor()->Get(1, true)->keys, std::vector<std::string>{"a"});
  EXPECT_EQ(store_->lessor()->Get(2, true)->keys, (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(store_->lessor()->LeaseOf("e"), 0);
  EXPECT_EQ(store_->lessor()->LeaseOf("f"), 0);
  EXPECT_EQ(store_->lessor()->LeaseOf("g"), 0);
  EXPECT_FALSE(Get("g").has_value());
  EXPECT_TRUE(Is(Grant(1, 10).status(), Error::kLeaseExists));

  // The restored lease still revokes its keys.
  ASSERT_TRUE(Revoke(2).ok());
  EXPECT_FALSE(Get("b").has_value());
  EXPECT_FALSE(Get("c").has_value());
  EXPECT_TRUE(Get("a").has_value());
  EXPECT_EQ(store_->Rev(), rev + 1);
  Reopen();
  EXPECT_EQ(store_->lessor()->List(), std::vector<int64_t>{1});
  EXPECT_EQ(store_->lessor()->Get(1, true)->keys, std::vector<std::string>{"a"});
}

// A 2 s lease (asked for 1 s, raised to the minimum) expires once the clock
// reaches its deadline: the expiry thread revokes it, its keys are deleted
// in one revision, and watchers see that revision.
TEST_F(LeaseStoreTest, ExpiredLeaseRevokesItsKeys) {
  KvStoreOptions o;
  // How often the expiry thread looks; the clock alone decides what is due.
  o.lease_check_interval = absl::Milliseconds(5);
  Reopen(o);
  Collector* w = Watch("x/", "x0");
  auto g = Grant(0, 1);
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->ttl(), 2);
  ASSERT_TRUE(Grant(4242, 600).ok());  // a long lease stays
  ASSERT_TRUE(Put("x/1", "v", g->id()).ok());
  ASSERT_TRUE(Put("x/2", "v", g->id()).ok());
  ASSERT_TRUE(Put("x/3", "v", 4242).ok());
  ASSERT_TRUE(w->SkipEvents(3));
  const int64_t rev = store_->Rev();

  // A millisecond before the deadline nothing is due; a put made then is
  // the next revision, before any revocation.
  clock_.Advance(seconds(2) - milliseconds(1));
  EXPECT_TRUE(store_->lessor()->Expired(10).empty()) << "due before its deadline";
  ASSERT_TRUE(Put("x/0", "v", 0).ok());
  auto put = w->Next();
  ASSERT_TRUE(put);
  ASSERT_EQ(put->events_size(), 1) << put->ShortDebugString();
  EXPECT_EQ(put->events(0).type(), mvccpb::Event::PUT);
  EXPECT_EQ(put->events(0).kv().mod_revision(), rev + 1);
  EXPECT_TRUE(store_->lessor()->Exists(g->id()));

  // At the deadline the expiry thread revokes it: wait for the revocation's
  // events (the timeout only bounds a failure).
  clock_.Advance(milliseconds(1));
  auto m = w->Next(milliseconds(10000));
  ASSERT_TRUE(m) << "the lease was not revoked within 10 s of its deadline";
  ASSERT_EQ(m->events_size(), 2) << m->ShortDebugString();
  EXPECT_EQ(m->events(0).type(), mvccpb::Event::DELETE);
  EXPECT_EQ(m->events(0).kv().key(), "x/1");
  EXPECT_EQ(m->events(1).kv().key(), "x/2");
  EXPECT_EQ(m->events(0).kv().mod_revision(), rev + 2);
  EXPECT_EQ(m->events(1).kv().mod_revision(), rev + 2);
  EXPECT_FALSE(store_->lessor()->Exists(g->id()));
  EXPECT_FALSE(Get("x/1").has_value());
  EXPECT_TRUE(Get("x/3").has_value());
  EXPECT_TRUE(store_->lessor()->Exists(4242));
  EXPECT_EQ(store_->Rev(), rev + 2);
}

// The expiry thread revokes what the clock makes due, and only that: of
// leases with deadlines 10 s apart, each goes when the clock passes its own.
TEST_F(LeaseStoreTest, LeasesExpireInDeadlineOrderAsTheClockMoves) {
  KvStoreOptions o;
  o.lease_check_interval = absl::Milliseconds(5);
  Reopen(o);
  Collector* w = Watch("y/", "y0");
  for (int64_t id : {1, 2, 3}) {
    ASSERT_TRUE(Grant(id, 10 * id).ok());
    ASSERT_TRUE(Put("y/" + std::to_string(id), "v", id).ok());
  }
  ASSERT_TRUE(w->SkipEvents(3));
  for (int64_t id : {1, 2, 3}) {
    clock_.Advance(seconds(10));
    auto m = w->Next(milliseconds(10000));
    ASSERT_TRUE(m) << "lease " << id << " was not revoked at its deadline";
    ASSERT_EQ(m->events_size(), 1) << m->ShortDebugString();
    EXPECT_EQ(m->events(0).type(), mvccpb::Event::DELETE);
    EXPECT_EQ(m->events(0).kv().key(), "y/" + std::to_string(id));
    EXPECT_FALSE(store_->lessor()->Exists(id));
    for (int64_t later = id + 1; later <= 3; ++later) {
      EXPECT_TRUE(store_->lessor()->Exists(later)) << "lease " << later << " went early";
    }
  }
}

}  // namespace
}  // namespace capstan::mvcc
