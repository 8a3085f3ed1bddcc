// WatchHub: created responses, events, start revisions, progress, fragments.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "mvcc/watch_hub_test_util.h"
#include "util/mutex.h"

namespace capstan::mvcc::watch_hub_test {
namespace {

using etcdserverpb::WatchCreateRequest;
using etcdserverpb::WatchResponse;
using mvccpb::Event;

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

// A txn's reads see its own earlier writes, but a watcher's prev_kv is the
// key before the txn, as etcd reads it at the event's revision - 1.
TEST_F(WatchHubTest, PrevKvOfKeyWrittenEarlierInTxnIsFromBeforeTxn) {
  Start();
  const int64_t old_rev = Put("p/old", "before");
  TestReader* r = NewReader();
  auto req = CreateReq("p/", "p0");
  req.set_prev_kv(true);
  r->stream()->Create(req);
  ExpectCreated(r, 0);
  // Put both keys, then delete from "p/" on: a from-key delete is exempt from
  // etcd's duplicate-key check, so it may follow the puts.
  etcdserverpb::TxnRequest txn;
  for (const char* key : {"p/new", "p/old"}) {
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value("in-txn");
  }
  auto* del = txn.add_success()->mutable_request_delete_range();
  del->set_key("p/");
  del->set_range_end(std::string(1, '\0'));
  auto resp = store_->Txn(txn);
  ASSERT_TRUE(resp.ok()) << resp.status();

  std::vector<Event> evs = ReadEvents(r, 0, 4);
  ASSERT_EQ(evs.size(), 4u);
  EXPECT_EQ(Keys(evs), (std::vector<std::string>{"p/new", "p/old", "p/new", "p/old"}));
  EXPECT_FALSE(evs[0].has_prev_kv()) << "a create has no previous value";
  ASSERT_TRUE(evs[1].has_prev_kv());
  EXPECT_EQ(evs[1].prev_kv().value(), "before");
  EXPECT_EQ(evs[2].type(), Event::DELETE);
  EXPECT_FALSE(evs[2].has_prev_kv()) << "p/new did not exist before the txn";
  EXPECT_EQ(evs[3].type(), Event::DELETE);
  ASSERT_TRUE(evs[3].has_prev_kv());
  EXPECT_EQ(evs[3].prev_kv().value(), "before");
  EXPECT_EQ(evs[3].prev_kv().mod_revision(), old_rev);
}

// A point of the hub's code where the first thread to get there waits until
// the test opens it; later ones pass.
class Gate {
 public:
  void Pass() {
    util::MutexLock l(&mu_);
    if (reached_) return;
    reached_ = true;
    mu_.Await(absl::Condition(&open_));
  }
  bool WaitReached() {
    util::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&reached_), absl::FromChrono(kWait));
  }
  void Open() {
    util::MutexLock l(&mu_);
    open_ = true;
  }

