// Continuous batching of sequence steps across RPCs (DESIGN.md §8): Extend calls,
// ExtendBatch entries and ExtendStream messages wait in one BatchScheduler and run together
// through RunExtendSteps (backends/paged/extend_batch.h): one append and one paged attention launch
// per compatible group.
//
// Signature: the step's q dtype, N, K, H (from its tensors; the sequence's kv dtype and
// scale split a batch further at launch). Tokens: the step's T, so a long prefill fills the
// token budget and runs alone instead of delaying decodes behind it in one launch. Exclusive
// key: the sequence id, so a batch never holds two steps of one sequence (they run in FIFO
// order in later batches). Deadlines and cancellation are checked before launch, and again
// once a step holds its sequence's lock (BatchedExtend::still_wanted): with several batch
// threads a step may wait there behind another batch's step on the same sequence, and one
// cancelled or past its deadline meanwhile is dropped (not applied; `done(status, false)`).
// Each step's result (StepResult) carries the launch's batch size and tokens, the step's
// queue time and the batch's times; the service builds the ExtendResponse from it in the
// step's completion callback. Completion callbacks (which build the response and hand it to
// gRPC, which serialises it and may write the socket on the calling thread) run on a small
// pool of responder threads, in chunks, so the batch thread goes back to the next batch at
// once (a batch of at most 4 steps is answered by the batch thread itself: one chunk, no
// hand-off); a full responder queue makes the batch thread answer itself. This class knows
// neither gRPC nor the protos. Thread-safety: all methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attn/common/status.h"
#include "batching/batch_scheduler.h"
#include "backends/paged/extend_batch.h"
#include "backends/paged/extend_step.h"
#include "backends/paged/paged_attention_backend.h"
#include "common/worker_pool.h"
#include "kv_cache/sequence_store.h"

namespace attn {

/// What a step got. On error only `status` and `ran` are meaningful.
struct StepResult {
  Status status;
  /// False when the step was dropped before it was applied (cancelled, deadline passed,
  /// shutting down, or dropped once its sequence was locked); true when it ran or failed on
  /// its own.
  bool ran = false;
  /// OK: the (T, N, H) output bytes, in outcome.dtype.
  std::string o;
  /// OK: the layer's length, replay flag, keys attended, the step's device times.
  ExtendOutcome outcome;
  int64_t q_tokens = 0;       ///< T of the step
  int64_t launch_size = 0;    ///< steps in the attention launch it ran in
  int64_t launch_tokens = 0;  ///< query tokens of that launch
  /// µs: received → queued (validation), queued → taken into a batch, the batch's wall time in
  /// the batcher and its kernels' time (all launches of the batch).
  int64_t decode_us = 0;
  int64_t queue_us = 0;
  int64_t batch_us = 0;
  int64_t batch_kernel_us = 0;
};

/// One step to run and where its result goes.
struct StepRequest {
  /// True once the caller no longer wants the result; called from batch threads (thread-safe,
  /// cheap). May be empty (never cancelled).
  std::function<bool()> cancelled;
  /// Absolute deadline of the call (time_point::max(): none).
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  std::string owner;  ///< caller identity
  ExtendArgs args;    ///< validated (ValidateExtend); pointers alias the request's bytes
  /// Called exactly once when the step ends, with its result (on a batch or responder thread).
  std::function<void(StepResult&& result)> done;
  /// When the call was received (for decode_us; the service's total_us).
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
};

class StepBatcher {
 public:
  /// `store` and `backend` are not owned and must outlive the batcher. `now_us`: the
  /// scheduler's monotonic clock in µs (null: steady_clock; tests inject one).
  StepBatcher(SequenceStore* store, PagedAttentionBackend* backend,
              const BatchSchedulerOptions& options, std::function<int64_t()> now_us = nullptr);
  ~StepBatcher() { Stop(); }

  /// Queues all `steps` (in order) or none; on success each `done` will be called once.
  /// Errors (nothing queued, no `done` called): RESOURCE_EXHAUSTED (queue full, with the
  /// numbers), UNAVAILABLE (stopping).
  Status Enqueue(std::vector<StepRequest>* steps);
  /// `observer(steps, tokens)` is called on the batch thread after each batch ran: its steps
  /// and their query tokens (empty: none). Set before the first Enqueue.
  void SetBatchObserver(std::function<void(int64_t steps, int64_t tokens)> observer) {
    on_batch_ = std::move(observer);
  }
  /// `on_fault()` is called on the batch thread when a batch's launch failed with INTERNAL (a
  /// device fault: the lane latches it and every later launch fails the same way), as the
  /// Attend path does (batching/attend_batcher.h); the server turns health NOT_SERVING. Those
  /// steps still get their INTERNAL status. Set before the first Enqueue.
  void SetFaultHandler(std::function<void()> on_fault) { on_fault_ = std::move(on_fault); }
  /// Wakes the scheduler to drop cancelled steps now (from OnCancel).
  void Notify() { scheduler_->Notify(); }
  /// Runs what is queued, sends every response, then stops the threads and logs (info) where
  /// the batches' host time went: mean per batch of wall, kernels, copies, the phases of
  /// RunExtendSteps and the responders' time, over all batches and over decode-only batches
  /// (every step T = 1: the steady state of generation, without prefills).
  void Stop();
  int64_t queued_requests() const { return scheduler_->queued_requests(); }
  int64_t queued_tokens() const { return scheduler_->queued_tokens(); }
  BatchScheduler* scheduler() { return scheduler_.get(); }

 private:
  class StepItem;
  struct Finished;
  /// Totals over batches (for the summary Stop logs).
  struct Totals {
    int64_t batches = 0, steps = 0, wall_ns = 0, respond_ns = 0;
    LaunchTimes launch;
    StepPhases phases;
    // Batches whose launches all measured device times, and those times (--kv-timing-every).
    int64_t timed_batches = 0, timed_kernel_ns = 0, timed_copy_ns = 0;
  };
  void Run(std::vector<std::unique_ptr<BatchItem>>& batch);
  /// Calls the completion callbacks of items [begin, end) of a finished batch.
  void Respond(Finished& f, size_t begin, size_t end);
  void LogTotals(const char* what, const Totals& t);

  SequenceStore* const store_;
  PagedAttentionBackend* const backend_;
  std::mutex stats_mu_;
  Totals all_, decode_;  // decode_: batches whose steps all have T = 1
  bool summary_logged_ = false;
  std::function<void(int64_t, int64_t)> on_batch_;
  std::function<void()> on_fault_;
  WorkerPool responders_;                      // stops after the scheduler (declared before it)
  std::unique_ptr<BatchScheduler> scheduler_;  // last: its threads stop first
};

}  // namespace attn
