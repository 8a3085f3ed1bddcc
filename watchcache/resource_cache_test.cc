#include "watchcache/resource_cache.h"

#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "watchcache/errors.h"
#include "watchcache/k8s_test_objects.h"

namespace capstan::watchcache {
namespace {

class ResourceCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { Recreate(); }

  void Recreate() {
    watches_.clear();
    cache_.reset();
    options_.wait_timeout = absl::Milliseconds(200);
    cache_ = std::make_unique<ResourceCache>(PodResource(), options_, alloc_.get());
    cache_->Reset(1, {});
  }

  ObjectRef Pod(int64_t rev, const std::string& name, const std::string& node,
                const std::string& phase = "Running", std::map<std::string, std::string> labels = {},
                const std::string& ns = "default") {
    testing::PodFields p{name, ns, node, phase, std::move(labels), 100};
    return cache_->MakeObject(testing::KvRecord(Key(name, ns), testing::PodProtobuf(p), rev));
  }
  static std::string Key(const std::string& name, const std::string& ns = "default") {
    return "/registry/pods/" + ns + "/" + name;
  }
  void Put(int64_t rev, const std::string& name, const std::string& node,
           const std::string& phase = "Running", std::map<std::string, std::string> labels = {},
           const std::string& ns = "default") {
    std::vector<FeedChange> c(1);
    c[0].rev = rev;
    c[0].object = Pod(rev, name, node, phase, std::move(labels), ns);
    cache_->Apply(std::move(c), rev);
  }
  void Del(int64_t rev, const std::string& name, const std::string& ns = "default") {
    std::vector<FeedChange> c(1);
    c[0].rev = rev;
    c[0].key = Key(name, ns);
    cache_->Apply(std::move(c), rev);
  }

  CacheWatch* Watch(const std::string& fields, const std::string& rv = "",
                    const std::string& labels = "", bool bookmarks = false, bool initial = false) {
    WatchOptions w;
    w.prefix = "/registry/pods/";
    w.field_selector = fields;
    w.label_selector = labels;
    w.resource_version = rv;
    w.allow_bookmarks = bookmarks;
    w.send_initial_events = initial;
    auto r = cache_->Watch(w);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    watches_.push_back(std::move(*r));
    return watches_.back().get();
  }

  static std::vector<WatchEvent> Drain(CacheWatch* w) {
    std::vector<WatchEvent> out;
    while (w->Pop(&out, 3) > 0) {
    }
    return out;
  }

  // "TYPE name@rev" per event, for compact expectations.
  static std::vector<std::string> Describe(const std::vector<WatchEvent>& evs) {
    std::vector<std::string> out;
    for (const auto& e : evs) {
      const char* t = e.type == EventType::kAdded      ? "ADDED"
                      : e.type == EventType::kModified ? "MODIFIED"
                      : e.type == EventType::kDeleted  ? "DELETED"
                                                       : "BOOKMARK";
      std::string name;
      if (e.object) name = std::string(e.object->key().substr(std::string("/registry/pods/default/").size()));
      out.push_back(absl::StrCat(t, " ", name, "@", e.revision, e.initial_events_end ? " end" : ""));
    }
    return out;
  }

  absl::StatusOr<ListResult> List(const std::string& fields, const std::string& rv = "0",
                                  ResourceVersionMatch match = ResourceVersionMatch::kUnset,
                                  int64_t limit = 0, const std::string& cont = "",
                                  const std::string& labels = "") {
    ListOptions l;
    l.prefix = "/registry/pods/";
    l.field_selector = fields;
    l.label_selector = labels;
    l.resource_version = rv;
    l.match = match;
    l.limit = limit;
    l.continue_token = cont;
    return cache_->List(l);
  }
  static std::vector<std::string> Names(const ListResult& r) {
    std::vector<std::string> out;
    for (const auto& o : r.objects) out.emplace_back(o->key().substr(o->key().rfind('/') + 1));
    return out;
  }

