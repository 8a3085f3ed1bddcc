// Watch races on etcd and Capstan, each server checked against the writes
// it acknowledged: watch creation racing writes, watching during a
// compaction, cancel during delivery, progress after events (see
// diff_watch_test.cc).

#include "diff_watch.h"

namespace capstan::testing {
namespace {

// ===========================================================================
// Races: each server on its own, checked against the writes it acknowledged

struct Write {
  int64_t rev;
  std::string key, value;
  bool is_delete;
};

class DiffWatchRaceTest : public WatchCompare<DiffTest> {
 protected:
  // Writes n revisions (puts, every seventh a delete) to keys of prefix() on
  // both servers from its own thread; log is filled as they are answered.
  std::thread Writer(int n, std::vector<Write>* log, std::mutex* mu,
                     std::atomic<bool>* done) {
    return std::thread([this, n, log, mu, done] {
      for (int i = 0; i < n; ++i) {
        const std::string key = K(absl::StrCat("k", i % 5));
        Write w;
        w.key = key;
        w.is_delete = i % 7 == 6;
        if (w.is_delete) {
          // Delete what exists (so that every write is a revision).
          etcdserverpb::TxnRequest t;
          t.add_success()->mutable_request_delete_range()->set_key(key);
          auto* put = t.add_success()->mutable_request_put();
          put->set_key(K("tick"));
          auto p = Both(t);
          EXPECT_SAME(p);
          w.rev = p.etcd.resp.header().revision();
        } else {
          w.value = absl::StrCat("v", i);
          w.rev = PutBoth(key, w.value);
        }
        std::lock_guard<std::mutex> l(*mu);
        log->push_back(std::move(w));
      }
      done->store(true);
    });
  }
  int64_t CurrentRev(ServerStubs& s) {
    etcdserverpb::RangeRequest r;
    r.set_key("x");
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(s.kv->Range(&ctx, r, &resp).ok());
    return resp.header().revision();
  }
  // The events of the log a watcher of prefix() on keys k* sees from start.
  static std::vector<std::pair<int64_t, std::string>> Expected(const std::vector<Write>& log,
                                                                int64_t start) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const Write& w : log) {
      if (w.rev >= start) out.emplace_back(w.rev, w.is_delete ? "DELETE " + w.key : w.key + "=" + w.value);
    }
    return out;
  }
  static std::vector<std::pair<int64_t, std::string>> Seen(const std::vector<WatchResponse>& rs) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const auto& r : rs) {
      for (const auto& ev : r.events()) {
        out.emplace_back(ev.kv().mod_revision(),
                         ev.type() == mvccpb::Event::DELETE
                             ? "DELETE " + ev.kv().key()
                             : ev.kv().key() + "=" + ev.kv().value());
      }
    }
    return out;
  }
  // Every revision's events in one response (no fragments asked for).
  static void ExpectRevisionsWhole(const std::vector<WatchResponse>& rs, const std::string& what) {
    std::set<int64_t> seen;
    for (const auto& r : rs) {
      std::set<int64_t> mine;
      for (const auto& ev : r.events()) mine.insert(ev.kv().mod_revision());
      for (int64_t rev : mine) {
        EXPECT_TRUE(seen.insert(rev).second) << what << ": revision " << rev << " split";
      }
    }
  }
};

