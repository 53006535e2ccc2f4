#include <gtest/gtest.h>

#include <sstream>

#include "loadgen/session_workload.h"

namespace attn::loadgen {
namespace {

TEST(ClientSession, PlanScalesContextAndGeneratedTokens) {
  TokenScaling s;
  s.scale = 0.5;
  const SessionPlan p = PlanSession(TraceRecord{0, 375, 40}, s, 0.25, 64);
  EXPECT_EQ(p.context_tokens, 188);  // 187.5 rounds away from zero
  EXPECT_EQ(p.generated_tokens, 10);
  EXPECT_EQ(p.reserve_tokens(), 198);
  EXPECT_EQ(ScaleGenerated(500, 1.0, 16), 16);  // clamped by --max-gen
  EXPECT_EQ(ScaleGenerated(3, 0.1, 16), 0);
  EXPECT_EQ(ScaleGenerated(5, 0.1, 16), 1);  // 0.5 -> 1
}

TEST(ClientSession, DecodePositionsFollowTheLength) {
  const SessionPlan p{12, 3};
  EXPECT_EQ(DecodePosition(p, 0), 12);
  EXPECT_EQ(DecodePosition(p, 2), 14);
}

TEST(ClientSession, SharedBlocksAndForkLength) {
  EXPECT_EQ(SharedBlocks({0, 1, 2, 3}, {0, 1, 9}), 2);
  EXPECT_EQ(SharedBlocks({5}, {0, 1}), 0);
  EXPECT_EQ(ForkLength(2, 1.0, 5000, 5000), 1024);
  EXPECT_EQ(ForkLength(2, 0.01, 100, 100), 10);    // 2 × 512 × 0.01 = 10.24
  EXPECT_EQ(ForkLength(3, 1.0, 700, 5000), 700);   // capped to the parent's context
  EXPECT_EQ(ForkLength(3, 1.0, 5000, 1000), 999);  // the child extends at least one token
  EXPECT_EQ(ForkLength(0, 1.0, 100, 100), 0);
}

TEST(ClientSession, PrefixCacheMatchesLongestPrefixAndEvictsLru) {
  PrefixCache cache(2);
  EXPECT_FALSE(cache.Acquire({0, 1}).has_value());
  EXPECT_TRUE(cache.Insert({0, 1, 2}, "a", 30).empty());
  EXPECT_TRUE(cache.Insert({0, 7}, "b", 20).empty());
  auto m = cache.Acquire({0, 1, 5});
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->sequence_id, "a");
  EXPECT_EQ(m->shared_blocks, 2);
  EXPECT_EQ(m->context_tokens, 30);
  // "a" is pinned and most recently used: inserting "c" evicts "b".
  EXPECT_EQ(cache.Insert({9}, "c", 5), std::vector<std::string>{"b"});
  cache.Release("a");
  EXPECT_FALSE(cache.Acquire({4}).has_value());
  // Same key replaces the old entry; then "a" (LRU) goes.
  const auto out = cache.Insert({9}, "d", 5);
  EXPECT_EQ(out, std::vector<std::string>{"c"});
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Drain().size(), 2u);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(ClientSession, MooncakeTokenKeysAreSharedOnlyWithinSharedBlocks) {
  MooncakeRequest a{0, 1000, 1, {0, 1, 2}};
  MooncakeRequest b{0, 1000, 1, {0, 1, 9}};
  const double scale = 0.1;  // 51.2 tokens per block
  for (int64_t p : {0, 50, 51, 102}) {
    EXPECT_EQ(MooncakeTokenKey(1, a, scale, 150, 0, p), MooncakeTokenKey(1, b, scale, 150, 1, p));
  }
  EXPECT_NE(MooncakeTokenKey(1, a, scale, 150, 0, 103), MooncakeTokenKey(1, b, scale, 150, 1, 103));
  // Past the context (generated tokens) keys are per request.
  EXPECT_NE(MooncakeTokenKey(1, a, scale, 10, 0, 10), MooncakeTokenKey(1, b, scale, 10, 1, 10));
  EXPECT_NE(SessionTokenKey(1, 0, 5), SessionTokenKey(1, 1, 5));
}

TEST(ClientSession, ParsesMooncakeHashIds) {
  std::istringstream in(
      "{\"timestamp\": 27, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1]}\n"
      "\n{\"timestamp\": 30, \"input_length\": 10}\n");
  std::vector<MooncakeRequest> out;
  std::string error;
  ASSERT_TRUE(ParseMooncakeRequests(in, &out, &error)) << error;
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].hash_ids, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(out[0].output_length, 500);
  EXPECT_DOUBLE_EQ(out[0].time_s, 0.027);
  EXPECT_TRUE(out[1].hash_ids.empty());
  std::istringstream bad("{\"input_length\": 3, \"hash_ids\": [\"x\"]}\n");
  EXPECT_FALSE(ParseMooncakeRequests(bad, &out, &error));
  EXPECT_NE(error.find("line 1"), std::string::npos);
}

}  // namespace
}  // namespace attn::loadgen
