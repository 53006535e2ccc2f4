#include "common/range_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace attn {
namespace {

TEST(RangeAllocator, AlignsAndCoalesces) {
  RangeAllocator a(4096, 256);
  auto x = a.Allocate(100);
  auto y = a.Allocate(300);
  auto z = a.Allocate(256);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 256u);
  EXPECT_EQ(*z, 768u);
  EXPECT_EQ(a.used(), 1024u);
  EXPECT_TRUE(a.Free(*y));
  EXPECT_FALSE(a.Free(*y));  // double free is refused
  EXPECT_TRUE(a.Free(*x));
  EXPECT_TRUE(a.Free(*z));
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free(), 4096u);
}

TEST(RangeAllocator, ExhaustionIsAStatusWithNumbers) {
  RangeAllocator a(1024, 256);
  ASSERT_TRUE(a.Allocate(768).ok());
  auto r = a.Allocate(512);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("512 bytes requested, 256 bytes free"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(a.Allocate(1 << 20).ok());
}

TEST(RangeAllocator, RandomisedNoOverlapAndFullRecovery) {
  RangeAllocator a(1 << 20, 256);
  std::mt19937 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 2) {
      const uint64_t bytes = 1 + rng() % 20000;
      auto off = a.Allocate(bytes);
      if (!off.ok()) continue;
      for (auto& [o, b] : live) {
        EXPECT_TRUE(*off + bytes <= o || o + b <= *off) << "overlap";
      }
      live.emplace_back(*off, bytes);
    } else {
      const size_t i = rng() % live.size();
      EXPECT_TRUE(a.Free(live[i].first));
      live.erase(live.begin() + i);
    }
  }
  for (auto& [o, b] : live) EXPECT_TRUE(a.Free(o));
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.free_ranges(), 1u);
}

}  // namespace
}  // namespace attn
