// The knobs of dynamic batching (DESIGN.md §8), from --max-batch-tokens, --max-batch-requests
// and --max-queue-delay-us.
#pragma once

#include <cstdint>

namespace attn {

struct BatchPolicy {
  /// Query tokens one launch may hold. A single item with more tokens runs alone.
  int64_t max_batch_tokens = 16384;
  /// Items (requests, or sequence steps) one launch may hold; 1 disables batching.
  int64_t max_batch_requests = 64;
  /// How long the oldest waiting item may wait for more work to join it, microseconds.
  /// 0: never wait, but still take everything compatible that is already waiting.
  int64_t max_queue_delay_us = 0;
};

}  // namespace attn
