// libcapstan's C++ API (include/capstan/capstan.h), used as an embedder
// uses it: only the public header, plus test helpers.

#include "capstan/capstan.h"

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "process_fixture.h"
#include "watchcache/k8s_test_objects.h"

namespace capstan {
namespace {

using std::chrono::milliseconds;
using watchcache::testing::PodFields;
using watchcache::testing::PodProtobuf;

std::string Pod(const std::string& name, const std::string& node, const std::string& app = "web") {
  PodFields p;
  p.name = name;
  p.ns = "default";
  p.node = node;
  p.phase = "Running";
  p.labels = {{"app", app}};
  return PodProtobuf(p);
}

class EmbedTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open(Options options = {}) {
    options.data_dir = dir_.path() + "/data";
    options.fsync = false;
    auto opened = Store::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(*opened);
  }

  testing::TempDir dir_{"capstan-embed"};
  std::unique_ptr<Store> store_;
};

TEST_F(EmbedTest, PutRangeDeleteWithEtcdRevisions) {
  EXPECT_EQ(store_->Revision(), 1);
  auto put = store_->Put("/a/1", "one");
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->revision, 2);
  PutOptions with_prev;
  with_prev.prev_kv = true;
  put = store_->Put("/a/1", "uno", with_prev);
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE(put->prev_kv.has_value());
  EXPECT_EQ(put->prev_kv->value, "one");
  ASSERT_TRUE(store_->Put("/a/2", "two").ok());
  ASSERT_TRUE(store_->Put("/b", "bee").ok());

  RangeOptions prefix;
  prefix.range_end = PrefixEnd("/a/");
  auto r = store_->Range("/a/", prefix);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->revision, 5);
  EXPECT_EQ(r->count, 2);
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0].key, "/a/1");
  EXPECT_EQ(r->kvs[0].value, "uno");
  EXPECT_EQ(r->kvs[0].create_revision, 2);
  EXPECT_EQ(r->kvs[0].mod_revision, 3);
  EXPECT_EQ(r->kvs[0].version, 2);

  prefix.limit = 1;
  r = store_->Range("/a/", prefix);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kvs.size(), 1u);
  EXPECT_TRUE(r->more);

  // The past stays readable until compacted.
  RangeOptions at;
  at.revision = 2;
  r = store_->Range("/a/1", at);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].value, "one");

  DeleteOptions del;
  del.range_end = PrefixEnd("/a/");
  del.prev_kv = true;
  auto d = store_->DeleteRange("/a/", del);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->deleted, 2);
  EXPECT_EQ(d->prev_kvs.size(), 2u);
  EXPECT_EQ(d->revision, 6);
  EXPECT_EQ(store_->Range("/a/1")->kvs.size(), 0u);
}

TEST_F(EmbedTest, ErrorsCarryEtcdCodesAndTexts) {
  auto put = store_->Put("", "v");
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(put.status().message(), "etcdserver: key is not provided");

  RangeOptions future;
  future.revision = 100;
  auto r = store_->Range("k", future);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().message(), "etcdserver: mvcc: required revision is a future revision");

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->Put("k", std::to_string(i)).ok());
  auto c = store_->Compact(3, /*physical=*/true);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(store_->CompactRevision(), 3);
  RangeOptions old;
  old.revision = 2;
  r = store_->Range("k", old);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().message(), "etcdserver: mvcc: required revision has been compacted");
  EXPECT_EQ(r.status().ToString(),
            "OUT_OF_RANGE: etcdserver: mvcc: required revision has been compacted");
  EXPECT_EQ(store_->Compact(2).status().message(),
            "etcdserver: mvcc: required revision has been compacted");

  auto keepalive = store_->LeaseKeepAlive(12345);
  EXPECT_EQ(keepalive.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(keepalive.status().message(), "etcdserver: requested lease not found");
}

TEST_F(EmbedTest, OpenValidatesOptionsLikeTheBinary) {
  Options none;
  EXPECT_EQ(Store::Open(none).status().code(), StatusCode::kInvalidArgument);
  Options bad;
  bad.data_dir = dir_.path() + "/other";
  bad.extra_flags = {"--no-such-flag=1"};
  auto s = Store::Open(bad).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no-such-flag"), std::string::npos) << s.message();
  // The data directory is held by the open store.
  Options again;
  again.data_dir = dir_.path() + "/data";
  EXPECT_FALSE(Store::Open(again).ok());
}

