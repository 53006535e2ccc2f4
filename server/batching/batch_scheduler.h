// The batching stage between the services and the compute (DESIGN.md §8).
//
// Items wait in one FIFO queue per signature. A fixed set of executor threads each take the
// next batch when they are free: under the scheduler lock a thread asks Decide() (the pure
// rule, batch_decision.h) about every signature's queue, takes the run-now batch whose head
// waited longest, and runs it through the executor outside the lock; when nothing may run
// yet it sleeps until the earliest "wait" expires or new work arrives. So while all executors
// are busy, compatible work piles up and is launched together (continuous batching), and
// --max-queue-delay-us can hold an idle executor back to let a batch grow.
//
// Before launch every taken item is checked: a cancelled call or one past its deadline is
// dropped (Drop with CANCELLED / DEADLINE_EXCEEDED) and never computed. Notify() (called from
// a reactor's OnCancel) makes a thread sweep the queues at once, so cancelled calls release
// what they hold without waiting for their batch. The queue is bounded: Enqueue beyond
// max_queued items is refused with RESOURCE_EXHAUSTED giving the numbers.
//
// Inline runs (inline_max_tokens > 0; the sequence-step batcher): an Enqueue that finds every
// queue empty and an executor slot free, with items of one signature and at most
// inline_max_tokens query tokens that the policy would run at once as one batch (Decide: no
// --max-queue-delay-us wait, within the limits, no exclusive key twice), runs them on the
// caller's thread instead of handing them to an executor thread: the same batch an idle
// executor would have taken at once, without the wake-up. It counts as one of the `threads` batches
// running, so work arriving meanwhile queues and is batched as before.
//
// Stop(): new work is refused (UNAVAILABLE); queued work is still run; then the threads are
// joined. Thread-safety: all methods are thread-safe; the executor runs on scheduler threads,
// several batches at once (one per thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attn/common/status.h"
#include "batching/batch_decision.h"
#include "batching/batch_item.h"
#include "batching/batch_policy.h"

namespace attn {

struct BatchSchedulerOptions {
  BatchPolicy policy;
  int threads = 1;          ///< executor threads (>= 1)
  int64_t max_queued = 1024;  ///< items allowed to wait (--max-queue-requests)
  std::string name = "batch";  ///< for logs and error messages, e.g. "Attend"
  /// > 0: small work that finds the scheduler idle runs on the caller's thread (see the file
  /// comment) when it holds at most this many query tokens; 0: never (always a hand-off).
  int64_t inline_max_tokens = 0;
};

/// Runs one batch: every item is live (not cancelled, not expired) and compatible; the
/// executor must end every item's call exactly once. Items are destroyed after it returns.
using BatchExecutor = std::function<void(std::vector<std::unique_ptr<BatchItem>>& batch)>;

class BatchScheduler {
 public:
  /// Starts the executor threads. `now_us`: monotonic clock in µs (null: steady_clock).
  BatchScheduler(const BatchSchedulerOptions& options, BatchExecutor executor,
                 std::function<int64_t()> now_us = nullptr);
  ~BatchScheduler();
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  /// Queues all of `items` (in order) or none. On success `items` is emptied. An all-or-none
  /// group larger than max_queued is admitted only into an empty queue.
  /// Errors: RESOURCE_EXHAUSTED (queue full: waiting, asked, limit), UNAVAILABLE (stopping).
  Status Enqueue(std::vector<std::unique_ptr<BatchItem>>* items);
  /// Queues one item; on error the item is still owned by `item`.
  Status Enqueue(std::unique_ptr<BatchItem>* item);
  /// Wakes a thread to drop cancelled/expired items now (e.g. from OnCancel).
  void Notify();
  /// Refuses new work, runs what is queued, joins the threads and waits for inline runs.
  /// Idempotent.
  void Stop();
  /// Refuses new work (UNAVAILABLE) and drops every queued item with `why` (e.g. UNAVAILABLE
  /// at the drain timeout, so queued calls get a status instead of a closed socket); running
  /// batches are not touched. Returns how many were dropped.
  int64_t RefuseQueued(const Status& why);

  /// Items waiting (not yet taken into a batch); for GetLoad and attn_requests_queued.
  int64_t queued_requests() const { return queued_requests_.load(); }
  /// Query tokens of the waiting items.
  int64_t queued_tokens() const { return queued_tokens_.load(); }
  /// Batches launched and items they held, since start (for tests and logs); inline_runs():
  /// those of them that ran on the caller's thread.
  int64_t batches_run() const { return batches_run_.load(); }
  int64_t inline_runs() const { return inline_runs_.load(); }
  int64_t items_run() const { return items_run_.load(); }
  const BatchSchedulerOptions& options() const { return options_; }

 private:
  using Queue = std::deque<std::unique_ptr<BatchItem>>;
  void Loop();
  // Scheduler lock held: moves dead items out of every queue into *dead.
  void SweepLocked(std::vector<std::pair<std::unique_ptr<BatchItem>, Status>>* dead);
  // Why `item` must not run now (CANCELLED / DEADLINE_EXCEEDED), or Ok.
  static Status Dead(const BatchItem& item);
  void Removed(const BatchItem& item);  // lock held: counters
  // Lock held: whether `items` may run on the caller's thread now (see the file comment).
  bool InlineOkLocked(const std::vector<std::unique_ptr<BatchItem>>& items, int64_t now_us) const;
  // Drops the dead items of `batch`, runs the rest through the executor, counts it.
  void Execute(std::vector<std::unique_ptr<BatchItem>>& batch);

  const BatchSchedulerOptions options_;
  const BatchExecutor executor_;
  const std::function<int64_t()> now_us_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Queue> queues_;  // signature → FIFO; empty queues are erased
  bool stopping_ = false;
  bool sweep_ = false;
  int running_ = 0;  // batches in the executor (executor threads and inline runs)
  int slot_waiters_ = 0;  // executor threads waiting for a slot an inline run holds
  std::atomic<int64_t> queued_requests_{0};
  std::atomic<int64_t> queued_tokens_{0};
  std::atomic<int64_t> batches_run_{0};
  std::atomic<int64_t> items_run_{0};
  std::atomic<int64_t> inline_runs_{0};
  // InlineOkLocked's scratch (under mu_), reused from call to call.
  mutable std::vector<QueuedItem> inline_view_;
  mutable std::vector<size_t> inline_order_;
  std::vector<std::thread> threads_;
};

}  // namespace attn
