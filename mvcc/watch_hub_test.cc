#include "mvcc/watch_hub.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store.h"

namespace capstan::mvcc {
namespace {

using etcdserverpb::WatchCreateRequest;
using etcdserverpb::WatchResponse;
using mvccpb::Event;

constexpr std::chrono::milliseconds kWait{10000};
constexpr std::chrono::milliseconds kQuiet{300};

// The client side of one Watch stream, driven like server/watch_service.cc's
// reactor drives it: the hub hands a message to the deliver function when
// the writer is idle (the write is then "in flight"); when that write
// completes (OnWriteDone) the reader calls Pop, and a popped message is the
// next write in flight. At most one message is ever in flight; a second
// delivery while one is in flight is a protocol violation and is counted.
//
// A stalled reader never completes its write, so everything after the first
// message stays queued in the stream until Resume().
//
// Thread safety: one thread reads (Next/DrainBurst/Resume); the hub may
// deliver from any thread.
class TestReader {
 public:
  TestReader(std::shared_ptr<WatchStream> stream, bool stalled)
      : stream_(std::move(stream)), stalled_(stalled) {
    stream_->SetDeliver([this](std::string m) { OnDeliver(std::move(m)); });
  }
  // Close() guarantees the deliver function is never called again.
  ~TestReader() { stream_->Close(); }

  WatchStream* stream() const { return stream_.get(); }

  // The next response the client receives, waiting up to `timeout`.
  std::optional<WatchResponse> Next(std::chrono::milliseconds timeout = kWait) {
    EXPECT_FALSE(stalled_) << "a stalled reader does not read";
    if (!HasReceived()) {
      {
        std::unique_lock<std::mutex> l(mu_);
        if (!cv_.wait_for(l, timeout, [this] { return inflight_.has_value(); })) {
          return std::nullopt;
        }
      }
      CompleteWrite();
    }
    std::string bytes;
    {
      std::lock_guard<std::mutex> l(mu_);
      bytes = std::move(received_.front());
      received_.pop_front();
    }
    WatchResponse resp;
    EXPECT_TRUE(resp.ParseFromString(bytes)) << "undecodable WatchResponse";
    return resp;
  }

  // A stalled reader starts reading.
  void Resume() { stalled_ = false; }

  // Completes writes back to back until the stream has nothing queued;
  // returns how many messages were queued behind the one in flight.
  size_t DrainBurst() {
    size_t popped = 0;
    while (CompleteWrite()) ++popped;
    return popped;
  }

  int violations() const {
    std::lock_guard<std::mutex> l(mu_);
    return violations_;
  }
  // Messages handed to the deliver function (not popped).
  int deliveries() const {
    std::lock_guard<std::mutex> l(mu_);
    return deliveries_;
  }

 private:
  bool HasReceived() const {
    std::lock_guard<std::mutex> l(mu_);
    return !received_.empty();
  }

  void OnDeliver(std::string m) {
    std::lock_guard<std::mutex> l(mu_);
    if (inflight_) ++violations_;
    inflight_ = std::move(m);
    ++deliveries_;
    cv_.notify_all();
  }

  // The write in flight completes: the client has it. Then, as OnWriteDone
  // does, Pop the next message. Returns true if one was popped.
  bool CompleteWrite() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!inflight_) return false;
      received_.push_back(std::move(*inflight_));
      inflight_.reset();
    }
    std::string next;
    if (!stream_->Pop(&next)) return false;  // the next message will be delivered
    std::lock_guard<std::mutex> l(mu_);
    if (inflight_) ++violations_;
    inflight_ = std::move(next);
    return true;
  }

  const std::shared_ptr<WatchStream> stream_;
  std::atomic<bool> stalled_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::string> inflight_;
  std::deque<std::string> received_;
  int violations_ = 0;
  int deliveries_ = 0;
};

WatchCreateRequest CreateReq(const std::string& key, const std::string& end = "",
                             int64_t start = 0) {
  WatchCreateRequest req;
  req.set_key(key);
  req.set_range_end(end);
  req.set_start_revision(start);
  return req;
}

std::vector<int64_t> Revs(const std::vector<Event>& evs) {
  std::vector<int64_t> out;
  for (const auto& e : evs) out.push_back(e.kv().mod_revision());
  return out;
}

std::vector<std::string> Keys(const std::vector<Event>& evs) {
  std::vector<std::string> out;
  for (const auto& e : evs) out.push_back(e.kv().key());
  return out;
}

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> out;
  for (int64_t r = from; r <= to; ++r) out.push_back(r);
  return out;
}

class WatchHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-watch-XXXXXX";
    dir_ = mkdtemp(tmpl);
    header_.set_cluster_id(11);
    header_.set_member_id(22);
    header_.set_raft_term(33);
  }
  void TearDown() override {
    // Detach, stop the syncer (it reads the store), then the store (joins
    // the committer), then the streams (they need the hub), then the hub.
    if (store_) store_->SetWatchHub(nullptr);
    if (hub_) hub_->Stop();
    store_.reset();
    for (const auto& r : readers_) EXPECT_EQ(r->violations(), 0) << "two messages in flight";
    readers_.clear();
    hub_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start(WatchHubOptions ho = {}, KvStoreOptions so = {}) {
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    bo.sync = false;  // durability is not under test here
    bo.block_cache_bytes = 8 << 20;
    bo.write_buffer_bytes = 8 << 20;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto store = KvStore::Open(so, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    hub_ = std::make_unique<WatchHub>(store_.get(), ho);
    store_->SetWatchHub(hub_.get());
  }

  TestReader* NewReader(bool stalled = false) {
    readers_.push_back(std::make_unique<TestReader>(hub_->OpenStream(header_), stalled));
    return readers_.back().get();
  }

  int64_t Put(const std::string& k, const std::string& v, int64_t lease = 0) {
    etcdserverpb::PutRequest req;
    req.set_key(k);
    req.set_value(v);
    req.set_lease(lease);
    auto resp = store_->Put(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }

  int64_t Delete(const std::string& k, const std::string& end = "") {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(k);
    req.set_range_end(end);
    auto resp = store_->DeleteRange(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }

  // Submits the puts with up to `window` of them queued at once, so they
  // are group-committed together; returns each put's revision, in order.
  std::vector<int64_t> PutMany(const std::vector<std::pair<std::string, std::string>>& kvs,
                               size_t window) {
    std::vector<int64_t> revs;
    for (size_t i = 0; i < kvs.size(); i += window) {
      const size_t n = std::min(window, kvs.size() - i);
      std::vector<etcdserverpb::PutRequest> reqs(n);
      std::vector<etcdserverpb::PutResponse> resps(n);
      std::mutex mu;
      std::condition_variable cv;
      size_t left = n;
      bool ok = true;
      for (size_t j = 0; j < n; ++j) {
        reqs[j].set_key(kvs[i + j].first);
        reqs[j].set_value(kvs[i + j].second);
        store_->Submit({WriteRequest::Kind::kPut, &reqs[j], &resps[j], [&](absl::Status s) {
                          std::lock_guard<std::mutex> l(mu);
                          if (!s.ok()) ok = false;
                          if (--left == 0) cv.notify_all();
                        }});
      }
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return left == 0; });
      EXPECT_TRUE(ok);
      for (const auto& r : resps) revs.push_back(r.header().revision());
    }
    return revs;
  }

  // Expects the next response to be the Created response of watch_id.
  void ExpectCreated(TestReader* r, int64_t watch_id) {
    auto resp = r->Next();
    ASSERT_TRUE(resp.has_value()) << "no Created response";
    EXPECT_TRUE(resp->created());
    EXPECT_FALSE(resp->canceled()) << resp->cancel_reason();
    EXPECT_EQ(resp->watch_id(), watch_id);
    EXPECT_EQ(resp->events_size(), 0);
  }

  // Reads responses until `want` events of watch_id arrived (all responses
  // read are appended to *all). Fails if they do not arrive in time.
  std::vector<Event> ReadEvents(TestReader* r, int64_t watch_id, size_t want,
                                std::vector<WatchResponse>* all = nullptr) {
    std::vector<Event> out;
    while (out.size() < want) {
      auto resp = r->Next();
      if (!resp) {
        ADD_FAILURE() << "watch " << watch_id << ": got " << out.size() << " of " << want
                      << " events";
        break;
      }
      if (resp->watch_id() == watch_id) {
        for (const auto& e : resp->events()) out.push_back(e);
      }
      if (all) all->push_back(*resp);
    }
    return out;
  }

  // Expects nothing more on the stream for a while.
  void ExpectQuiet(TestReader* r) {
    auto resp = r->Next(kQuiet);
    EXPECT_FALSE(resp.has_value()) << "unexpected response: " << resp->ShortDebugString();
  }

  std::string dir_;
  etcdserverpb::ResponseHeader header_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<WatchHub> hub_;
  std::vector<std::unique_ptr<TestReader>> readers_;
};

// ---------------------------------------------------------------------------
// Created responses and watch ids.

TEST_F(WatchHubTest, CreatedFirstWithCurrentRevisionAndAutoIds) {
  Start();
  Put("a", "1");
  Put("a", "2");
  const int64_t rev = Put("b", "1");
  TestReader* r = NewReader();
  for (int i = 0; i < 3; ++i) {
    r->stream()->Create(CreateReq("a"));
    auto resp = r->Next();
    ASSERT_TRUE(resp);
    EXPECT_TRUE(resp->created());
    EXPECT_FALSE(resp->canceled());
    EXPECT_EQ(resp->watch_id(), i) << "auto ids count from 0 per stream";
    EXPECT_EQ(resp->header().revision(), rev);
    EXPECT_EQ(resp->header().cluster_id(), 11u);
    EXPECT_EQ(resp->header().member_id(), 22u);
    EXPECT_EQ(resp->header().raft_term(), 33u);
  }
  // A client-chosen id is honoured; automatic ids skip ids in use.
  auto chosen = CreateReq("a");
  chosen.set_watch_id(4);
  r->stream()->Create(chosen);
  ExpectCreated(r, 4);
  r->stream()->Create(CreateReq("a"));
  ExpectCreated(r, 3);
  r->stream()->Create(CreateReq("a"));
  ExpectCreated(r, 5);
  EXPECT_EQ(r->stream()->num_watchers(), 6u);

  // Another stream counts from 0 again.
  TestReader* r2 = NewReader();
  r2->stream()->Create(CreateReq("a"));
  ExpectCreated(r2, 0);

  // Every watcher of the stream gets the event, tagged with its id.
  const int64_t put = Put("a", "3");
  std::map<int64_t, int64_t> rev_by_id;
  for (int i = 0; i < 6; ++i) {
    auto resp = r->Next();
    ASSERT_TRUE(resp);
    ASSERT_EQ(resp->events_size(), 1);
    EXPECT_EQ(resp->header().revision(), put);
    rev_by_id[resp->watch_id()] = resp->events(0).kv().mod_revision();
  }
  EXPECT_EQ(rev_by_id.size(), 6u);
  for (const auto& [id, rv] : rev_by_id) EXPECT_EQ(rv, put) << id;
}

// etcd 3.5 (mvcc/watcher.go watchStream.Watch): a duplicate id returns
// (-1, ErrWatcherDuplicateID); v3rpc sends created+canceled with
// WatchId = -1 (etcd main asserts exactly that in sendLoop).
TEST_F(WatchHubTest, DuplicateWatchIdIsCreatedAndCanceled) {
  Start();
  TestReader* r = NewReader();
  auto req = CreateReq("a");
  req.set_watch_id(7);
  r->stream()->Create(req);
  ExpectCreated(r, 7);
  r->stream()->Create(req);
  auto dup = r->Next();
  ASSERT_TRUE(dup);
  EXPECT_TRUE(dup->created());
  EXPECT_TRUE(dup->canceled());
  EXPECT_EQ(dup->cancel_reason(), "mvcc: duplicate watch ID provided on the WatchStream");
  EXPECT_EQ(dup->watch_id(), -1) << "etcd answers a failed create with watch_id -1";
  EXPECT_EQ(r->stream()->num_watchers(), 1u);
  // The original watcher is intact.
  const int64_t rev = Put("a", "1");
  auto evs = ReadEvents(r, 7, 1);
  EXPECT_EQ(Revs(evs), std::vector<int64_t>{rev});
}

// etcd 3.5 watchStream.Watch: key >= range_end (other than the "\0"
// from-key form) is ErrEmptyWatcherRange, answered created+canceled with
// watch_id -1 and cancel_reason "mvcc: watcher range is empty".
TEST_F(WatchHubTest, EmptyRangeIsCreatedAndCanceled) {
  Start();
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("b", "a"));
  auto resp = r->Next();
  ASSERT_TRUE(resp);
  EXPECT_TRUE(resp->created());
  EXPECT_TRUE(resp->canceled());
  EXPECT_EQ(resp->watch_id(), -1);
  EXPECT_EQ(resp->cancel_reason(), "mvcc: watcher range is empty");
  EXPECT_EQ(r->stream()->num_watchers(), 0u);
}

