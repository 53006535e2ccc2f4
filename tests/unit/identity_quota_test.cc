// Unit tests of per-identity accounting on its own (kv_cache/identity_quota.h): limits refuse
// with the numbers and change nothing, identities have separate budgets, no limit is unlimited.
// Its use inside the SequenceStore is in sequence_store_quota_test.cc.
#include "kv_cache/identity_quota.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace attn::security {
namespace {

TEST(IdentityQuota, LimitsRefuseWithTheNumbersAndChangeNothing) {
  IdentityQuota q({2, 10});
  ASSERT_TRUE(q.AddSequence("a").ok());
  ASSERT_TRUE(q.AddSequence("a").ok());
  const Status s = q.AddSequence("a");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("has 2 live sequences"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("is 2"), std::string::npos) << s.message();
  EXPECT_EQ(q.Usage("a").sequences, 2);
  ASSERT_TRUE(q.ReservePages("a", 7).ok());
  const Status p = q.ReservePages("a", 4);
  EXPECT_EQ(p.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.message().find("holds 7 KV pages"), std::string::npos) << p.message();
  EXPECT_NE(p.message().find("is 10; requested 4"), std::string::npos) << p.message();
  EXPECT_EQ(q.Usage("a").pages, 7);
  // Another identity has its own budget.
  EXPECT_TRUE(q.AddSequence("b").ok());
  EXPECT_TRUE(q.ReservePages("b", 10).ok());
  q.ReturnPages("a", 7);
  q.RemoveSequence("a");
  q.RemoveSequence("a");
  EXPECT_EQ(q.Usage("a").sequences, 0);
  EXPECT_EQ(q.Usage("a").pages, 0);
  EXPECT_EQ(q.identities(), 1u);  // only b remains
  IdentityQuota unlimited;
  EXPECT_TRUE(unlimited.ReservePages("x", int64_t{1} << 40).ok());
}

}  // namespace
}  // namespace attn::security
