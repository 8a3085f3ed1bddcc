#include "bench/loadgen/histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace capstan::bench {

namespace {

void AtomicMin(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void AtomicMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

Histogram::Histogram() : counts_(new std::atomic<uint64_t>[kNumBuckets]) { Reset(); }

Histogram::Histogram(const Histogram& other) : Histogram() { Merge(other); }

Histogram& Histogram::operator=(const Histogram& other) {
  if (this != &other) {
    Reset();
    Merge(other);
  }
  return *this;
}

size_t Histogram::BucketIndex(uint64_t value) {
  if (value < kSubBuckets) return static_cast<size_t>(value);
  const int msb = 63 - std::countl_zero(value);
  if (msb >= kMaxValueBits) return kNumBuckets - 1;
  const int shift = msb - kSubBucketBits;  // bucket width is 2^shift
  // (value >> shift) is in [kSubBuckets, 2 * kSubBuckets).
  return static_cast<size_t>((shift + 1) * kSubBuckets + ((value >> shift) - kSubBuckets));
}

uint64_t Histogram::BucketLow(size_t index) {
  if (index < kSubBuckets) return index;
  const uint64_t shift = index / kSubBuckets - 1;
  const uint64_t sub = index % kSubBuckets + kSubBuckets;
  return sub << shift;
}

uint64_t Histogram::BucketHigh(size_t index) {
  if (index < kSubBuckets) return index;
  const uint64_t shift = index / kSubBuckets - 1;
  return BucketLow(index) + (uint64_t{1} << shift) - 1;
}

void Histogram::RecordN(uint64_t value, uint64_t count) {
  if (count == 0) return;
  counts_[BucketIndex(value)].fetch_add(count, std::memory_order_relaxed);
  count_.fetch_add(count, std::memory_order_relaxed);
  sum_.fetch_add(value * count, std::memory_order_relaxed);
  AtomicMin(min_, value);
  AtomicMax(max_, value);
}

void Histogram::RecordAll(const uint64_t* values, size_t n) {
  if (n == 0) return;
  uint64_t sum = 0, lo = UINT64_MAX, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    counts_[BucketIndex(values[i])].fetch_add(1, std::memory_order_relaxed);
    sum += values[i];
    lo = std::min(lo, values[i]);
    hi = std::max(hi, values[i]);
  }
  count_.fetch_add(n, std::memory_order_relaxed);
  sum_.fetch_add(sum, std::memory_order_relaxed);
  AtomicMin(min_, lo);
  AtomicMax(max_, hi);
}

void Histogram::Merge(const Histogram& other) {
  if (other.Count() == 0) return;
  for (size_t i = 0; i < kNumBuckets; ++i) {
    const uint64_t c = other.BucketCount(i);
    if (c != 0) counts_[i].fetch_add(c, std::memory_order_relaxed);
  }
  count_.fetch_add(other.Count(), std::memory_order_relaxed);
  sum_.fetch_add(other.sum_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  AtomicMin(min_, other.min_.load(std::memory_order_relaxed));
  AtomicMax(max_, other.max_.load(std::memory_order_relaxed));
}

void Histogram::Reset() {
  for (size_t i = 0; i < kNumBuckets; ++i) counts_[i].store(0, std::memory_order_relaxed);
  count_.store(0, std::memory_order_relaxed);
  sum_.store(0, std::memory_order_relaxed);
  min_.store(UINT64_MAX, std::memory_order_relaxed);
  max_.store(0, std::memory_order_relaxed);
}

uint64_t Histogram::Min() const {
  return Count() == 0 ? 0 : min_.load(std::memory_order_relaxed);
}

double Histogram::Mean() const {
  const uint64_t n = Count();
  return n == 0 ? 0.0 : static_cast<double>(sum_.load(std::memory_order_relaxed)) / n;
}

double Histogram::Stddev() const {
  const uint64_t n = Count();
  if (n < 2) return 0.0;
  const double mean = Mean();
  double acc = 0;
  for (size_t i = 0; i < kNumBuckets; ++i) {
    const uint64_t c = BucketCount(i);
    if (c == 0) continue;
    const double mid = (static_cast<double>(BucketLow(i)) + static_cast<double>(BucketHigh(i))) / 2;
    acc += c * (mid - mean) * (mid - mean);
  }
  return std::sqrt(acc / n);
}

uint64_t Histogram::Percentile(double p) const {
  const uint64_t n = Count();
  if (n == 0) return 0;
  if (p >= 100) return Max();
  p = std::max(p, 0.0);
  // ceil(p/100 * n), forgiving the rounding error of p/100 (99.9% of 1000 is 999, not 1000).
  const double exact = p / 100.0 * static_cast<double>(n);
  uint64_t rank = static_cast<uint64_t>(std::ceil(exact - exact * 1e-12));
  rank = std::clamp<uint64_t>(rank, 1, n);
  uint64_t seen = 0;
  for (size_t i = 0; i < kNumBuckets; ++i) {
    seen += BucketCount(i);
    if (seen >= rank) {
      const uint64_t low = BucketLow(i);
      const uint64_t mid = low + (BucketHigh(i) - low) / 2;
      return std::clamp(mid, Min(), Max());
    }
  }
  return Max();
}

std::vector<std::pair<uint64_t, double>> Histogram::Cdf() const {
  std::vector<std::pair<uint64_t, double>> out;
  const uint64_t n = Count();
  if (n == 0) return out;
  uint64_t seen = 0;
  for (size_t i = 0; i < kNumBuckets; ++i) {
    const uint64_t c = BucketCount(i);
    if (c == 0) continue;
    seen += c;
    out.emplace_back(std::min(BucketHigh(i), Max()), static_cast<double>(seen) / n);
  }
  return out;
}

}  // namespace capstan::bench