TEST_F(DiffWatchRaceTest, CreationRacesWrites) {
  constexpr int kWrites = 240;
  std::vector<Write> log;
  std::mutex mu;
  std::atomic<bool> done{false};
  WatchClient ec(etcd_stubs().watch.get()), cc(capstan_stubs().watch.get());
  struct Made {
    int64_t id;
    int64_t start;   // requested start revision (0: current)
  };
  std::vector<Made> made;
  std::thread writer = Writer(kWrites, &log, &mu, &done);
  int64_t next_id = 0;
  // Watchers created while the writer runs, alternately at current + 1 (as
  // each server just reported it) and at 0 ("from now").
  while (!done.load() && next_id < 40) {
    for (auto* side : {&ec, &cc}) {
      const int64_t rev = CurrentRev(side == &ec ? etcd_stubs() : capstan_stubs());
      WatchRequest req = CreateReq(K("k"), PrefixEnd(K("k")), next_id % 2 == 0 ? rev + 1 : 0);
      req.mutable_create_request()->set_watch_id(next_id + 1);
      EXPECT_TRUE(side->Send(req));
      made.push_back({next_id + 1, req.create_request().start_revision()});
    }
    ++next_id;
    std::this_thread::sleep_for(5ms);
  }
  writer.join();
  const int64_t last = log.back().rev;
  for (auto* side : {&ec, &cc}) {
    const char* name = side == &ec ? "etcd" : "capstan";
    // Read until every watcher reached the last revision.
    std::map<int64_t, std::vector<WatchResponse>> got;
    std::map<int64_t, int64_t> reached;
    for (int64_t id = 1; id <= next_id; ++id) {
      const int64_t requested = made[(id - 1) * 2 + (side == &ec ? 0 : 1)].start;
      if (requested != 0) reached[id] = requested - 1;
    }
    const auto deadline = Clock::now() + kEventWait;
    auto all_reached = [&] {
      for (int64_t id = 1; id <= next_id; ++id) {
        if (reached[id] < last) return false;
      }
      return true;
    };
    while (!all_reached()) {
      auto r = side->Next(deadline - Clock::now());
      if (!r) break;
      if (r->created()) {
        // A "from now" watcher has seen everything up to its header revision.
        reached[r->watch_id()] = std::max(reached[r->watch_id()], r->header().revision());
      }
      for (const auto& ev : r->events()) {
        reached[r->watch_id()] = std::max(reached[r->watch_id()], ev.kv().mod_revision());
      }
      got[r->watch_id()].push_back(std::move(*r));
    }
    for (int64_t id = 1; id <= next_id; ++id) {
      const auto& rs = got[id];
      ASSERT_FALSE(rs.empty()) << name << " watch " << id << ": no response";
      ASSERT_TRUE(rs.front().created()) << name << " watch " << id;
      const int64_t requested = made[(id - 1) * 2 + (side == &ec ? 0 : 1)].start;
      const int64_t start = requested != 0 ? requested : rs.front().header().revision() + 1;
      std::vector<WatchResponse> events(rs.begin() + 1, rs.end());
      EXPECT_EQ(Seen(events), Expected(log, start))
          << name << " watch " << id << " from " << start
          << (requested == 0 ? " (created at 0)" : "");
      ExpectRevisionsWhole(events, absl::StrCat(name, " watch ", id));
    }
  }
}

