#include "watchcache/absl_compat.h"
#include "watchcache/resource_cache.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "mvcc/check.h"
#include "mvcc/kv_codec.h"
#include "watchcache/continue_token.h"
#include "watchcache/errors.h"

namespace capstan::watchcache {
namespace {

// What one revision's snapshot keeps alive once the writer has moved on:
// the copied path (a leaf and its inner nodes), estimated per tree level.
constexpr uint64_t kSnapshotBytesPerLevel = 600;

// How long a consistent read waits between progress requests.
constexpr absl::Duration kProgressRetry = absl::Milliseconds(100);

bool ParseRv(std::string_view s, int64_t* rev) {
  uint64_t v;
  if (!absl::SimpleAtoi(AV(s), &v) || v > static_cast<uint64_t>(INT64_MAX)) return false;
  *rev = static_cast<int64_t>(v);
  return true;
}

}  // namespace

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return end;
}

// ---------------------------------------------------------------------------
// CacheWatcher / CacheWatch

bool CacheWatcher::Selects(const CachedObject* o) const {
  return o != nullptr && o->key().starts_with(prefix_) && selector_.Matches(*o);
}

bool CacheWatcher::Transition(const CacheEvent& ev, WatchEvent* out) const {
  const bool was = Selects(ev.prev.get());
  const bool is = Selects(ev.object.get());
  if (!was && !is) return false;
  out->revision = ev.rev;
  out->initial_events_end = false;
  if (was && is) {
    out->type = EventType::kModified;
    out->object = ev.object;
    out->prev_object = ev.prev;
  } else if (is) {
    out->type = EventType::kAdded;
    out->object = ev.object;
    out->prev_object.reset();
  } else {
    // Deleted, or no longer selected: the last state that was, as
    // Kubernetes sends it.
    out->type = EventType::kDeleted;
    out->object = ev.prev;
    out->prev_object.reset();
  }
  return true;
}

void CacheWatcher::Notify() {
  absl::MutexLock l(&notify_mu_);
  if (notify_) notify_();
}

CacheWatch::~CacheWatch() { Cancel(); }

size_t CacheWatch::Pop(std::vector<WatchEvent>* out, size_t max_events) {
  CacheWatcher* w = w_.get();
  size_t n = 0;
  {
    absl::MutexLock l(&w->mu_);
    while (n < max_events && w->initial_pos_ < w->initial_.size()) {
      WatchEvent ev;
      ev.type = EventType::kAdded;
      ev.revision = w->initial_rev_;
      ev.object = std::move(w->initial_[w->initial_pos_++]);
      out->push_back(std::move(ev));
      ++n;
    }
    if (w->initial_pos_ == w->initial_.size() && !w->initial_.empty()) {
      w->initial_.clear();
      w->initial_.shrink_to_fit();
      w->initial_pos_ = 0;
    }
    if (n < max_events && w->initial_.empty() && w->initial_end_pending_) {
      WatchEvent ev;
      ev.type = EventType::kBookmark;
      ev.revision = w->initial_rev_;
      ev.initial_events_end = true;
      out->push_back(std::move(ev));
      w->initial_end_pending_ = false;
      ++n;
    }
    while (n < max_events && !w->queue_.empty()) {
      out->push_back(std::move(w->queue_.front()));
      w->queue_.pop_front();
      ++n;
    }
    if (n > 0) return n;
    if (w->state_ == CacheWatcher::State::kDone) return 0;
    if (w->state_ == CacheWatcher::State::kLive) {
      w->waiting_ = true;
      return 0;
    }
  }
  n = w->owner_->CatchUp(w, out, max_events);
  if (n == 0) {
    absl::MutexLock l(&w->mu_);
    if (w->queue_.empty() && w->state_ == CacheWatcher::State::kLive) {
      w->waiting_ = true;
    } else if (w->state_ != CacheWatcher::State::kDone) {
      // Caught up with events queued meanwhile, or still behind with
      // nothing selected in the part of history read: pop again.
      return Pop(out, max_events);
    }
  }
  return n;
}

bool CacheWatch::done() {
  absl::MutexLock l(&w_->mu_);
  return w_->state_ == CacheWatcher::State::kDone && w_->queue_.empty();
}

absl::Status CacheWatch::status() {
  absl::MutexLock l(&w_->mu_);
  return w_->end_;
}

void CacheWatch::SetNotify(std::function<void()> fn) {
  absl::MutexLock l(&w_->notify_mu_);
  w_->notify_ = std::move(fn);
}

void CacheWatch::Cancel() {
  SetNotify(nullptr);
  w_->owner_->Remove(w_.get());
}

// ---------------------------------------------------------------------------
// ResourceCache

