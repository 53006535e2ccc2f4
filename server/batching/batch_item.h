// One unit of work waiting in a BatchScheduler: a stateless Attend call, or one sequence step
// (an Extend call, one ExtendBatch entry, one ExtendStream message).
//
// The owner (the service) fills the public fields before enqueueing; the scheduler sets
// enqueued_us/dequeued_us. Items are owned by the scheduler while queued and handed to the
// executor (or to Drop) exactly once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "attn/common/status.h"

namespace attn {

class BatchItem {
 public:
  virtual ~BatchItem() = default;

  /// True when the caller no longer wants the result (cancelled, or the call ended).
  /// Called from scheduler threads; must be thread-safe and cheap.
  virtual bool Cancelled() const = 0;
  /// Absolute deadline of the call (time_point::max() when none).
  virtual std::chrono::system_clock::time_point deadline() const = 0;
  /// Ends the item without computing it, with `status` (CANCELLED, DEADLINE_EXCEEDED or
  /// UNAVAILABLE). Called at most once, outside scheduler locks; the item is destroyed after.
  virtual void Drop(const Status& status) = 0;

  /// Items with equal signatures may share a launch (same head configuration, dtype, mask,
  /// scale, backend, ...). Compared as bytes.
  std::string signature;
  /// Query tokens the item adds to a launch.
  int64_t tokens = 0;
  /// Non-empty: no two items with this key share a launch (e.g. a sequence id).
  std::string exclusive_key;
  /// The key the scheduler compares: `exclusive_key` unless a subclass names bytes it owns
  /// (alive and unchanged while the item is queued), saving the copy.
  virtual std::string_view ExclusiveKey() const { return exclusive_key; }
  /// Scheduler clock (µs) when queued and when taken into a batch.
  int64_t enqueued_us = 0;
  int64_t dequeued_us = 0;
};

}  // namespace attn
