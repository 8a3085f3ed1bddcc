// Seeded random differential test of watchers (diff_random_test.cc
// describes the seeded tests; the fixture is in diff_random.h).

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "diff_random.h"
#include "diff_watch.h"
#include "gtest/gtest.h"

namespace capstan::testing::diff_random {
namespace {

// ===========================================================================
// Watch

// What one watcher sent after its Created response, without the response
// boundaries, which legitimately differ (etcd sends a catching-up watcher's
// history in batches, Capstan may join revisions queued behind a slow reader:
// docs/COMPATIBILITY.md): its events in order, and how it ended.
struct WatcherLog {
  WatchResponse merged;  // watch_id, events, canceled, cancel_reason, compact_revision
  int64_t last_event_rev = 0;
  WatchResponse cancel;  // the response that canceled it, whole

  void Add(const WatchResponse& r) {
    merged.set_watch_id(r.watch_id());
    for (const auto& ev : r.events()) {
      *merged.add_events() = ev;
      last_event_rev = ev.kv().mod_revision();
    }
    if (r.canceled()) {
      merged.set_canceled(true);
      merged.set_cancel_reason(r.cancel_reason());
      cancel = r;
    }
    if (r.compact_revision() != 0) merged.set_compact_revision(r.compact_revision());
  }
};

// One server's Watch stream, and what each of its watchers sent so far.
class WatchLogs {
 public:
  explicit WatchLogs(etcdserverpb::Watch::Stub* stub) : client_(stub) {}

  bool Send(const WatchRequest& r) { return client_.Send(r); }

  // The next Created response (the answer to the last create request, since
  // each create waits for its answer), or nothing after kEventWait.
  std::optional<WatchResponse> AwaitCreated() { return AwaitFirst(&created_); }
  // The next answer to a progress request, or nothing after `wait`.
  std::optional<WatchResponse> AwaitProgress(Clock::duration wait = kEventWait) {
    return AwaitFirst(&progress_, wait);
  }

  // Reads responses until done() or the deadline. Returns done().
  template <typename Pred>
  bool ReadUntil(const Pred& done, Clock::time_point deadline) {
    while (!done()) {
      std::optional<WatchResponse> r = client_.Next(deadline - Clock::now());
      if (!r) return done();
      if (r->created()) {
        created_.push_back(std::move(*r));
      } else if (IsProgress(*r)) {
        progress_.push_back(std::move(*r));
      } else {
        logs_[r->watch_id()].Add(*r);
      }
    }
    return true;
  }

  const WatcherLog& log(int64_t id) { return logs_[id]; }

 private:
  std::optional<WatchResponse> AwaitFirst(std::deque<WatchResponse>* queue,
                                         Clock::duration wait = kEventWait) {
    ReadUntil([queue] { return !queue->empty(); }, Clock::now() + wait);
    if (queue->empty()) return std::nullopt;
    WatchResponse r = std::move(queue->front());
    queue->pop_front();
    return r;
  }

  WatchClient client_;
  std::deque<WatchResponse> created_;
  std::deque<WatchResponse> progress_;
  std::map<int64_t, WatcherLog> logs_;
};

class DiffRandomWatchTest : public DiffRandomTest {
 protected:
  struct Watcher {
    WatchCreateRequest req;
    int created_at_step = 0;
    int64_t id = 0;     // from etcd's Created response
    int64_t start = 0;  // the first revision it can report
    bool puts = true;   // its filters let puts through
    bool deletes = true;
    bool compacted = false;  // starts below the compaction: to be canceled
    bool canceled = false;   // by a cancel step
  };

  bool BeginWatchSeed() {
    if (!BeginSeed()) return false;
    etcd_logs_ = std::make_unique<WatchLogs>(etcd_stubs().watch.get());
    capstan_logs_ = std::make_unique<WatchLogs>(capstan_stubs().watch.get());
    return true;
  }

  bool WatchStep(StepKind kind) {
    switch (kind) {
      case StepKind::kWatch:
        return CreateWatcher();
      case StepKind::kCancelWatch:
        return CancelWatcher();
      case StepKind::kProgress:
        return RequestProgress();
      case StepKind::kCompact: {
        // A compaction cancels a watcher still catching up from below it,
        // and etcd reads an event's prev_kv when it sends the event: both
        // would race the compaction, so every watcher catches up first.
        // Physical, so that a watcher created later at exactly the
        // compaction revision reads history after the compaction finished.
        if (!Quiesce()) return false;
        CompactionRequest c = gen_->Compact();
        c.set_physical(true);
        return Step(c);
      }
      default:
        return KvStep(kind);
    }
  }

