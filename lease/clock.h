// Clock: the monotonic time leases are measured by.
//
// The lessor reads the time from a Clock it is given instead of from
// std::chrono::steady_clock, so that tests move time themselves (a lease
// expires when the test says so, not when a sleep ends) and a replicated
// lessor can one day take its time from the leader. Monotonic() is the
// real clock; ManualClock moves only when told.
//
// Thread safety: Now() may be called from any thread. The lessor calls it
// with its lock held, so an implementation must not block and must not call
// back into a lessor.

#ifndef CAPSTAN_LEASE_CLOCK_H_
#define CAPSTAN_LEASE_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "util/check.h"

namespace capstan::lease {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  // The current time; never earlier than a time it returned before.
  virtual TimePoint Now() const = 0;

  // std::chrono::steady_clock. One instance for the process, never
  // destroyed: callers may keep the pointer for as long as they run.
  static const Clock* Monotonic();

 protected:
  // Never deleted through a Clock*: whoever makes a clock owns it as what it
  // is, and users only borrow it (non-virtual, so that a clock without
  // state stays trivially destructible).
  ~Clock() = default;
};

// A clock that stands still until Advance() moves it; for tests. It starts
// at the steady clock's epoch.
//
// Thread safety: every method may be called from any thread (the time is
// one atomic); a reader sees an Advance() once it has returned.
class ManualClock final : public Clock {
 public:
  ManualClock() = default;
  ManualClock(const ManualClock&) = delete;
  ManualClock& operator=(const ManualClock&) = delete;

  TimePoint Now() const override {
    return TimePoint(std::chrono::nanoseconds(now_ns_.load(std::memory_order_acquire)));
  }

  // Moves the time forward by d. REQUIRES: d >= 0.
  void Advance(std::chrono::nanoseconds d) {
    CHECK(d.count() >= 0) << "a monotonic clock does not go back";
    now_ns_.fetch_add(d.count(), std::memory_order_acq_rel);
  }

 private:
  std::atomic<int64_t> now_ns_{0};
};

}  // namespace capstan::lease

#endif  // CAPSTAN_LEASE_CLOCK_H_
