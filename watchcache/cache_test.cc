// The cache fed in process from a real KvStore and WatchHub: every List the
// cache answers is compared with the answer computed from the store
// (KvStore::Range at the same revision, then the same filter), over many
// random revisions with compactions.

#include "watchcache/cache.h"

#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"
#include "watchcache/errors.h"
#include "watchcache/k8s_test_objects.h"
#include "watchcache/test_store.h"

namespace capstan::watchcache {
namespace {

class CacheStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(OpenStore()); }
  void TearDown() override {
    cache_.reset();
    env_.Close();
  }
  void OpenStore(mvcc::WatchHubOptions hub_options = {}) {
    env_.Open(hub_options);
    store_ = env_.store();
    hub_ = env_.hub();
  }
  void StartCache(CacheOptions options = {}) {
    auto c = Cache::Start(std::move(options), store_, hub_);
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = std::move(*c);
    ASSERT_TRUE(cache_->WaitReady(absl::Seconds(10)));
  }

  int64_t Put(const std::string& key, const std::string& value) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    auto r = store_->Put(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->header().revision() : 0;
  }
  int64_t PutPod(const std::string& ns, const std::string& name, const std::string& node,
                 const std::string& phase, std::map<std::string, std::string> labels, bool json = false) {
    testing::PodFields p{name, ns, node, phase, std::move(labels), 200};
    return Put(absl::StrCat("/registry/pods/", ns, "/", name),
               json ? testing::PodJson(p) : testing::PodProtobuf(p));
  }
  void Delete(const std::string& key) {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(key);
    ASSERT_TRUE(store_->DeleteRange(req).ok());
  }

  // The records a List must return, computed from the store. False if the
  // store cannot answer at rev (compacted).
  bool Oracle(int64_t rev, const std::string& prefix, const std::string& labels,
              const std::string& fields, std::vector<std::string>* out) {
    etcdserverpb::RangeRequest req;
    req.set_key(prefix);
    req.set_range_end(PrefixEnd(prefix));
    req.set_revision(rev);
    mvcc::RangeResult res;
    if (!store_->Range(req, &res).ok()) return false;
    IndexExtractor ex(PodResource());
    auto sel = Selector::Parse(labels, fields, ex);
    EXPECT_TRUE(sel.ok());
    const char* p = res.kvs_wire.data();
    const char* end = p + res.kvs_wire.size();
    while (p < end) {
      uint64_t tag, len;
      EXPECT_TRUE(util::ReadVarint(&p, end, &tag) && util::ReadVarint(&p, end, &len));
      std::string rec(p, len);
      p += len;
      mvcc::KeyValueView kv;
      EXPECT_TRUE(mvcc::DecodeKeyValue(rec, &kv));
      Extracted e;
      ex.Extract(kv.value, &e);
      ObjectRef o = CachedObject::Create(oracle_alloc_.get(), rec, e);
      if (sel->Matches(*o)) out->push_back(rec);
    }
    return true;
  }

  // Stops the cache, the hub and the store, opens the store again on the
  // same data and starts a new cache (which lists it afresh).
  void Restart(CacheOptions options) {
    cache_.reset();
    env_.Close();
    ASSERT_NO_FATAL_FAILURE(OpenStore());
    StartCache(std::move(options));
  }

  static std::vector<std::string> Records(const ListResult& r) {
    std::vector<std::string> out;
    for (const auto& o : r.objects) out.emplace_back(o->kv());
    return out;
  }

  testing::TestStore env_;
  mvcc::KvStore* store_ = nullptr;
  mvcc::WatchHub* hub_ = nullptr;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<ObjectAllocator> oracle_alloc_ = NewMallocAllocator();
};

TEST_F(CacheStoreTest, InitialListAndConsistentReads) {
  PutPod("a", "p1", "n1", "Running", {{"app", "web"}});
  PutPod("a", "p2", "n2", "Running", {{"app", "db"}}, /*json=*/true);
  Put("/registry/minions/n1", "not a k8s value");
  StartCache();
  ListOptions l;
  l.prefix = "/registry/pods/";
  l.field_selector = "spec.nodeName=n2";
  auto r = cache_->List(l);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->objects.size(), 1u);
  EXPECT_EQ(r->objects[0]->key(), "/registry/pods/a/p2");
  // A write elsewhere moves the store's revision: a consistent read waits
  // until the cache has it (via a progress notification).
  const int64_t rev = Put("/registry/configmaps/x", "v");
  l.field_selector.clear();
  r = cache_->List(l);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->revision, rev);
  EXPECT_EQ(r->objects.size(), 2u);
  ListOptions nodes;
  nodes.prefix = "/registry/minions/";
  r = cache_->List(nodes);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->objects.size(), 1u);
  EXPECT_EQ(cache_->ResourceFor("/registry/minions/")->GetStats().undecoded, 1u);
  ListOptions other;
  other.prefix = "/registry/configmaps/";
  EXPECT_TRUE(Is(cache_->List(other).status(), CacheError::kNotCached));
}