TEST_F(EmbedTest, TxnTakesTheBranchTheComparesChoose) {
  ASSERT_TRUE(store_->Put("x", "1").ok());
  auto t = store_->Txn({Compare::Value("x", Compare::Result::kEqual, "1")},
                       {Op::Put("x", "2"), Op::Range("x"),
                        Op::Txn({Compare::Version("y", Compare::Result::kEqual, 0)},
                                {Op::Put("y", "new")}, {})},
                       {Op::Delete("x")});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->succeeded);
  EXPECT_EQ(t->revision, 3);
  ASSERT_EQ(t->results.size(), 3u);
  EXPECT_EQ(t->results[0].type, Op::Type::kPut);
  ASSERT_EQ(t->results[1].range.kvs.size(), 1u);
  EXPECT_EQ(t->results[1].range.kvs[0].value, "2");
  EXPECT_TRUE(t->results[2].txn_succeeded);
  EXPECT_EQ(store_->Range("y")->kvs.at(0).value, "new");

  t = store_->Txn({Compare::ModRevision("x", Compare::Result::kLess, 2)}, {Op::Delete("x")},
                  {Op::Range("x")});
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->succeeded);
  EXPECT_EQ(t->revision, 3);  // a read-only branch makes no revision

  auto dup = store_->Txn({}, {Op::Put("d", "1"), Op::Put("d", "2")}, {});
  EXPECT_EQ(dup.status().message(), "etcdserver: duplicate key given in txn request");
}

TEST_F(EmbedTest, PullWatchSeesPutsAndDeletesInOrder) {
  WatchOptions o;
  o.range_end = PrefixEnd("/w/");
  o.prev_kv = true;
  auto w = store_->Watch("/w/", o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(store_->Put("/w/a", "1").ok());
  ASSERT_TRUE(store_->Put("/w/a", "2").ok());
  ASSERT_TRUE(store_->Put("/other", "x").ok());
  ASSERT_TRUE(store_->DeleteRange("/w/a").ok());

  std::vector<Event> events;
  WatchBatch batch;
  while (events.size() < 3 && (*w)->Next(&batch, milliseconds(5000))) {
    ASSERT_TRUE(batch.end.ok());
    for (auto& e : batch.events) events.push_back(e);
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, Event::Type::kPut);
  EXPECT_EQ(events[0].kv.mod_revision, 2);
  EXPECT_EQ(events[1].kv.value, "2");
  ASSERT_TRUE(events[1].prev_kv.has_value());
  EXPECT_EQ(events[1].prev_kv->value, "1");
  EXPECT_EQ(events[2].type, Event::Type::kDelete);
  EXPECT_EQ(events[2].kv.key, "/w/a");
  EXPECT_EQ(events[2].kv.mod_revision, 5);
  EXPECT_FALSE((*w)->Next(&batch, milliseconds(50)));  // nothing more
}

TEST_F(EmbedTest, WatchFromACompactedRevisionEnds) {
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store_->Put("k", std::to_string(i)).ok());
  ASSERT_TRUE(store_->Compact(4, true).ok());
  WatchOptions o;
  o.start_revision = 2;
  auto w = store_->Watch("k", o);
  ASSERT_TRUE(w.ok());
  WatchBatch batch;
  ASSERT_TRUE((*w)->Next(&batch, milliseconds(5000)));
  EXPECT_EQ(batch.end.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(batch.end.message(), "etcdserver: mvcc: required revision has been compacted");
  EXPECT_EQ(batch.compact_revision, 4);
}

TEST_F(EmbedTest, CallbackWatchFromThePast) {
  ASSERT_TRUE(store_->Put("c", "1").ok());
  ASSERT_TRUE(store_->Put("c", "2").ok());
  std::mutex mu;
  std::vector<std::string> seen;
  WatchOptions o;
  o.start_revision = 1;
  auto w = store_->Watch("c", o, [&](const WatchBatch& b) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& e : b.events) seen.push_back(e.kv.value);
  });
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(store_->Put("c", "3").ok());
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (seen.size() >= 3) break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  w->reset();  // cancels; the callback never runs again
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"1", "2", "3"}));
}