 private:
  util::Mutex mu_;
  bool reached_ ABSL_GUARDED_BY(mu_) = false;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

// A prev_kv watcher created while a write is being committed gets that
// write's event without the previous value the write path attaches (it
// looked before the watcher existed): the hub reads it from storage. That
// read must not hold the hub: while it waits, other streams create and
// cancel watchers and get their events.
TEST_F(WatchHubTest, PrevKvReadFromStorageDoesNotHoldTheHub) {
  Start();
  const int64_t r1 = Put("x", "v1");
  TestReader* a = NewReader();
  TestReader* b = NewReader();

  struct Gates {
    Gate create, notify, lookup;
  };
  auto gates = std::make_shared<Gates>();
  hub_->TEST_SetSyncPoint([gates](std::string_view point) {
    if (point == "WatchStream::Create:AfterStoreRev") gates->create.Pass();
    if (point == "WatchHub::Notify:BeforeDispatchLock") gates->notify.Pass();
    if (point == "WatchHub::LookupPrev") gates->lookup.Pass();
  });
  std::vector<std::thread> threads;
  auto finish = [&] {
    gates->create.Open();
    gates->notify.Open();
    gates->lookup.Open();
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
    threads.clear();
    hub_->TEST_SetSyncPoint(nullptr);
  };

  // A's watcher reads the store's revision (r1), then waits; the write of
  // r2 looks for prev_kv watchers (none), is published and reaches Notify;
  // the watcher is added (synced from r2) before Notify delivers r2.
  threads.emplace_back([a] {
    auto req = CreateReq("x");
    req.set_prev_kv(true);
    a->stream()->Create(req);
  });
  if (!gates->create.WaitReached()) {
    finish();
    FAIL() << "Create did not read the store's revision";
  }
  int64_t r2 = 0;
  threads.emplace_back([this, &r2] { r2 = Put("x", "v2"); });
  if (!gates->notify.WaitReached()) {
    finish();
    FAIL() << "the write did not reach Notify";
  }
  gates->create.Open();
  threads[0].join();
  gates->notify.Open();
  // The read of x at r1 for A's event waits.
  if (!gates->lookup.WaitReached()) {
    finish();
    FAIL() << "r2's previous value was not read from storage";
  }

  // Meanwhile another stream creates a watcher, gets an event and cancels.
  util::Mutex mu;
  bool other_done = false;
  threads.emplace_back([&] {
    b->stream()->Create(CreateReq("y"));
    ExpectCreated(b, 0);
    const int64_t r3 = Put("y", "1");
    EXPECT_EQ(Revs(ReadEvents(b, 0, 1)), std::vector<int64_t>{r3});
    b->stream()->Cancel(0);
    auto canceled = b->Next();
    EXPECT_TRUE(canceled && canceled->canceled());
    EXPECT_EQ(hub_->GetStats().streams, 2u);
    util::MutexLock l(&mu);
    other_done = true;
  });
  bool done;
  {
    util::MutexLock l(&mu);
    done = mu.AwaitWithTimeout(absl::Condition(&other_done), absl::FromChrono(kWait));
  }
  EXPECT_TRUE(done) << "another stream waited for a storage read of the watch hub";
  finish();

  // A gets r2 with the value before it.
  ExpectCreated(a, 0);
  const std::vector<Event> evs = ReadEvents(a, 0, 1);
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(evs[0].kv().mod_revision(), r2);
  ASSERT_TRUE(evs[0].has_prev_kv());
  EXPECT_EQ(evs[0].prev_kv().value(), "v1");
  EXPECT_EQ(evs[0].prev_kv().mod_revision(), r1);
  ExpectQuiet(a);
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

TEST_F(WatchHubTest, WatchersFromThePastAreCaughtUpAtOnceOrTogether) {
  // A watcher from a past revision that finds the syncer idle is caught up
  // at once; one that arrives within sync_gap of a pass that caught some up
  // waits for the gap's end, with whatever arrives meanwhile: etcd's
  // watch-get benchmark creates thousands at once, and a pass for every few
  // of them cost more than all the rest.
  WatchHubOptions ho;
  ho.sync_gap = absl::Seconds(1);
  Start(ho);
  std::vector<int64_t> revs;
  for (int i = 0; i < 8; ++i) revs.push_back(Put("k", std::to_string(i)));
  TestReader* first = NewReader();
  const auto t0 = std::chrono::steady_clock::now();
  first->stream()->Create(CreateReq("k", "", revs.front()));
  EXPECT_EQ(Revs(ReadEvents(first, 0, revs.size())), revs);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_LT(t1 - t0, std::chrono::milliseconds(500)) << "the syncer was idle";

  const uint64_t passes_before = hub_->GetStats().sync_passes;
  constexpr int kStreams = 4, kPerStream = 50;
  std::vector<TestReader*> readers;
  for (int s = 0; s < kStreams; ++s) readers.push_back(NewReader());
  for (int i = 0; i < kPerStream; ++i) {
    for (TestReader* r : readers) r->stream()->Create(CreateReq("k", "", revs.front()));
  }
  for (TestReader* r : readers) {
    std::map<int64_t, std::vector<int64_t>> got;  // watch id -> revisions
    size_t events = 0;
    while (events < kPerStream * revs.size()) {
      auto resp = r->Next();
      ASSERT_TRUE(resp) << events << " events of " << kPerStream * revs.size();
      for (const auto& e : resp->events()) got[resp->watch_id()].push_back(e.kv().mod_revision());
      events += resp->events_size();
    }
    ASSERT_EQ(got.size(), static_cast<size_t>(kPerStream));
    for (const auto& [id, rs] : got) EXPECT_EQ(rs, revs) << "watch " << id;
  }
  // The first pass started after t0, less than 500 ms before t1: the
  // next not before t1 + 500 ms.
  EXPECT_GE(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(500))
      << "a burst right after a pass waits for the gap";
  const uint64_t passes = hub_->GetStats().sync_passes - passes_before;
  EXPECT_GE(passes, 1u);
  EXPECT_LE(passes, 2u) << "200 watchers created together, caught up in " << passes << " passes";
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
  // As in etcd, its id stays taken until the client cancels it (clientv3
  // does), and that cancel is answered.
  EXPECT_EQ(r->stream()->num_watchers(), 1u);
  r->stream()->Cancel(0);
  auto answer = r->Next();
  ASSERT_TRUE(answer);
  EXPECT_TRUE(answer->canceled());
  EXPECT_EQ(answer->watch_id(), 0);
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

// etcd 3.5.16 (progressIfSync) drops a progress request while a watcher of
// the stream is unsynced, and never answers it later.
TEST_F(WatchHubTest, RequestProgressDroppedWhileUnsynced) {
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
  for (const auto& m : all) EXPECT_NE(m.watch_id(), -1) << "a dropped request answered";
  ExpectQuiet(r);
  // Synced now: the next request is answered.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (hub_->GetStats().unsynced != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(hub_->GetStats().unsynced, 0u);
  r->stream()->RequestProgress();
  auto p = r->Next();
  ASSERT_TRUE(p) << "no progress once synced";
  EXPECT_EQ(p->watch_id(), -1);
  EXPECT_EQ(p->events_size(), 0);
  EXPECT_EQ(p->header().revision(), revs.back());
  ExpectQuiet(r);
}

// A watcher canceled for compaction stays in etcd's stream until the client
// cancels it, never synced: until then the stream's progress requests are
// dropped.
TEST_F(WatchHubTest, RequestProgressDroppedWhileACompactedWatcherStays) {
  Start();
  const int64_t r1 = Put("a", "1");
  const int64_t r2 = Put("a", "2");
  etcdserverpb::CompactionRequest creq;
  creq.set_revision(r2);
  creq.set_physical(true);
  ASSERT_TRUE(store_->Compact(creq).ok());

  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("b"));
  ExpectCreated(r, 0);
  r->stream()->Create(CreateReq("a", "", r1));
  ExpectCreated(r, 1);
  auto canceled = r->Next();
  ASSERT_TRUE(canceled);
  EXPECT_TRUE(canceled->canceled());
  EXPECT_EQ(canceled->compact_revision(), r2);
  r->stream()->RequestProgress();
  ExpectQuiet(r);
  r->stream()->Cancel(1);
  auto answer = r->Next();
  ASSERT_TRUE(answer);
  EXPECT_TRUE(answer->canceled());
  r->stream()->RequestProgress();
  auto p = r->Next();
  ASSERT_TRUE(p) << "no progress once the compacted watcher is canceled";
  EXPECT_EQ(p->watch_id(), -1);
  EXPECT_EQ(p->header().revision(), r2);
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

}  // namespace
}  // namespace capstan::mvcc::watch_hub_test