TEST_F(CacheStoreTest, WatchThroughTheStore) {
  StartCache();
  WatchOptions w;
  w.prefix = "/registry/pods/";
  w.field_selector = "spec.nodeName=n1";
  w.resource_version = "0";
  w.allow_bookmarks = true;
  auto watch = cache_->Watch(w);
  ASSERT_TRUE(watch.ok()) << watch.status();
  PutPod("a", "p", "n1", "Pending", {});
  PutPod("a", "p", "n1", "Running", {});
  PutPod("a", "p", "n2", "Running", {});
  const int64_t last = PutPod("a", "q", "n1", "Running", {});
  std::vector<WatchEvent> evs;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (evs.size() < 4 && absl::Now() < deadline) {
    if ((*watch)->Pop(&evs, 10) == 0) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(evs.size(), 4u);
  EXPECT_EQ(evs[0].type, EventType::kAdded);
  EXPECT_EQ(evs[1].type, EventType::kModified);
  EXPECT_EQ(evs[2].type, EventType::kDeleted);
  EXPECT_EQ(evs[3].type, EventType::kAdded);
  EXPECT_EQ(evs[3].revision, last);
}

TEST_F(CacheStoreTest, DifferentialAgainstStoreWithCompactions) {
  CacheOptions options;
  options.ring_min_capacity = 64;
  options.ring_max_capacity = 256;
  StartCache(options);
  std::mt19937 rng(42);
  const char* nodes[] = {"n0", "n1", "n2", "n3", "n4", ""};
  const char* phases[] = {"Pending", "Running", "Succeeded"};
  struct Query {
    std::string prefix, labels, fields;
  };
  const std::vector<Query> queries = {
      {"/registry/pods/", "", ""},
      {"/registry/pods/", "", "spec.nodeName=n1"},
      {"/registry/pods/", "", "spec.nodeName="},
      {"/registry/pods/", "", "status.phase!=Running"},
      {"/registry/pods/", "app=web", ""},
      {"/registry/pods/", "app in (web,db),!tier", "metadata.namespace=b"},
      {"/registry/pods/", "tier", "spec.nodeName=n2,status.phase=Running"},
      {"/registry/pods/a/", "", ""},
      {"/registry/pods/b/", "app!=web", "spec.nodeName=n3"},
  };
  int64_t compacted = 0;
  int checks = 0, exact_checks = 0, page_checks = 0;
  std::vector<int64_t> revs;
  for (int op = 0; op < 1500; ++op) {
    const int k = static_cast<int>(rng() % 100);
    const std::string ns = rng() % 2 ? "a" : "b";
    const std::string name = absl::StrCat("p", rng() % 80);
    if (k < 70) {
      std::map<std::string, std::string> labels;
      if (rng() % 3) labels["app"] = rng() % 2 ? "web" : "db";
      if (rng() % 4 == 0) labels["tier"] = "x";
      revs.push_back(PutPod(ns, name, nodes[rng() % 6], phases[rng() % 3], labels, rng() % 5 == 0));
    } else if (k < 88) {
      Delete(absl::StrCat("/registry/pods/", ns, "/", name));
      revs.push_back(store_->Rev());
    } else if (k < 95) {
      revs.push_back(Put("/registry/configmaps/c", "v"));  // moves the revision only
    } else if (revs.size() > 50) {
      const int64_t at = revs[revs.size() - 1 - rng() % 40];
      if (at > compacted) {
        etcdserverpb::CompactionRequest req;
        req.set_revision(at);
        ASSERT_TRUE(store_->Compact(req).ok());
        compacted = at;
      }
    }
    if (op % 25 != 24) continue;
    for (const Query& q : queries) {
      // Consistent read of the latest state.
      ListOptions l;
      l.prefix = q.prefix;
      l.label_selector = q.labels;
      l.field_selector = q.fields;
      auto r = cache_->List(l);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_GE(r->revision, revs.back());
      std::vector<std::string> want;
      ASSERT_TRUE(Oracle(r->revision, q.prefix, q.labels, q.fields, &want));
      ASSERT_EQ(Records(*r), want) << "latest " << q.labels << " " << q.fields << " at " << r->revision;
      ++checks;
      // Exact at a past revision the cache and the store both still hold.
      const int64_t oldest = cache_->ResourceFor(q.prefix)->GetStats().oldest_rev;
      const int64_t x = revs[revs.size() - 1 - rng() % std::min<size_t>(revs.size(), 60)];
      l.resource_version = absl::StrCat(x);
      l.match = ResourceVersionMatch::kExact;
      r = cache_->List(l);
      if (x < oldest) {
        EXPECT_TRUE(Is(r.status(), CacheError::kTooOldResourceVersion)) << r.status();
      } else {
        ASSERT_TRUE(r.ok()) << r.status() << " x=" << x << " oldest=" << oldest;
        want.clear();
        if (Oracle(x, q.prefix, q.labels, q.fields, &want)) {
          ASSERT_EQ(Records(*r), want) << "exact " << q.labels << " " << q.fields << " at " << x;
          ++exact_checks;
        }
      }
      // Paginated, consistent: the pages make up the list at the first
      // page's revision, while writes go on between pages.
      ListOptions page;
      page.prefix = q.prefix;
      page.label_selector = q.labels;
      page.field_selector = q.fields;
      page.limit = 1 + rng() % 9;
      std::vector<std::string> got;
      int64_t at = 0;
      for (int i = 0;; ++i) {
        auto pr = cache_->List(page);
        ASSERT_TRUE(pr.ok()) << pr.status();
        if (i == 0) at = pr->revision;
        ASSERT_EQ(pr->revision, at);
        for (auto& rec : Records(*pr)) got.push_back(rec);
        if (pr->continue_token.empty()) break;
        page.continue_token = pr->continue_token;
        if (i % 2 == 0) PutPod("a", absl::StrCat("p", rng() % 80), "n1", "Running", {});
      }
      want.clear();
      if (Oracle(at, q.prefix, q.labels, q.fields, &want)) {
        ASSERT_EQ(got, want) << "pages " << q.labels << " " << q.fields << " at " << at;
        ++page_checks;
      }
    }
  }
  EXPECT_GT(checks, 400);
  EXPECT_GT(exact_checks, 100);
  EXPECT_GT(page_checks, 100);
  auto st = cache_->ResourceFor("/registry/pods/")->GetStats();
  EXPECT_EQ(st.feed_mismatches, 0u);
}

// Every watcher's events, from a revision or with initial events, equal the
// changes computed from the store's states at each revision (selector
// transitions included), across compactions of the store and restarts of
// store and cache; after a restart, revisions before the new list are too
// old for the cache.
TEST_F(CacheStoreTest, WatchDifferentialWithCompactionsAndRestarts) {
  CacheOptions options;
  options.ring_min_capacity = 64;
  options.ring_max_capacity = 1024;
  options.watcher_queue_events = 16;  // some watchers fall behind and catch up from history
  StartCache(options);
  std::mt19937 rng(99);
  const char* nodes[] = {"n0", "n1", "n2", ""};
  struct Query {
    std::string prefix, labels, fields;
  };
  const std::vector<Query> queries = {
      {"/registry/pods/", "", ""},
      {"/registry/pods/", "", "spec.nodeName=n1"},
      {"/registry/pods/", "", "spec.nodeName!=n1,status.phase=Running"},
      {"/registry/pods/", "app=web", ""},
      {"/registry/pods/b/", "", ""},
      {"/registry/pods/a/", "app in (web,db)", "spec.nodeName=n2"},
  };
  IndexExtractor ex(PodResource());
  // The store's state of the pods at rev: key -> record.
  auto state = [&](int64_t rev) {
    std::map<std::string, std::string> out;
    std::vector<std::string> recs;
    EXPECT_TRUE(Oracle(rev, "/registry/pods/", "", "", &recs)) << rev;
    for (auto& r : recs) {
      mvcc::KeyValueView kv;
      EXPECT_TRUE(mvcc::DecodeKeyValue(r, &kv));
      out[std::string(kv.key)] = r;
    }
    return out;
  };
  auto matches = [&](const Query& q, const std::string* rec) {
    if (rec == nullptr) return false;
    mvcc::KeyValueView kv;
    EXPECT_TRUE(mvcc::DecodeKeyValue(*rec, &kv));
    if (!kv.key.starts_with(q.prefix)) return false;
    Extracted e;
    ex.Extract(kv.value, &e);
    ObjectRef o = CachedObject::Create(oracle_alloc_.get(), *rec, e);
    return Selector::Parse(q.labels, q.fields, ex)->Matches(*o);
  };
  // An event as "TYPE rev object-record prev-record".
  auto describe = [](int type, int64_t rev, std::string_view obj, std::string_view prev) {
    return absl::StrCat(type, " ", rev, " ") + std::string(obj) + " " + std::string(prev);
  };
  int watch_checks = 0, events_checked = 0, initial_checks = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    if (epoch > 0) {
      const int64_t before = store_->Rev();
      Restart(options);
      PutPod("a", "restart-marker", "n0", "Running", {});
      WatchOptions old;
      old.prefix = "/registry/pods/";
      old.resource_version = absl::StrCat(before - 1);
      EXPECT_TRUE(Is(cache_->Watch(old).status(), CacheError::kTooOldResourceVersion));
    }
    for (int round = 0; round < 6; ++round) {
      const int64_t from = store_->Rev();
      if (rng() % 3 == 0) {
        etcdserverpb::CompactionRequest req;
        req.set_revision(from);
        ASSERT_TRUE(store_->Compact(req).ok());
      }
      std::vector<std::unique_ptr<CacheWatch>> watches;
      for (const Query& q : queries) {
        WatchOptions w;
        w.prefix = q.prefix;
        w.label_selector = q.labels;
        w.field_selector = q.fields;
        w.resource_version = absl::StrCat(from);
        auto r = cache_->Watch(w);
        ASSERT_TRUE(r.ok()) << r.status();
        watches.push_back(std::move(*r));
      }
      // One watcher with initial events at the latest state.
      WatchOptions init;
      init.prefix = "/registry/pods/";
      init.field_selector = "spec.nodeName=n1";
      init.send_initial_events = true;
      auto iw = cache_->Watch(init);
      ASSERT_TRUE(iw.ok()) << iw.status();

      for (int op = 0; op < 60; ++op) {
        const std::string ns = rng() % 2 ? "a" : "b";
        const std::string name = absl::StrCat("p", rng() % 30);
        const int k = static_cast<int>(rng() % 100);
        if (k < 65) {
          std::map<std::string, std::string> labels;
          if (rng() % 3) labels["app"] = rng() % 2 ? "web" : "db";
          PutPod(ns, name, nodes[rng() % 4], rng() % 2 ? "Running" : "Pending", labels, rng() % 4 == 0);
        } else if (k < 85) {
          Delete(absl::StrCat("/registry/pods/", ns, "/", name));
        } else {
          Put("/registry/configmaps/c", "v");
        }
      }
      const int64_t to = store_->Rev();
      ListOptions l;  // consistent: the cache has everything up to `to`
      l.prefix = "/registry/pods/";
      ASSERT_TRUE(cache_->List(l).ok());

      // The initial events: the node's pods when the watch started, then
      // the bookmark, then the changes.
      {
        std::vector<WatchEvent> evs;
        while ((*iw)->Pop(&evs, 1000) > 0) {
        }
        size_t i = 0;
        std::vector<std::string> got_initial;
        int64_t initial_rev = 0;
        for (; i < evs.size() && !evs[i].initial_events_end; ++i) {
          ASSERT_EQ(evs[i].type, EventType::kAdded);
          got_initial.emplace_back(evs[i].object->kv());
          initial_rev = evs[i].revision;
        }
        ASSERT_LT(i, evs.size()) << "no initial-events-end bookmark";
        if (initial_rev == 0) initial_rev = evs[i].revision;
        std::vector<std::string> want_initial;
        ASSERT_TRUE(Oracle(evs[i].revision, "/registry/pods/", "", "spec.nodeName=n1", &want_initial));
        EXPECT_EQ(got_initial, want_initial);
        ++initial_checks;
      }
      // Every watcher from `from`: the store's changes through its selector.
      std::map<std::string, std::string> prev_state = state(from);
      std::vector<std::vector<std::string>> want(queries.size());
      for (int64_t r = from + 1; r <= to; ++r) {
        std::map<std::string, std::string> cur = state(r);
        std::set<std::string> keys;
        for (const auto& [key, rec] : prev_state) keys.insert(key);
        for (const auto& [key, rec] : cur) keys.insert(key);
        for (const std::string& key : keys) {
          auto p = prev_state.find(key);
          auto c = cur.find(key);
          const std::string* pv = p == prev_state.end() ? nullptr : &p->second;
          const std::string* cv = c == cur.end() ? nullptr : &c->second;
          if ((pv == nullptr) != (cv == nullptr) || (pv && *pv != *cv)) {
            for (size_t qi = 0; qi < queries.size(); ++qi) {
              const bool was = matches(queries[qi], pv), is = matches(queries[qi], cv);
              if (was && is) want[qi].push_back(describe(1, r, *cv, *pv));
              if (!was && is) want[qi].push_back(describe(0, r, *cv, ""));
              if (was && !is) want[qi].push_back(describe(2, r, *pv, ""));
            }
          }
        }
        prev_state = std::move(cur);
      }
      for (size_t qi = 0; qi < queries.size(); ++qi) {
        std::vector<WatchEvent> evs;
        while (watches[qi]->Pop(&evs, 7) > 0) {
        }
        ASSERT_TRUE(watches[qi]->status().ok()) << watches[qi]->status();
        std::vector<std::string> got;
        for (const auto& e : evs) {
          if (e.type == EventType::kBookmark) continue;
          got.push_back(describe(static_cast<int>(e.type), e.revision, e.object->kv(),
                                 e.prev_object ? e.prev_object->kv() : std::string_view()));
        }
        ASSERT_EQ(got.size(), want[qi].size()) << queries[qi].labels << " " << queries[qi].fields;
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[qi][i]) << "event " << i;
        events_checked += static_cast<int>(got.size());
        ++watch_checks;
      }
    }
  }
  EXPECT_EQ(watch_checks, 3 * 6 * static_cast<int>(queries.size()));
  EXPECT_EQ(initial_checks, 3 * 6);
  EXPECT_GT(events_checked, 800);
}

