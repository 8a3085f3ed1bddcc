#include "mvcc/watch_hub.h"

#include <algorithm>
#include <map>

#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "mvcc/revision_key.h"
#include "mvcc/watch_hub_watcher.h"
#include "util/check.h"
#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::mvcc {

// ---------------------------------------------------------------------------
// Watchers and the interval index of range watchers.

// Range watchers by the key ranges they cover. Lookups of a key ("which
// ranges contain k") use elementary segments between sorted endpoints,
// rebuilt lazily after the set changes; watcher creation is rare next to
// event delivery.
class WatchHub::IntervalIndex {
 public:
  void Add(Watcher* w) {
    all_.insert(w);
    dirty_ = true;
  }
  void Remove(Watcher* w) {
    all_.erase(w);
    dirty_ = true;
  }
  bool empty() const { return all_.empty(); }
  size_t size() const { return all_.size(); }

  // Calls visit for every range watcher whose range contains key.
  template <typename Visit>
  void Stab(std::string_view key, Visit visit) {
    if (all_.empty()) return;
    if (dirty_) Rebuild();
    auto it = std::upper_bound(bounds_.begin(), bounds_.end(), key,
                               [](std::string_view k, const std::string& b) { return k < b; });
    if (it == bounds_.begin()) return;
    for (Watcher* w : segments_[it - bounds_.begin() - 1]) visit(w);
  }

 private:
  void Rebuild() {
    bounds_.clear();
    for (Watcher* w : all_) {
      bounds_.push_back(w->key);
      if (!w->end.empty()) bounds_.push_back(w->end);
    }
    std::sort(bounds_.begin(), bounds_.end());
    bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
    segments_.assign(bounds_.size(), {});
    for (Watcher* w : all_) {
      size_t from = std::lower_bound(bounds_.begin(), bounds_.end(), w->key) - bounds_.begin();
      size_t to = w->end.empty()
                      ? bounds_.size()
                      : std::lower_bound(bounds_.begin(), bounds_.end(), w->end) - bounds_.begin();
      for (size_t i = from; i < to; ++i) segments_[i].push_back(w);
    }
    dirty_ = false;
  }

  absl::flat_hash_set<Watcher*> all_;
  bool dirty_ = false;
  std::vector<std::string> bounds_;
  // segments_[i]: the watchers covering [bounds_[i], bounds_[i+1]).
  std::vector<std::vector<Watcher*>> segments_;
};

// ---------------------------------------------------------------------------
// WatchHub

WatchHub::WatchHub(KvStore* store, WatchHubOptions options)
    : store_(store),
      options_(options),
      synced_ranges_(std::make_unique<IntervalIndex>()) {
  {
    util::MutexLock l(&mu_);
    last_notified_rev_ = store->Rev();
    next_progress_ = absl::Now() + options.progress_interval;
  }
  syncer_ = NamedThread("watch-sync", [this] { SyncLoop(); });
  dispatcher_ = NamedThread("watch-dispatch", [this] { DispatchLoop(); });
}

WatchHub::~WatchHub() { Stop(); }

void WatchHub::Stop() {
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (syncer_.joinable()) syncer_.join();
  {
    util::MutexLock l(&pending_mu_);
    dispatch_stopping_ = true;
  }
  if (dispatcher_.joinable()) dispatcher_.join();
}

std::shared_ptr<WatchStream> WatchHub::OpenStream(const etcdserverpb::ResponseHeader& header,
                                                  StreamUse use) {
  std::shared_ptr<WatchStream> s(new WatchStream(this, header, use == StreamUse::kInternal));
  util::MutexLock l(&mu_);
  streams_.emplace(s.get(), StreamWatchers());
  return s;
}

WatchHub::StreamWatchers* WatchHub::StreamWatchersLocked(WatchStream* s) {
  auto it = streams_.find(s);
  return it == streams_.end() ? nullptr : &it->second;
}

void WatchHub::AddWatcherLocked(std::unique_ptr<Watcher> w) {
  Watcher* p = w.get();
  p->serial = ++next_serial_;
  StreamWatchers* sw = StreamWatchersLocked(p->stream);
  CHECK(sw != nullptr) << "a watcher of a closed stream";
  sw->by_id[p->id] = p;
  if (p->prev_kv) prev_kv_watchers_.fetch_add(1, std::memory_order_relaxed);
  watchers_.emplace(p, std::move(w));
  if (p->synced) {
    p->synced = false;
    MakeSyncedLocked(p);
  } else {
    unsynced_.insert(p);
    sync_wanted_ = true;
  }
}

