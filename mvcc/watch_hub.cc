#include "mvcc/watch_hub.h"

#include <algorithm>
#include <map>

#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "mvcc/revision_key.h"
#include "spdlog/spdlog.h"

namespace capstan::mvcc {

using etcdserverpb::WatchCreateRequest;

// ---------------------------------------------------------------------------
// Watchers and the interval index of range watchers.

struct HubWatcher {
  int64_t id = 0;
  WatchStream* stream = nullptr;
  std::string key;
  std::string end;  // with !single: empty means +infinity
  bool single = true;
  int64_t min_rev = 0;  // the next revision this watcher needs
  uint64_t serial = 0;  // unique per hub: tells a watcher from a later one at the same address
  bool synced = false;
  bool prev_kv = false, no_put = false, no_delete = false, progress = false, fragment = false;

  bool Matches(std::string_view k) const {
    if (single) return k == key;
    return k >= key && (end.empty() || k < end);
  }
};

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
// Encoding of WatchResponse messages.

namespace {

struct ResponseFields {
  int64_t watch_id = 0;
  bool created = false, canceled = false, fragment = false;
  int64_t compact_revision = 0;
  std::string cancel_reason;
};

std::string EncodeHeader(const etcdserverpb::ResponseHeader& base, int64_t rev) {
  etcdserverpb::ResponseHeader h = base;
  h.set_revision(rev);
  return h.SerializeAsString();
}

// WatchResponse: header(1) watch_id(2) created(3) canceled(4)
// compact_revision(5) cancel_reason(6) fragment(7) events(11).
std::string EncodeResponse(const std::string& header, const ResponseFields& f,
                           const std::vector<const std::string*>& events) {
  size_t size = header.size() + 32 + f.cancel_reason.size();
  for (auto* e : events) size += e->size();
  std::string out;
  out.reserve(size);
  AppendBytesField(1, header, &out);
  AppendVarintField(2, static_cast<uint64_t>(f.watch_id), &out);
  AppendVarintField(3, f.created ? 1 : 0, &out);
  AppendVarintField(4, f.canceled ? 1 : 0, &out);
  AppendVarintField(5, static_cast<uint64_t>(f.compact_revision), &out);
  if (!f.cancel_reason.empty()) AppendBytesField(6, f.cancel_reason, &out);
  AppendVarintField(7, f.fragment ? 1 : 0, &out);
  for (auto* e : events) out.append(*e);
  return out;
}

// An Event (type 1, kv 2, prev_kv 3) as field 11 of a WatchResponse.
std::string EncodeEventField(const WatchEvent& ev, bool with_prev) {
  std::string event;
  event.reserve(ev.kv.size() + (with_prev ? ev.prev_kv.size() : 0) + 16);
  AppendVarintField(1, ev.is_delete ? 1 : 0, &event);
  AppendBytesField(2, ev.kv, &event);
  if (with_prev && ev.has_prev) AppendBytesField(3, ev.prev_kv, &event);
  std::string field;
  field.reserve(event.size() + 8);
  AppendBytesField(11, event, &field);
  return field;
}

}  // namespace

// ---------------------------------------------------------------------------
// WatchStream

WatchStream::WatchStream(WatchHub* hub, etcdserverpb::ResponseHeader header)
    : hub_(hub), header_(std::move(header)) {}

WatchStream::~WatchStream() { Close(); }

bool WatchStream::HasRoomLocked() const {
  return queue_.size() < hub_->options_.stream_queue_messages &&
         queued_bytes_ < hub_->options_.stream_queue_bytes;
}

void WatchStream::PushLocked(std::string message) {
  if (closed_) return;
  if (waiting_ && deliver_ && queue_.empty()) {
    waiting_ = false;
    deliver_(std::move(message));
    return;
  }
  queued_bytes_ += message.size();
  queue_.push_back(std::move(message));
}

bool WatchStream::Pop(std::string* message) {
  std::lock_guard<std::mutex> l(mu_);
  if (queue_.empty()) {
    waiting_ = true;
    return false;
  }
  *message = std::move(queue_.front());
  queue_.pop_front();
  queued_bytes_ -= message->size();
  return true;
}

void WatchStream::SetDeliver(std::function<void(std::string)> deliver) {
  std::lock_guard<std::mutex> l(mu_);
  deliver_ = std::move(deliver);
  if (waiting_ && !queue_.empty() && deliver_) {
    waiting_ = false;
    std::string m = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= m.size();
    deliver_(std::move(m));
  }
}

size_t WatchStream::num_watchers() const {
  std::lock_guard<std::mutex> l(hub_->mu_);
  return by_id_.size();
}

void WatchStream::Create(const WatchCreateRequest& req) {
  auto w = std::make_unique<HubWatcher>();
  // etcd's normalization: an empty key is "\0" (the smallest key); an empty
  // range_end watches one key; "\0" watches every key >= key.
  w->key = req.key().empty() ? std::string(1, '\0') : req.key();
  if (req.range_end().empty()) {
    w->single = true;
  } else {
    w->single = false;
    w->end = (req.range_end().size() == 1 && req.range_end()[0] == 0) ? "" : req.range_end();
  }
  w->prev_kv = req.prev_kv();
  w->progress = req.progress_notify();
  w->fragment = req.fragment();
  for (int f : req.filters()) {
    if (f == WatchCreateRequest::NOPUT) w->no_put = true;
    if (f == WatchCreateRequest::NODELETE) w->no_delete = true;
  }
  w->stream = this;

  bool unsynced = false;
  {
    std::lock_guard<std::mutex> hl(hub_->mu_);
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    const int64_t wsrev = hub_->last_notified_rev_;
    auto taken = [this](int64_t id) { return by_id_.contains(id); };
    ResponseFields f;
    f.created = true;
    // Refusals are created-and-canceled responses with watch_id -1, as etcd
    // answers them.
    if (req.watch_id() != 0 && taken(req.watch_id())) {
      f.watch_id = -1;
      f.canceled = true;
      f.cancel_reason = "mvcc: duplicate watch ID provided on the WatchStream";
      PushLocked(EncodeResponse(EncodeHeader(header_, wsrev), f, {}));
      return;
    }
    if (!w->single && !w->end.empty() && w->key >= w->end) {
      f.watch_id = -1;
      f.canceled = true;
      f.cancel_reason = "mvcc: watcher range is empty";
      PushLocked(EncodeResponse(EncodeHeader(header_, wsrev), f, {}));
      return;
    }
    if (req.watch_id() != 0) {
      w->id = req.watch_id();
    } else {
      while (taken(next_watch_id_)) ++next_watch_id_;
      w->id = next_watch_id_++;
    }
    f.watch_id = w->id;
    PushLocked(EncodeResponse(EncodeHeader(header_, wsrev), f, {}));
    w->min_rev = req.start_revision() == 0 ? wsrev + 1 : req.start_revision();
    w->synced = w->min_rev > wsrev;
    unsynced = !w->synced;
    hub_->AddWatcherLocked(std::move(w));
  }
  if (unsynced) hub_->cv_.notify_all();
}

void WatchStream::Cancel(int64_t watch_id) {
  {
    std::lock_guard<std::mutex> hl(hub_->mu_);
    auto it = by_id_.find(watch_id);
    if (it == by_id_.end()) return;
    hub_->RemoveWatcherLocked(it->second);
    std::lock_guard<std::mutex> l(mu_);
    ResponseFields f;
    f.watch_id = watch_id;
    f.canceled = true;
    PushLocked(EncodeResponse(EncodeHeader(header_, hub_->last_notified_rev_), f, {}));
  }
}

void WatchStream::RequestProgress() {
  std::lock_guard<std::mutex> hl(hub_->mu_);
  std::lock_guard<std::mutex> l(mu_);
  if (!hub_->AllSyncedLocked(this)) {
    progress_deferred_ = true;
    return;
  }
  ResponseFields f;
  f.watch_id = -1;  // not one watcher's: the whole stream is at this revision
  PushLocked(EncodeResponse(EncodeHeader(header_, hub_->last_notified_rev_), f, {}));
}

void WatchStream::Close() {
  std::lock_guard<std::mutex> hl(hub_->mu_);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    closed_ = true;
    deliver_ = nullptr;
    queue_.clear();
    queued_bytes_ = 0;
  }
  std::vector<HubWatcher*> mine;
  for (const auto& [id, p] : by_id_) mine.push_back(p);
  for (auto* p : mine) hub_->RemoveWatcherLocked(p);
  hub_->streams_.erase(this);
}