// Writers on several threads, watchers of both kinds and a cache watch at
// once: every watcher sees every write exactly once, in revision order.
TEST_F(EmbedTest, ConcurrentWritersAndWatchers) {
  ASSERT_TRUE(store_->WaitCacheReady(milliseconds(10000)));
  constexpr int kThreads = 4, kPerThread = 50, kTotal = kThreads * kPerThread;
  WatchOptions all;
  all.range_end = PrefixEnd("/registry/pods/");
  auto pull = store_->Watch("/registry/pods/", all);
  ASSERT_TRUE(pull.ok());
  std::mutex mu;
  std::vector<int64_t> pushed;
  auto push = store_->Watch("/registry/pods/", all, [&](const WatchBatch& b) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& e : b.events) pushed.push_back(e.kv.mod_revision);
  });
  ASSERT_TRUE(push.ok());
  CacheWatchOptions co;
  co.prefix = "/registry/pods/";
  co.resource_version = std::to_string(store_->Revision());
  std::vector<int64_t> cached;
  auto cache = store_->CacheWatch(co, [&](const std::vector<CacheEvent>& events, const Status&) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& e : events) cached.push_back(e.revision);
  });
  ASSERT_TRUE(cache.ok());

  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string name = "p" + std::to_string(t) + "-" + std::to_string(i);
        EXPECT_TRUE(store_->Put("/registry/pods/ns/" + name, Pod(name, "n" + std::to_string(i % 3)))
                        .ok());
      }
    });
  }
  std::vector<int64_t> pulled;
  WatchBatch batch;
  while (pulled.size() < kTotal && (*pull)->Next(&batch, milliseconds(5000))) {
    for (const auto& e : batch.events) pulled.push_back(e.kv.mod_revision);
  }
  for (auto& w : writers) w.join();
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (pushed.size() >= kTotal && cached.size() >= kTotal) break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  // Two threads cancel the same watch at once; then the destructors run.
  std::thread c1([&] { (*push)->Cancel(); });
  std::thread c2([&] { (*push)->Cancel(); });
  c1.join();
  c2.join();
  cache->reset();
  push->reset();

  std::vector<int64_t> want;
  for (int64_t r = 2; r < 2 + kTotal; ++r) want.push_back(r);
  EXPECT_EQ(pulled, want);
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(pushed, want);
  EXPECT_EQ(cached, want);
}

TEST_F(EmbedTest, LeasesGrantKeepAliveRevoke) {
  auto g = store_->LeaseGrant(30);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_NE(g->id, 0);
  EXPECT_EQ(g->ttl, 30);
  PutOptions with_lease;
  with_lease.lease = g->id;
  ASSERT_TRUE(store_->Put("leased", "v", with_lease).ok());
  EXPECT_EQ(store_->Range("leased")->kvs.at(0).lease, g->id);

  LeaseInfo info = store_->LeaseTimeToLive(g->id, /*keys=*/true);
  EXPECT_EQ(info.granted_ttl, 30);
  EXPECT_GT(info.ttl, 25);
  EXPECT_EQ(info.keys, std::vector<std::string>{"leased"});
  EXPECT_EQ(*store_->LeaseKeepAlive(g->id), 30);
  EXPECT_EQ(store_->Leases(), std::vector<int64_t>{g->id});

  PutOptions missing;
  missing.lease = 777;
  EXPECT_EQ(store_->Put("k", "v", missing).status().message(),
            "etcdserver: requested lease not found");
  EXPECT_EQ(store_->LeaseGrant(30, g->id).status().message(), "etcdserver: lease already exists");

  ASSERT_TRUE(store_->LeaseRevoke(g->id).ok());
  EXPECT_TRUE(store_->Range("leased")->kvs.empty());
  EXPECT_EQ(store_->LeaseTimeToLive(g->id).ttl, -1);
  EXPECT_EQ(store_->LeaseRevoke(g->id).status().code(), StatusCode::kNotFound);
}