ResourceCache::ResourceCache(const ResourceSpec& spec, const CacheOptions& options,
                             ObjectAllocator* alloc)
    : extractor_(spec),
      options_(options),
      alloc_(alloc),
      use_indexes_(options.use_indexes),
      ring_capacity_(options.ring_min_capacity),
      field_index_(spec.fields.size()),
      field_watchers_(spec.fields.size()),
      field_watcher_count_(spec.fields.size(), 0) {}

ResourceCache::~ResourceCache() { Stop(); }

void ResourceCache::SetRevisionSource(std::function<int64_t()> current_rev,
                                      std::function<void()> request_progress) {
  current_rev_ = std::move(current_rev);
  request_progress_ = std::move(request_progress);
}

ObjectRef ResourceCache::MakeObject(std::string_view kv_record) {
  mvcc::KeyValueView kv;
  if (!mvcc::DecodeKeyValue(kv_record, &kv)) return ObjectRef();
  Extracted ex;
  if (!extractor_.Extract(kv.value, &ex)) undecoded_.fetch_add(1, std::memory_order_relaxed);
  return CachedObject::Create(alloc_, kv_record, ex);
}

int64_t ResourceCache::rev() const {
  absl::ReaderMutexLock l(&mu_);
  return rev_;
}

bool ResourceCache::ready() const {
  absl::ReaderMutexLock l(&mu_);
  return ready_;
}

bool ResourceCache::WaitReady(absl::Duration timeout) const {
  absl::ReaderMutexLock l(&mu_);
  auto cond = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return ready_ || stopped_; };
  return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout) && ready_;
}

void ResourceCache::IndexAddLocked(const CachedObject* o) {
  object_bytes_ += o->block_size();
  raw_bytes_ += o->kv().size();
  if (!o->decoded()) return;
  const auto& fields = spec().fields;
  for (size_t f = 0; f < fields.size(); ++f) {
    if (!fields[f].indexed) continue;
    field_index_[f][AV(o->field(static_cast<int>(f)))].insert(o);
  }
  if (spec().index_labels) {
    for (int j = 0; j < o->num_labels(); ++j) {
      auto [k, v] = o->label(j);
      scratch_.assign(k);
      scratch_.push_back('=');
      scratch_.append(v);
      label_index_[scratch_].insert(o);
    }
  }
}

void ResourceCache::IndexRemoveLocked(const CachedObject* o) {
  object_bytes_ -= o->block_size();
  raw_bytes_ -= o->kv().size();
  if (!o->decoded()) return;
  const auto& fields = spec().fields;
  for (size_t f = 0; f < fields.size(); ++f) {
    if (!fields[f].indexed) continue;
    auto it = field_index_[f].find(AV(o->field(static_cast<int>(f))));
    if (it == field_index_[f].end()) continue;
    it->second.erase(o);
    if (it->second.empty()) field_index_[f].erase(it);
  }
  if (spec().index_labels) {
    for (int j = 0; j < o->num_labels(); ++j) {
      auto [k, v] = o->label(j);
      scratch_.assign(k);
      scratch_.push_back('=');
      scratch_.append(v);
      auto it = label_index_.find(scratch_);
      if (it == label_index_.end()) continue;
      it->second.erase(o);
      if (it->second.empty()) label_index_.erase(it);
    }
  }
}

void ResourceCache::Reset(int64_t rev, std::vector<ObjectRef> objects) {
  std::sort(objects.begin(), objects.end(),
            [](const ObjectRef& a, const ObjectRef& b) { return a->key() < b->key(); });
  Notifications notify;
  {
    absl::MutexLock l(&mu_);
    for (auto& [p, w] : watchers_) {
      absl::MutexLock wl(&w->mu_);
      if (w->state_ != CacheWatcher::State::kDone) EndLocked(w.get(), CacheReinitialized(), &notify);
    }
    SweepEndedLocked();
    tree_.Clear();
    for (auto& f : field_index_) f.clear();
    label_index_.clear();
    object_bytes_ = raw_bytes_ = 0;
    ring_.clear();
    ring_bytes_ = 0;
    snapshots_.clear();
    for (auto& o : objects) {
      const CachedObject* p = o.get();
      ObjectRef old = tree_.Put(std::move(o));
      if (old) IndexRemoveLocked(old.get());
      IndexAddLocked(p);
    }
    rev_ = rev;
    snapshots_.push_back({rev, tree_.Snapshot()});
    ready_ = true;
  }
  RunNotifications(&notify);
}