// ---------------------------------------------------------------------------
// Events.

TEST_F(WatchHubTest, SingleKeyPutAndDeleteEvents) {
  Start();
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("k"));
  ExpectCreated(r, 0);
  const int64_t r1 = Put("k", "v1");
  Put("other", "x");
  const int64_t r2 = Put("k", "v2");
  const int64_t r3 = Delete("k");
  Delete("k");  // deletes nothing: no event
  const int64_t r4 = Put("k", "v3");
  std::vector<WatchResponse> all;
  auto evs = ReadEvents(r, 0, 4, &all);
  ASSERT_EQ(evs.size(), 4u);
  EXPECT_EQ(Revs(evs), (std::vector<int64_t>{r1, r2, r3, r4}));
  EXPECT_EQ(evs[0].type(), Event::PUT);
  EXPECT_EQ(evs[0].kv().key(), "k");
  EXPECT_EQ(evs[0].kv().value(), "v1");
  EXPECT_EQ(evs[0].kv().create_revision(), r1);
  EXPECT_EQ(evs[0].kv().version(), 1);
  EXPECT_FALSE(evs[0].has_prev_kv());
  EXPECT_EQ(evs[1].kv().value(), "v2");
  EXPECT_EQ(evs[1].kv().create_revision(), r1);
  EXPECT_EQ(evs[1].kv().version(), 2);
  EXPECT_FALSE(evs[1].has_prev_kv()) << "prev_kv only when asked";
  // A delete carries the key and the deletion revision only.
  EXPECT_EQ(evs[2].type(), Event::DELETE);
  EXPECT_EQ(evs[2].kv().key(), "k");
  EXPECT_EQ(evs[2].kv().mod_revision(), r3);
  EXPECT_EQ(evs[2].kv().create_revision(), 0);
  EXPECT_EQ(evs[2].kv().version(), 0);
  EXPECT_EQ(evs[2].kv().value(), "");
  EXPECT_EQ(evs[3].kv().create_revision(), r4);
  EXPECT_EQ(evs[3].kv().version(), 1);
  for (const auto& resp : all) {
    ASSERT_GT(resp.events_size(), 0);
    EXPECT_EQ(resp.header().revision(), resp.events(resp.events_size() - 1).kv().mod_revision());
  }
  ExpectQuiet(r);
}

TEST_F(WatchHubTest, RangePrefixFromKeyAndEmptyKeyWatchers) {
  Start();
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("b", "d"));                     // 0: [b, d)
  r->stream()->Create(CreateReq("p/", "p0"));                   // 1: prefix p/
  r->stream()->Create(CreateReq("m", std::string(1, '\0')));    // 2: >= m
  r->stream()->Create(CreateReq("", std::string(1, '\0')));     // 3: every key
  r->stream()->Create(CreateReq(""));                           // 4: the key "\0"
  r->stream()->Create(CreateReq("c"));                          // 5: the key c
  for (int i = 0; i < 6; ++i) ExpectCreated(r, i);

  const std::vector<std::string> keys = {"a", "b", "bz", "c", "d", "l", "m", "p", "p/",
                                         "p/x", "p0", "q", "z", "\xff", std::string(1, '\0')};
  std::map<std::string, int64_t> rev;
  for (const auto& k : keys) rev[k] = Put(k, "v");
  auto expect_for = [&](auto pred) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const auto& k : keys) {
      if (pred(k)) out.emplace_back(rev[k], k);
    }
    return out;
  };
  std::map<int64_t, std::vector<std::pair<int64_t, std::string>>> want = {
      {0, expect_for([](const std::string& k) { return k >= "b" && k < "d"; })},
      {1, expect_for([](const std::string& k) { return k.rfind("p/", 0) == 0; })},
      {2, expect_for([](const std::string& k) { return k >= "m"; })},
      {3, expect_for([](const std::string&) { return true; })},
      {4, expect_for([](const std::string& k) { return k == std::string(1, '\0'); })},
      {5, expect_for([](const std::string& k) { return k == "c"; })},
  };
  size_t total = 0;
  for (const auto& [id, evs] : want) total += evs.size();
  std::map<int64_t, std::vector<std::pair<int64_t, std::string>>> got;
  size_t n = 0;
  while (n < total) {
    auto resp = r->Next();
    ASSERT_TRUE(resp) << n << " of " << total;
    for (const auto& e : resp->events()) {
      got[resp->watch_id()].emplace_back(e.kv().mod_revision(), e.kv().key());
      ++n;
    }
  }
  for (const auto& [id, evs] : want) EXPECT_EQ(got[id], evs) << "watcher " << id;
  ExpectQuiet(r);
}

