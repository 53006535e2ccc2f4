// Unit tests of sequence ids (kv_cache/sequence_id.h, DESIGN.md §12): an id starts with its
// replica's tag and is otherwise random; malformed ids have no tag; replica tags differ.
#include "kv_cache/sequence_id.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace attn {
namespace {

TEST(SequenceId, StartsWithTheReplicaTagAndIsOtherwiseRandom) {
  std::random_device rd;
  const uint32_t tag = 0x0a1b2c3du;
  EXPECT_EQ(ReplicaTagHex(tag), "0a1b2c3d");
  std::set<std::string> tails;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewSequenceId(tag, rd);
    ASSERT_TRUE(IsSequenceId(id)) << id;
    EXPECT_EQ(id.substr(0, 8), "0a1b2c3d");
    EXPECT_EQ(ReplicaTagOfId(id), "0a1b2c3d");
    tails.insert(id.substr(8));
  }
  EXPECT_EQ(tails.size(), 1000u) << "96 random bits should never repeat in 1000 draws";
}

TEST(SequenceId, MalformedIdsHaveNoTag) {
  for (const std::string &bad : std::vector<std::string>{
           "", "0a1b2c3d", std::string(32, 'g'), std::string(33, 'a'), std::string(32, 'A')}) {
    EXPECT_FALSE(IsSequenceId(bad)) << bad;
    EXPECT_EQ(ReplicaTagOfId(bad), "") << bad;
  }
}

TEST(SequenceId, ReplicaTagsDifferBetweenDraws) {
  std::set<uint32_t> tags;
  for (int i = 0; i < 64; ++i) tags.insert(NewReplicaTag());
  EXPECT_GT(tags.size(), 60u);
}

}  // namespace
}  // namespace attn