void ResourceCache::Apply(std::vector<FeedChange> changes, int64_t header_rev) {
  const absl::Time now = absl::Now();
  Notifications notify;
  {
    absl::MutexLock l(&mu_);
    CHECK(ready_) << "Apply before Reset";
    SweepEndedLocked();
    for (size_t i = 0; i < changes.size(); ++i) {
      FeedChange& c = changes[i];
      CHECK(c.rev > snapshots_.back().rev) << "change at revision " << c.rev << " after "
                                           << snapshots_.back().rev;
      auto ev = std::make_shared<CacheEvent>();
      ev->rev = c.rev;
      ev->time = now;
      if (c.object) {
        const CachedObject* p = c.object.get();
        ev->object = c.object;
        ev->prev = tree_.Put(std::move(c.object));
        if (ev->prev) IndexRemoveLocked(ev->prev.get());
        IndexAddLocked(p);
      } else {
        ev->prev = tree_.Erase(c.key);
        if (ev->prev) IndexRemoveLocked(ev->prev.get());
      }
      if (c.prev_mod_rev >= 0 && c.prev_mod_rev != (ev->prev ? ev->prev->mod_revision() : 0)) {
        feed_mismatches_.fetch_add(1, std::memory_order_relaxed);
      }
      if (ev->prev || ev->object) {
        ring_bytes_ += ev->prev ? ev->prev->block_size() : 0;
        ring_.push_back(ev);
        DispatchLocked(ev, &notify);
        events_applied_.fetch_add(1, std::memory_order_relaxed);
      }
      const bool last_of_rev = i + 1 == changes.size() || changes[i + 1].rev != c.rev;
      if (last_of_rev) {
        // The tree is shared from now on: later changes copy their paths.
        const size_t n = std::max<size_t>(tree_.size(), 2);
        const uint64_t levels = 1 + static_cast<uint64_t>(std::log(static_cast<double>(n)) / std::log(20.0));
        ring_bytes_ += levels * kSnapshotBytesPerLevel;
        snapshots_.push_back({c.rev, tree_.Snapshot()});
      }
    }
    rev_ = std::max({rev_, header_rev, snapshots_.back().rev});
    EvictLocked(now);
  }
  RunNotifications(&notify);
}

void ResourceCache::AdvanceTo(int64_t rev) {
  absl::MutexLock l(&mu_);
  if (rev > rev_) rev_ = rev;
}

int64_t ResourceCache::OldestRevLocked() const { return snapshots_.front().rev; }

const TreeSnapshot& ResourceCache::SnapshotAtLocked(int64_t rev) const {
  // The last snapshot at or before rev.
  auto it = std::upper_bound(snapshots_.begin(), snapshots_.end(), rev,
                             [](int64_t r, const RevSnapshot& s) { return r < s.rev; });
  CHECK(it != snapshots_.begin());
  return std::prev(it)->snap;
}

void ResourceCache::EvictLocked(absl::Time now) {
  // kube-apiserver's resizeCacheLocked: grow while the full ring's oldest
  // event is fresh, shrink when even its newest quarter is stale.
  if (ring_.size() >= ring_capacity_) {
    if (now - ring_.front()->time < options_.event_window) {
      ring_capacity_ = std::min(ring_capacity_ * 2, options_.ring_max_capacity);
    } else if (ring_capacity_ / 4 > 0 && ring_.size() >= ring_capacity_ / 4 &&
               now - ring_[ring_.size() - ring_capacity_ / 4]->time > options_.event_window) {
      ring_capacity_ = std::max(ring_capacity_ / 2, options_.ring_min_capacity);
    }
  }
  const size_t n = std::max<size_t>(tree_.size(), 2);
  const uint64_t snapshot_bytes =
      (1 + static_cast<uint64_t>(std::log(static_cast<double>(n)) / std::log(20.0))) * kSnapshotBytesPerLevel;
  while (!ring_.empty() && (ring_.size() > ring_capacity_ || ring_bytes_ > options_.ring_max_bytes)) {
    // Evict the oldest revision whole: the base becomes the state after it.
    const int64_t r = ring_.front()->rev;
    while (!ring_.empty() && ring_.front()->rev == r) {
      ring_bytes_ -= ring_.front()->prev ? ring_.front()->prev->block_size() : 0;
      ring_.pop_front();
    }
    while (snapshots_.size() > 1 && snapshots_.front().rev < r) {
      snapshots_.pop_front();
      ring_bytes_ -= std::min(ring_bytes_, snapshot_bytes);
    }
  }
}

// ---------------------------------------------------------------------------
// Dispatch