TEST_F(WatchHubTest, PrevKvLiveAndReplayedFromStorage) {
  Start();
  TestReader* live = NewReader();
  auto req = CreateReq("a");
  req.set_prev_kv(true);
  live->stream()->Create(req);
  ExpectCreated(live, 0);
  const int64_t r1 = Put("a", "1");
  const int64_t r2 = Put("a", "2");
  const int64_t r3 = Delete("a");
  const int64_t r4 = Put("a", "3");

  auto check = [&](const std::vector<Event>& evs) {
    ASSERT_EQ(evs.size(), 4u);
    EXPECT_EQ(Revs(evs), (std::vector<int64_t>{r1, r2, r3, r4}));
    EXPECT_FALSE(evs[0].has_prev_kv()) << "a create has no previous value";
    ASSERT_TRUE(evs[1].has_prev_kv());
    EXPECT_EQ(evs[1].prev_kv().value(), "1");
    EXPECT_EQ(evs[1].prev_kv().mod_revision(), r1);
    ASSERT_TRUE(evs[2].has_prev_kv());
    EXPECT_EQ(evs[2].type(), Event::DELETE);
    EXPECT_EQ(evs[2].prev_kv().value(), "2");
    EXPECT_EQ(evs[2].prev_kv().mod_revision(), r2);
    EXPECT_EQ(evs[2].prev_kv().version(), 2);
    EXPECT_FALSE(evs[3].has_prev_kv()) << "a re-create after a delete has no previous value";
  };
  check(ReadEvents(live, 0, 4));

  // The same history replayed from storage.
  TestReader* replay = NewReader();
  req.set_start_revision(r1);
  replay->stream()->Create(req);
  ExpectCreated(replay, 0);
  check(ReadEvents(replay, 0, 4));

  // Without prev_kv, replayed events carry none.
  TestReader* plain = NewReader();
  plain->stream()->Create(CreateReq("a", "", r1));
  ExpectCreated(plain, 0);
  for (const auto& e : ReadEvents(plain, 0, 4)) EXPECT_FALSE(e.has_prev_kv());
}

TEST_F(WatchHubTest, FiltersNoPutAndNoDelete) {
  Start();
  TestReader* r = NewReader();
  auto noput = CreateReq("f/", "f0");
  noput.add_filters(WatchCreateRequest::NOPUT);
  auto nodel = CreateReq("f/", "f0");
  nodel.add_filters(WatchCreateRequest::NODELETE);
  auto both = CreateReq("f/", "f0");
  both.add_filters(WatchCreateRequest::NOPUT);
  both.add_filters(WatchCreateRequest::NODELETE);
  r->stream()->Create(noput);
  r->stream()->Create(nodel);
  r->stream()->Create(both);
  for (int i = 0; i < 3; ++i) ExpectCreated(r, i);
  const int64_t p1 = Put("f/1", "x");
  const int64_t p2 = Put("f/2", "x");
  const int64_t d = Delete("f/", "f0");  // deletes both keys in one revision
  const int64_t p3 = Put("f/1", "y");
  std::map<int64_t, std::vector<Event>> got;
  size_t n = 0;
  while (n < 5) {
    auto resp = r->Next();
    ASSERT_TRUE(resp);
    for (const auto& e : resp->events()) got[resp->watch_id()].push_back(e), ++n;
  }
  EXPECT_EQ(Revs(got[0]), (std::vector<int64_t>{d, d}));
  for (const auto& e : got[0]) EXPECT_EQ(e.type(), Event::DELETE);
  EXPECT_EQ(Revs(got[1]), (std::vector<int64_t>{p1, p2, p3}));
  for (const auto& e : got[1]) EXPECT_EQ(e.type(), Event::PUT);
  EXPECT_TRUE(got[2].empty());
  ExpectQuiet(r);
}

TEST_F(WatchHubTest, TxnEventsOfOneRevisionArriveTogether) {
  Start();
  Put("t/y", "old");
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("t/", "t0"));
  ExpectCreated(r, 0);
  etcdserverpb::TxnRequest txn;
  txn.add_success()->mutable_request_put()->set_key("t/x1");
  txn.add_success()->mutable_request_put()->set_key("t/x2");
  txn.add_success()->mutable_request_delete_range()->set_key("t/y");
  txn.add_success()->mutable_request_put()->set_key("t/x3");
  auto resp = store_->Txn(txn);
  ASSERT_TRUE(resp.ok()) << resp.status();
  const int64_t rev = resp->header().revision();
  auto msg = r->Next();
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->header().revision(), rev);
  ASSERT_EQ(msg->events_size(), 4) << "one revision, one response";
  std::vector<Event> evs(msg->events().begin(), msg->events().end());
  EXPECT_EQ(Keys(evs), (std::vector<std::string>{"t/x1", "t/x2", "t/y", "t/x3"}));
  EXPECT_EQ(Revs(evs), (std::vector<int64_t>{rev, rev, rev, rev}));
  EXPECT_EQ(evs[2].type(), Event::DELETE);
}

