// HdrHistogram: bucket layout, percentile error bound against exact nearest-rank percentiles,
// clamping, merge.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "loadgen/hdr_histogram.h"
#include "loadgen/stats.h"

namespace attn::loadgen {
namespace {

TEST(ClientHdrHistogram, BucketsCoverTheRangeContiguously) {
  const int n = HdrHistogram::BucketCount();
  EXPECT_LT(n, 30000);  // fixed, small memory
  EXPECT_EQ(HdrHistogram::LowestEquivalent(1), 1);
  for (int i = 1; i + 1 < n; ++i) {
    ASSERT_EQ(HdrHistogram::HighestEquivalent(i) + 1, HdrHistogram::LowestEquivalent(i + 1)) << i;
    if (i < 2048) continue;  // exact (width 1) below 2048
    // Relative width at most 1/1024: ~3 significant digits.
    const double lo = static_cast<double>(HdrHistogram::LowestEquivalent(i));
    const double width = static_cast<double>(HdrHistogram::HighestEquivalent(i)) - lo + 1;
    ASSERT_LE(width / lo, 1.0 / 1024 + 1e-12) << i;
  }
  EXPECT_GE(HdrHistogram::HighestEquivalent(n - 1), HdrHistogram::kMaxValue);
  for (int64_t v : {int64_t{1}, int64_t{2047}, int64_t{2048}, int64_t{123456789},
                    HdrHistogram::kMaxValue}) {
    const int i = HdrHistogram::Index(v);
    EXPECT_LE(HdrHistogram::LowestEquivalent(i), v);
    EXPECT_GE(HdrHistogram::HighestEquivalent(i), v);
  }
}

TEST(ClientHdrHistogram, SmallValuesAreExact) {
  HdrHistogram h;
  for (int v = 1; v <= 100; ++v) h.Record(v);
  EXPECT_EQ(h.count(), 100);
  EXPECT_DOUBLE_EQ(h.Percentile(50), 50);
  EXPECT_DOUBLE_EQ(h.Percentile(99), 99);
  EXPECT_DOUBLE_EQ(h.Percentile(100), 100);
  EXPECT_DOUBLE_EQ(h.Percentile(0), 1);
  EXPECT_DOUBLE_EQ(h.mean(), 50.5);
}

TEST(ClientHdrHistogram, PercentilesWithinErrorBoundOfExact) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(std::log(20000.0), 1.5);  // µs: ~20 ms, heavy tail
  HdrHistogram h;
  std::vector<double> exact;
  for (int i = 0; i < 100000; ++i) {
    const int64_t v = std::clamp<int64_t>(std::llround(dist(rng)), 1, HdrHistogram::kMaxValue);
    h.Record(v);
    exact.push_back(static_cast<double>(v));
  }
  std::sort(exact.begin(), exact.end());
  for (double p : {0.0, 1.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0}) {
    const double want = Percentile(exact, p);
    const double got = h.Percentile(p);
    EXPECT_LE(std::abs(got - want), want / 2048.0 + 0.5) << "p" << p;
  }
  EXPECT_EQ(h.min(), static_cast<int64_t>(exact.front()));
  EXPECT_EQ(h.max(), static_cast<int64_t>(exact.back()));
}

TEST(ClientHdrHistogram, ClampsAndMerges) {
  HdrHistogram a, b;
  a.Record(0);
  a.Record(-5);
  b.Record(HdrHistogram::kMaxValue * 10);
  b.Record(5000, 3);
  EXPECT_EQ(a.min(), 1);
  EXPECT_EQ(b.max(), HdrHistogram::kMaxValue);
  a.Merge(b);
  EXPECT_EQ(a.count(), 6);
  EXPECT_EQ(a.min(), 1);
  EXPECT_EQ(a.max(), HdrHistogram::kMaxValue);
  EXPECT_NEAR(a.Percentile(50), 5000, 5000 / 2048.0);
  a.Reset();
  EXPECT_EQ(a.count(), 0);
  EXPECT_EQ(a.Percentile(50), 0);
}

}  // namespace
}  // namespace attn::loadgen