  CacheOptions options_;
  std::unique_ptr<ObjectAllocator> alloc_ = NewSlabAllocator();
  std::unique_ptr<ResourceCache> cache_;
  std::vector<std::unique_ptr<CacheWatch>> watches_;
};

using V = std::vector<std::string>;

TEST_F(ResourceCacheTest, SelectorTransitionsReachOldAndNewIndexValues) {
  CacheWatch* a = Watch("spec.nodeName=node-a", "1");
  CacheWatch* b = Watch("spec.nodeName=node-b", "1");
  CacheWatch* web = Watch("", "1", "app=web");
  std::vector<CacheWatch*> others;
  for (int i = 0; i < 100; ++i) others.push_back(Watch(absl::StrCat("spec.nodeName=other-", i), "1"));

  Put(2, "p1", "node-a", "Pending", {{"app", "web"}});
  EXPECT_EQ(Describe(Drain(a)), V({"ADDED p1@2"}));
  Put(3, "p1", "node-b", "Running", {{"app", "web"}});  // moves from a to b
  auto ev = Drain(a);
  EXPECT_EQ(Describe(ev), V({"DELETED p1@3"}));
  // The DELETED carries the last state node-a's watcher saw.
  EXPECT_EQ(ev[0].object->field(cache_->extractor().FieldIndex("spec.nodeName")), "node-a");
  EXPECT_EQ(Describe(Drain(b)), V({"ADDED p1@3"}));
  Put(4, "p1", "node-b", "Succeeded", {{"app", "db"}});  // stays on b, leaves app=web
  EXPECT_EQ(Describe(Drain(b)), V({"MODIFIED p1@4"}));
  EXPECT_TRUE(Drain(a).empty());
  Del(5, "p1");
  EXPECT_EQ(Describe(Drain(b)), V({"DELETED p1@5"}));
  EXPECT_EQ(Describe(Drain(web)), V({"ADDED p1@2", "MODIFIED p1@3", "DELETED p1@4"}));
  for (auto* o : others) EXPECT_TRUE(Drain(o).empty());
  // Dispatch looked only at the watchers of the values involved, never at
  // the 100 others.
  auto st = cache_->GetStats();
  EXPECT_LE(st.dispatch_candidates, 4u * 3);
}

TEST_F(ResourceCacheTest, NamespaceWatchersAndNotify) {
  WatchOptions w;
  w.prefix = "/registry/pods/team-a/";
  w.resource_version = "1";
  auto watch = cache_->Watch(w);
  ASSERT_TRUE(watch.ok());
  std::vector<WatchEvent> out;
  EXPECT_EQ((*watch)->Pop(&out, 10), 0u);
  std::atomic<int> notified{0};
  (*watch)->SetNotify([&] { notified++; });
  Put(2, "x", "n", "Running", {}, "team-b");
  EXPECT_EQ(notified.load(), 0);
  Put(3, "x", "n", "Running", {}, "team-a");
  Put(4, "y", "n", "Running", {}, "team-a");
  EXPECT_EQ(notified.load(), 1) << "notified once, when the first event arrived";
  EXPECT_EQ((*watch)->Pop(&out, 10), 2u);
  EXPECT_EQ(out[0].object->key(), "/registry/pods/team-a/x");
  (*watch)->Cancel();
  Put(5, "z", "n", "Running", {}, "team-a");
  EXPECT_EQ(notified.load(), 1);
  EXPECT_TRUE((*watch)->done());
}

TEST_F(ResourceCacheTest, ListSemantics) {
  Put(2, "a", "n1");
  Put(3, "b", "n2");
  Put(4, "c", "n1", "Pending");
  auto r = List("spec.nodeName=n1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Names(*r), V({"a", "c"}));
  EXPECT_EQ(r->revision, 4);
  r = List("spec.nodeName=n1,status.phase=Running");
  EXPECT_EQ(Names(*r), V({"a"}));
  r = List("status.phase!=Running");
  EXPECT_EQ(Names(*r), V({"c"}));
  Put(5, "a", "n2");
  Del(6, "c");
  // Exact reads the state at that revision, through the index plus the
  // keys changed since.
  r = List("spec.nodeName=n1", "4", ResourceVersionMatch::kExact);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Names(*r), V({"a", "c"}));
  EXPECT_EQ(r->revision, 4);
  r = List("", "3", ResourceVersionMatch::kExact);
  EXPECT_EQ(Names(*r), V({"a", "b"}));
  r = List("spec.nodeName=n1", "6");  // NotOlderThan 6: the latest
  EXPECT_EQ(Names(*r), V({}));
  cache_->AdvanceTo(9);  // the store moved on elsewhere
  r = List("", "8", ResourceVersionMatch::kExact);
  EXPECT_EQ(Names(*r), V({"a", "b"}));
  EXPECT_EQ(r->revision, 8);
  r = List("", "0");
  EXPECT_EQ(r->revision, 9);

  // Errors.
  const absl::Time t0 = absl::Now();
  r = List("", "20");
  EXPECT_TRUE(Is(r.status(), CacheError::kTooLargeResourceVersion)) << r.status();
  EXPECT_EQ(r.status().message(), "Too large resource version: 20, current: 9");
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(150));
  EXPECT_TRUE(Is(List("", "0", ResourceVersionMatch::kExact).status(), CacheError::kInvalidRequest));
  EXPECT_TRUE(Is(List("", "", ResourceVersionMatch::kNotOlderThan).status(), CacheError::kInvalidRequest));
  EXPECT_TRUE(Is(List("", "abc").status(), CacheError::kInvalidRequest));
  EXPECT_TRUE(Is(List("spec.foo=1").status(), CacheError::kInvalidRequest));
  EXPECT_TRUE(Is(List("", "", ResourceVersionMatch::kUnset, 1, "not-a-token").status(),
                 CacheError::kInvalidRequest));