// ---------------------------------------------------------------------------
// Start revisions, compaction, cancel.

TEST_F(WatchHubTest, PastStartRevisionCatchesUpWhileWritesContinue) {
  WatchHubOptions ho;
  ho.catch_up_batch_revs = 25;  // many catch-up batches
  Start(ho);
  std::vector<std::pair<std::string, std::string>> kvs;
  for (int i = 0; i < 300; ++i) kvs.emplace_back("c/" + std::to_string(i % 7), std::to_string(i));
  std::vector<int64_t> before = PutMany(kvs, 4);

  // Writes go on while the watcher catches up: matching keys and others.
  std::vector<int64_t> during;
  std::atomic<bool> started{false};
  std::thread writer([&] {
    for (int i = 0; i < 400; ++i) {
      if (i == 50) started = true;
      during.push_back(Put("c/" + std::to_string(i % 5), "w" + std::to_string(i)));
      Put("d/" + std::to_string(i % 3), "noise");
    }
  });
  while (!started) std::this_thread::yield();
  TestReader* r = NewReader();
  const int64_t start = before[10];
  r->stream()->Create(CreateReq("c/", "c0", start));
  // A live watcher on another stream, for comparison.
  TestReader* live = NewReader();
  live->stream()->Create(CreateReq("c/", "c0"));
  writer.join();

  std::vector<int64_t> want(before.begin() + 10, before.end());
  want.insert(want.end(), during.begin(), during.end());
  std::vector<WatchResponse> all;
  auto evs = ReadEvents(r, 0, want.size(), &all);
  EXPECT_EQ(Revs(evs), want) << "every revision from start, once, in order";
  ASSERT_FALSE(all.empty());
  EXPECT_TRUE(all.front().created()) << "Created precedes events";
  // A response's header revision covers its events. etcd's syncWatchers
  // stamps catch-up responses with the store's current revision, so header
  // revisions never go back on a stream (not below the Created revision).
  int behind = 0;
  std::string first_behind;
  for (size_t i = 1; i < all.size(); ++i) {
    const auto& m = all[i];
    if (m.events_size() > 0) {
      EXPECT_GE(m.header().revision(), m.events(m.events_size() - 1).kv().mod_revision());
    }
    if (m.header().revision() < all[i - 1].header().revision()) {
      if (behind++ == 0) {
        first_behind = "response " + std::to_string(i) + " has header revision " +
                       std::to_string(m.header().revision()) + " after " +
                       std::to_string(all[i - 1].header().revision());
      }
    }
  }
  EXPECT_EQ(behind, 0) << "header revision went back " << behind << " times; first: "
                       << first_behind;
  ExpectQuiet(r);

  // The live watcher got a suffix of the same sequence, starting after its
  // Created revision.
  auto created = live->Next();
  ASSERT_TRUE(created && created->created());
  std::vector<int64_t> live_want;
  for (int64_t rv : want) {
    if (rv > created->header().revision()) live_want.push_back(rv);
  }
  EXPECT_EQ(Revs(ReadEvents(live, 0, live_want.size())), live_want);
}

TEST_F(WatchHubTest, FutureStartRevisionWaits) {
  Start();
  const int64_t now = Put("a", "1");
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("a", "", now + 3));
  ExpectCreated(r, 0);
  EXPECT_EQ(Put("a", "2"), now + 1);
  EXPECT_EQ(Put("a", "3"), now + 2);
  ExpectQuiet(r);
  Put("a", "4");
  Put("a", "5");
  auto evs = ReadEvents(r, 0, 2);
  EXPECT_EQ(Revs(evs), (std::vector<int64_t>{now + 3, now + 4}));
  EXPECT_EQ(evs[0].kv().value(), "4");
}

TEST_F(WatchHubTest, StartRevisionBelowCompactionIsCanceled) {
  Start();
  const int64_t r1 = Put("a", "1");
  Put("a", "2");
  const int64_t r3 = Put("a", "3");
  const int64_t r4 = Put("b", "1");
  etcdserverpb::CompactionRequest creq;
  creq.set_revision(r3);
  creq.set_physical(true);
  ASSERT_TRUE(store_->Compact(creq).ok());

  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("a", "", r1));
  ExpectCreated(r, 0);
  auto canceled = r->Next();
  ASSERT_TRUE(canceled);
  EXPECT_EQ(canceled->watch_id(), 0);
  EXPECT_TRUE(canceled->canceled());
  EXPECT_FALSE(canceled->created());
  EXPECT_EQ(canceled->compact_revision(), r3);
  EXPECT_EQ(canceled->header().revision(), 0) << "etcd sends it with header revision 0";
  EXPECT_EQ(canceled->events_size(), 0);
  EXPECT_EQ(r->stream()->num_watchers(), 0u);
  Put("a", "4");
  ExpectQuiet(r);

  // Exactly the compaction revision is still watchable.
  TestReader* at = NewReader();
  at->stream()->Create(CreateReq("", std::string(1, '\0'), r3));
  ExpectCreated(at, 0);
  auto evs = ReadEvents(at, 0, 3);
  EXPECT_EQ(Revs(evs), (std::vector<int64_t>{r3, r4, r4 + 1}));
  EXPECT_EQ(evs[0].kv().value(), "3");
}