TEST_F(DiffWatchRaceTest, WatchDuringCompaction) {
  constexpr int kWrites = 200;
  std::vector<Write> log;
  std::mutex mu;
  std::atomic<bool> done{false};
  const int64_t base = Revision();
  WatchClient ec(etcd_stubs().watch.get()), cc(capstan_stubs().watch.get());
  std::thread writer = Writer(kWrites, &log, &mu, &done);
  // Watchers from the test's first revision, created while the writer runs
  // and a compaction to the middle of the writes happens.
  int64_t made = 0;
  int64_t compacted_at = 0;
  while (!done.load() && made < 30) {
    ++made;
    WatchRequest req = CreateReq(K("k"), PrefixEnd(K("k")), base + 1 + made);
    req.mutable_create_request()->set_watch_id(made);
    EXPECT_TRUE(ec.Send(req));
    EXPECT_TRUE(cc.Send(req));
    if (made == 10) {
      std::lock_guard<std::mutex> l(mu);
      compacted_at = log.empty() ? base + 1 : log[log.size() / 2].rev;
    }
    if (made == 10) {
      etcdserverpb::CompactionRequest c;
      c.set_revision(compacted_at);
      auto p = Both(c);  // header revisions differ: the writer goes on
      EXPECT_TRUE(p.etcd.status.ok() && p.capstan.status.ok())
          << Describe(p.etcd.status) << " / " << Describe(p.capstan.status);
    }
    std::this_thread::sleep_for(8ms);
  }
  writer.join();
  ASSERT_GT(compacted_at, 0) << "the writer finished before the compaction";
  const int64_t last = log.back().rev;
  for (auto* side : {&ec, &cc}) {
    const char* name = side == &ec ? "etcd" : "capstan";
    std::map<int64_t, std::vector<WatchResponse>> got;
    std::map<int64_t, bool> finished;
    auto all = [&] {
      for (int64_t id = 1; id <= made; ++id) {
        if (!finished[id]) return false;
      }
      return true;
    };
    const auto deadline = Clock::now() + kEventWait;
    while (!all()) {
      auto r = side->Next(deadline - Clock::now());
      if (!r) break;
      if (r->canceled() || (r->events_size() > 0 &&
                            r->events(r->events_size() - 1).kv().mod_revision() == last)) {
        finished[r->watch_id()] = true;
      }
      got[r->watch_id()].push_back(std::move(*r));
    }
    int canceled = 0;
    for (int64_t id = 1; id <= made; ++id) {
      const auto& rs = got[id];
      ASSERT_GE(rs.size(), 2u) << name << " watch " << id;
      EXPECT_TRUE(rs.front().created()) << name << " watch " << id;
      const int64_t start = base + 1 + id;
      if (rs.back().canceled()) {
        // Canceled: only for a start below the compaction, with nothing else.
        ++canceled;
        EXPECT_EQ(rs.size(), 2u) << name << " watch " << id << ": events and a cancel";
        EXPECT_LT(start, compacted_at) << name << " watch " << id;
        EXPECT_EQ(rs.back().compact_revision(), compacted_at) << name << " watch " << id;
        continue;
      }
      std::vector<WatchResponse> events(rs.begin() + 1, rs.end());
      // A delete at the compaction revision is compacted away: a watcher
      // starting there that caught up afterwards does not see it.
      auto seen = Seen(events), want = Expected(log, start);
      for (auto* v : {&seen, &want}) {
        std::erase_if(*v, [&](const auto& e) {
          return e.first == compacted_at && e.second.rfind("DELETE ", 0) == 0;
        });
      }
      EXPECT_EQ(seen, want) << name << " watch " << id;
      ExpectRevisionsWhole(events, absl::StrCat(name, " watch ", id));
    }
    std::printf("%s: %d of %lld watchers canceled by the compaction at %lld\n", name, canceled,
                static_cast<long long>(made), static_cast<long long>(compacted_at));
  }
}

