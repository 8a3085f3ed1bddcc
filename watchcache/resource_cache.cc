// ResourceCache: the feeder side (Reset, Apply, the history and its
// eviction, index maintenance), Stop and statistics. Lists are in
// resource_cache_list.cc, watchers and dispatch in resource_cache_watch.cc.

#include "watchcache/absl_compat.h"
#include "watchcache/resource_cache.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "mvcc/kv_codec.h"
#include "util/check.h"
#include "watchcache/errors.h"

namespace capstan::watchcache {

namespace {

// What one revision's snapshot keeps alive once the writer has moved on:
// the copied path (a leaf and its inner nodes), estimated per tree level.
constexpr uint64_t kSnapshotBytesPerLevel = 600;

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

void ResourceCache::SetRevisionSource(std::function<absl::StatusOr<int64_t>()> current_rev,
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
  util::ReaderMutexLock l(&mu_);
  return rev_;
}

bool ResourceCache::ready() const {
  util::ReaderMutexLock l(&mu_);
  return ready_;
}

bool ResourceCache::WaitReady(absl::Duration timeout) const {
  util::ReaderMutexLock l(&mu_);
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
    util::MutexLock l(&mu_);
    for (auto& [p, w] : watchers_) {
      util::MutexLock wl(&w->mu_);
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
    util::MutexLock l(&mu_);
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
  util::MutexLock l(&mu_);
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

void ResourceCache::Stop() {
  Notifications notify;
  {
    util::MutexLock l(&mu_);
    stopped_ = true;
    for (auto& [p, w] : watchers_) {
      util::MutexLock wl(&w->mu_);
      EndLocked(w.get(), CacheStopped(), &notify);
    }
    SweepEndedLocked();
  }
  RunNotifications(&notify);
}

ResourceCache::Stats ResourceCache::GetStats(bool estimate_indexes) const {
  Stats s;
  util::ReaderMutexLock l(&mu_);
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
    util::MutexLock wl(&w->mu_);
    if (w->state_ == CacheWatcher::State::kBehind) ++s.watchers_behind;
  }
  s.watchers_cut_off = watchers_cut_off_.load(std::memory_order_relaxed);
  s.events_applied = events_applied_.load(std::memory_order_relaxed);
  s.events_dispatched = events_dispatched_.load(std::memory_order_relaxed);
  s.dispatch_candidates = dispatch_candidates_.load(std::memory_order_relaxed);
  s.feed_mismatches = feed_mismatches_.load(std::memory_order_relaxed);
  if (!estimate_indexes) return s;
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
