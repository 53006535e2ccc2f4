// The executor of stateless Attend calls (DESIGN.md §8), the twin of StepBatcher: the service
// enqueues validated work (AttendWork: the problem, its backend, cancellation, deadline and a
// completion callback) and builds its response in that callback; this class queues the work in
// a BatchScheduler, runs each batch and reports the result (AttendResult: status, output
// bytes, times). It knows neither gRPC nor the protos.
//
// Signature: AttendSignature (dtype, heads, mask, scale, lse, backend); a call that may not
// share a launch (MayCoalesce false) gets a signature of its own. Tokens: the call's query
// tokens. A batch of several calls runs as one varlen launch through Backend::ExecuteStaged:
// the calls' inputs are packed (attend_coalescer.h PackInto) straight into the buffers the
// backend provides (a GPU backend's pinned lane staging; host vectors on cpu) and the output
// scattered (ScatterFrom) from where the backend left it into each call's own buffers, one
// host copy each way; a batch of one runs straight into its result's buffers. Fallback policy:
//  - packing refused, or the backend refuses the packed problem (no varlen, a size limit of
//    the bigger problem): every call runs on its own and gets its own status (a call cancelled
//    meanwhile gets CANCELLED "cancelled by the client while queued");
//  - the backend answers INTERNAL (a device fault): `on_fault` is called (the server turns
//    health NOT_SERVING) and every call of the launch gets that status;
//  - the backend answers CANCELLED (the cpu reference stops between chunks of rows once every
//    call of its launch is cancelled or past its deadline): each call gets DEADLINE_EXCEEDED or
//    CANCELLED "... while computing; the computation was stopped".
// Calls cancelled or past their deadline while queued are dropped before launch with
// CANCELLED / DEADLINE_EXCEEDED (BatchScheduler). Every accepted work's `done` is called
// exactly once, on a batch thread.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"
#include "backends/backend.h"
#include "batching/batch_scheduler.h"
#include "validation/validated_attend.h"

namespace attn {

/// What an Attend call got. On error only `status` is set.
struct AttendResult {
  Status status;
  /// The output: ValidatedAttend::o_bytes bytes in the layout of q (o_shape).
  std::string o;
  /// return_lse: lse_shape float32 values (as bytes); else empty.
  std::string lse;
  /// The launch the call ran in: its device-side times (backend's ExecuteTimes, µs), its calls
  /// and their query tokens (1 and the call's own when it ran alone).
  ExecuteTimes times;
  int64_t batch_size = 0;
  int64_t batch_tokens = 0;
  /// Time the call waited in the batching queue, µs (>= 0).
  int64_t queue_us = 0;
};

/// One validated Attend call to run.
struct AttendWork {
  /// The problem (not owned): its tensors alias the request's bytes; must stay alive and
  /// unchanged until `done` has returned.
  const ValidatedAttend* validated = nullptr;
  /// The backend that runs it (not owned; from BackendRegistry::Resolve).
  Backend* backend = nullptr;
  /// True once the caller no longer wants the result; called from batch threads (thread-safe,
  /// cheap).
  std::function<bool()> cancelled;
  /// Absolute deadline (time_point::max(): none).
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  /// Called exactly once with the result (OK with the output, or why not).
  std::function<void(AttendResult&& result)> done;
};

/// One launch that ran to completion (OK), for metrics: its backend, calls, query tokens, the
/// sum of its calls' flops, the launched problem (the packed varlen problem of a batch) and its
/// kernel time in µs.
struct AttendLaunch {
  const Backend* backend = nullptr;
  int64_t calls = 0;
  int64_t query_tokens = 0;
  double flops = 0;
  const kernels::AttentionShape* shape = nullptr;
  int64_t kernel_us = 0;
};

class AttendBatcher {
 public:
  /// Starts the batch threads. `on_fault` (may be null) is called on an INTERNAL from a
  /// backend. `now_us`: the scheduler's monotonic clock in µs (null: steady_clock).
  AttendBatcher(const BatchSchedulerOptions& options, std::function<void()> on_fault,
                std::function<int64_t()> now_us = nullptr);
  ~AttendBatcher() { Stop(); }
  AttendBatcher(const AttendBatcher&) = delete;
  AttendBatcher& operator=(const AttendBatcher&) = delete;

  /// Queues `work`; on success its `done` will be called once. Errors (nothing queued, `done`
  /// not called): RESOURCE_EXHAUSTED (queue full, with the numbers), UNAVAILABLE (stopping).
  Status Enqueue(AttendWork work);
  /// `observer` is called on the batch thread after each launch that succeeded. Set before the
  /// first Enqueue.
  void SetLaunchObserver(std::function<void(const AttendLaunch&)> observer) {
    on_launch_ = std::move(observer);
  }
  /// Wakes the scheduler to drop cancelled calls now (from OnCancel).
  void Notify() { scheduler_->Notify(); }
  /// Refuses new work, runs what is queued, joins the threads. Idempotent.
  void Stop() { scheduler_->Stop(); }
  /// Drops every queued (not yet started) call with `why`; returns how many.
  int64_t RefuseQueued(const Status& why) { return scheduler_->RefuseQueued(why); }
  int64_t queued_requests() const { return scheduler_->queued_requests(); }
  int64_t queued_tokens() const { return scheduler_->queued_tokens(); }
  BatchScheduler* scheduler() { return scheduler_.get(); }

 private:
  class AttendItem;
  void RunBatch(std::vector<std::unique_ptr<BatchItem>>& batch);
  /// Runs the batch (>= 2 calls) as one packed launch (Backend::ExecuteStaged); false when the
  /// packed problem was refused (nothing was answered: the caller runs the calls one by one).
  bool RunPacked(std::vector<AttendItem*>& calls);
  void RunAlone(AttendItem* call);

  const std::function<void()> on_fault_;
  std::function<void(const AttendLaunch&)> on_launch_;
  std::unique_ptr<BatchScheduler> scheduler_;  // last: its threads stop first
};

}  // namespace attn
