// The batching decision (DESIGN.md §8) as a pure function of the queue, the time and the
// policy: run the first `count` items now, or wait `wait_us` for more to join them.
//
// Rules, for one FIFO queue of compatible items (oldest first):
//  - The batch is a FIFO prefix: items are never skipped or reordered.
//  - The head always joins (an item larger than max_batch_tokens runs alone).
//  - The next item joins while the batch has fewer than max_batch_requests items and the
//    sum of tokens stays <= max_batch_tokens; an item marked `barrier` (it may not share a
//    launch with an earlier item, e.g. a second step of the same sequence) never joins.
//  - When the prefix cannot grow (a limit or a barrier stops it), it runs now.
//  - Otherwise it runs once the head has waited max_queue_delay_us (at once when 0), else the
//    answer is "wait" for the rest of that delay.
// Pure and thread-safe; unit-tested with an injected clock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "batching/batch_policy.h"

namespace attn {

/// One waiting item as the decision sees it.
struct QueuedItem {
  int64_t tokens = 0;       ///< query tokens it adds to a launch (>= 0)
  int64_t enqueued_us = 0;  ///< when it was queued, on the same clock as `now_us`
  bool barrier = false;     ///< may not join a batch with any earlier item of the queue
};

struct BatchDecision {
  enum class Kind { kIdle, kRunNow, kWait };
  Kind kind = Kind::kIdle;
  size_t count = 0;     ///< kRunNow: items to take from the front (>= 1)
  int64_t wait_us = 0;  ///< kWait: microseconds until the head's delay expires (> 0)
  /// Query tokens of the first `count` items (kRunNow), or of the items considered (kWait).
  int64_t tokens = 0;
};

/// Decides for the queue `items[0..n)` (oldest first) at `now_us`. kIdle when n == 0.
BatchDecision Decide(const QueuedItem* items, size_t n, int64_t now_us, const BatchPolicy& policy);

}  // namespace attn