void ResourceCache::RegisterLocked(CacheWatcher* w) {
  const Selector& sel = w->selector_;
  w->registration_ = CacheWatcher::Registration::kAll;
  for (const auto& f : sel.fields()) {
    if (f.equals) {
      w->registration_ = CacheWatcher::Registration::kField;
      w->reg_field_ = f.field;
      w->reg_value_ = f.value;
      break;
    }
  }
  if (w->registration_ == CacheWatcher::Registration::kAll) {
    for (const auto& l : sel.labels()) {
      if ((l.op == LabelRequirement::Op::kEquals || l.op == LabelRequirement::Op::kIn) &&
          l.values.size() == 1) {
        w->registration_ = CacheWatcher::Registration::kLabel;
        w->reg_value_ = LabelIndexValue(l.key, l.values[0]);
        break;
      }
    }
  }
  if (w->registration_ == CacheWatcher::Registration::kAll) {
    // A namespace's prefix: "<resource prefix><namespace>/".
    std::string_view rest = std::string_view(w->prefix_).substr(spec().prefix.size());
    if (!rest.empty() && rest.back() == '/' && rest.find('/') == rest.size() - 1) {
      w->registration_ = CacheWatcher::Registration::kNamespace;
      w->reg_value_ = w->prefix_;
    }
  }
  switch (w->registration_) {
    case CacheWatcher::Registration::kAll: all_watchers_.insert(w); break;
    case CacheWatcher::Registration::kField:
      field_watchers_[w->reg_field_][w->reg_value_].insert(w);
      ++field_watcher_count_[w->reg_field_];
      break;
    case CacheWatcher::Registration::kLabel:
      label_watchers_[w->reg_value_].insert(w);
      ++label_watcher_count_;
      break;
    case CacheWatcher::Registration::kNamespace: namespace_watchers_[w->reg_value_].insert(w); break;
  }
  w->registered_ = true;
}

void ResourceCache::UnregisterLocked(CacheWatcher* w) {
  if (!w->registered_) return;
  w->registered_ = false;
  auto erase_from = [w](WatcherIndex& idx) {
    auto it = idx.find(w->reg_value_);
    if (it == idx.end()) return;
    it->second.erase(w);
    if (it->second.empty()) idx.erase(it);
  };
  switch (w->registration_) {
    case CacheWatcher::Registration::kAll: all_watchers_.erase(w); break;
    case CacheWatcher::Registration::kField:
      erase_from(field_watchers_[w->reg_field_]);
      --field_watcher_count_[w->reg_field_];
      break;
    case CacheWatcher::Registration::kLabel:
      erase_from(label_watchers_);
      --label_watcher_count_;
      break;
    case CacheWatcher::Registration::kNamespace: erase_from(namespace_watchers_); break;
  }
}

void ResourceCache::DispatchLocked(const std::shared_ptr<const CacheEvent>& ev, Notifications* notify) {
  const uint64_t stamp = ++stamp_;
  uint64_t candidates = 0;
  auto visit_set = [&](const WatcherSet& set) {
    for (CacheWatcher* w : set) {
      if (w->stamp_ == stamp) continue;
      w->stamp_ = stamp;
      ++candidates;
      OfferLocked(w, *ev, notify);
    }
  };
  auto visit_value = [&](const WatcherIndex& idx, std::string_view value) {
    auto it = idx.find(AV(value));
    if (it != idx.end()) visit_set(it->second);
  };
  visit_set(all_watchers_);
  const CachedObject* objs[2] = {ev->prev.get(), ev->object.get()};
  for (size_t f = 0; f < field_watchers_.size(); ++f) {
    if (field_watcher_count_[f] == 0) continue;
    for (const CachedObject* o : objs) {
      if (o != nullptr && o->decoded()) visit_value(field_watchers_[f], o->field(static_cast<int>(f)));
    }
  }
  if (label_watcher_count_ > 0) {
    for (const CachedObject* o : objs) {
      if (o == nullptr || !o->decoded()) continue;
      for (int j = 0; j < o->num_labels(); ++j) {
        auto [k, v] = o->label(j);
        scratch_.assign(k);
        scratch_.push_back('=');
        scratch_.append(v);
        visit_value(label_watchers_, scratch_);
      }
    }
  }
  if (!namespace_watchers_.empty()) {
    std::string_view key = ev->key();
    size_t slash = key.find('/', spec().prefix.size());
    if (slash != std::string_view::npos) visit_value(namespace_watchers_, key.substr(0, slash + 1));
  }
  dispatch_candidates_.fetch_add(candidates, std::memory_order_relaxed);
}