TEST_F(DiffWatchRaceTest, CancelDuringDelivery) {
  constexpr int kWrites = 160;
  std::vector<Write> log;
  std::mutex mu;
  std::atomic<bool> done{false};
  const int64_t start = Revision() + 1;
  WatchClient ec(etcd_stubs().watch.get()), cc(capstan_stubs().watch.get());
  for (auto* side : {&ec, &cc}) {
    ASSERT_TRUE(side->Send(CreateReq(K("k"), PrefixEnd(K("k")), start)));     // 0
    ASSERT_TRUE(side->Send(CreateReq(K("marker"))));                          // 1
  }
  std::thread writer = Writer(kWrites, &log, &mu, &done);
  // Cancel watcher 0 once it has some events, while the writer goes on.
  std::map<WatchClient*, std::vector<WatchResponse>> got;
  for (auto* side : {&ec, &cc}) {
    int events = 0;
    const auto deadline = Clock::now() + kEventWait;
    while (events < 40) {
      auto r = side->Next(deadline - Clock::now());
      if (!r) break;
      events += r->events_size();
      got[side].push_back(std::move(*r));
    }
    EXPECT_GE(events, 40);
    EXPECT_TRUE(side->Send(CancelReq(0)));
  }
  writer.join();
  PutBoth(K("marker"), "end");
  for (auto* side : {&ec, &cc}) {
    const char* name = side == &ec ? "etcd" : "capstan";
    auto& rs = got[side];
    const auto deadline = Clock::now() + kEventWait;
    for (;;) {
      auto r = side->Next(deadline - Clock::now());
      ASSERT_TRUE(r.has_value()) << name << ": no marker event";
      const bool marker = r->watch_id() == 1 && r->events_size() > 0;
      rs.push_back(std::move(*r));
      if (marker) break;
    }
    std::vector<WatchResponse> before;
    bool canceled = false;
    for (const auto& r : rs) {
      if (r.watch_id() != 0) continue;
      if (canceled) {
        ADD_FAILURE() << name << ": a response after the canceled one:\n" << Describe(r);
        continue;
      }
      if (r.canceled()) {
        canceled = true;
      } else if (!r.created()) {
        before.push_back(r);
      }
    }
    EXPECT_TRUE(canceled) << name << ": no canceled response";
    // What came before the cancel is the start of the history, in order.
    auto seen = Seen(before);
    auto want = Expected(log, start);
    ASSERT_LE(seen.size(), want.size()) << name;
    want.resize(seen.size());
    EXPECT_EQ(seen, want) << name;
    ExpectRevisionsWhole(before, name);
  }
}

// A progress notification comes after every event at or below its revision
// on its stream, on both servers (etcd 3.4 answered progress requests at
// once, ahead of events still on their way; fixed in 3.5).
TEST_F(DiffWatchRaceTest, ProgressAfterEvents) {
  constexpr int kWrites = 160;
  std::vector<Write> log;
  std::mutex mu;
  std::atomic<bool> done{false};
  WatchClient ec(etcd_stubs().watch.get());
  WatchClient cc(capstan_stubs().watch.get());
  for (WatchClient* w : {&ec, &cc}) {
    ASSERT_TRUE(w->Send(CreateReq(K("k"), PrefixEnd(K("k")))));
    ASSERT_TRUE(w->Next(kEventWait).has_value());  // Created
  }
  std::thread writer = Writer(kWrites, &log, &mu, &done);
  int requests = 0;
  while (!done.load()) {
    EXPECT_TRUE(ec.Send(ProgressReq()));
    EXPECT_TRUE(cc.Send(ProgressReq()));
    ++requests;
    std::this_thread::sleep_for(3ms);
  }
  writer.join();
  ASSERT_TRUE(ec.Send(ProgressReq()));
  ASSERT_TRUE(cc.Send(ProgressReq()));
  ++requests;
  const int64_t last = log.back().rev;
  for (WatchClient* w : {&ec, &cc}) {
    SCOPED_TRACE(w == &ec ? "etcd" : "capstan");
    int progress = 0;
    int64_t max_event = 0, max_progress = 0;
    const auto deadline = Clock::now() + kEventWait;
    while (max_event < last || max_progress < last) {
      auto r = w->Next(deadline - Clock::now());
      if (!r) break;
      if (IsProgress(*r)) {
        ++progress;
        const int64_t rev = r->header().revision();
        EXPECT_GE(rev, max_progress) << "progress went backwards";
        max_progress = std::max(max_progress, rev);
        continue;
      }
      for (const auto& ev : r->events()) {
        EXPECT_GT(ev.kv().mod_revision(), max_progress)
            << "event at " << ev.kv().mod_revision() << " after a progress notification at "
            << max_progress;
        max_event = std::max(max_event, ev.kv().mod_revision());
      }
    }
    EXPECT_EQ(max_event, last);
    EXPECT_EQ(max_progress, last) << "the last progress request is answered at the last revision";
    EXPECT_GT(progress, 0);
    std::printf("%s: %d progress requests, %d answered\n", w == &ec ? "etcd" : "capstan",
                requests, progress);
  }
}

}  // namespace
}  // namespace capstan::testing
