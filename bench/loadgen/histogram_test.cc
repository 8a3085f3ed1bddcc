#include "bench/loadgen/histogram.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace capstan::bench {
namespace {

// The exact sample of rank ceil(p/100 * n) in a sorted vector.
uint64_t ExactPercentile(std::vector<uint64_t> v, double p) {
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

TEST(HistogramTest, EmptyReportsZeros) {
  Histogram h;
  EXPECT_EQ(h.Count(), 0u);
  EXPECT_EQ(h.Min(), 0u);
  EXPECT_EQ(h.Max(), 0u);
  EXPECT_EQ(h.Percentile(50), 0u);
  EXPECT_EQ(h.Percentile(100), 0u);
  EXPECT_EQ(h.Mean(), 0.0);
  EXPECT_TRUE(h.Cdf().empty());
}

TEST(HistogramTest, SmallValuesAreExact) {
  Histogram h;
  for (uint64_t v = 0; v < Histogram::kSubBuckets; ++v) h.Record(v);
  EXPECT_EQ(h.Percentile(50), 63u);
  EXPECT_EQ(h.Min(), 0u);
  EXPECT_EQ(h.Max(), 127u);
  EXPECT_EQ(h.Percentile(100), 127u);
}

TEST(HistogramTest, BucketsTileTheRangeWithoutGaps) {
  for (size_t i = 0; i + 1 < Histogram::kNumBuckets; ++i) {
    ASSERT_EQ(Histogram::BucketHigh(i) + 1, Histogram::BucketLow(i + 1)) << i;
    ASSERT_EQ(Histogram::BucketIndex(Histogram::BucketLow(i)), i);
    ASSERT_EQ(Histogram::BucketIndex(Histogram::BucketHigh(i)), i);
  }
}

TEST(HistogramTest, BucketWidthIsUnderOnePercent) {
  for (size_t i = Histogram::kSubBuckets; i + 1 < Histogram::kNumBuckets; ++i) {
    const double low = static_cast<double>(Histogram::BucketLow(i));
    const double width = static_cast<double>(Histogram::BucketHigh(i)) - low + 1;
    ASSERT_LE(width / low, 1.0 / 128 + 1e-12) << i;
  }
}

TEST(HistogramTest, HugeValuesLandInTheLastBucketAndMaxStaysExact) {
  Histogram h;
  h.Record(UINT64_MAX / 2);
  EXPECT_EQ(Histogram::BucketIndex(UINT64_MAX), Histogram::kNumBuckets - 1);
  EXPECT_EQ(h.Max(), UINT64_MAX / 2);
  EXPECT_EQ(h.Percentile(50), UINT64_MAX / 2);  // clamped to [min, max]
}

TEST(HistogramTest, PercentilesWithinOnePercentOfExactOnSkewedData) {
  std::mt19937_64 rng(42);
  // Lognormal latencies around 2 ms with a long tail, in ns.
  std::lognormal_distribution<double> dist(std::log(2e6), 1.0);
  std::vector<uint64_t> samples;
  Histogram h;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t v = static_cast<uint64_t>(dist(rng));
    samples.push_back(v);
    h.Record(v);
  }
  for (double p : {1.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99}) {
    const double exact = static_cast<double>(ExactPercentile(samples, p));
    const double got = static_cast<double>(h.Percentile(p));
    EXPECT_NEAR(got / exact, 1.0, 0.01) << "p" << p;
  }
  EXPECT_EQ(h.Max(), *std::max_element(samples.begin(), samples.end()));
  EXPECT_EQ(h.Min(), *std::min_element(samples.begin(), samples.end()));
  double sum = 0;
  for (uint64_t v : samples) sum += static_cast<double>(v);
  EXPECT_NEAR(h.Mean(), sum / samples.size(), 1.0);
}

TEST(HistogramTest, StddevMatchesWithinOnePercent) {
  Histogram h;
  std::vector<double> vals;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> dist(1000000, 9000000);
  for (int i = 0; i < 50000; ++i) {
    const uint64_t v = dist(rng);
    vals.push_back(static_cast<double>(v));
    h.Record(v);
  }
  double mean = 0;
  for (double v : vals) mean += v;
  mean /= vals.size();
  double var = 0;
  for (double v : vals) var += (v - mean) * (v - mean);
  const double sd = std::sqrt(var / vals.size());
  EXPECT_NEAR(h.Stddev() / sd, 1.0, 0.01);
}

TEST(HistogramTest, OutlierDoesNotMoveTheMedianButIsTheMax) {
  Histogram h;
  for (int i = 0; i < 999; ++i) h.Record(1000000);  // 1 ms
  h.Record(5000000000);                           // 5 s
  EXPECT_NEAR(static_cast<double>(h.Percentile(50)), 1e6, 1e6 * 0.005);
  EXPECT_NEAR(static_cast<double>(h.Percentile(99.9)), 1e6, 1e6 * 0.005);
  EXPECT_EQ(h.Percentile(100), 5000000000u);
  EXPECT_EQ(h.Max(), 5000000000u);
}

TEST(HistogramTest, MergeEqualsRecordingEverythingInOne) {
  Histogram a, b, all;
  std::mt19937_64 rng(1);
  std::exponential_distribution<double> dist(1.0 / 3e6);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t v = static_cast<uint64_t>(dist(rng));
    (i % 3 == 0 ? a : b).Record(v);
    all.Record(v);
  }
  Histogram merged = a;
  merged.Merge(b);
  EXPECT_EQ(merged.Count(), all.Count());
  EXPECT_EQ(merged.Min(), all.Min());
  EXPECT_EQ(merged.Max(), all.Max());
  for (double p : {50.0, 90.0, 99.0, 99.9}) EXPECT_EQ(merged.Percentile(p), all.Percentile(p));
}

TEST(HistogramTest, ConcurrentRecordsAreAllCounted) {
  Histogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (uint64_t i = 0; i < 100000; ++i) h.Record(i * (t + 1));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(h.Count(), 400000u);
  EXPECT_EQ(h.Min(), 0u);
  EXPECT_EQ(h.Max(), 99999u * 4);
}

TEST(HistogramTest, CdfIsMonotoneAndEndsAtOne) {
  Histogram h;
  for (uint64_t v = 1; v <= 100000; v += 7) h.Record(v * 1000);
  auto cdf = h.Cdf();
  ASSERT_FALSE(cdf.empty());
  for (size_t i = 1; i < cdf.size(); ++i) {
    EXPECT_GT(cdf[i].first, cdf[i - 1].first);
    EXPECT_GT(cdf[i].second, cdf[i - 1].second);
  }
  EXPECT_DOUBLE_EQ(cdf.back().second, 1.0);
  EXPECT_EQ(cdf.back().first, h.Max());
}

}  // namespace
}  // namespace capstan::bench