void WatchHub::MakeSyncedLocked(Watcher* w) {
  unsynced_.erase(w);
  w->synced = true;
  if (w->single) {
    synced_keys_[w->key].insert(w);
  } else {
    synced_ranges_->Add(w);
  }
}

void WatchHub::MakeUnsyncedLocked(Watcher* w, int64_t min_rev) {
  if (w->synced) {
    if (w->single) {
      auto it = synced_keys_.find(w->key);
      it->second.erase(w);
      if (it->second.empty()) synced_keys_.erase(it);
    } else {
      synced_ranges_->Remove(w);
    }
  }
  w->synced = false;
  w->min_rev = std::max(w->min_rev, min_rev);
  unsynced_.insert(w);
  sync_wanted_ = true;
}

void WatchHub::RemoveWatcherLocked(Watcher* w) {
  if (w->synced) {
    if (w->single) {
      auto it = synced_keys_.find(w->key);
      if (it != synced_keys_.end()) {
        it->second.erase(w);
        if (it->second.empty()) synced_keys_.erase(it);
      }
    } else {
      synced_ranges_->Remove(w);
    }
  } else {
    unsynced_.erase(w);
  }
  if (w->prev_kv) prev_kv_watchers_.fetch_sub(1, std::memory_order_relaxed);
  StreamWatchers* sw = StreamWatchersLocked(w->stream);
  CHECK(sw != nullptr) << "a watcher of a closed stream";
  sw->by_id.erase(w->id);
  watchers_.erase(w);
}

bool WatchHub::AllSyncedLocked(WatchStream* s) const {
  // As etcd's progressIfSync over the stream's watchers: one catching up,
  // parked, or canceled for compaction and not yet canceled by the client
  // (etcd keeps it in the stream) is not synced.
  auto it = streams_.find(s);
  if (it == streams_.end()) return false;
  for (const auto& [id, w] : it->second.by_id) {
    if (!w->synced) return false;
  }
  return true;
}

void WatchHub::TEST_SetSyncPoint(std::function<void(std::string_view point)> hook) {
  util::MutexLock l(&test_mu_);
  has_test_sync_point_.store(hook != nullptr, std::memory_order_relaxed);
  test_sync_point_ = std::move(hook);
}

void WatchHub::TestSyncPoint(std::string_view point) {
  if (!has_test_sync_point_.load(std::memory_order_relaxed)) return;
  std::function<void(std::string_view)> hook;
  {
    util::MutexLock l(&test_mu_);
    hook = test_sync_point_;
  }
  if (hook) hook(point);
}

void WatchHub::LookupPrev(WatchEvent* ev) {
  TestSyncPoint("WatchHub::LookupPrev");
  ev->prev_known = true;
  etcdserverpb::RangeRequest req;
  req.set_key(ev->key);
  req.set_revision(ev->rev - 1);
  RangeResult result;
  if (!store_->Range(req, &result).ok() || result.num_kvs == 0) return;
  etcdserverpb::RangeResponse resp;
  if (!resp.ParseFromString(result.kvs_wire) || resp.kvs_size() == 0) return;
  ev->prev_kv = resp.kvs(0).SerializeAsString();
  ev->has_prev = true;
}

namespace {

const std::string& EventField(const WatchEvent& ev, bool with_prev) {
  std::string& field = with_prev && ev.has_prev ? ev.field_with_prev : ev.field;
  if (field.empty()) {
    std::string event;
    event.reserve(ev.kv.size() + (with_prev ? ev.prev_kv.size() : 0) + 16);
    util::AppendVarintField(1, ev.is_delete ? 1 : 0, &event);
    util::AppendBytesField(2, ev.kv, &event);
    if (with_prev && ev.has_prev) util::AppendBytesField(3, ev.prev_kv, &event);
    field.reserve(event.size() + 8);
    util::AppendBytesField(11, event, &field);
  }
  return field;
}

size_t EventBytes(const std::vector<WatchEvent>& events) {
  size_t n = 0;
  for (const auto& ev : events) n += ev.kv.size() + ev.prev_kv.size() + 32;
  return n;
}

}  // namespace

