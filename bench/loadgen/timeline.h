// A latency distribution per second of a run: what a phase's p99 was at each
// moment, not only over the whole phase, for figures over time (a write path
// that degrades as the data grows, a stall while a list runs).
//
// Thread safety: Record and the readers may be called from any thread; a
// mutex guards the per-second histograms (a few thousand records a second
// do not contend on it).

#ifndef CAPSTAN_BENCH_LOADGEN_TIMELINE_H_
#define CAPSTAN_BENCH_LOADGEN_TIMELINE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "bench/loadgen/histogram.h"

namespace capstan::bench {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Seconds are counted from start.
  explicit Timeline(Clock::time_point start) : start_(start) {}

  // A sample of value (ns) taken at `at`; before start counts in second 0.
  void Record(Clock::time_point at, uint64_t value);

  // Per second from start up to the last one with a sample: how many
  // samples, and their p-th percentile in milliseconds (0 where none).
  std::vector<double> Counts() const;
  std::vector<double> PercentileMs(double p) const;

 private:
  const Clock::time_point start_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Histogram>> seconds_;  // guarded by mu_; null: no sample
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_TIMELINE_H_
