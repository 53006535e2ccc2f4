#include <gtest/gtest.h>

#include "loadgen/stats.h"

namespace attn::loadgen {
namespace {

TEST(ClientStats, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 90), 90);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 100), 100);
  EXPECT_EQ(Percentile(v, 0), 1);
  EXPECT_EQ(Percentile(v, 99.5), 100);

  const std::vector<double> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(Percentile(ten, 50), 5);
  EXPECT_EQ(Percentile(ten, 90), 9);
  EXPECT_EQ(Percentile(ten, 91), 10);
  EXPECT_EQ(Percentile(ten, 99), 10);

  EXPECT_EQ(Percentile({7}, 50), 7);
  EXPECT_EQ(Percentile({}, 50), 0);
}

TEST(ClientStats, SummarizeSortsAndAverages) {
  const Summary s = Summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_EQ(s.p50, 3);
  EXPECT_EQ(s.p90, 5);
  EXPECT_EQ(s.p99, 5);
  EXPECT_EQ(s.max, 5);
  EXPECT_EQ(Summarize({}).count, 0);
}

}  // namespace
}  // namespace attn::loadgen