void ResourceCache::OfferLocked(CacheWatcher* w, const CacheEvent& ev, Notifications* notify) {
  WatchEvent out;
  if (!w->Transition(ev, &out)) return;
  absl::MutexLock wl(&w->mu_);
  if (w->state_ != CacheWatcher::State::kLive) return;
  if (w->queue_.size() >= options_.watcher_queue_events) {
    // Fall behind: the rest (from this revision on, whole) comes from the
    // history once the consumer has drained the queue.
    while (!w->queue_.empty() && w->queue_.back().revision == ev.rev &&
           w->queue_.back().type != EventType::kBookmark) {
      w->queue_.pop_back();
    }
    w->state_ = CacheWatcher::State::kBehind;
    w->next_rev_ = ev.rev;
    w->behind_since_ = ev.time;
    return;
  }
  w->queue_.push_back(std::move(out));
  events_dispatched_.fetch_add(1, std::memory_order_relaxed);
  if (w->waiting_) {
    w->waiting_ = false;
    notify->push_back(w->shared_from_this());
  }
}

void ResourceCache::EndLocked(CacheWatcher* w, absl::Status status, Notifications* notify) {
  if (w->state_ == CacheWatcher::State::kDone) return;
  w->state_ = CacheWatcher::State::kDone;
  w->end_ = std::move(status);
  w->queue_.clear();
  w->initial_.clear();
  w->initial_end_pending_ = false;
  if (!w->end_.ok()) watchers_cut_off_.fetch_add(1, std::memory_order_relaxed);
  if (w->waiting_ && notify != nullptr) {
    w->waiting_ = false;
    notify->push_back(w->shared_from_this());
  }
  absl::MutexLock l(&ended_mu_);
  ended_.push_back(w);
}

void ResourceCache::SweepEndedLocked() {
  std::vector<CacheWatcher*> ended;
  {
    absl::MutexLock l(&ended_mu_);
    ended.swap(ended_);
  }
  for (CacheWatcher* w : ended) {
    UnregisterLocked(w);
    watchers_.erase(w);
  }
}

void ResourceCache::RunNotifications(Notifications* notify) {
  for (auto& w : *notify) w->Notify();
  notify->clear();
}

size_t ResourceCache::CatchUp(CacheWatcher* w, std::vector<WatchEvent>* out, size_t max_events) {
  Notifications notify;
  size_t n = 0;
  {
    absl::ReaderMutexLock l(&mu_);
    absl::MutexLock wl(&w->mu_);
    if (w->state_ != CacheWatcher::State::kBehind) return 0;
    if (w->next_rev_ - 1 < OldestRevLocked()) {
      EndLocked(w,
                WatcherTooSlow(absl::StrCat("watcher fell behind: its next revision ", w->next_rev_,
                                            " has left the watch cache's history (oldest ",
                                            OldestRevLocked(), ")")),
                nullptr);
      return 0;
    }
    if (absl::Now() - w->behind_since_ > options_.slow_watcher_budget) {
      EndLocked(w,
                WatcherTooSlow(absl::StrCat("watcher was behind for more than ",
                                            absl::FormatDuration(options_.slow_watcher_budget))),
                nullptr);
      return 0;
    }
    auto it = std::lower_bound(ring_.begin(), ring_.end(), w->next_rev_,
                               [](const auto& ev, int64_t r) { return ev->rev < r; });
    for (; it != ring_.end(); ++it) {
      const CacheEvent& ev = **it;
      if (n >= max_events && ev.rev != w->next_rev_ - 1) break;  // only whole revisions
      WatchEvent e;
      if (w->Transition(ev, &e)) {
        out->push_back(std::move(e));
        ++n;
      }
      w->next_rev_ = ev.rev + 1;
    }
    if (it == ring_.end()) {
      // Caught up: dispatch (which needs mu_ exclusively) queues from here.
      w->state_ = CacheWatcher::State::kLive;
      w->next_rev_ = rev_ + 1;
    }
  }
  return n;
}

void ResourceCache::Remove(CacheWatcher* w) {
  absl::MutexLock l(&mu_);
  {
    absl::MutexLock wl(&w->mu_);
    if (w->state_ != CacheWatcher::State::kDone) {
      w->state_ = CacheWatcher::State::kDone;
      w->queue_.clear();
      w->initial_.clear();
      w->end_ = absl::OkStatus();
    }
  }
  UnregisterLocked(w);
  {
    absl::MutexLock el(&ended_mu_);
    ended_.erase(std::remove(ended_.begin(), ended_.end(), w), ended_.end());
  }
  watchers_.erase(w);
}