// The feed's hub watch is canceled when the revisions it still needs are
// compacted away (here: the hub's dispatcher falls so far behind that it
// drops its queue, and the store is compacted before the feed's watcher can
// catch up from storage). The feed then lists again, as kube-apiserver's
// reflector re-lists after "too old resource version": watchers of the old
// state are ended with CacheReinitialized, and the cache holds the store's
// state again, including what was written while it was cut off.
TEST_F(CacheStoreTest, FeedListsAgainWhenItsWatchIsCompacted) {
  env_.Close();
  mvcc::WatchHubOptions ho;
  ho.dispatch_queue_bytes = 2048;  // a few pods
  ho.sync_interval = absl::Milliseconds(20);
  ASSERT_NO_FATAL_FAILURE(OpenStore(ho));
  PutPod("a", "before", "n1", "Running", {});
  StartCache();
  WatchOptions w;
  w.prefix = "/registry/pods/";
  w.resource_version = "0";
  auto watch = cache_->Watch(w);
  ASSERT_TRUE(watch.ok()) << watch.status();

  hub_->TEST_PauseDispatcher(true);
  int64_t last = 0;
  for (int i = 0; i < 30; ++i) last = PutPod("a", absl::StrCat("p", i), "n2", "Running", {});
  Delete("/registry/pods/a/before");
  last = store_->Rev();
  etcdserverpb::CompactionRequest compact;
  compact.set_revision(last);
  compact.set_physical(true);
  ASSERT_TRUE(store_->Compact(compact).ok());
  hub_->TEST_PauseDispatcher(false);

  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!(*watch)->done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE((*watch)->done()) << "the feed never listed again";
  EXPECT_TRUE(Is((*watch)->status(), CacheError::kCacheReinitialized)) << (*watch)->status();

  // A consistent list equals the store's state at its revision.
  ListOptions lo;
  lo.prefix = "/registry/pods/";
  auto r = cache_->List(lo);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->revision, last);
  std::vector<std::string> want;
  ASSERT_TRUE(Oracle(r->revision, "/registry/pods/", "", "", &want));
  EXPECT_EQ(Records(*r), want);
  EXPECT_EQ(r->objects.size(), 30u);

  // And the cache follows the store again.
  auto again = cache_->Watch(w);
  ASSERT_TRUE(again.ok()) << again.status();
  const int64_t next = PutPod("a", "after", "n1", "Running", {});
  std::vector<WatchEvent> evs;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while ((evs.empty() || evs.back().revision < next) && absl::Now() < until) {
    if ((*again)->Pop(&evs, 100) == 0) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().revision, next);
  EXPECT_EQ(evs.back().type, EventType::kAdded);
}

TEST_F(CacheStoreTest, FeedChecksPrevKv) {
  CacheOptions options;
  options.feed_prev_kv = true;
  StartCache(options);
  for (int i = 0; i < 50; ++i) PutPod("a", absl::StrCat("p", i % 7), "n1", "Running", {});
  Delete("/registry/pods/a/p1");
  ListOptions l;
  l.prefix = "/registry/pods/";
  auto r = cache_->List(l);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->objects.size(), 6u);
  EXPECT_EQ(cache_->ResourceFor("/registry/pods/")->GetStats().feed_mismatches, 0u);
}

}  // namespace
}  // namespace capstan::watchcache
