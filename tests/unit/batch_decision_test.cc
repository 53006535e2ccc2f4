// Decide() (server/batching/batch_decision.h): every rule, with an injected clock (the time is
// an argument; nothing sleeps).
#include "batching/batch_decision.h"

#include <gtest/gtest.h>

#include <vector>

namespace attn {
namespace {

using Kind = BatchDecision::Kind;

BatchPolicy Policy(int64_t tokens, int64_t requests, int64_t delay_us) {
  BatchPolicy p;
  p.max_batch_tokens = tokens;
  p.max_batch_requests = requests;
  p.max_queue_delay_us = delay_us;
  return p;
}

BatchDecision D(const std::vector<QueuedItem>& q, int64_t now, const BatchPolicy& p) {
  return Decide(q.data(), q.size(), now, p);
}

TEST(BatchDecision, EmptyQueueIsIdle) {
  EXPECT_EQ(D({}, 100, Policy(100, 8, 50)).kind, Kind::kIdle);
}

TEST(BatchDecision, WaitsForTheRestOfTheDelayThenRuns) {
  const std::vector<QueuedItem> q = {{1, 1000}, {1, 1010}};
  const BatchPolicy p = Policy(100, 8, 500);
  BatchDecision d = D(q, 1200, p);
  EXPECT_EQ(d.kind, Kind::kWait);
  EXPECT_EQ(d.wait_us, 300);  // the head was queued at 1000; delay ends at 1500
  d = D(q, 1499, p);
  EXPECT_EQ(d.kind, Kind::kWait);
  EXPECT_EQ(d.wait_us, 1);
  d = D(q, 1500, p);
  EXPECT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 2u);
  EXPECT_EQ(d.tokens, 2);
}

TEST(BatchDecision, ZeroDelayStillTakesEverythingWaiting) {
  std::vector<QueuedItem> q;
  for (int i = 0; i < 5; ++i) q.push_back({3, 10 + i});
  const BatchDecision d = D(q, 10, Policy(100, 8, 0));
  EXPECT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 5u);
  EXPECT_EQ(d.tokens, 15);
}

TEST(BatchDecision, RequestLimitRunsAtOnceWithoutWaiting) {
  std::vector<QueuedItem> q;
  for (int i = 0; i < 10; ++i) q.push_back({1, 0});
  const BatchDecision d = D(q, 0, Policy(1000, 4, 1000000));
  EXPECT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 4u);
  // Exactly max_batch_requests waiting: full, runs now.
  const BatchDecision e = D({{1, 0}, {1, 0}, {1, 0}, {1, 0}}, 0, Policy(1000, 4, 1000000));
  EXPECT_EQ(e.kind, Kind::kRunNow);
  EXPECT_EQ(e.count, 4u);
}

TEST(BatchDecision, TokenBudgetStopsThePrefixAndRunsIt) {
  // 40 + 50 fit in 100; the third (20) would make 110: the batch is full, runs now.
  const std::vector<QueuedItem> q = {{40, 0}, {50, 1}, {20, 2}, {1, 3}};
  const BatchDecision d = D(q, 5, Policy(100, 64, 1000000));
  EXPECT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 2u);
  EXPECT_EQ(d.tokens, 90);
}

TEST(BatchDecision, FifoPrefixNeverSkipsAnItemThatDoesNotFit) {
  // The 95-token item does not fit after 10; the small one behind it must not jump ahead.
  const std::vector<QueuedItem> q = {{10, 0}, {95, 1}, {1, 2}};
  const BatchDecision d = D(q, 0, Policy(100, 64, 0));
  EXPECT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 1u);
  EXPECT_EQ(d.tokens, 10);
}

TEST(BatchDecision, OversizeItemRunsAloneAtOnce) {
  const std::vector<QueuedItem> q = {{5000, 0}, {1, 1}, {1, 2}};
  const BatchDecision d = D(q, 0, Policy(1000, 64, 1000000));
  EXPECT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 1u);
  EXPECT_EQ(d.tokens, 5000);
  // Alone in the queue it also runs at once (it can never grow).
  EXPECT_EQ(D({{5000, 0}}, 0, Policy(1000, 64, 1000000)).kind, Kind::kRunNow);
}

TEST(BatchDecision, DecodesBehindALongPrefillRunTogetherNext) {
  // A prefill larger than the budget runs alone; the decodes behind it form the next batch.
  std::vector<QueuedItem> q = {{4096, 0}};
  for (int i = 0; i < 8; ++i) q.push_back({1, 1 + i});
  const BatchPolicy p = Policy(2048, 64, 0);
  BatchDecision d = D(q, 10, p);
  ASSERT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 1u);
  q.erase(q.begin());
  d = D(q, 10, p);
  ASSERT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 8u);
}

TEST(BatchDecision, BarrierEndsTheBatch) {
  const std::vector<QueuedItem> q = {{1, 0}, {1, 0}, {1, 0, true}, {1, 0}};
  const BatchDecision d = D(q, 0, Policy(100, 64, 1000000));
  EXPECT_EQ(d.kind, Kind::kRunNow);  // cannot grow past the barrier: no point waiting
  EXPECT_EQ(d.count, 2u);
}

TEST(BatchDecision, MaxBatchRequestsOneDisablesBatching) {
  const std::vector<QueuedItem> q = {{1, 0}, {1, 0}, {1, 0}};
  const BatchDecision d = D(q, 0, Policy(100, 1, 1000000));
  EXPECT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 1u);
}

TEST(BatchDecision, ExactTokenBudgetIsFull) {
  const BatchDecision d = D({{60, 0}, {40, 0}, {1, 0}}, 0, Policy(100, 64, 1000000));
  EXPECT_EQ(d.kind, Kind::kRunNow);
  EXPECT_EQ(d.count, 2u);
  EXPECT_EQ(d.tokens, 100);
}

}  // namespace
}  // namespace attn
