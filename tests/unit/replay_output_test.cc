// ReplayOutput (server/kv_cache/replay_output.h): Store charges exactly the held output's bytes
// to its budget through every change of size (a larger one only when the budget has room for
// the difference), a refused Store holds nothing and gives everything back, a Store into
// another budget gives the old charge back to the old one, and a much larger buffer left from an
// earlier output is not kept for a small one.
#include "kv_cache/replay_output.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace attn {
namespace {

TEST(ReplayOutput, StoreChargesTheHeldBytesThroughEverySize) {
  auto budget = std::make_shared<ByteBudget>(1000);
  ReplayOutput r;
  ASSERT_TRUE(r.Store(budget, std::string(64, 'a')));
  EXPECT_EQ(budget->used(), 64);
  ASSERT_TRUE(r.Store(budget, std::string(64, 'b')));  // same size: new bytes, same charge
  EXPECT_EQ(r.bytes(), std::string(64, 'b'));
  EXPECT_EQ(budget->used(), 64);
  ASSERT_TRUE(r.Store(budget, std::string(10, 'c')));
  EXPECT_EQ(budget->used(), 10);
  ASSERT_TRUE(r.Store(budget, std::string(1000, 'd')));  // the held 10 count as free for it
  EXPECT_EQ(budget->used(), 1000);
  EXPECT_EQ(r.bytes(), std::string(1000, 'd'));
  r.Clear();
  EXPECT_EQ(budget->used(), 0);
  EXPECT_TRUE(r.bytes().empty());
}

TEST(ReplayOutput, ARefusedStoreHoldsNothing) {
  auto budget = std::make_shared<ByteBudget>(100);
  auto other = std::make_shared<ByteBudget>(100);
  ReplayOutput r, s;
  ASSERT_TRUE(s.Store(budget, std::string(30, 's')));  // someone else's 30 bytes
  ASSERT_TRUE(r.Store(budget, std::string(60, 'a')));
  EXPECT_EQ(budget->used(), 90);
  EXPECT_FALSE(r.Store(budget, std::string(71, 'b')));  // 30 + 71 > 100
  EXPECT_TRUE(r.bytes().empty());
  EXPECT_EQ(budget->used(), 30);
  ASSERT_TRUE(r.Store(budget, std::string(70, 'c')));
  EXPECT_EQ(budget->used(), 100);
  ASSERT_TRUE(r.Store(other, std::string(5, 'd')));  // another budget: the 70 go back
  EXPECT_EQ(budget->used(), 30);
  EXPECT_EQ(other->used(), 5);
  EXPECT_FALSE(r.Store(nullptr, std::string(5, 'e')));  // no budget: nothing is stored
  EXPECT_EQ(other->used(), 0);
  EXPECT_TRUE(r.bytes().empty());
  ReplayOutput moved(std::move(s));
  EXPECT_EQ(moved.bytes(), std::string(30, 's'));
  EXPECT_EQ(budget->used(), 30);
}

TEST(ReplayOutput, AMuchLargerBufferIsNotKeptForASmallOutput) {
  auto budget = std::make_shared<ByteBudget>(1 << 20);
  ReplayOutput r;
  ASSERT_TRUE(r.Store(budget, std::string(100000, 'p')));  // a prefill's output
  ASSERT_TRUE(r.Store(budget, std::string(100, 'q')));     // then a decode step's
  EXPECT_LT(r.bytes().capacity(), size_t{100000});
  EXPECT_EQ(budget->used(), 100);
  const char *buffer = r.bytes().data();
  ASSERT_TRUE(r.Store(budget, std::string(100, 'r')));  // the same size again: same buffer
  EXPECT_EQ(r.bytes().data(), buffer);
  EXPECT_EQ(r.bytes(), std::string(100, 'r'));
}

}  // namespace
}  // namespace attn
