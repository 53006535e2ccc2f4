#include "batching/batch_decision.h"

#include <algorithm>

namespace attn {

BatchDecision Decide(const QueuedItem* items, size_t n, int64_t now_us,
                     const BatchPolicy& policy) {
  BatchDecision d;
  if (n == 0) return d;
  const int64_t max_requests = std::max<int64_t>(1, policy.max_batch_requests);
  const int64_t max_tokens = std::max<int64_t>(1, policy.max_batch_tokens);
  size_t count = 1;
  int64_t tokens = items[0].tokens;
  bool full = tokens >= max_tokens || max_requests <= 1;
  for (size_t i = 1; i < n && !full; ++i) {
    if (items[i].barrier || tokens + items[i].tokens > max_tokens) {
      full = true;
      break;
    }
    ++count;
    tokens += items[i].tokens;
    if (static_cast<int64_t>(count) >= max_requests || tokens >= max_tokens) full = true;
  }
  d.count = count;
  d.tokens = tokens;
  const int64_t age = now_us - items[0].enqueued_us;
  if (full || age >= policy.max_queue_delay_us) {
    d.kind = BatchDecision::Kind::kRunNow;
    return d;
  }
  d.kind = BatchDecision::Kind::kWait;
  d.wait_us = policy.max_queue_delay_us - age;
  return d;
}

}  // namespace attn
