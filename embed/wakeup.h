// Wakeup: how a watch consumer (a Next caller or a callback thread) waits
// for its producer without a lost notification; WatchConsumer: the wakeup
// and callback thread of one watch, and how they stop.

#ifndef CAPSTAN_EMBED_WAKEUP_H_
#define CAPSTAN_EMBED_WAKEUP_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace capstan::embed {

// Thread safety: every method may be called from any thread. Its mutex is
// a leaf lock (producers notify while holding their own locks).
class Wakeup {
 public:
  using Clock = std::chrono::steady_clock;

  // Something may be ready: the next (or current) Wait returns.
  void Notify() {
    std::lock_guard<std::mutex> l(mu_);
    notified_ = true;
    cv_.notify_all();
  }

  // Waits for a Notify since the last Wait, or Close, until deadline.
  // Returns false on timeout or once closed.
  bool Wait(Clock::time_point deadline) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_until(l, deadline, [&] { return notified_ || closed_; });
    if (closed_ || !notified_) return false;
    notified_ = false;
    return true;
  }

  // Ends every Wait for good.
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
    cv_.notify_all();
  }

  bool closed() {
    std::lock_guard<std::mutex> l(mu_);
    return closed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool notified_ = false;
  bool closed_ = false;
};

// The consumer side of one watch: its Wakeup and, for a callback watch, the
// thread running the callback loop. Thread-safe.
class WatchConsumer {
 public:
  Wakeup wakeup;

  // Runs loop on the watch's own thread. REQUIRES: called at most once.
  void StartThread(std::function<void()> loop) { thread_ = std::thread(std::move(loop)); }

  // Ends every wait, waits for the thread, then runs detach (which
  // unhooks the watch from its producer). Concurrent calls run one after
  // the other. REQUIRES: not called from the thread.
  void Stop(const std::function<void()>& detach) {
    std::lock_guard<std::mutex> l(stop_mu_);
    wakeup.Close();
    if (thread_.joinable()) thread_.join();
    detach();
  }

 private:
  std::mutex stop_mu_;
  std::thread thread_;
};

// The deadline timeout from now, without overflow for huge timeouts.
inline Wakeup::Clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = Wakeup::Clock::now();
  if (timeout > std::chrono::hours(24 * 365)) return now + std::chrono::hours(24 * 365);
  return now + timeout;
}

}  // namespace capstan::embed

#endif  // CAPSTAN_EMBED_WAKEUP_H_
