// A high-dynamic-range histogram of non-negative integer samples (latencies in
// nanoseconds), with log-linear buckets in the style of HdrHistogram.
//
// Values below 2^kSubBucketBits are counted exactly. Above that, every power
// of two [2^k, 2^(k+1)) is split into 2^kSubBucketBits equal buckets, so a
// bucket is at most 1/128 (0.78%) of the values it holds wide, and a reported
// percentile (the middle of its bucket, clamped to the exact min and max) is
// within 0.4% of the true sample. Values up to 2^44 ns (4.9 h) are resolved;
// larger ones are counted in the last bucket. Min, max and the sum are exact.
//
// Thread safety: Record() may be called from any number of threads at once
// (relaxed atomics, no lock). Readers (Count, Percentile, Merge's argument,
// ...) see every Record() that happened-before them; run them after the
// writers are joined, or accept a view that is slightly behind.

#ifndef CAPSTAN_BENCH_LOADGEN_HISTOGRAM_H_
#define CAPSTAN_BENCH_LOADGEN_HISTOGRAM_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace capstan::bench {

class Histogram {
 public:
  static constexpr int kSubBucketBits = 7;
  static constexpr int kMaxValueBits = 44;
  static constexpr uint64_t kSubBuckets = uint64_t{1} << kSubBucketBits;
  static constexpr size_t kNumBuckets =
      kSubBuckets + (kMaxValueBits - kSubBucketBits) * kSubBuckets;

  Histogram();
  Histogram(const Histogram& other);
  Histogram& operator=(const Histogram& other);

  void Record(uint64_t value) { RecordN(value, 1); }
  void RecordN(uint64_t value, uint64_t count);
  // Records every value: the same as Record for each, with the count, sum,
  // min and max updated once (for callers that have many at a time).
  void RecordAll(const uint64_t* values, size_t n);
  // Adds every sample of other to this histogram.
  void Merge(const Histogram& other);
  void Reset();

  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  // 0 when empty.
  uint64_t Min() const;
  uint64_t Max() const { return max_.load(std::memory_order_relaxed); }
  double Mean() const;
  // Population standard deviation, computed from bucket midpoints.
  double Stddev() const;
  // The value below which p percent of the samples fall (p in [0, 100]):
  // the sample of rank ceil(p/100 * count), as the middle of its bucket,
  // clamped to [Min(), Max()]. Percentile(100) is Max(); 0 when empty.
  uint64_t Percentile(double p) const;

  // (value, cumulative fraction) at the upper end of each non-empty bucket.
  std::vector<std::pair<uint64_t, double>> Cdf() const;

  // Bucket arithmetic, exposed for tests.
  static size_t BucketIndex(uint64_t value);
  static uint64_t BucketLow(size_t index);
  // The largest value that maps to the bucket.
  static uint64_t BucketHigh(size_t index);

 private:
  uint64_t BucketCount(size_t i) const { return counts_[i].load(std::memory_order_relaxed); }

  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> min_{UINT64_MAX};
  std::atomic<uint64_t> max_{0};
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_HISTOGRAM_H_
