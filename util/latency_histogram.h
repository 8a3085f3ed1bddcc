// A fixed-bucket latency histogram for Prometheus export, updated with
// relaxed atomics so that a hot thread can record into it without a lock.
// Bucket i's upper bound is first * 2^i, as prometheus.ExponentialBuckets
// makes etcd's: by default etcd's disk latencies, 0.001 s doubling up to
// 8.192 s (14 buckets); etcd's peer round trips are 0.0001 s doubling up to
// 3.2768 s (16).

#ifndef CAPSTAN_UTIL_LATENCY_HISTOGRAM_H_
#define CAPSTAN_UTIL_LATENCY_HISTOGRAM_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

namespace capstan::util {

class LatencyHistogram {
 public:
  static constexpr int kMaxBuckets = 24;

  // buckets is clamped to 1..kMaxBuckets.
  explicit LatencyHistogram(double first = 0.001, int buckets = 14)
      : first_(first), buckets_(std::clamp(buckets, 1, kMaxBuckets)) {}

  int buckets() const { return buckets_; }
  double UpperBound(int i) const { return first_ * static_cast<double>(uint64_t{1} << i); }

  void Record(double seconds) {
    int i = 0;
    while (i < buckets_ && seconds > UpperBound(i)) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);  // counts_[buckets_]: +Inf
    sum_micros_.fetch_add(static_cast<uint64_t>(seconds * 1e6), std::memory_order_relaxed);
  }

  // Cumulative count of observations <= UpperBound(i) (i == buckets(): all).
  uint64_t Cumulative(int i) const {
    uint64_t n = 0;
    for (int j = 0; j <= i; ++j) n += counts_[j].load(std::memory_order_relaxed);
    return n;
  }
  uint64_t Count() const { return Cumulative(buckets_); }
  double Sum() const { return static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6; }

 private:
  const double first_;
  const int buckets_;
  std::array<std::atomic<uint64_t>, kMaxBuckets + 1> counts_{};
  std::atomic<uint64_t> sum_micros_{0};
};

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_LATENCY_HISTOGRAM_H_