void WatchHub::DeliverLocked(Watcher* w, const std::vector<const WatchEvent*>& evs,
                             int64_t header_rev) {
  std::vector<const std::string*> fields;
  fields.reserve(evs.size());
  for (const WatchEvent* ev : evs) {
    CHECK(!w->prev_kv || ev->prev_known) << "previous value not read at revision " << ev->rev;
    fields.push_back(&EventField(*ev, w->prev_kv));
  }
  w->events_since_progress = true;
  WatchStream* s = w->stream;
  util::MutexLock l(&s->mu_);
  s->PushEventsLocked(w->id, header_rev, fields, w->fragment,
                      static_cast<size_t>(options_.max_response_bytes));
  if (!s->internal_) events_sent_.fetch_add(evs.size(), std::memory_order_relaxed);
}

void WatchHub::Notify(int64_t rev, std::vector<WatchEvent> events) {
  notified_rev_.store(rev, std::memory_order_release);
  // Fan-outs this small are delivered on the committer's thread when the
  // dispatcher has nothing queued, before the write is answered, as etcd
  // hands a write's events to its watchers before answering it: the events
  // start out before the answer, with no hand-off to the dispatcher. A
  // delivery starts the stream's write and gRPC's threads send it, a
  // connection's streams together; a hundred watchers delay the answer by
  // about a millisecond (docs/BENCHMARKS.md, "A write's watchers served
  // before its answer"). A stream with this much queued is not
  // keeping up: appending to its queued response (a copy of up to a
  // response's size) is left to the dispatcher, off the path of the write.
  constexpr size_t kInlineWatchers = 128;
  constexpr size_t kInlineBacklogBytes = 64 << 10;
  const size_t bytes = EventBytes(events);
  bool inline_first = false;
  {
    util::MutexLock l(&pending_mu_);
    if (!dispatcher_exited_) {
      if (pending_.empty() && dropped_to_ == 0 && !dispatching_ && !dispatch_paused_) {
        // Notify has one caller, so nothing is queued while this runs.
        dispatching_ = true;
        inline_first = true;
      } else {
        if (!pending_.empty() && pending_bytes_ + bytes > options_.dispatch_queue_bytes) {
          // The dispatcher is too far behind: forget the queued changes; the
          // watchers that needed them catch up from storage.
          if (dropped_to_ == 0) {
            const Pending& first = pending_.front();
            dropped_from_ = first.events.empty() ? first.rev : first.events.front().rev;
          }
          dropped_to_ = pending_.back().rev;
          dropped_.fetch_add(pending_.size(), std::memory_order_relaxed);
          pending_.clear();
          pending_bytes_ = 0;
        }
        pending_bytes_ += bytes;
        // The dispatcher waits on a condition over pending_: releasing
        // pending_mu_ wakes it.
        pending_.push_back(Pending{rev, std::move(events)});
        return;
      }
    }
  }
  std::vector<Pending> groups;
  groups.push_back(Pending{rev, std::move(events)});
  if (!inline_first) {
    // After Stop(): deliver here, in order.
    util::MutexLock l(&inline_dispatch_mu_);
    Dispatch(groups, 0, 0);
    return;
  }
  bool done;
  TestSyncPoint("WatchHub::Notify:BeforeDispatchLock");
  {
    util::MutexLock l(&mu_);
    size_t delivered = 0;
    done = DispatchLocked(groups, kInlineWatchers, &delivered, kInlineBacklogBytes);
  }
  pending_mu_.Lock();
  dispatching_ = false;
  if (!done) {
    if (dispatcher_exited_) {  // stopped meanwhile
      pending_mu_.Unlock();
      util::MutexLock il(&inline_dispatch_mu_);
      Dispatch(groups, 0, 0);
      return;
    }
    pending_bytes_ += bytes;
    pending_.push_front(std::move(groups.front()));
  }
  pending_mu_.Unlock();
}

void WatchHub::TEST_PauseDispatcher(bool paused) {
  util::MutexLock l(&pending_mu_);
  dispatch_paused_ = paused;
}

void WatchHub::Resync(int64_t from_rev, int64_t to_rev) {
  notified_rev_.store(to_rev, std::memory_order_release);
  util::MutexLock l(&pending_mu_);
  if (!pending_.empty()) {
    const Pending& first = pending_.front();
    from_rev = std::min(from_rev, first.events.empty() ? first.rev : first.events.front().rev);
    dropped_.fetch_add(pending_.size(), std::memory_order_relaxed);
    pending_.clear();
    pending_bytes_ = 0;
  }
  dropped_from_ = dropped_to_ == 0 ? from_rev : std::min(dropped_from_, from_rev);
  dropped_to_ = std::max(dropped_to_, to_rev);
}