void ResourceCache::Tick(absl::Time now) {
  Notifications notify;
  {
    absl::MutexLock l(&mu_);
    SweepEndedLocked();
    for (auto& [p, w] : watchers_) {
      absl::MutexLock wl(&w->mu_);
      if (w->state_ == CacheWatcher::State::kBehind &&
          now - w->behind_since_ > options_.slow_watcher_budget) {
        EndLocked(w.get(),
                  WatcherTooSlow(absl::StrCat("watcher was behind for more than ",
                                              absl::FormatDuration(options_.slow_watcher_budget),
                                              " (from revision ", w->next_rev_, ")")),
                  &notify);
        continue;
      }
      if (w->allow_bookmarks_ && w->state_ == CacheWatcher::State::kLive && now >= w->next_bookmark_ &&
          !w->initial_end_pending_) {
        w->next_bookmark_ = now + options_.bookmark_interval;
        if (!w->queue_.empty() && w->queue_.back().type == EventType::kBookmark) {
          w->queue_.back().revision = rev_;
        } else {
          WatchEvent b;
          b.type = EventType::kBookmark;
          b.revision = rev_;
          w->queue_.push_back(std::move(b));
        }
        if (w->waiting_) {
          w->waiting_ = false;
          notify.push_back(w);
        }
      }
    }
  }
  RunNotifications(&notify);
}

void ResourceCache::Stop() {
  Notifications notify;
  {
    absl::MutexLock l(&mu_);
    stopped_ = true;
    for (auto& [p, w] : watchers_) {
      absl::MutexLock wl(&w->mu_);
      EndLocked(w.get(), CacheStopped(), &notify);
    }
    SweepEndedLocked();
  }
  RunNotifications(&notify);
}

// ---------------------------------------------------------------------------
// List and Watch

bool ResourceCache::AwaitRevLocked(int64_t rev, absl::Duration timeout) {
  auto cond = [this, rev]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return rev_ >= rev || stopped_; };
  mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
  return rev_ >= rev && !stopped_;
}

absl::Status ResourceCache::WaitConsistent() {
  if (!current_rev_) return absl::OkStatus();
  const int64_t want = current_rev_();
  const absl::Time deadline = absl::Now() + options_.wait_timeout;
  for (;;) {
    {
      absl::ReaderMutexLock l(&mu_);
      if (stopped_) return CacheStopped();
      if (rev_ >= want) return absl::OkStatus();
    }
    if (request_progress_) request_progress_();
    absl::ReaderMutexLock l(&mu_);
    const absl::Duration left = deadline - absl::Now();
    if (AwaitRevLocked(want, std::min(left, kProgressRetry))) return absl::OkStatus();
    if (stopped_) return CacheStopped();
    if (absl::Now() >= deadline) return TooLargeResourceVersion(want, rev_);
  }
}

bool ResourceCache::IndexCandidatesLocked(const Selector& sel, std::vector<ObjectRef>* out) const {
  if (!use_indexes_.load(std::memory_order_relaxed)) return false;
  // The requirement with the fewest candidates.
  std::vector<const ObjectSet*> best;
  size_t best_size = SIZE_MAX;
  static const ObjectSet kEmpty;
  for (const auto& f : sel.fields()) {
    if (!f.equals || !spec().fields[f.field].indexed) continue;
    auto it = field_index_[f.field].find(f.value);
    const ObjectSet* s = it == field_index_[f.field].end() ? &kEmpty : &it->second;
    if (s->size() < best_size) {
      best_size = s->size();
      best = {s};
    }
  }
  if (spec().index_labels) {
    for (const auto& l : sel.labels()) {
      if (l.op != LabelRequirement::Op::kEquals && l.op != LabelRequirement::Op::kIn) continue;
      std::vector<const ObjectSet*> sets;
      size_t size = 0;
      for (const auto& v : l.values) {
        auto it = label_index_.find(LabelIndexValue(l.key, v));
        if (it == label_index_.end()) continue;
        sets.push_back(&it->second);
        size += it->second.size();
      }
      if (size < best_size) {
        best_size = size;
        best = std::move(sets);
      }
    }
  }
  if (best_size == SIZE_MAX) return false;
  out->reserve(out->size() + best_size);
  for (const ObjectSet* s : best) {
    for (const CachedObject* o : *s) out->push_back(ObjectRef::Share(o));
  }
  return true;
}

