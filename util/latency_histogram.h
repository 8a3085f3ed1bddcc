// A fixed-bucket latency histogram for Prometheus export, updated with
// relaxed atomics so the committer can record into it without a lock.
// Buckets are etcd's for disk latencies: 0.001 s doubling up to 8.192 s.

#ifndef CAPSTAN_UTIL_LATENCY_HISTOGRAM_H_
#define CAPSTAN_UTIL_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace capstan::util {

class LatencyHistogram {
 public:
  static constexpr int kBuckets = 14;  // 0.001 * 2^i, i = 0..13

  static constexpr double UpperBound(int i) { return 0.001 * static_cast<double>(1 << i); }

  void Record(double seconds) {
    int i = 0;
    while (i < kBuckets && seconds > UpperBound(i)) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);  // counts_[kBuckets]: +Inf
    sum_micros_.fetch_add(static_cast<uint64_t>(seconds * 1e6), std::memory_order_relaxed);
  }

  // Cumulative count of observations <= UpperBound(i) (i == kBuckets: all).
  uint64_t Cumulative(int i) const {
    uint64_t n = 0;
    for (int j = 0; j <= i; ++j) n += counts_[j].load(std::memory_order_relaxed);
    return n;
  }
  double Sum() const { return static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6; }

 private:
  std::array<std::atomic<uint64_t>, kBuckets + 1> counts_{};
  std::atomic<uint64_t> sum_micros_{0};
};

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_LATENCY_HISTOGRAM_H_
