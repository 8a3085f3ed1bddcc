// Wakeup: how a watch consumer (a Next caller or a callback thread) waits
// for its producer without a lost notification.

#ifndef CAPSTAN_SERVER_EMBED_WAKEUP_H_
#define CAPSTAN_SERVER_EMBED_WAKEUP_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

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

// The deadline timeout from now, without overflow for huge timeouts.
inline Wakeup::Clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = Wakeup::Clock::now();
  if (timeout > std::chrono::hours(24 * 365)) return now + std::chrono::hours(24 * 365);
  return now + timeout;
}

}  // namespace capstan::embed

#endif  // CAPSTAN_SERVER_EMBED_WAKEUP_H_
