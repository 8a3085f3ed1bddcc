// CacheWatcher: one watch on a ResourceCache, and CacheWatch, the handle its
// consumer holds.
//
// A live watcher gets its events pushed into a bounded queue by the cache's
// dispatch (shared event objects, never copied bytes). When the queue is
// full the watcher falls behind: the cache stops queueing for it, and once
// its consumer has drained the queue, Pop catches it up from the cache's
// event history and makes it live again. A watcher that stays behind for
// longer than the slow-watcher budget, or whose next event has left the
// history, is cut off with a reason. Memory per watcher is bounded by its
// queue.
//
// Thread safety: CacheWatch methods may be called from any thread, but Pop
// from one thread at a time. Lock order: the ResourceCache's mu_ before a
// watcher's mu_; notify_mu_ is taken with no other lock held.

#ifndef CAPSTAN_WATCHCACHE_CACHE_WATCHER_H_
#define CAPSTAN_WATCHCACHE_CACHE_WATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "util/mutex.h"
#include "watchcache/cache_types.h"
#include "watchcache/selector.h"

namespace capstan::watchcache {

class ResourceCache;

// One change as the event history holds it: shared by the ring and every
// watcher queue it reaches.
struct CacheEvent {
  int64_t rev = 0;
  ObjectRef object;  // after the change; null for a deletion
  ObjectRef prev;    // before the change; null for a creation
  absl::Time time;

  std::string_view key() const { return object ? object->key() : prev->key(); }
};

class CacheWatcher : public std::enable_shared_from_this<CacheWatcher> {
 public:
  CacheWatcher(ResourceCache* owner, uint64_t id, std::string prefix, Selector selector,
               bool allow_bookmarks)
      : owner_(owner), id_(id), prefix_(std::move(prefix)), selector_(std::move(selector)),
        allow_bookmarks_(allow_bookmarks) {}

  // The event this watcher sees for a change, if any: ADDED when the object
  // enters its selection, DELETED (with the previous object) when it leaves,
  // MODIFIED when it stays.
  bool Transition(const CacheEvent& ev, WatchEvent* out) const;
  bool Selects(const CachedObject* o) const;

  uint64_t id() const { return id_; }
  const std::string& prefix() const { return prefix_; }
  const Selector& selector() const { return selector_; }

 private:
  friend class ResourceCache;
  friend class CacheWatch;

  enum class State { kLive, kBehind, kDone };

  // Runs the notify function, if one is set.
  void Notify();

  ResourceCache* const owner_;
  const uint64_t id_;
  const std::string prefix_;
  const Selector selector_;
  const bool allow_bookmarks_;

  // Lock order: after the owner's mu_, before the owner's ended_mu_.
  util::Mutex mu_;
  // The initial ADDED events (a snapshot's objects), served before queue_.
  std::vector<ObjectRef> initial_ ABSL_GUARDED_BY(mu_);
  size_t initial_pos_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t initial_rev_ ABSL_GUARDED_BY(mu_) = 0;
  bool initial_end_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<WatchEvent> queue_ ABSL_GUARDED_BY(mu_);
  State state_ ABSL_GUARDED_BY(mu_) = State::kLive;
  // kBehind: the first revision not delivered, and since when.
  int64_t next_rev_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time behind_since_ ABSL_GUARDED_BY(mu_);
  absl::Status end_ ABSL_GUARDED_BY(mu_);
  // The consumer found nothing to pop: notify it when something arrives.
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time next_bookmark_ ABSL_GUARDED_BY(mu_);

  // Held while the notify function runs (so that SetNotify and Cancel can
  // wait it out). Taken with no other lock held.
  util::Mutex notify_mu_;
  std::function<void()> notify_ ABSL_GUARDED_BY(notify_mu_);

  // Owned by the ResourceCache, under its mu_: the dispatch stamp that
  // dedupes a watcher reached through several index values, and where the
  // watcher is registered. (Not ABSL_GUARDED_BY(owner_->mu_): the cache
  // holds its mu_ as this->mu_, which the analysis cannot equate with
  // w->owner_->mu_.)
  uint64_t stamp_ = 0;
  enum class Registration { kAll, kField, kLabel, kNamespace } registration_ = Registration::kAll;
  int reg_field_ = -1;
  std::string reg_value_;
  bool registered_ = false;
};

// The consumer's handle on a watch. Destroying it cancels the watch.
class CacheWatch {
 public:
  ~CacheWatch();
  CacheWatch(const CacheWatch&) = delete;
  CacheWatch& operator=(const CacheWatch&) = delete;

  // Appends up to max_events events that are ready, in order, and returns
  // how many. Returns 0 when none is ready: then the notify function runs
  // once when one is (or when the watch ends). Never blocks on the cache's
  // writer for long (catching up from history reads under a shared lock).
  size_t Pop(std::vector<WatchEvent>* out, size_t max_events);

  // True once the watch has ended; status() says why (OK after Cancel).
  // Events queued before the end have been dropped.
  bool done();
  absl::Status status();

  // Sets the function run when Pop would find something after it returned
  // 0. It runs on a cache thread with no cache lock held; it must not block
  // and must not call SetNotify or Cancel. After SetNotify(nullptr) or
  // Cancel returns, it is not running and never runs again.
  void SetNotify(std::function<void()> fn);

  // Ends the watch (idempotent).
  void Cancel();

  // The revision the watch started after (its initial state, or the
  // requested resourceVersion).
  int64_t start_revision() const { return start_rev_; }

 private:
  friend class ResourceCache;
  CacheWatch(std::shared_ptr<CacheWatcher> w, int64_t start_rev)
      : w_(std::move(w)), start_rev_(start_rev) {}

  std::shared_ptr<CacheWatcher> w_;
  const int64_t start_rev_;
};

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_CACHE_WATCHER_H_
