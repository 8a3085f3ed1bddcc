// WatchHub: slow consumers, batching and merging, the dispatcher's bound,
// scale, close.
//
// No test here waits for time to pass. "Nothing more arrives" is checked
// with a fence: a put the reader's watcher sees, after which the next
// response must be exactly the fence's event (events reach a stream in
// revision order, so anything still owed to it would come first). Waits for
// a state are bounded only to catch a failure.

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "mvcc/watch_hub_test_util.h"

namespace capstan::mvcc::watch_hub_test {
namespace {

using etcdserverpb::WatchCreateRequest;
using etcdserverpb::WatchResponse;
using mvccpb::Event;

// Expects r's next response to hold exactly one event, at fence_rev, for
// watch_id: nothing else was still coming to r before the fence.
void ExpectFence(TestReader* r, int64_t watch_id, int64_t fence_rev) {
  auto m = r->Next();
  ASSERT_TRUE(m.has_value()) << "the fence at revision " << fence_rev << " did not arrive";
  EXPECT_EQ(m->watch_id(), watch_id) << m->ShortDebugString();
  ASSERT_EQ(m->events_size(), 1) << "more than the fence: " << m->ShortDebugString();
  EXPECT_EQ(m->events(0).kv().mod_revision(), fence_rev) << m->ShortDebugString();
}

// Waits until cond holds; false if it does not within kWait (the bound
// only catches a failure).
bool WaitUntil(const std::function<bool()>& cond) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
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
  ExpectFence(stalled, 0, Put("s/fence", "f"));
  auto stats = hub_->GetStats();
  EXPECT_EQ(stats.unsynced, 0u);
  EXPECT_EQ(stats.synced, 3u);
}

// A reader that has not taken its write in flight gets everything after it
// in one response per watcher: later revisions are appended to the queued
// one, under the newest revision.
TEST_F(WatchHubTest, LaggingReaderGetsLaterRevisionsMergedIntoTheQueuedResponse) {
  Start();
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("m"));
  ExpectCreated(r, 0);
  std::vector<int64_t> revs;
  for (int i = 0; i < 6; ++i) revs.push_back(Put("m", std::to_string(i)));
  std::vector<WatchResponse> all;
  auto evs = ReadEvents(r, 0, revs.size(), &all);
  EXPECT_EQ(Revs(evs), revs);
  // The first response went out at once; all later ones waited behind it.
  EXPECT_LE(all.size(), 2u);
  EXPECT_EQ(all.back().header().revision(), revs.back());
  ExpectFence(r, 0, Put("m", "fence"));
}

// Events are never merged across another response of the same watch id:
// after a cancel and a new watcher with that id, its events come after its
// Created response.
TEST_F(WatchHubTest, MergingStopsAtTheWatchersOtherResponses) {
  Start();
  TestReader* r = NewReader();
  auto req = CreateReq("m");
  req.set_watch_id(7);
  r->stream()->Create(req);  // the Created response stays in flight
  const int64_t rev1 = Put("m", "1");
  // The event is queued behind the Created response before the cancel.
  ASSERT_TRUE(WaitUntil([&] { return hub_->GetStats().events_sent >= 1; }));
  ASSERT_EQ(hub_->GetStats().events_sent, 1u);
  r->stream()->Cancel(7);
  r->stream()->Create(req);
  const int64_t rev2 = Put("m", "2");
  ExpectCreated(r, 7);
  auto e1 = r->Next();
  ASSERT_TRUE(e1);
  ASSERT_EQ(e1->events_size(), 1);
  EXPECT_EQ(e1->events(0).kv().mod_revision(), rev1);
  auto canceled = r->Next();
  ASSERT_TRUE(canceled);
  EXPECT_TRUE(canceled->canceled());
  EXPECT_EQ(canceled->watch_id(), 7);
  ExpectCreated(r, 7);
  auto e2 = r->Next();
  ASSERT_TRUE(e2);
  ASSERT_EQ(e2->events_size(), 1);
  EXPECT_EQ(e2->events(0).kv().mod_revision(), rev2);
  ExpectFence(r, 7, Put("m", "fence"));
}

// A dispatcher too far behind drops what it queued and parks its synced
// watchers; they catch up from storage and get every event exactly once.
TEST_F(WatchHubTest, DispatcherFarBehindDropsItsQueueAndWatchersCatchUp) {
  WatchHubOptions ho;
  ho.dispatch_queue_bytes = 1024;
  ho.sync_interval = absl::Milliseconds(20);
  Start(ho);
  TestReader* r = NewReader();
  r->stream()->Create(CreateReq("d/", "d0"));
  ExpectCreated(r, 0);
  hub_->TEST_PauseDispatcher(true);
  std::vector<std::pair<std::string, std::string>> kvs;
  for (int i = 0; i < 300; ++i) kvs.emplace_back("d/" + std::to_string(i % 10), std::to_string(i));
  const std::vector<int64_t> revs = PutMany(kvs, 4);
  hub_->TEST_PauseDispatcher(false);
  auto evs = ReadEvents(r, 0, revs.size());
  EXPECT_EQ(Revs(evs), revs);
  ExpectFence(r, 0, Put("d/fence", "f"));
  const auto stats = hub_->GetStats();
  EXPECT_GT(stats.dropped, 0u);
  EXPECT_GE(stats.parked, 1u);
  EXPECT_EQ(stats.unsynced, 0u);
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
  EXPECT_EQ(hub_->GetStats().unsynced, 2u);
  // A probe created after them, on a stream with room, catches up: the
  // syncer pass that serves it went over both and, their stream being
  // full, served neither.
  TestReader* probe = NewReader();
  probe->stream()->Create(CreateReq("k", "", 81));
  ExpectCreated(probe, 0);
  EXPECT_EQ(Revs(ReadEvents(probe, 0, 1)), std::vector<int64_t>{81});
  const auto stats = hub_->GetStats();
  EXPECT_EQ(stats.unsynced, 2u) << "a watcher of the full stream was caught up";
  EXPECT_EQ(stats.events_sent, 1u) << "events were queued on the full stream";
  r->Resume();
  r->DrainBurst();  // both now have room in the same pass

  // Everything up to a fence put after the catch-up: each watcher's events
  // end with the fence's, and nothing else comes before it.
  std::map<int64_t, std::vector<int64_t>> got;
  auto read = [&](size_t events) {
    for (size_t n = 0; n < events;) {
      auto m = r->Next();
      if (!m) return false;
      for (const auto& e : m->events()) {
        got[m->watch_id()].push_back(e.kv().mod_revision());
        ++n;
      }
    }
    return true;
  };
  ASSERT_TRUE(read(80 + 22)) << got[3].size() << " and " << got[4].size() << " events";
  const int64_t fence = Put("k", "fence");
  ASSERT_TRUE(read(2)) << "the fence did not arrive";
  std::vector<int64_t> want3 = Range(2, 81), want4 = Range(60, 81);
  want3.push_back(fence);
  want4.push_back(fence);
  EXPECT_EQ(got[3], want3);
  EXPECT_EQ(got[4], want4) << "watcher 4 started at 60";
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
  // A fence per stream, under its range watcher's prefix (and no other
  // watcher's): the next response of each stream is its fence.
  std::vector<int64_t> fences;
  for (int s = 0; s < kStreams; ++s) {
    fences.push_back(Put("m/" + std::to_string(s * kPerStream) + "/fence", "f"));
  }
  for (int s = 0; s < kStreams; ++s) {
    SCOPED_TRACE("stream " + std::to_string(s));
    ExpectFence(readers[s], kPerStream, fences[s]);
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
}  // namespace capstan::mvcc::watch_hub_test