  // A List waiting for a newer revision is answered when it arrives.
  std::thread feeder([this] {
    absl::SleepFor(absl::Milliseconds(50));
    Put(10, "d", "n3");
  });
  r = List("", "10");
  feeder.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Names(*r), V({"a", "b", "d"}));
}

TEST_F(ResourceCacheTest, PaginationReadsOneSnapshot) {
  for (int i = 0; i < 50; ++i) Put(2 + i, absl::StrCat("p", 100 + i), i % 2 ? "odd" : "even");
  std::vector<std::string> all;
  std::string cont;
  int64_t rev = 0;
  int64_t next_rev = 60;
  for (int page = 0;; ++page) {
    auto r = List("", cont.empty() ? "0" : "", ResourceVersionMatch::kUnset, 7, cont);
    ASSERT_TRUE(r.ok()) << r.status();
    if (page == 0) {
      rev = r->revision;
      ASSERT_TRUE(r->remaining_item_count.has_value());
      EXPECT_EQ(*r->remaining_item_count, 43);
    }
    EXPECT_EQ(r->revision, rev);
    for (auto& n : Names(*r)) all.push_back(n);
    if (r->continue_token.empty()) break;
    cont = r->continue_token;
    // Changes between pages are not seen by the pages.
    Put(next_rev++, absl::StrCat("p", 100 + page), "moved");
    Put(next_rev++, absl::StrCat("q", page), "new");
  }
  ASSERT_EQ(all.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(all[i], absl::StrCat("p", 100 + i));
  // With a selector: pages through the index at the first page's snapshot.
  auto r = List("spec.nodeName=odd", "51", ResourceVersionMatch::kExact, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->objects.size(), 10u);
  EXPECT_FALSE(r->remaining_item_count.has_value());
  auto r2 = List("spec.nodeName=odd", "", ResourceVersionMatch::kUnset, 100, r->continue_token);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->objects.size(), 15u);
  EXPECT_TRUE(r2->continue_token.empty());
}