TEST_F(WatchHubTest, CancelAnswersAndStopsEvents) {
  Start();
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("x"));
  r->stream()->Create(CreateReq("y"));
  ExpectCreated(r, 0);
  ExpectCreated(r, 1);
  const int64_t rx = Put("x", "1");
  EXPECT_EQ(Revs(ReadEvents(r, 0, 1)), std::vector<int64_t>{rx});
  r->stream()->Cancel(0);
  auto c = r->Next();
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->canceled());
  EXPECT_FALSE(c->created());
  EXPECT_EQ(c->watch_id(), 0);
  EXPECT_EQ(c->header().revision(), rx);
  r->stream()->Cancel(0);   // unknown now: ignored
  r->stream()->Cancel(42);  // never existed: ignored
  Put("x", "2");
  const int64_t ry = Put("y", "1");
  // y's event is the barrier: anything for 0 would have come before it.
  auto next = r->Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->watch_id(), 1);
  ASSERT_EQ(next->events_size(), 1);
  EXPECT_EQ(next->events(0).kv().mod_revision(), ry);
  ExpectQuiet(r);
  EXPECT_EQ(r->stream()->num_watchers(), 1u);
}

// ---------------------------------------------------------------------------
// Progress.

TEST_F(WatchHubTest, RequestProgressWhenSynced) {
  Start();
  Put("a", "1");
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("a"));
  ExpectCreated(r, 0);
  const int64_t other = Put("zz", "1");  // not watched: no event, but the revision moves
  r->stream()->RequestProgress();
  auto p = r->Next();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->watch_id(), -1);
  EXPECT_FALSE(p->created());
  EXPECT_FALSE(p->canceled());
  EXPECT_EQ(p->events_size(), 0);
  EXPECT_EQ(p->header().revision(), other);
  EXPECT_EQ(p->header().cluster_id(), 11u);
}

TEST_F(WatchHubTest, RequestProgressDeferredWhileUnsynced) {
  WatchHubOptions ho;
  ho.stream_queue_messages = 4;
  ho.max_response_bytes = 64;  // no merging of catch-up batches into queued responses
  ho.catch_up_batch_revs = 5;
  ho.sync_interval = absl::Milliseconds(20);
  Start(ho);
  std::vector<std::pair<std::string, std::string>> kvs;
  for (int i = 0; i < 100; ++i) kvs.emplace_back("k", std::to_string(i));
  std::vector<int64_t> revs = PutMany(kvs, 10);
  TestReader* r = NewReader(/*stalled=*/true);
  r->stream()->Create(CreateReq("k", "", revs.front()));
  // The watcher cannot catch up 100 revisions through a queue of 4
  // five-revision batches while nobody reads: it stays unsynced.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(hub_->GetStats().unsynced, 1u);
  r->stream()->RequestProgress();
  r->Resume();
  std::vector<WatchResponse> all;
  auto evs = ReadEvents(r, 0, revs.size(), &all);
  EXPECT_EQ(Revs(evs), revs);
  for (const auto& m : all) {
    EXPECT_NE(m.watch_id(), -1) << "progress before the events it covers";
  }
  auto p = r->Next();
  ASSERT_TRUE(p) << "deferred progress never sent";
  EXPECT_EQ(p->watch_id(), -1);
  EXPECT_EQ(p->events_size(), 0);
  EXPECT_EQ(p->header().revision(), revs.back());
  ExpectQuiet(r);
}

TEST_F(WatchHubTest, PeriodicProgressNotifications) {
  WatchHubOptions ho;
  ho.progress_interval = absl::Milliseconds(100);
  ho.sync_interval = absl::Milliseconds(20);
  Start(ho);
  const int64_t rev = Put("a", "1");
  TestReader* r = NewReader();
  auto req = CreateReq("a");
  req.set_progress_notify(true);
  req.set_watch_id(3);
  r->stream()->Create(req);
  ExpectCreated(r, 3);
  TestReader* silent = NewReader();
  silent->stream()->Create(CreateReq("a"));
  ExpectCreated(silent, 0);
  for (int i = 0; i < 2; ++i) {
    auto p = r->Next(std::chrono::milliseconds(3000));
    ASSERT_TRUE(p) << "no progress notification " << i;
    EXPECT_EQ(p->watch_id(), 3);
    EXPECT_EQ(p->events_size(), 0);
    EXPECT_FALSE(p->created());
    EXPECT_FALSE(p->canceled());
    EXPECT_EQ(p->header().revision(), rev);
  }
  ExpectQuiet(silent);  // did not ask for progress
}

// ---------------------------------------------------------------------------
// Fragments.

TEST_F(WatchHubTest, LargeTxnIsFragmentedForWatchersThatAsk) {
  WatchHubOptions ho;
  ho.max_response_bytes = 64 << 10;
  Start(ho);
  TestReader* r = NewReader();
  auto req = CreateReq("big/", "big0");
  req.set_fragment(true);
  r->stream()->Create(req);
  ExpectCreated(r, 0);
  TestReader* whole = NewReader();
  whole->stream()->Create(CreateReq("big/", "big0"));
  ExpectCreated(whole, 0);

  etcdserverpb::TxnRequest txn;
  constexpr int kOps = 12;
  for (int i = 0; i < kOps; ++i) {
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key("big/" + std::to_string(100 + i));
    put->set_value(std::string(20000, static_cast<char>('a' + i)));
  }
  auto resp = store_->Txn(txn);
  ASSERT_TRUE(resp.ok()) << resp.status();
  const int64_t rev = resp->header().revision();

  std::vector<Event> evs;
  int messages = 0;
  for (;;) {
    auto m = r->Next();
    ASSERT_TRUE(m) << "fragments stopped after " << evs.size() << " events";
    ++messages;
    EXPECT_EQ(m->header().revision(), rev);
    EXPECT_EQ(m->watch_id(), 0);
    EXPECT_GT(m->events_size(), 0);
    if (m->events_size() > 1) {
      EXPECT_LE(m->ByteSizeLong(), static_cast<size_t>(ho.max_response_bytes));
    }
    for (const auto& e : m->events()) evs.push_back(e);
    if (!m->fragment()) break;
  }
  EXPECT_GT(messages, 1) << "expected the response to be split";
  ASSERT_EQ(evs.size(), static_cast<size_t>(kOps));
  for (int i = 0; i < kOps; ++i) {
    EXPECT_EQ(evs[i].kv().key(), "big/" + std::to_string(100 + i));
    EXPECT_EQ(evs[i].kv().value(), std::string(20000, static_cast<char>('a' + i)));
    EXPECT_EQ(evs[i].kv().mod_revision(), rev);
  }
  ExpectQuiet(r);

  // A watcher that did not ask for fragments gets one response.
  auto one = whole->Next();
  ASSERT_TRUE(one);
  EXPECT_FALSE(one->fragment());
  EXPECT_EQ(one->events_size(), kOps);
}

