// ResourceCache: watchers (CacheWatch), their registration by index value,
// dispatch of applied events, catching up from the history, bookmarks
// and cutting off slow watchers.

#include "watchcache/absl_compat.h"
#include "watchcache/resource_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/check.h"
#include "watchcache/errors.h"

namespace capstan::watchcache {

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
  util::MutexLock l(&notify_mu_);
  if (notify_) notify_();
}

CacheWatch::~CacheWatch() { Cancel(); }

size_t CacheWatch::Pop(std::vector<WatchEvent>* out, size_t max_events) {
  CacheWatcher* w = w_.get();
  size_t n = 0;
  {
    util::MutexLock l(&w->mu_);
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
    util::MutexLock l(&w->mu_);
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
  util::MutexLock l(&w_->mu_);
  return w_->state_ == CacheWatcher::State::kDone && w_->queue_.empty();
}

absl::Status CacheWatch::status() {
  util::MutexLock l(&w_->mu_);
  return w_->end_;
}

void CacheWatch::SetNotify(std::function<void()> fn) {
  util::MutexLock l(&w_->notify_mu_);
  w_->notify_ = std::move(fn);
}

void CacheWatch::Cancel() {
  SetNotify(nullptr);
  w_->owner_->Remove(w_.get());
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
  // Lambdas are analyzed on their own: they say what they run under.
  auto visit_set = [&](const WatcherSet& set) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (CacheWatcher* w : set) {
      if (w->stamp_ == stamp) continue;
      w->stamp_ = stamp;
      ++candidates;
      OfferLocked(w, *ev, notify);
    }
  };
  auto visit_value = [&](const WatcherIndex& idx, std::string_view value)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
  util::MutexLock wl(&w->mu_);
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
  util::MutexLock l(&ended_mu_);
  ended_.push_back(w);
}

void ResourceCache::SweepEndedLocked() {
  std::vector<CacheWatcher*> ended;
  {
    util::MutexLock l(&ended_mu_);
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
    util::ReaderMutexLock l(&mu_);
    util::MutexLock wl(&w->mu_);
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
  util::MutexLock l(&mu_);
  {
    util::MutexLock wl(&w->mu_);
    if (w->state_ != CacheWatcher::State::kDone) {
      w->state_ = CacheWatcher::State::kDone;
      w->queue_.clear();
      w->initial_.clear();
      w->end_ = absl::OkStatus();
    }
  }
  UnregisterLocked(w);
  {
    util::MutexLock el(&ended_mu_);
    ended_.erase(std::remove(ended_.begin(), ended_.end(), w), ended_.end());
  }
  watchers_.erase(w);
}

void ResourceCache::Tick(absl::Time now) {
  Notifications notify;
  {
    util::MutexLock l(&mu_);
    SweepEndedLocked();
    for (auto& [p, w] : watchers_) {
      util::MutexLock wl(&w->mu_);
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

// ---------------------------------------------------------------------------
// Watch

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
    util::MutexLock l(&mu_);
    if (stopped_) return CacheStopped();
    if (from > rev_ && !AwaitRevLocked(from, options_.wait_timeout)) {
      if (stopped_) return CacheStopped();
      return TooLargeResourceVersion(from, rev_);
    }
    if (!initial && from < OldestRevLocked()) return TooOldResourceVersion(from, OldestRevLocked());
    SweepEndedLocked();
    util::MutexLock wl(&w->mu_);
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
    util::MutexLock wl(&w->mu_);
    if (w->state_ != CacheWatcher::State::kDone) w->initial_ = std::move(objs);
  }
  return std::unique_ptr<CacheWatch>(new CacheWatch(std::move(w), start_rev));
}

}  // namespace capstan::watchcache
