#include "bench/loadgen/load_driver.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace capstan::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `total` requests paced to `rate` whose completions come at once from
// another thread, as gRPC's would; returns each request's start, by number.
std::vector<Clock::time_point> PacedRun(double rate, uint64_t total, int clients) {
  std::vector<Clock::time_point> started(total);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<DoneFn> pending;
  bool over = false;
  std::thread completer([&] {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [&] { return over || !pending.empty(); });
      if (pending.empty()) return;
      DoneFn done = std::move(pending.front());
      pending.pop_front();
      l.unlock();
      done(grpc::Status::OK);
      l.lock();
    }
  });
  LoopOptions o;
  o.name = "paced";
  o.total = total;
  o.clients = clients;
  o.rate = rate;
  RunClosedLoop(o, [&](uint64_t seq, size_t, DoneFn done) {
    started[seq] = Clock::now();
    std::lock_guard<std::mutex> l(mu);
    pending.push_back(std::move(done));
    cv.notify_one();
  });
  {
    std::lock_guard<std::mutex> l(mu);
    over = true;
    cv.notify_one();
  }
  completer.join();
  return started;
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

TEST(LoadDriverTest, PacedRequestsNeverRunAheadOfTheRate) {
  // Request k may start early only by the lag the schedule may make up
  // (1 ms) plus the shortest wait that is slept (100 us).
  constexpr double kRate = 20000;
  const auto started = PacedRun(kRate, 4000, 100);
  const double interval_us = 1e6 / kRate;
  for (size_t k = 1; k < started.size(); ++k) {
    const double ahead = k * interval_us - Micros(started[k] - started[0]);
    ASSERT_LE(ahead, 1100 + 1) << "request " << k << " started " << ahead << " us early";
  }
}

TEST(LoadDriverTest, PacedRunKeepsUpWithAFastRate) {
  // Each sleep overshoots by tens of microseconds; a pacer that loses the
  // overshoot runs 100,000 requests/s at a fraction of that (20,000
  // requests took 1.2 s). This one makes it up: about 0.2 s. The bound is
  // loose, for loaded machines.
  constexpr double kRate = 100000;
  const auto started = PacedRun(kRate, 20000, 100);
  const double seconds = Micros(started.back() - started.front()) / 1e6;
  std::printf("%zu requests paced to %.0f/s in %.3f s (%.0f/s)\n", started.size(), kRate, seconds,
              (started.size() - 1) / seconds);
  EXPECT_LT(seconds, 0.8);
}

}  // namespace
}  // namespace capstan::bench