// ---------------------------------------------------------------------------
// Slow consumers, scale, close.

TEST_F(WatchHubTest, StalledStreamIsParkedAndCatchesUpExactlyOnce) {
  WatchHubOptions ho;
  ho.stream_queue_messages = 32;
  // Small responses, so that merging events into queued ones soon stops
  // and the queue fills.
  ho.max_response_bytes = 256;
  ho.sync_interval = absl::Milliseconds(20);
  Start(ho);
  constexpr int kPuts = 3000;
  TestReader* stalled = NewReader(/*stalled=*/true);
  stalled->stream()->Create(CreateReq("s/", "s0"));
  TestReader* fast[2] = {NewReader(), NewReader()};
  for (TestReader* f : fast) {
    f->stream()->Create(CreateReq("s/", "s0"));
    ExpectCreated(f, 0);
  }

  // Fast readers consume on their own threads while the writes happen.
  std::vector<Event> fast_events[2];
  std::vector<std::thread> consumers;
  for (int i = 0; i < 2; ++i) {
    consumers.emplace_back([&, i] {
      while (fast_events[i].size() < static_cast<size_t>(kPuts)) {
        auto m = fast[i]->Next();
        if (!m) break;
        for (const auto& e : m->events()) fast_events[i].push_back(e);
      }
    });
  }
  std::vector<std::pair<std::string, std::string>> kvs;
  for (int i = 0; i < kPuts; ++i) kvs.emplace_back("s/" + std::to_string(i % 100), std::to_string(i));
  const std::vector<int64_t> revs = PutMany(kvs, 8);
  for (auto& t : consumers) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Revs(fast_events[i]), revs) << "fast stream " << i;
  }

  // The stalled stream: one message in flight, a bounded queue behind it.
  EXPECT_EQ(stalled->deliveries(), 1);
  EXPECT_GE(hub_->GetStats().parked, 1u);
  const size_t queued = stalled->DrainBurst();
  EXPECT_LE(queued, ho.stream_queue_messages);
  EXPECT_GT(queued, 0u);

  // Reading again, it gets every event exactly once, in order.
  stalled->Resume();
  std::vector<WatchResponse> all;
  auto evs = ReadEvents(stalled, 0, kPuts, &all);
  ASSERT_FALSE(all.empty());
  EXPECT_TRUE(all.front().created());
  EXPECT_EQ(Revs(evs), revs);
  for (size_t i = 0; i < evs.size() && i < kvs.size(); ++i) {
    if (evs[i].kv().key() != kvs[i].first || evs[i].kv().value() != kvs[i].second) {
      ADD_FAILURE() << "event " << i << " is " << evs[i].kv().ShortDebugString();
      break;
    }
  }
  ExpectQuiet(stalled);
  auto stats = hub_->GetStats();
  EXPECT_EQ(stats.unsynced, 0u);
  EXPECT_EQ(stats.synced, 3u);
}

// Two unsynced watchers caught up in the same syncer pass: each must get
// exactly its own revisions from its start revision on.
TEST_F(WatchHubTest, CatchUpOfTwoWatchersKeepsEachStartRevision) {
  WatchHubOptions ho;
  ho.stream_queue_messages = 2;
  ho.catch_up_batch_revs = 10;
  ho.sync_interval = absl::Milliseconds(50);
  Start(ho);
  std::vector<std::pair<std::string, std::string>> kvs;
  for (int i = 0; i < 80; ++i) kvs.emplace_back("k", std::to_string(i));
  const std::vector<int64_t> revs = PutMany(kvs, 10);  // revisions 2..81
  ASSERT_EQ(revs.front(), 2);
  ASSERT_EQ(revs.back(), 81);

  // Fill the stalled stream's queue first, so that neither catch-up watcher
  // can start before both exist.
  TestReader* r = NewReader(/*stalled=*/true);
  for (int i = 0; i < 3; ++i) r->stream()->Create(CreateReq("unrelated"));  // ids 0-2
  r->stream()->Create(CreateReq("k", "", 2));                             // id 3
  r->stream()->Create(CreateReq("k", "", 60));                            // id 4
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(hub_->GetStats().unsynced, 2u);
  r->Resume();
  r->DrainBurst();  // both now have room in the same pass

  std::map<int64_t, std::vector<int64_t>> got;
  size_t n = 0;
  while (n < 80 + 22) {
    auto m = r->Next(std::chrono::milliseconds(3000));
    if (!m) break;
    for (const auto& e : m->events()) {
      got[m->watch_id()].push_back(e.kv().mod_revision());
      ++n;
    }
  }
  while (auto extra = r->Next(kQuiet)) {
    for (const auto& e : extra->events()) got[extra->watch_id()].push_back(e.kv().mod_revision());
  }
  EXPECT_EQ(got[3], Range(2, 81));
  EXPECT_EQ(got[4], Range(60, 81)) << "watcher 4 started at 60";
}