TEST_F(ResourceCacheTest, TooOldResourceVersion) {
  options_.ring_min_capacity = 8;
  options_.ring_max_capacity = 8;
  Recreate();
  for (int i = 0; i < 40; ++i) Put(2 + i, absl::StrCat("p", i % 5), "n");
  auto st = cache_->GetStats();
  EXPECT_LE(st.ring_events, 8u);
  EXPECT_GT(st.oldest_rev, 2);
  WatchOptions w;
  w.prefix = "/registry/pods/";
  w.resource_version = "2";
  auto watch = cache_->Watch(w);
  EXPECT_TRUE(Is(watch.status(), CacheError::kTooOldResourceVersion)) << watch.status();
  EXPECT_EQ(watch.status().message(), absl::StrCat("too old resource version: 2 (", st.oldest_rev, ")"));
  auto r = List("", "2", ResourceVersionMatch::kExact);
  EXPECT_TRUE(Is(r.status(), CacheError::kTooOldResourceVersion));
  // The oldest state still held can be watched from and listed exactly.
  w.resource_version = absl::StrCat(st.oldest_rev);
  watch = cache_->Watch(w);
  ASSERT_TRUE(watch.ok()) << watch.status();
  EXPECT_EQ(Drain(watch->get()).size(), static_cast<size_t>(41 - st.oldest_rev));
  EXPECT_TRUE(List("", absl::StrCat(st.oldest_rev), ResourceVersionMatch::kExact).ok());
  // A continue token whose snapshot is gone has expired.
  auto page = List("", "0", ResourceVersionMatch::kUnset, 2);
  for (int i = 0; i < 40; ++i) Put(100 + i, absl::StrCat("p", i % 5), "n");
  r = List("", "", ResourceVersionMatch::kUnset, 2, page->continue_token);
  EXPECT_TRUE(Is(r.status(), CacheError::kContinueExpired)) << r.status();
}

// The event ring follows the event rate, as kube-apiserver's cacher does: a
// burst whose oldest event is still inside the window doubles the capacity
// (up to the max); a slow feed whose newest quarter is older than the window
// halves it (down to the min). The ring never holds more than its capacity.
TEST_F(ResourceCacheTest, RingGrowsWithABurstAndShrinksWhenTheRateFalls) {
  options_.event_window = absl::Milliseconds(300);
  options_.ring_min_capacity = 8;
  options_.ring_max_capacity = 64;
  Recreate();
  EXPECT_EQ(cache_->GetStats().ring_capacity, 8u);
  int64_t rev = 2;
  for (int i = 0; i < 120; ++i) {
    Put(rev++, absl::StrCat("p", i % 20), "n");
    auto st = cache_->GetStats();
    ASSERT_LE(st.ring_events, st.ring_capacity);
  }
  auto burst = cache_->GetStats();
  EXPECT_EQ(burst.ring_capacity, 64u) << "a burst inside the window grows the ring to its max";
  EXPECT_EQ(burst.ring_events, 64u);

  // One event every 100 ms: each quarter of a full ring soon spans more
  // than the 300 ms window.
  size_t last_capacity = burst.ring_capacity;
  for (int i = 0; i < 100 && last_capacity > 8; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    Put(rev++, absl::StrCat("p", i % 20), "n");
    auto st = cache_->GetStats();
    ASSERT_LE(st.ring_events, st.ring_capacity);
    ASSERT_LE(st.ring_capacity, last_capacity) << "the ring grew while the rate fell";
    last_capacity = st.ring_capacity;
  }
  EXPECT_EQ(last_capacity, 8u) << "a slow feed shrinks the ring to its min";

  // A new burst grows it again.
  for (int i = 0; i < 40; ++i) Put(rev++, absl::StrCat("p", i % 20), "n");
  EXPECT_GT(cache_->GetStats().ring_capacity, 8u);
}

TEST_F(ResourceCacheTest, InitialEventsAndBookmarks) {
  options_.bookmark_interval = absl::Milliseconds(10);
  Recreate();
  Put(2, "a", "n1");
  Put(3, "b", "n2");
  Put(4, "c", "n1");
  CacheWatch* w = Watch("spec.nodeName=n1", "", "", /*bookmarks=*/true, /*initial=*/true);
  EXPECT_EQ(Describe(Drain(w)), V({"ADDED a@4", "ADDED c@4", "BOOKMARK @4 end"}));
  Put(5, "d", "n1");
  cache_->AdvanceTo(7);
  cache_->Tick(absl::Now() + absl::Seconds(1));
  EXPECT_EQ(Describe(Drain(w)), V({"ADDED d@5", "BOOKMARK @7"}));
  // Without allow_bookmarks: none.
  CacheWatch* quiet = Watch("spec.nodeName=n1", "7");
  cache_->Tick(absl::Now() + absl::Seconds(2));
  EXPECT_TRUE(Drain(quiet).empty());
  // RV "0" without send_initial_events: ADDED events, no end bookmark.
  CacheWatch* any = Watch("spec.nodeName=n1", "0");
  EXPECT_EQ(Describe(Drain(any)), V({"ADDED a@7", "ADDED c@7", "ADDED d@7"}));
}