// ---------------------------------------------------------------------------
// WatchHub

WatchHub::WatchHub(KvStore* store, WatchHubOptions options)
    : store_(store),
      options_(options),
      synced_ranges_(std::make_unique<IntervalIndex>()),
      last_notified_rev_(store->Rev()),
      next_progress_(absl::Now() + options.progress_interval) {
  syncer_ = std::thread([this] { SyncLoop(); });
}

WatchHub::~WatchHub() { Stop(); }

void WatchHub::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (syncer_.joinable()) syncer_.join();
}

std::shared_ptr<WatchStream> WatchHub::OpenStream(const etcdserverpb::ResponseHeader& header) {
  std::shared_ptr<WatchStream> s(new WatchStream(this, header));
  std::lock_guard<std::mutex> l(mu_);
  streams_.insert(s.get());
  return s;
}

void WatchHub::AddWatcherLocked(std::unique_ptr<Watcher> w) {
  Watcher* p = w.get();
  p->serial = ++next_serial_;
  p->stream->by_id_[p->id] = p;
  if (p->prev_kv) prev_kv_watchers_.fetch_add(1, std::memory_order_relaxed);
  watchers_.emplace(p, std::move(w));
  if (p->synced) {
    if (p->single) {
      synced_keys_[p->key].insert(p);
    } else {
      synced_ranges_->Add(p);
    }
  } else {
    unsynced_.insert(p);
  }
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
  w->stream->by_id_.erase(w->id);
  watchers_.erase(w);
}