absl::StatusOr<ListResult> ResourceCache::List(const ListOptions& opts) {
  CHECK(opts.prefix.starts_with(spec().prefix));
  auto sel = Selector::Parse(opts.label_selector, opts.field_selector, extractor_);
  if (!sel.ok()) return sel.status();
  if (opts.limit < 0) return InvalidRequest("limit must not be negative");

  // What state to list: the latest (after waiting as the request says) or
  // exactly the state at `exact`.
  int64_t exact = 0;
  int64_t min_rev = 0;
  std::string start_rel;
  bool from_continue = false;
  if (!opts.continue_token.empty()) {
    if (!opts.resource_version.empty() && opts.resource_version != "0") {
      return InvalidRequest("specifying resource version is not allowed when using continue");
    }
    auto cp = DecodeContinue(opts.continue_token);
    if (!cp.ok()) return cp.status();
    exact = cp->rev;
    start_rel = std::move(cp->start);
    from_continue = true;
  } else if (opts.resource_version.empty()) {
    if (opts.match != ResourceVersionMatch::kUnset) {
      return InvalidRequest("resourceVersionMatch is forbidden unless resourceVersion is provided");
    }
  } else {
    int64_t rv;
    if (!ParseRv(opts.resource_version, &rv)) {
      return InvalidRequest(absl::StrCat("invalid resource version: ", opts.resource_version));
    }
    if (opts.match == ResourceVersionMatch::kExact) {
      if (rv == 0) return InvalidRequest("resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"");
      exact = rv;
    } else {
      min_rev = rv;
    }
  }

  if (!WaitReady(options_.wait_timeout)) return NotReady();
  if (opts.resource_version.empty() && !from_continue) {
    if (auto s = WaitConsistent(); !s.ok()) return s;
  }

  ListResult result;
  TreeSnapshot snap;
  std::vector<ObjectRef> candidates;
  bool indexed = false;
  bool historical = false;  // snap is older than the index
  {
    absl::ReaderMutexLock l(&mu_);
    const int64_t need = std::max(exact, min_rev);
    if (need > rev_ && !AwaitRevLocked(need, options_.wait_timeout)) {
      if (stopped_) return CacheStopped();
      return TooLargeResourceVersion(need, rev_);
    }
    if (exact > 0) {
      if (exact < OldestRevLocked()) {
        return from_continue ? ContinueExpired() : TooOldResourceVersion(exact, OldestRevLocked());
      }
      snap = SnapshotAtLocked(exact);
      result.revision = exact;
    } else {
      snap = snapshots_.back().snap;
      result.revision = rev_;
    }
    indexed = IndexCandidatesLocked(*sel, &candidates);
    historical = exact > 0 && exact < snapshots_.back().rev;
    if (indexed && historical) {
      // The index is of the latest state: add every key changed since
      // `exact`, and read each candidate from the snapshot below.
      auto it = std::upper_bound(ring_.begin(), ring_.end(), exact,
                                 [](int64_t r, const auto& ev) { return r < ev->rev; });
      const size_t changed = ring_.end() - it;
      if (changed > snap.size() / 4 + 64) {
        indexed = false;  // scanning the snapshot is cheaper
      } else {
        for (; it != ring_.end(); ++it) candidates.push_back((*it)->object ? (*it)->object : (*it)->prev);
      }
    }
  }

  const std::string start = from_continue ? absl::StrCat(opts.prefix, start_rel) : opts.prefix;
  const std::string end = PrefixEnd(opts.prefix);
  const size_t want = opts.limit > 0 ? static_cast<size_t>(opts.limit) + 1 : SIZE_MAX;
  if (indexed) {
    std::sort(candidates.begin(), candidates.end(),
              [](const ObjectRef& a, const ObjectRef& b) { return a->key() < b->key(); });
    std::string_view prev_key;  // its object stays alive in candidates or result
    for (size_t i = 0; i < candidates.size() && result.objects.size() < want; ++i) {
      std::string_view key = candidates[i]->key();
      if (i > 0 && prev_key == key) continue;
      prev_key = key;
      if (key < start || (!end.empty() && key >= end)) continue;
      if (!historical) {
        // Taken from the index under the same lock as snap: the object itself.
        if (sel->Matches(*candidates[i])) result.objects.push_back(std::move(candidates[i]));
        continue;
      }
      const CachedObject* o = snap.Find(key);
      if (o != nullptr && sel->Matches(*o)) result.objects.push_back(ObjectRef::Share(o));
    }
  } else {
    snap.Scan(start, end, [&](const ObjectRef& o) {
      if (sel->Matches(*o)) result.objects.push_back(o);
      return result.objects.size() < want;
    });
  }
  if (result.objects.size() == want && opts.limit > 0) {
    result.objects.pop_back();
    const std::string_view last = result.objects.back()->key();
    std::string next(last.substr(opts.prefix.size()));
    next.push_back('\0');
    result.continue_token = EncodeContinue(result.revision, next);
    if (sel->empty()) {
      result.remaining_item_count =
          static_cast<int64_t>(snap.Count(absl::StrCat(opts.prefix, next), end));
    }
  }
  return result;
}

absl::StatusOr<std::unique_ptr<CacheWatch>> ResourceCache::Watch(const WatchOptions& opts) {
  CHECK(opts.prefix.starts_with(spec().prefix));
  auto sel = Selector::Parse(opts.label_selector, opts.field_selector, extractor_);
  if (!sel.ok()) return sel.status();
  int64_t from = 0;  // 0: from the current state with initial events
  if (!opts.resource_version.empty() && opts.resource_version != "0") {
    if (!ParseRv(opts.resource_version, &from)) {
      return InvalidRequest(absl::StrCat("invalid resource version: ", opts.resource_version));
    }
  }
  const bool initial = from == 0 || opts.send_initial_events;
  if (!WaitReady(options_.wait_timeout)) return NotReady();
  if (opts.send_initial_events && opts.resource_version.empty()) {
    if (auto s = WaitConsistent(); !s.ok()) return s;
  }

  auto w = std::make_shared<CacheWatcher>(this, 0, opts.prefix, std::move(*sel), opts.allow_bookmarks);
  TreeSnapshot snap;
  std::vector<ObjectRef> candidates;
  bool indexed = false;
  int64_t start_rev;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return CacheStopped();
    if (from > rev_ && !AwaitRevLocked(from, options_.wait_timeout)) {
      if (stopped_) return CacheStopped();
      return TooLargeResourceVersion(from, rev_);
    }
    if (!initial && from < OldestRevLocked()) return TooOldResourceVersion(from, OldestRevLocked());
    SweepEndedLocked();
    absl::MutexLock wl(&w->mu_);
    w->next_bookmark_ = absl::Now() + options_.bookmark_interval;
    if (initial) {
      // The state at rev_, then live events after it.
      start_rev = rev_;
      snap = snapshots_.back().snap;
      indexed = IndexCandidatesLocked(w->selector_, &candidates);
      w->state_ = CacheWatcher::State::kLive;
      w->initial_rev_ = rev_;
      w->initial_end_pending_ = opts.send_initial_events;
    } else if (from >= snapshots_.back().rev) {
      start_rev = from;
      w->state_ = CacheWatcher::State::kLive;
    } else {
      // Events after `from` come from the history first.
      start_rev = from;
      w->state_ = CacheWatcher::State::kBehind;
      w->next_rev_ = from + 1;
      w->behind_since_ = absl::Now();
    }
    RegisterLocked(w.get());
    watchers_.emplace(w.get(), w);
  }
  if (initial) {
    std::vector<ObjectRef> objs;
    const std::string end = PrefixEnd(opts.prefix);
    if (indexed) {
      std::sort(candidates.begin(), candidates.end(),
                [](const ObjectRef& a, const ObjectRef& b) { return a->key() < b->key(); });
      for (auto& o : candidates) {
        if (w->Selects(o.get())) objs.push_back(std::move(o));
      }
    } else {
      snap.Scan(opts.prefix, end, [&](const ObjectRef& o) {
        if (w->selector_.Matches(*o)) objs.push_back(o);
        return true;
      });
    }
    absl::MutexLock wl(&w->mu_);
    if (w->state_ != CacheWatcher::State::kDone) w->initial_ = std::move(objs);
  }
  return std::unique_ptr<CacheWatch>(new CacheWatch(std::move(w), start_rev));
}