TEST_F(ResourceCacheTest, SlowWatcherCatchesUpFromHistory) {
  options_.watcher_queue_events = 4;
  Recreate();
  CacheWatch* w = Watch("", "1");
  for (int i = 0; i < 30; ++i) Put(2 + i, absl::StrCat("p", i), "n");
  EXPECT_EQ(cache_->GetStats().watchers_behind, 1u);
  auto evs = Drain(w);
  ASSERT_EQ(evs.size(), 30u);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(evs[i].revision, 2 + i);
  EXPECT_EQ(cache_->GetStats().watchers_behind, 0u);
  Put(40, "live", "n");
  EXPECT_EQ(Describe(Drain(w)), V({"ADDED live@40"}));
}

TEST_F(ResourceCacheTest, SlowWatcherIsCutOff) {
  options_.watcher_queue_events = 4;
  options_.slow_watcher_budget = absl::Milliseconds(50);
  Recreate();
  CacheWatch* slow = Watch("", "1");
  CacheWatch* fast = Watch("", "1");
  std::atomic<int> notified{0};
  for (int i = 0; i < 20; ++i) {
    Put(2 + i, absl::StrCat("p", i), "n");
    Drain(fast);
  }
  cache_->Tick(absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(slow->done());
  EXPECT_TRUE(Is(slow->status(), CacheError::kWatcherTooSlow)) << slow->status();
  EXPECT_FALSE(fast->done());
  std::vector<WatchEvent> out;
  EXPECT_EQ(slow->Pop(&out, 10), 0u);
  EXPECT_EQ(cache_->GetStats().watchers_cut_off, 1u);
  (void)notified;
}

TEST_F(ResourceCacheTest, WatcherWhoseHistoryIsGoneIsCutOff) {
  options_.watcher_queue_events = 2;
  options_.ring_min_capacity = 4;
  options_.ring_max_capacity = 4;
  Recreate();
  CacheWatch* w = Watch("", "1");
  for (int i = 0; i < 20; ++i) Put(2 + i, absl::StrCat("p", i), "n");
  auto evs = Drain(w);
  EXPECT_EQ(evs.size(), 2u) << "what was queued before it fell behind";
  EXPECT_TRUE(w->done());
  EXPECT_TRUE(Is(w->status(), CacheError::kWatcherTooSlow)) << w->status();
}

TEST_F(ResourceCacheTest, ResetEndsWatchers) {
  CacheWatch* w = Watch("", "1");
  Put(2, "a", "n");
  std::vector<ObjectRef> objs = {Pod(10, "z", "n")};
  cache_->Reset(10, std::move(objs));
  EXPECT_TRUE(w->done());
  EXPECT_TRUE(Is(w->status(), CacheError::kCacheReinitialized));
  auto r = List("");
  EXPECT_EQ(Names(*r), V({"z"}));
  EXPECT_TRUE(Is(List("", "5", ResourceVersionMatch::kExact).status(), CacheError::kTooOldResourceVersion));
}

TEST_F(ResourceCacheTest, UndecodableValuesAreCachedAndCounted) {
  std::vector<FeedChange> c(1);
  c[0].rev = 2;
  c[0].object = cache_->MakeObject(testing::KvRecord(Key("enc"), "k8s:enc:aescbc:v1:xyz", 2));
  cache_->Apply(std::move(c), 2);
  Put(3, "ok", "n");
  EXPECT_EQ(cache_->GetStats().undecoded, 1u);
  EXPECT_EQ(Names(*List("")), V({"enc", "ok"}));
  EXPECT_EQ(Names(*List("spec.nodeName=n")), V({"ok"}));
  EXPECT_EQ(Names(*List("", "0", ResourceVersionMatch::kUnset, 0, "", "!app")), V({"ok"}));
}

}  // namespace
}  // namespace capstan::watchcache
