// Wakeup: how a watch consumer (a Next caller or a callback thread) waits
// for its producer without a lost notification; WatchConsumer: the wakeup
// and callback thread of one watch, and how they stop.

#ifndef CAPSTAN_EMBED_WAKEUP_H_
#define CAPSTAN_EMBED_WAKEUP_H_

#include <chrono>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "util/mutex.h"

namespace capstan::embed {

// Thread safety: every method may be called from any thread.
class Wakeup {
 public:
  using Clock = std::chrono::steady_clock;

  // Something may be ready: the next (or current) Wait returns.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_) {
    util::MutexLock l(&mu_);
    notified_ = true;
  }

  // Waits for a Notify since the last Wait, or Close, until deadline.
  // Returns false on timeout or once closed.
  bool Wait(Clock::time_point deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    util::MutexLock l(&mu_);
    auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return notified_ || closed_; };
    mu_.AwaitWithTimeout(absl::Condition(&woken), absl::FromChrono(deadline - Clock::now()));
    if (closed_ || !notified_) return false;
    notified_ = false;
    return true;
  }

  // Ends every Wait for good.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    util::MutexLock l(&mu_);
    closed_ = true;
  }

  bool closed() ABSL_LOCKS_EXCLUDED(mu_) {
    util::MutexLock l(&mu_);
    return closed_;
  }

 private:
  // A leaf lock: producers notify while holding their own locks. Wait
  // waits on a condition over the flags, so setting one under it wakes.
  util::Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// The consumer side of one watch: its Wakeup and, for a callback watch, the
// thread running the callback loop. Thread-safe.
class WatchConsumer {
 public:
  Wakeup wakeup;

  // Runs loop on the watch's own thread. REQUIRES: called at most once.
  void StartThread(std::function<void()> loop) ABSL_LOCKS_EXCLUDED(stop_mu_) {
    util::MutexLock l(&stop_mu_);
    thread_ = std::thread(std::move(loop));
  }

  // Ends every wait, waits for the thread, then runs detach (which
  // unhooks the watch from its producer). Concurrent calls run one after
  // the other. REQUIRES: not called from the thread.
  void Stop(const std::function<void()>& detach) ABSL_LOCKS_EXCLUDED(stop_mu_) {
    util::MutexLock l(&stop_mu_);
    wakeup.Close();
    if (thread_.joinable()) thread_.join();
    detach();
  }

 private:
  // Held across Stop on purpose, join and detach included: a second Stop
  // returns only once the watch is stopped. Lock order: before the
  // wakeup's lock and whatever detach takes; the watch's thread never
  // takes it.
  util::Mutex stop_mu_;
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
};

// The deadline timeout from now, without overflow for huge timeouts.
inline Wakeup::Clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = Wakeup::Clock::now();
  if (timeout > std::chrono::hours(24 * 365)) return now + std::chrono::hours(24 * 365);
  return now + timeout;
}

}  // namespace capstan::embed

#endif  // CAPSTAN_EMBED_WAKEUP_H_