void WatchHub::DispatchLoop() {
  // Groups taken at once: up to this many bytes, so that one response per
  // watcher stays well under the response size limit.
  const size_t batch_bytes = static_cast<size_t>(std::max<int64_t>(1, options_.max_response_bytes / 2));
  std::vector<Pending> groups;
  for (;;) {
    int64_t dropped_from = 0, dropped_to = 0;
    groups.clear();
    {
      util::MutexLock l(&pending_mu_);
      auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(pending_mu_) {
        return ((!pending_.empty() || dropped_to_ != 0) && !dispatch_paused_ && !dispatching_) ||
               dispatch_stopping_;
      };
      pending_mu_.Await(absl::Condition(&work));
      if (pending_.empty() && dropped_to_ == 0) {
        dispatcher_exited_ = true;  // stopping, and everything queued was delivered
        return;
      }
      std::swap(dropped_from, dropped_from_);
      std::swap(dropped_to, dropped_to_);
      dispatching_ = true;
      size_t taken = 0;
      while (!pending_.empty() && (groups.empty() || taken < batch_bytes)) {
        const size_t b = EventBytes(pending_.front().events);
        taken += b;
        pending_bytes_ -= b;
        groups.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
    }
    const size_t delivered = Dispatch(groups, dropped_from, dropped_to);
    util::MutexLock l(&pending_mu_);
    dispatching_ = false;
    if (delivered > options_.dispatch_wide_fanout) {
      // Let the next revisions gather: each watcher gets them in one response.
      pending_mu_.AwaitWithTimeout(absl::Condition(&dispatch_stopping_), options_.dispatch_pause);
    }
  }
}

size_t WatchHub::Dispatch(std::vector<Pending>& groups, int64_t dropped_from, int64_t dropped_to) {
  size_t delivered = 0;
  util::MutexLock l(&mu_);
  if (dropped_to != 0) {
    std::vector<Watcher*> synced;
    for (const auto& [w, owned] : watchers_) {
      if (w->synced) synced.push_back(w);
    }
    for (Watcher* w : synced) MakeUnsyncedLocked(w, dropped_from);
    parked_.fetch_add(synced.size(), std::memory_order_relaxed);
    last_notified_rev_ = std::max(last_notified_rev_, dropped_to);
  }
  if (!groups.empty()) DispatchLocked(groups, SIZE_MAX, &delivered);
  if (absl::Now() >= next_progress_) SendProgressLocked();
  if (!unsynced_.empty()) sync_wanted_ = true;
  return delivered;
}

bool WatchHub::DispatchLocked(std::vector<Pending>& groups, size_t max_watchers,
                              size_t* delivered, size_t max_backlog_bytes) {
  const int64_t rev = groups.back().rev;
  // Events per watcher, in revision order. Each watcher carries its slot
  // for this round, so that an event reaching a thousand watchers costs no
  // lookup per watcher.
  std::vector<std::pair<Watcher*, std::vector<const WatchEvent*>>> per_watcher;
  const uint64_t round = ++dispatch_round_;
  auto add = [&](Watcher* w, const WatchEvent& ev) {
    if (ev.rev < w->min_rev) return;
    if (ev.is_delete ? w->no_delete : w->no_put) return;
    if (w->dispatch_round != round) {
      w->dispatch_round = round;
      w->dispatch_slot = per_watcher.size();
      per_watcher.emplace_back(w, std::vector<const WatchEvent*>());
    }
    per_watcher[w->dispatch_slot].second.push_back(&ev);
  };
  for (const Pending& g : groups) {
    for (const WatchEvent& ev : g.events) {
      if (auto it = synced_keys_.find(ev.key); it != synced_keys_.end()) {
        for (Watcher* w : it->second) add(w, ev);
      }
      synced_ranges_->Stab(ev.key, [&](Watcher* w) { add(w, ev); });
      // Wider than the caller takes: given up at the first event that
      // shows it, not after gathering the whole fan-out (the dispatcher
      // gathers it again).
      if (per_watcher.size() > max_watchers) return false;
    }
  }
  if (max_backlog_bytes != SIZE_MAX) {
    for (const auto& [w, evs] : per_watcher) {
      util::MutexLock sl(&w->stream->mu_);
      if (w->stream->queued_bytes_ >= max_backlog_bytes) return false;
    }
  }
  last_notified_rev_ = rev;
  for (auto& [w, evs] : per_watcher) {
    bool room;
    {
      util::MutexLock sl(&w->stream->mu_);
      room = w->stream->HasRoomLocked();
    }
    if (!room) {
      // Park: drop the events; the watcher catches up from storage once
      // its stream drains.
      MakeUnsyncedLocked(w, evs.front()->rev);
      parked_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (w->prev_kv &&
        !std::all_of(evs.begin(), evs.end(), [](const WatchEvent* ev) { return ev->prev_known; })) {
      // A previous value the write path did not attach: the watcher came
      // after that write looked at WantsPrevKv, or the request wrote the key
      // earlier. Reading it here would read storage under mu_: the watcher
      // catches up from storage instead, on the syncer, which reads
      // previous values with no hub lock held.
      MakeUnsyncedLocked(w, evs.front()->rev);
      continue;
    }
    DeliverLocked(w, evs, rev);
    w->min_rev = rev + 1;
    ++*delivered;
  }
  AnswerDeferredProgressLocked();
  if (absl::Now() >= next_progress_) SendProgressLocked();
  // Unsynced watchers waiting for a revision may now catch up or join.
  if (!unsynced_.empty()) sync_wanted_ = true;
  return true;
}

void WatchHub::SendProgressLocked() {
  next_progress_ = absl::Now() + options_.progress_interval;
  for (const auto& [w, owned] : watchers_) {
    // As etcd: a watcher that got events since the last tick skips this one.
    const bool elide = w->events_since_progress;
    w->events_since_progress = false;
    if (!w->progress || !w->synced || elide) continue;
    WatchStream* s = w->stream;
    util::MutexLock l(&s->mu_);
    if (!s->HasRoomLocked()) continue;
    WatchStream::ControlFields f;
    f.watch_id = w->id;
    s->PushControlLocked(f, last_notified_rev_);
  }
}

void WatchHub::AnswerDeferredProgressLocked() {
  // Progress requests that waited for the hub to reach the writes
  // acknowledged before them: answered if every watcher of the stream is
  // still synced, else dropped, as etcd 3.5.16 drops a request it gets while
  // one is not.
  for (auto& [s, sw] : streams_) {
    if (!sw.progress_deferred || last_notified_rev_ < sw.progress_rev) continue;
    sw.progress_deferred = false;
    sw.progress_rev = 0;
    // Its watchers are gone, or one is not synced: no answer.
    if (sw.by_id.empty() || !AllSyncedLocked(s)) continue;
    util::MutexLock sl(&s->mu_);
    WatchStream::ControlFields f;
    f.watch_id = -1;
    s->PushControlLocked(f, last_notified_rev_);
  }
}

void WatchHub::SyncLoop() {
  for (;;) {
    {
      util::MutexLock l(&mu_);
      if (stopping_) return;
      sync_wanted_ = false;
    }
    const absl::Time pass_start = absl::Now();
    bool caught_up = false;
    const bool more = SyncOnce(&caught_up);
    util::MutexLock l(&mu_);
    if (stopping_) return;
    if (!more) {
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || sync_wanted_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), options_.sync_interval);
      if (absl::Now() >= next_progress_) SendProgressLocked();
      if (caught_up) {
        // Watchers that arrived within sync_gap of the start of a pass
        // that caught watchers up wait for the rest of it, with those
        // that arrive meanwhile.
        auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
        mu_.AwaitWithTimeout(absl::Condition(&stop), pass_start + options_.sync_gap - absl::Now());
      }
    }
  }
}