TEST_F(EmbedTest, CacheListsAndWatchesThePodsOfOneNode) {
  ASSERT_TRUE(store_->WaitCacheReady(milliseconds(10000)));
  for (int i = 0; i < 6; ++i) {
    const std::string name = "pod-" + std::to_string(i);
    ASSERT_TRUE(store_->Put("/registry/pods/default/" + name,
                            Pod(name, i % 2 ? "node-1" : "node-2", i < 2 ? "db" : "web"))
                    .ok());
  }
  ListOptions l;
  l.prefix = "/registry/pods/";
  l.field_selector = "spec.nodeName=node-1";
  auto list = store_->List(l);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->revision, store_->Revision());
  ASSERT_EQ(list->objects.size(), 3u);
  EXPECT_EQ(list->objects[0].key, "/registry/pods/default/pod-1");
  EXPECT_EQ(list->objects[2].key, "/registry/pods/default/pod-5");

  l.label_selector = "app=db";
  list = store_->List(l);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->objects.size(), 1u);
  EXPECT_EQ(list->objects[0].key, "/registry/pods/default/pod-1");

  CacheWatchOptions wo;
  wo.prefix = "/registry/pods/";
  wo.field_selector = "spec.nodeName=node-1";
  wo.resource_version = std::to_string(store_->Revision());
  auto w = store_->CacheWatch(wo);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // pod-1 moves to node-2: node-1's watcher sees it leave as DELETED.
  ASSERT_TRUE(store_->Put("/registry/pods/default/pod-1", Pod("pod-1", "node-2")).ok());
  ASSERT_TRUE(store_->Put("/registry/pods/default/pod-9", Pod("pod-9", "node-1")).ok());
  ASSERT_TRUE(store_->Put("/registry/pods/default/pod-8", Pod("pod-8", "node-3")).ok());
  std::vector<CacheEvent> events;
  for (int i = 0; i < 50 && events.size() < 2; ++i) {
    ASSERT_TRUE((*w)->Next(&events, milliseconds(100)).ok());
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, CacheEvent::Type::kDeleted);
  EXPECT_EQ(events[0].object.key, "/registry/pods/default/pod-1");
  EXPECT_EQ(events[1].type, CacheEvent::Type::kAdded);
  EXPECT_EQ(events[1].object.key, "/registry/pods/default/pod-9");
  EXPECT_EQ(events[1].revision, store_->Revision() - 1);

  ListOptions bad;
  bad.prefix = "/registry/pods/";
  bad.field_selector = "spec.nodeName";
  EXPECT_EQ(store_->List(bad).status().code(), StatusCode::kInvalidArgument);
  ListOptions uncached;
  uncached.prefix = "/registry/secrets/";
  EXPECT_EQ(store_->List(uncached).status().code(), StatusCode::kNotFound);
  CacheWatchOptions bad_rv = wo;
  bad_rv.resource_version = "abc";
  EXPECT_EQ(store_->CacheWatch(bad_rv).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EmbedTest, DataSurvivesReopen) {
  ASSERT_TRUE(store_->Put("durable", "yes").ok());
  const int64_t rev = store_->Revision();
  store_.reset();
  Open();
  EXPECT_EQ(store_->Revision(), rev);
  EXPECT_EQ(store_->Range("durable")->kvs.at(0).value, "yes");
}

// Auto compaction runs in an embedded store that serves nothing.
TEST_F(EmbedTest, PeriodicAutoCompaction) {
  store_.reset();
  Options o;
  o.auto_compaction_period = std::chrono::seconds(1);
  Open(o);
  ASSERT_TRUE(store_->Put("k", "1").ok());
  ASSERT_TRUE(store_->Put("k", "2").ok());
  // etcd's periodic schedule: the first compaction, one period after the
  // start, goes to the revision of the start; the next, a period later, to
  // the revision one period old, which includes both puts.
  for (int i = 0; i < 200 && store_->CompactRevision() < 3; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_GE(store_->CompactRevision(), 3);
}

std::string RunCommand(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// etcdctl talks to the embedded store: what the process writes, etcdctl
// reads, and the other way round.
TEST_F(EmbedTest, ServesEtcdGrpcFromTheSameStore) {
  store_.reset();
  Options o;
  o.listen_client_urls = {"http://127.0.0.1:0"};
  Open(o);
  ASSERT_EQ(store_->ClientPorts().size(), 1u);
  const int port = store_->ClientPorts()[0];
  ASSERT_GT(port, 0);
  ASSERT_TRUE(store_->Put("from-process", "hello").ok());
  const std::string etcdctl =
      "ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:" + std::to_string(port) + " ";
  EXPECT_EQ(RunCommand(etcdctl + "get from-process --print-value-only"), "hello\n");
  EXPECT_EQ(RunCommand(etcdctl + "put from-etcdctl world"), "OK\n");
  auto r = store_->Range("from-etcdctl");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].value, "world");
  EXPECT_NE(RunCommand(etcdctl + "endpoint status -w json").find("\"revision\":3"), std::string::npos);
}

}  // namespace
}  // namespace capstan