TEST_F(WatchHubTest, ThousandSingleKeyWatchersGetExactlyTheirEvents) {
  Start();
  constexpr int kStreams = 10, kPerStream = 100;
  std::vector<TestReader*> readers;
  for (int s = 0; s < kStreams; ++s) {
    TestReader* r = NewReader();
    readers.push_back(r);
    for (int j = 0; j < kPerStream; ++j) {
      r->stream()->Create(CreateReq("m/" + std::to_string(s * kPerStream + j)));
    }
    // One range watcher per stream over its own keys as well.
    r->stream()->Create(CreateReq("m/" + std::to_string(s * kPerStream),
                                  "m/" + std::to_string(s * kPerStream) + "~"));
  }
  EXPECT_EQ(hub_->GetStats().synced, static_cast<size_t>(kStreams * (kPerStream + 1)));
  std::vector<std::pair<std::string, std::string>> kvs;
  for (int i = 0; i < kStreams * kPerStream; ++i) kvs.emplace_back("m/" + std::to_string(i), "v");
  for (int i = 0; i < kStreams * kPerStream; ++i) kvs.emplace_back("m/" + std::to_string(i), "w");
  const std::vector<int64_t> revs = PutMany(kvs, 16);
  const int n = kStreams * kPerStream;

  for (int s = 0; s < kStreams; ++s) {
    // Each single-key watcher gets its key's 2 events; the range watcher
    // (id kPerStream) covers exactly one existing key, "m/<s*100>".
    std::map<int64_t, std::vector<int64_t>> got;
    int created = 0;
    size_t events = 0;
    while (created < kPerStream + 1 || events < static_cast<size_t>(2 * (kPerStream + 1))) {
      auto m = readers[s]->Next();
      ASSERT_TRUE(m) << "stream " << s << ": " << events << " events";
      if (m->created()) {
        EXPECT_EQ(m->watch_id(), created);
        ++created;
        continue;
      }
      for (const auto& e : m->events()) {
        got[m->watch_id()].push_back(e.kv().mod_revision());
        ++events;
      }
    }
    for (int j = 0; j < kPerStream; ++j) {
      const int key = s * kPerStream + j;
      EXPECT_EQ(got[j], (std::vector<int64_t>{revs[key], revs[n + key]})) << "key " << key;
    }
    const int first = s * kPerStream;
    EXPECT_EQ(got[kPerStream], (std::vector<int64_t>{revs[first], revs[n + first]}));
  }
  std::this_thread::sleep_for(kQuiet);
  for (TestReader* r : readers) {
    auto extra = r->Next(std::chrono::milliseconds(0));
    EXPECT_FALSE(extra.has_value()) << extra->ShortDebugString();
  }
}

TEST_F(WatchHubTest, CloseRemovesWatchersAndWritesGoOn) {
  Start();
  TestReader* a = NewReader();
  auto pk = CreateReq("c/", "c0");
  pk.set_prev_kv(true);
  a->stream()->Create(pk);
  a->stream()->Create(CreateReq("c/1"));
  a->stream()->Create(CreateReq("", std::string(1, '\0')));
  TestReader* b = NewReader();
  b->stream()->Create(CreateReq("c/1"));
  ExpectCreated(b, 0);
  // A stream with an unsynced watcher and a queue nobody reads.
  const int64_t first = Put("c/1", "0");
  EXPECT_EQ(Revs(ReadEvents(b, 0, 1)), std::vector<int64_t>{first});
  TestReader* stuck = NewReader(/*stalled=*/true);
  stuck->stream()->Create(CreateReq("c/", "c0", 1));
  auto stats = hub_->GetStats();
  EXPECT_EQ(stats.streams, 3u);
  EXPECT_EQ(stats.synced + stats.unsynced, 5u);
  EXPECT_TRUE(hub_->WantsPrevKv());

  a->stream()->Close();
  a->stream()->Close();  // idempotent
  stuck->stream()->Close();
  stats = hub_->GetStats();
  EXPECT_EQ(stats.streams, 1u);
  EXPECT_EQ(stats.synced, 1u);
  EXPECT_EQ(stats.unsynced, 0u);
  EXPECT_EQ(a->stream()->num_watchers(), 0u);
  EXPECT_FALSE(hub_->WantsPrevKv());
  const int deliveries = a->deliveries();

  std::vector<int64_t> revs;
  for (int i = 0; i < 50; ++i) {
    revs.push_back(Put("c/1", std::to_string(i)));
    Delete("c/2");
  }
  a->stream()->Create(CreateReq("c/1"));  // ignored after Close
  EXPECT_EQ(Revs(ReadEvents(b, 0, revs.size())), revs);
  EXPECT_EQ(a->deliveries(), deliveries) << "nothing delivered after Close";
  EXPECT_EQ(a->stream()->num_watchers(), 0u);
  EXPECT_EQ(hub_->GetStats().streams, 1u);

  // Dropping the last reference of a live stream closes it too.
  readers_.pop_back();  // stuck
  b->stream()->Close();
  Put("c/1", "after");
  stats = hub_->GetStats();
  EXPECT_EQ(stats.streams, 0u);
  EXPECT_EQ(stats.synced + stats.unsynced, 0u);
}

}  // namespace
}  // namespace capstan::mvcc
