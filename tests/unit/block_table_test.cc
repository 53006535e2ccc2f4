// Unit tests of a sequence layer's block table (kv_cache/block_table.h): blocks needed for a
// length, the partial last page, truncation returning the pages it drops.
#include "kv_cache/block_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace attn {
namespace {

TEST(BlockTable, BlocksAndTruncate) {
  BlockTable t(4);
  EXPECT_EQ(t.BlocksNeeded(0), 0);
  EXPECT_EQ(t.BlocksNeeded(5), 2);
  const int32_t p[3] = {7, 3, 9};
  t.AddPages(p, 3);
  t.SetLength(10);
  EXPECT_TRUE(t.LastPagePartial());
  EXPECT_EQ(t.LastPageTokens(), 2);
  EXPECT_EQ(t.BlocksNeeded(12), 0);
  EXPECT_EQ(t.BlocksNeeded(13), 1);
  EXPECT_TRUE(t.Truncate(11).empty());
  EXPECT_EQ(t.Truncate(4), std::vector<int32_t>({3, 9}));
  EXPECT_EQ(t.length(), 4);
  EXPECT_FALSE(t.LastPagePartial());
  EXPECT_EQ(t.Truncate(0), std::vector<int32_t>({7}));
}

}  // namespace
}  // namespace attn