ResourceCache::Stats ResourceCache::GetStats() const {
  Stats s;
  absl::ReaderMutexLock l(&mu_);
  s.rev = rev_;
  s.oldest_rev = snapshots_.empty() ? 0 : OldestRevLocked();
  s.objects = tree_.size();
  s.object_bytes = object_bytes_;
  s.raw_bytes = raw_bytes_;
  s.undecoded = undecoded_.load(std::memory_order_relaxed);
  s.ring_events = ring_.size();
  s.ring_capacity = ring_capacity_;
  s.ring_bytes = ring_bytes_;
  s.snapshots = snapshots_.size();
  s.watchers = watchers_.size();
  for (const auto& [p, w] : watchers_) {
    absl::MutexLock wl(&w->mu_);
    if (w->state_ == CacheWatcher::State::kBehind) ++s.watchers_behind;
  }
  s.watchers_cut_off = watchers_cut_off_.load(std::memory_order_relaxed);
  s.events_applied = events_applied_.load(std::memory_order_relaxed);
  s.events_dispatched = events_dispatched_.load(std::memory_order_relaxed);
  s.dispatch_candidates = dispatch_candidates_.load(std::memory_order_relaxed);
  s.feed_mismatches = feed_mismatches_.load(std::memory_order_relaxed);
  // flat_hash_set slots (8 bytes + 1 control byte, at ~7/8 load) per entry,
  // and the value strings.
  uint64_t idx = 0;
  auto add = [&idx](const ValueIndex& vi) {
    for (const auto& [v, set] : vi) idx += 64 + v.size() + set.capacity() * 9 + 16;
  };
  for (const auto& vi : field_index_) add(vi);
  add(label_index_);
  s.index_bytes_estimate = idx;
  return s;
}

}  // namespace capstan::watchcache
