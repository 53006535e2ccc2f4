// The attention.v1 AttentionService on gRPC's callback API.
//
// Attend: the callback thread admits the call (CallGate), validates the request
// (INVALID_ARGUMENT before any work), resolves the backend (FAILED_PRECONDITION with the
// reason), checks the work bound, and enqueues it in the Attend batcher
// (batching/attend_batcher.h; RESOURCE_EXHAUSTED when the queue is full), which runs it, alone
// or coalesced with compatible calls into one varlen launch, and reports the result to the
// completion callback; that callback (on a batch thread) builds the response and its
// ExecutionReport (the batch size, batch tokens and queue time of the launch the call ran in)
// and finishes the call. Cancelled calls and calls past their deadline are dropped before
// launch. While draining, new calls get UNAVAILABLE and in-flight calls finish. Bounds (issue
// 16): a call whose estimated work is over its backend kind's bound (validation/work_bound.h)
// gets RESOURCE_EXHAUSTED before queueing; the cpu reference stops between chunks of rows once
// every caller of its launch is gone or past its deadline. A call stays in flight until its
// response has been taken by the client (OnDone); answered calls whose responses are not taken
// hold at most --max-unsent-response-bytes (above it the oldest are cancelled) for at most
// --response-write-timeout-s (then cancelled): write_watchdog.h. A call arriving while calls in
// flight hold more request and response bytes than --max-inflight-bytes gets
// RESOURCE_EXHAUSTED. A device fault (INTERNAL) calls `on_fault`, which turns health
// NOT_SERVING. GetLoad answers from the LoadReporter without queueing, also while draining.
// Thread-safety: all methods are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "attention/v1/attention.grpc.pb.h"
#include "backends/backend_registry.h"
#include "backends/server_facts.h"
#include "batching/attend_batcher.h"
#include "common/worker_pool.h"
#include "config/server_config.h"
#include "security/call_gate.h"
#include "service/write_watchdog.h"
#include "validation/attend_validator.h"

namespace attn {

class LoadReporter;

namespace metrics {
class Metrics;
class ShadowChecker;
}  // namespace metrics

class AttentionServiceImpl final : public attention::v1::AttentionService::CallbackService {
 public:
  AttentionServiceImpl(const ServerConfig& config, const BackendRegistry* registry,
                       WorkerPool* workers, ServerFacts facts, std::function<void()> on_fault,
                       metrics::Metrics* metrics = nullptr,
                       metrics::ShadowChecker* shadow = nullptr);

  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const attention::v1::AttendRequest* request,
                                   attention::v1::AttendResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const attention::v1::GetServerInfoRequest* request,
                                          attention::v1::GetServerInfoResponse* response) override;
  /// GetLoad: answered by the LoadReporter given to SetLoadReporter; UNIMPLEMENTED when none
  /// was given.
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const attention::v1::GetLoadRequest* request,
                                    attention::v1::GetLoadResponse* response) override;
  /// `load` (not owned, may be null) serves GetLoad and GetServerInfo.replica; set before
  /// the server starts.
  void SetLoadReporter(const LoadReporter* load) { load_ = load; }

  /// Authentication and request limits every call passes first (not owned;
  /// default: security::OpenGate()). Set before serving.
  void SetCallGate(const security::CallGate* gate) { gate_ = gate; }
  /// From now on new calls get UNAVAILABLE.
  void StartDraining();
  /// Waits until no call is in flight or `timeout` passes; true when idle.
  bool WaitIdle(std::chrono::milliseconds timeout);
  int64_t in_flight() const { return in_flight_.load(); }
  /// Attend calls waiting in the batching queue, and their query tokens.
  int64_t queued_requests() const { return batcher_->queued_requests(); }
  int64_t queued_tokens() const { return batcher_->queued_tokens(); }
  /// Bytes held by answered calls whose clients have not taken their responses yet (the
  /// request plus the response, as message and serialized).
  int64_t unsent_response_bytes() const { return watchdog_->held_bytes(); }
  /// Bytes of requests and responses held by Attend calls in flight (--max-inflight-bytes).
  int64_t inflight_bytes() const { return inflight_bytes_.load(); }
  /// Answered calls cancelled because their response was not taken in time or in bytes.
  int64_t write_timeouts() const { return watchdog_->cancelled(); }
  /// Drops every queued (not yet started) Attend call with `why`; returns how many.
  int64_t RefuseQueued(const Status& why) { return batcher_->RefuseQueued(why); }
  /// The Attend batcher (for tests and shutdown).
  AttendBatcher* batcher() { return batcher_.get(); }

 private:
  struct AttendCall;
  /// The completion callback: builds the response of `call` from `result` and finishes it.
  void Complete(AttendCall* call, AttendResult&& result);
  /// Fills the ExecutionReport and metrics of a call that ran OK (`result`: its launch),
  /// submits its shadow check, then finishes it OK.
  void Respond(AttendCall* call, const AttendResult& result);
  /// Records one launch in the metrics (the batcher's launch observer).
  void ObserveLaunch(const AttendLaunch& launch);
  int MetricsBackend(const Backend* backend) const;
  void Finish(AttendCall* call, const Status& status);
  void CallDone();

  const ServerConfig config_;
  const BackendRegistry* registry_;
  WorkerPool* workers_;
  const security::CallGate* gate_ = &security::OpenGate();
  const ServerFacts facts_;
  std::function<void()> on_fault_;
  metrics::Metrics* metrics_;       // null: no metrics
  metrics::ShadowChecker* shadow_;  // null: no shadow checks
  std::vector<std::pair<const Backend*, int>> metrics_backends_;  // backend → metrics index
  std::vector<std::pair<const Backend*, std::string>> backend_devices_;  // backend → device
  std::atomic<bool> draining_{false};
  const LoadReporter* load_ = nullptr;  // GetLoad; null: UNIMPLEMENTED
  std::atomic<int64_t> in_flight_{0};
  std::unique_ptr<WriteWatchdog> watchdog_;
  std::atomic<int64_t> inflight_bytes_{0};  // requests + responses of calls not yet done
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
  std::unique_ptr<AttendBatcher> batcher_;  // last: its threads stop first
};

}  // namespace attn