  // Creates a random watcher on both streams and compares the Created
  // responses. Waits for them, so that a watcher from the current revision
  // starts at the same revision on both servers.
  bool CreateWatcher() {
    ++step_;
    WatchRequest req;
    *req.mutable_create_request() = gen_->Watch();
    // Client-chosen IDs from 100 on, so that they don't take the automatic ones.
    if (gen_->OneIn(2)) req.mutable_create_request()->set_watch_id(100 + step_);
    SendBoth(req);
    const std::optional<WatchResponse> e = etcd_logs_->AwaitCreated();
    const std::optional<WatchResponse> c = capstan_logs_->AwaitCreated();
    auto what = [&] {
      return absl::StrCat(At(), ": watch create\n", Describe(req));
    };
    if (!e || !c) {
      ADD_FAILURE() << what() << "no Created response from " << (e ? "capstan" : "etcd");
      return false;
    }
    if (auto same = SameResponse(*e, *c, etcd(), capstan()); !same) {
      ADD_FAILURE() << what() << same.message();
      return false;
    }
    if (e->canceled()) return true;
    const WatchCreateRequest& cr = req.create_request();
    Watcher w;
    w.req = cr;
    w.created_at_step = step_;
    w.id = e->watch_id();
    w.start = cr.start_revision() != 0 ? cr.start_revision() : e->header().revision() + 1;
    w.compacted = cr.start_revision() != 0 && cr.start_revision() < model_.compacted;
    for (int f : cr.filters()) {
      if (f == WatchCreateRequest::NOPUT) w.puts = false;
      if (f == WatchCreateRequest::NODELETE) w.deletes = false;
    }
    watchers_.push_back(w);
    return true;
  }

  // Cancels a random live watcher on both streams and compares the canceled
  // responses. Every watcher catches up first, so that the events each
  // server sends before the cancel are the same.
  bool CancelWatcher() {
    const std::vector<Watcher*> live = LiveWatchers();
    if (live.empty()) return true;
    if (!Quiesce()) return false;
    Watcher& w = *gen_->Pick(live);
    ++step_;
    w.canceled = true;
    const WatchRequest req = CancelReq(w.id);
    SendBoth(req);
    const auto deadline = Clock::now() + kEventWait;
    for (WatchLogs* side : {etcd_logs_.get(), capstan_logs_.get()}) {
      if (!side->ReadUntil([&] { return side->log(w.id).merged.canceled(); }, deadline)) {
        ADD_FAILURE() << At() << ": "
                      << Name(side)
                      << " did not cancel watch id " << w.id;
        return false;
      }
    }
    if (auto same = SameResponse(etcd_logs_->log(w.id).cancel, capstan_logs_->log(w.id).cancel,
                                 etcd(), capstan());
        !same) {
      ADD_FAILURE() << At() << ": watch cancel\n"
                    << Describe(req) << same.message();
      return false;
    }
    return true;
  }

  // Sends a progress request on both streams once every watcher caught up,
  // and compares the answers. etcd 3.4 answers a progress request at once;
  // etcd 3.5.16 (progressIfSync) and Capstan answer only if every watcher of
  // the stream is synced and drop the request otherwise, and never answer on
  // a stream without watchers (docs/COMPATIBILITY.md). A watcher canceled for
  // compaction stays in etcd's stream until the client cancels it, never
  // synced: from then on every request is dropped (this test cancels only
  // live watchers). So only a stream with a live watcher is asked, every
  // watcher caught up: both answer with the current revision, or, with a
  // watcher canceled for compaction, neither answers.
  bool RequestProgress() {
    if (LiveWatchers().empty()) return true;
    if (!Quiesce()) return false;
    ++step_;
    SendBoth(ProgressReq());
    const std::string what = absl::StrCat(At(), ": watch progress\n");
    const bool dropped = std::any_of(watchers_.begin(), watchers_.end(),
                                     [](const Watcher& w) { return w.compacted && !w.canceled; });
    if (dropped) {
      const std::optional<WatchResponse> e = etcd_logs_->AwaitProgress(kQuiet);
      const std::optional<WatchResponse> c = capstan_logs_->AwaitProgress(kQuiet);
      if (e || c) {
        ADD_FAILURE() << what << (e ? "etcd" : "capstan")
                      << " answered on a stream with a watcher canceled for compaction:\n"
                      << Describe(e ? *e : *c);
        return false;
      }
      return true;
    }
    const std::optional<WatchResponse> e = etcd_logs_->AwaitProgress();
    const std::optional<WatchResponse> c = capstan_logs_->AwaitProgress();
    if (!e || !c) {
      ADD_FAILURE() << what << "no progress response from " << (e ? "capstan" : "etcd");
      return false;
    }
    if (auto same = SameResponse(*e, *c, etcd(), capstan()); !same) {
      ADD_FAILURE() << what << same.message();
      return false;
    }
    return true;
  }

  const char* Name(const WatchLogs* side) const {
    return side == etcd_logs_.get() ? "etcd" : "capstan";
  }