bool WatchHub::AllSyncedLocked(WatchStream* s) const {
  for (Watcher* w : unsynced_) {
    if (w->stream == s) return false;
  }
  return true;
}

void WatchHub::LookupPrev(WatchEvent* ev) {
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

std::vector<std::string> WatchHub::EncodeEvents(Watcher* w, std::vector<const WatchEvent*>& evs,
                                                int64_t header_rev) {
  std::vector<std::string> fields;
  fields.reserve(evs.size());
  for (const WatchEvent* ev : evs) {
    if (w->prev_kv && !ev->prev_known) {
      // The write path did not attach it (no prev_kv watcher existed then).
      LookupPrev(const_cast<WatchEvent*>(ev));
    }
    fields.push_back(EncodeEventField(*ev, w->prev_kv));
  }
  std::vector<std::string> messages;
  const std::string header = EncodeHeader(w->stream->header_, header_rev);
  ResponseFields f;
  f.watch_id = w->id;
  size_t total = header.size();
  for (const auto& e : fields) total += e.size();
  if (!w->fragment || static_cast<int64_t>(total) < options_.max_response_bytes ||
      fields.size() < 2) {
    std::vector<const std::string*> ptrs;
    for (const auto& e : fields) ptrs.push_back(&e);
    messages.push_back(EncodeResponse(header, f, ptrs));
    return messages;
  }
  // etcd's sendFragments: as many events as fit under the limit (at least
  // one) per response; every response but the last is marked fragment.
  size_t i = 0;
  while (i < fields.size()) {
    std::vector<const std::string*> ptrs;
    size_t size = header.size() + 16;
    while (i < fields.size()) {
      if (!ptrs.empty() && static_cast<int64_t>(size + fields[i].size()) >= options_.max_response_bytes) {
        break;
      }
      size += fields[i].size();
      ptrs.push_back(&fields[i]);
      ++i;
    }
    f.fragment = i < fields.size();
    messages.push_back(EncodeResponse(header, f, ptrs));
  }
  return messages;
}

void WatchHub::Deliver(Watcher* w, std::vector<const WatchEvent*>& evs, int64_t header_rev) {
  WatchStream* s = w->stream;
  std::vector<std::string> messages = EncodeEvents(w, evs, header_rev);
  std::lock_guard<std::mutex> l(s->mu_);
  for (auto& m : messages) s->PushLocked(std::move(m));
  events_sent_.fetch_add(evs.size(), std::memory_order_relaxed);
}

void WatchHub::Notify(int64_t rev, std::vector<WatchEvent> events) {
  // Previous values the write path did not attach (no prev_kv watcher when
  // it ran) are read here, before the hub lock is taken.
  if (WantsPrevKv()) {
    for (WatchEvent& ev : events) {
      if (!ev.prev_known) LookupPrev(&ev);
    }
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    last_notified_rev_ = rev;
    // Events per watcher, in revision order. Most groups reach few watchers.
    std::vector<std::pair<Watcher*, std::vector<const WatchEvent*>>> per_watcher;
    absl::flat_hash_map<Watcher*, size_t> slot;
    auto add = [&](Watcher* w, const WatchEvent& ev) {
      if (ev.rev < w->min_rev) return;
      if (ev.is_delete ? w->no_delete : w->no_put) return;
      auto [it, inserted] = slot.try_emplace(w, per_watcher.size());
      if (inserted) per_watcher.emplace_back(w, std::vector<const WatchEvent*>());
      per_watcher[it->second].second.push_back(&ev);
    };
    for (const WatchEvent& ev : events) {
      if (auto it = synced_keys_.find(ev.key); it != synced_keys_.end()) {
        for (Watcher* w : it->second) add(w, ev);
      }
      synced_ranges_->Stab(ev.key, [&](Watcher* w) { add(w, ev); });
    }
    for (auto& [w, evs] : per_watcher) {
      bool room;
      {
        std::lock_guard<std::mutex> sl(w->stream->mu_);
        room = w->stream->HasRoomLocked();
      }
      if (!room) {
        // Park: drop the events; the watcher catches up from storage once
        // its stream drains.
        if (w->single) {
          auto it = synced_keys_.find(w->key);
          it->second.erase(w);
          if (it->second.empty()) synced_keys_.erase(it);
        } else {
          synced_ranges_->Remove(w);
        }
        w->synced = false;
        w->min_rev = evs.front()->rev;
        unsynced_.insert(w);
        parked_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      Deliver(w, evs, rev);
      w->min_rev = rev + 1;
    }
    if (absl::Now() >= next_progress_) SendProgressLocked();
    if (unsynced_.empty()) return;
  }
  cv_.notify_all();
}

void WatchHub::SendProgressLocked() {
  next_progress_ = absl::Now() + options_.progress_interval;
  for (const auto& [w, owned] : watchers_) {
    if (!w->progress || !w->synced) continue;
    WatchStream* s = w->stream;
    std::lock_guard<std::mutex> l(s->mu_);
    if (!s->HasRoomLocked()) continue;
    ResponseFields f;
    f.watch_id = w->id;
    s->PushLocked(EncodeResponse(EncodeHeader(s->header_, last_notified_rev_), f, {}));
  }
}

void WatchHub::SyncLoop() {
  for (;;) {
    bool more;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (stopping_) return;
    }
    more = SyncOnce();
    std::unique_lock<std::mutex> l(mu_);
    if (stopping_) return;
    if (!more) {
      cv_.wait_for(l, absl::ToChronoNanoseconds(options_.sync_interval));
      if (absl::Now() >= next_progress_) SendProgressLocked();
    }
  }
}

bool WatchHub::SyncOnce() {
  // Hold a view for the whole pass: compaction does not delete revisions
  // this pass reads until it is released.
  std::shared_ptr<const ReadView> view = store_->View();
  std::vector<std::pair<Watcher*, uint64_t>> ready;
  int64_t from = INT64_MAX;
  {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<Watcher*> compacted;
    for (Watcher* w : unsynced_) {
      std::lock_guard<std::mutex> sl(w->stream->mu_);
      if (!w->stream->HasRoomLocked()) continue;
      if (w->min_rev < view->compact_rev) {
        compacted.push_back(w);
        continue;
      }
      if (w->min_rev > view->rev) continue;  // waits for the committer to notify
      ready.emplace_back(w, w->serial);
      from = std::min(from, w->min_rev);
    }
    for (Watcher* w : compacted) {
      WatchStream* s = w->stream;
      {
        std::lock_guard<std::mutex> sl(s->mu_);
        ResponseFields f;
        f.watch_id = w->id;
        f.canceled = true;
        f.compact_revision = view->compact_rev;
        // etcd sends this response with header revision 0.
        s->PushLocked(EncodeResponse(EncodeHeader(s->header_, 0), f, {}));
      }
      RemoveWatcherLocked(w);
    }
    // Watchers that were behind but need nothing stored (their next
    // revision is past what storage holds) join the synced set.
    std::vector<Watcher*> promote;
    for (Watcher* w : unsynced_) {
      if (w->min_rev > last_notified_rev_) promote.push_back(w);
    }
    for (Watcher* w : promote) {
      unsynced_.erase(w);
      w->synced = true;
      if (w->single) {
        synced_keys_[w->key].insert(w);
      } else {
        synced_ranges_->Add(w);
      }
    }
  }
  if (!ready.empty()) {
    const int64_t to = std::min(view->rev, from + options_.catch_up_batch_revs - 1);
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
    // Previous values for watchers that want them, still outside the lock.
    bool want_prev = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& [w, serial] : ready) {
        auto found = watchers_.find(w);
        want_prev |= found != watchers_.end() && w->serial == serial && w->prev_kv;
      }
    }
    if (want_prev) {
      for (WatchEvent& ev : events) {
        if (!ev.prev_known) LookupPrev(&ev);
      }
    }

    std::lock_guard<std::mutex> l(mu_);
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
      if (!evs.empty()) Deliver(w, evs, view->rev);
      w->min_rev = to + 1;
      if (w->min_rev > last_notified_rev_) {
        unsynced_.erase(w);
        w->synced = true;
        if (w->single) {
          synced_keys_[w->key].insert(w);
        } else {
          synced_ranges_->Add(w);
        }
      }
    }
  }
  bool more;
  {
    std::lock_guard<std::mutex> l(mu_);
    // Deferred progress requests of streams that are now all synced.
    for (WatchStream* s : streams_) {
      std::lock_guard<std::mutex> sl(s->mu_);
      if (!s->progress_deferred_ || !AllSyncedLocked(s)) continue;
      s->progress_deferred_ = false;
      ResponseFields f;
      f.watch_id = -1;
      s->PushLocked(EncodeResponse(EncodeHeader(s->header_, last_notified_rev_), f, {}));
    }
    more = !ready.empty() && !unsynced_.empty();
  }
  return more;
}

WatchHub::Stats WatchHub::GetStats() const {
  std::lock_guard<std::mutex> l(mu_);
  Stats s;
  s.unsynced = unsynced_.size();
  s.synced = watchers_.size() - unsynced_.size();
  s.streams = streams_.size();
  s.events_sent = events_sent_.load(std::memory_order_relaxed);
  s.parked = parked_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace capstan::mvcc
