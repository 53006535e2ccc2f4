// Unit tests of the KV page pool and its sub-pools (kv_cache/page_pool.h, sub_pool.h): O(1)
// free list, exhaustion with the numbers and the chunk size, distinct pages, LIFO reuse,
// reference counts, no leaks, all-or-nothing allocation. No network, no device.
#include "kv_cache/page_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kv_cache/host_pool.h"
#include "kv_test_fixtures.h"

namespace attn {
namespace {

using kernels::DType;

using testing::PoolFixture;

TEST(SubPool, FreeListExhaustionRefcountsNoLeaks) {
  // 64 KiB pool, pages of K=1 x 4 tokens x H=16 fp32 = 256 B; chunks of 8 pages
  // = 17*256 B.
  PoolFixture f(64 << 10);
  SubPool *sub = *f.pool.GetClass({1, 16, DType::kFloat32});
  EXPECT_EQ(sub->page_bytes(), 256);
  const int64_t avail = f.pool.AvailablePages(sub);
  EXPECT_EQ(avail, (64 << 10) / (17 * 256) * 8);
  std::vector<int32_t> all(static_cast<size_t>(avail));
  ASSERT_TRUE(f.pool.Allocate(sub, avail, all.data()).ok());
  int32_t one = -1;
  Status s = f.pool.Allocate(sub, 3, &one);
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("need 3 pages, 0 free"), std::string::npos) << s.message();
  // The message says why free bytes may not help: pages are carved a chunk at a time.
  EXPECT_NE(s.message().find("8 at a time"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--kv-chunk-pages"), std::string::npos) << s.message();
  // Distinct pages.
  std::vector<int32_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
  // LIFO reuse and reference counts.
  f.pool.Retain(sub, &all[5], 1);
  EXPECT_EQ(f.pool.RefCount(sub, all[5]), 2);
  EXPECT_EQ(f.pool.Release(sub, &all[5], 1), 0);
  EXPECT_EQ(f.pool.Release(sub, &all[5], 1), 1);
  EXPECT_EQ(f.pool.RefCount(sub, all[5]), 0);
  ASSERT_TRUE(f.pool.Allocate(sub, 1, &one).ok());
  EXPECT_EQ(one, all[5]);
  all[5] = one;
  EXPECT_EQ(f.pool.Release(sub, all.data(), avail), avail);
  EXPECT_EQ(sub->pages_used(), 0);
  EXPECT_EQ(sub->pages_total(), 0);  // empty chunks go back to the pool
  EXPECT_EQ(f.memory->used(), 0u);
  // A failed all-or-nothing allocation takes nothing.
  std::vector<int32_t> big(static_cast<size_t>(avail + 1));
  EXPECT_FALSE(f.pool.Allocate(sub, avail + 1, big.data()).ok());
  EXPECT_EQ(f.memory->used(), 0u);
}

}  // namespace
}  // namespace attn