  void SendBoth(const WatchRequest& req) {
    EXPECT_TRUE(etcd_logs_->Send(req)) << "etcd stream broke";
    EXPECT_TRUE(capstan_logs_->Send(req)) << "capstan stream broke";
  }

  // The watchers that neither a compaction nor a cancel step canceled.
  std::vector<Watcher*> LiveWatchers() {
    std::vector<Watcher*> live;
    for (Watcher& w : watchers_) {
      if (!w.compacted && !w.canceled) live.push_back(&w);
    }
    return live;
  }

  // Writes two revisions that every watcher sees (puts of the watchers' keys,
  // then their deletes), after padding up to the last start revision, and
  // reads both streams until each watcher sent everything up to them.
  bool Quiesce() {
    int64_t last_start = 0;
    for (const Watcher& w : watchers_) last_start = std::max(last_start, w.start);
    while (model_.rev + 1 < last_start) {
      PutRequest pad;
      pad.set_key(RootKey("pad"));
      if (!Step(pad)) return false;
    }
    std::set<std::string> keys;
    for (const Watcher& w : watchers_) keys.insert(w.req.key());
    if (keys.empty()) return true;
    TxnRequest puts, deletes;
    for (const std::string& k : keys) {
      PutRequest* put = puts.add_success()->mutable_request_put();
      put->set_key(k);
      put->set_value("sentinel");
      deletes.add_success()->mutable_request_delete_range()->set_key(k);
    }
    if (!Step(puts)) return false;
    const int64_t puts_rev = model_.rev;
    if (!Step(deletes)) return false;
    const int64_t deletes_rev = model_.rev;

    const auto deadline = Clock::now() + kEventWait;
    for (WatchLogs* side : {etcd_logs_.get(), capstan_logs_.get()}) {
      auto caught_up = [&](const Watcher& w) {
        const WatcherLog& log = side->log(w.id);
        // etcd cancels a watcher from below the compaction when it first
        // syncs it, naming the compaction of that moment: wait for it.
        if (w.compacted || log.merged.canceled()) return log.merged.canceled();
        const int64_t last = w.deletes ? deletes_rev : w.puts ? puts_rev : 0;
        return last == 0 || log.last_event_rev >= last;
      };
      auto all = [&] { return std::all_of(watchers_.begin(), watchers_.end(), caught_up); };
      if (side->ReadUntil(all, deadline)) continue;
      CompareWatchers();
      ::testing::Message late;
      for (const Watcher& w : watchers_) {
        if (!caught_up(w)) late << "\n  watch id " << w.id << ": " << Describe(w.req);
      }
      ADD_FAILURE() << At() << ": "
                    << Name(side)
                    << " did not send these watchers' events up to revision " << deletes_rev
                    << " within " << std::chrono::seconds(kEventWait).count() << " s:" << late;
      return false;
    }
    return true;
  }

  // Compares what each watcher sent on both servers: the first event that
  // differs, else the whole log (more events on one side, how it ended).
  void CompareWatchers() {
    for (const Watcher& w : watchers_) {
      const WatchResponse& e = etcd_logs_->log(w.id).merged;
      const WatchResponse& c = capstan_logs_->log(w.id).merged;
      const std::string what =
          absl::StrCat("seed ", seed(), ": watch id ", w.id, ", created at step ",
                       w.created_at_step, ":\n", Describe(w.req));
      int i = 0;
      while (i < std::min(e.events_size(), c.events_size()) &&
             google::protobuf::util::MessageDifferencer::Equals(e.events(i), c.events(i))) {
        ++i;
      }
      if (i < std::min(e.events_size(), c.events_size())) {
        ADD_FAILURE() << what << "event " << i << " differs:\netcd:\n"
                      << Describe(e.events(i)) << "capstan:\n"
                      << Describe(c.events(i));
      } else if (auto same = SameResponse(e, c, etcd(), capstan()); !same) {
        ADD_FAILURE() << what << same.message();
      }
    }
  }

 private:
  std::unique_ptr<WatchLogs> etcd_logs_;
  std::unique_ptr<WatchLogs> capstan_logs_;
  std::vector<Watcher> watchers_;
};

TEST_P(DiffRandomWatchTest, Run) {
  if (!BeginWatchSeed()) return;
  // Some watchers before the first write, more among the writes.
  for (int i = 0; i < 4; ++i) {
    if (!CreateWatcher()) return;
  }
  for (int i = 0; i < Steps() / 2; ++i) {
    if (!WatchStep(gen_->Kind(kWatchMix))) return;
  }
  if (Quiesce()) CompareWatchers();
}

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomWatchTest, ::testing::ValuesIn(Seeds()), SeedName);

}  // namespace
}  // namespace capstan::testing::diff_random