bool WatchHub::SyncOnce(bool* caught_up) {
  // Hold a view for the whole pass: compaction does not delete revisions
  // this pass reads until it is released.
  std::shared_ptr<const ReadView> view = store_->View();
  std::vector<std::pair<Watcher*, uint64_t>> ready;
  int64_t from = INT64_MAX;
  bool want_prev = false;
  // etcd's compaction revision is -1 until the first compaction: a start
  // revision below it (-2 or less) is canceled as compacted, with -1.
  const int64_t compact_rev = view->compact_rev == 0 ? -1 : view->compact_rev;
  {
    util::MutexLock l(&mu_);
    std::vector<Watcher*> compacted;
    for (Watcher* w : unsynced_) {
      util::MutexLock sl(&w->stream->mu_);
      if (!w->stream->HasRoomLocked()) continue;
      if (w->min_rev < compact_rev) {
        compacted.push_back(w);
        continue;
      }
      // A start revision of -1 before any compaction: etcd finds no history
      // below revision 1 (its revision keys are unsigned) and the watcher
      // starts after the current revision.
      if (w->min_rev < 1) w->min_rev = view->rev + 1;
      if (w->min_rev > view->rev) continue;  // waits for the committer to notify
      ready.emplace_back(w, w->serial);
      from = std::min(from, w->min_rev);
      want_prev |= w->prev_kv;
    }
    for (Watcher* w : compacted) {
      WatchStream* s = w->stream;
      {
        util::MutexLock sl(&s->mu_);
        WatchStream::ControlFields f;
        f.watch_id = w->id;
        f.canceled = true;
        f.compact_revision = compact_rev;
        // etcd sends this response with header revision 0.
        s->PushControlLocked(f, 0);
      }
      unsynced_.erase(w);
      w->compacted = true;
    }
    // Watchers that were behind but need nothing stored (their next
    // revision is past what storage holds) join the synced set.
    std::vector<Watcher*> promote;
    for (Watcher* w : unsynced_) {
      if (w->min_rev > last_notified_rev_) promote.push_back(w);
    }
    for (Watcher* w : promote) MakeSyncedLocked(w);
  }
  // A pass cut short by catch_up_batch_revs leaves its watchers more to
  // read: the next starts at once.
  bool cut = false;
  if (!ready.empty()) {
    sync_passes_.fetch_add(1, std::memory_order_relaxed);
    *caught_up = true;
    const int64_t to = std::min(view->rev, from + options_.catch_up_batch_revs - 1);
    cut = to < view->rev;
    // Read revisions [from, to] from storage, without any hub lock.
    std::vector<WatchEvent> events;
    auto it = store_->backend()->NewIterator(storage::Cf::kKey);
    const std::string end = RevisionKey(Revision{to + 1, 0});
    for (it->Seek(RevisionKey(Revision{from, 0})); it->Valid() && it->key() < end; it->Next()) {
      Revision rev;
      bool tombstone;
      KeyValueView kv;
      if (!ParseRevisionKey(it->key(), &rev, &tombstone) || !DecodeKeyValue(it->value(), &kv)) {
        continue;
      }
      WatchEvent ev;
      ev.rev = rev.main;
      ev.key = std::string(kv.key);
      ev.is_delete = tombstone;
      if (tombstone) {
        KeyValueView del;
        del.key = kv.key;
        del.mod_revision = rev.main;
        ev.kv = EncodeKeyValue(del);
      } else {
        ev.kv = std::string(it->value());
        // A create has no previous value.
        if (kv.version == 1) ev.prev_known = true;
      }
      events.push_back(std::move(ev));
    }
    it.reset();
    // Previous values for watchers that want them (prev_kv never changes
    // on a watcher), still outside the lock.
    if (want_prev) {
      for (WatchEvent& ev : events) {
        if (!ev.prev_known) LookupPrev(&ev);
      }
    }

    util::MutexLock l(&mu_);
    for (const auto& [w, serial] : ready) {
      // Canceled (its address possibly reused) or promoted meanwhile.
      auto it = watchers_.find(w);
      if (it == watchers_.end() || w->serial != serial || w->synced) continue;
      // A watcher that starts past this batch waits for a later one.
      if (w->min_rev > to) continue;
      std::vector<const WatchEvent*> evs;
      for (const auto& ev : events) {
        if (ev.rev < w->min_rev || !w->Matches(ev.key)) continue;
        if (ev.is_delete ? w->no_delete : w->no_put) continue;
        evs.push_back(&ev);
      }
      // Like etcd, catch-up responses carry the store's revision.
      if (!evs.empty()) DeliverLocked(w, evs, view->rev);
      w->min_rev = to + 1;
      if (w->min_rev > last_notified_rev_) MakeSyncedLocked(w);
    }
  }
  bool more;
  {
    util::MutexLock l(&mu_);
    AnswerDeferredProgressLocked();
    more = cut && !unsynced_.empty();
  }
  return more;
}

WatchHub::Stats WatchHub::GetStats() const {
  util::MutexLock l(&mu_);
  Stats s;
  for (const Watcher* w : unsynced_) s.unsynced += w->stream->internal_ ? 0 : 1;
  for (const auto& [w, owned] : watchers_) s.synced += w->synced && !w->stream->internal_ ? 1 : 0;
  for (const auto& [stream, watchers] : streams_) s.streams += stream->internal_ ? 0 : 1;
  s.events_sent = events_sent_.load(std::memory_order_relaxed);
  s.parked = parked_.load(std::memory_order_relaxed);
  s.dropped = dropped_.load(std::memory_order_relaxed);
  s.sync_passes = sync_passes_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace capstan::mvcc
