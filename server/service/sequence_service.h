// The attention.v1 SequenceService (sequence.proto) on gRPC's callback API:
// stateful sequences over the paged KV cache (DESIGN.md §3, §7).
//
// Every call is admitted (CallGate: identity, limits) and validated first (INVALID_ARGUMENT
// before any work). Sequence steps (Extend, each ExtendBatch entry, each ExtendStream message)
// are then enqueued in the step batcher (batching/step_batcher.h: continuous batching across
// RPCs, RESOURCE_EXHAUSTED when its queue is full), which drops steps cancelled or past their
// deadline before launch, runs the rest through the SequenceStore and the PagedAttentionBackend
// (the cpu path, CpuPagedAttention, or the GPU paged kernels in a CUDA build) and reports each
// step's result to its completion callback, where this service builds the ExtendResponse
// (extend_response.h) and finishes the call or writes the stream's result. The other calls
// (Create, Truncate, Fork, Release, GetSequence) run on the shared worker pool
// (RESOURCE_EXHAUSTED when its queue is full; ReleaseSequence then runs on the gRPC thread),
// which checks cancellation and deadline first. Calls on one sequence are serialised by the
// sequence's lock; calls on different sequences run in parallel. The caller's identity comes
// from the CallGate (the open gate: metadata "x-attn-identity", absent: ""). ExtendStream
// handles one request at a time per stream, in order, one ExtendResult each (a message that
// does not parse gets an INVALID_ARGUMENT result and the stream goes on; sequence_stream.cc).
// ExtendBatch takes the per-step form (each entry its own tensors) or the packed form (one q, k,
// v for all steps, validated whole; each step one StepRequest aliasing its rows; one o, one
// result per step, one report: packed_extend_batch.cc). ExtendBatchStream runs up to
// --max-batches-in-flight ExtendBatch requests of one stream at a time through the same path
// and answers each, tagged, as it completes (batch_stream.cc). While draining, new sequences
// (CreateSequence, ForkSequence) get UNAVAILABLE; calls and streams on existing sequences are
// served. SharedMemoryLease (shm_lease.cc) maps a client's host shared-memory object as a
// region of the caller's identity (shm/region_registry.h) for as long as its stream is open;
// packed batches name slices of such regions (call_regions.h); new leases get UNAVAILABLE
// while draining, and EndStreams ends the open ones.
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
#include <unordered_set>
#include <vector>

#include "attention/v1/sequence.grpc.pb.h"
#include "backends/paged/paged_attention_backend.h"
#include "batching/step_batcher.h"
#include "common/worker_pool.h"
#include "config/server_config.h"
#include "kv_cache/sequence_store.h"
#include "metrics/metrics.h"
#include "security/call_gate.h"
#include "shm/region_registry.h"
#include "validation/packed_batch_validator.h"
#include "validation/sequence_validator.h"
#include "validation/work_bound.h"

namespace attn {

namespace internal {
using sv = attention::v1::SequenceService;
/// The callback service with ExtendStream, ExtendBatchStream and SharedMemoryLease raw
/// (ByteBuffer in and out): their reactors parse and serialise their messages themselves
/// (sequence_stream.cc, batch_stream.cc, shm_lease.cc). The other methods are typed.
using SequenceServiceBase = sv::WithCallbackMethod_CreateSequence<
    sv::WithCallbackMethod_Extend<sv::WithCallbackMethod_ExtendBatch<
        sv::WithRawCallbackMethod_ExtendStream<sv::WithRawCallbackMethod_ExtendBatchStream<
            sv::WithRawCallbackMethod_SharedMemoryLease<sv::WithCallbackMethod_TruncateSequence<
                sv::WithCallbackMethod_ForkSequence<sv::WithCallbackMethod_ReleaseSequence<
                    sv::WithCallbackMethod_GetSequence<sv::Service>>>>>>>>>>;

/// An open stream that shutdown and token revocation can end (both stream reactors).
class EndableStream {
 public:
  virtual ~EndableStream() = default;
  /// EndStreams: finish now when idle, else once the work in progress is answered. Called with
  /// the service's streams_mu_ held (so the stream outlives the call).
  virtual void EndForShutdown() = 0;
  /// RevokeIdentities: as EndForShutdown with UNAUTHENTICATED when the stream is `identity`'s;
  /// true when it is. Called with the service's streams_mu_ held.
  virtual bool EndIfOwnedBy(const std::string &identity) = 0;
};
}  // namespace internal

class SequenceServiceImpl final : public internal::SequenceServiceBase {
 public:
  /// `store`, `backend` and `workers` are not owned and must outlive the
  /// service.
  /// `batching`: policy, threads and queue bound of the step batcher that Extend,
  /// ExtendBatch and ExtendStream steps go through (continuous batching, DESIGN.md §8).
  SequenceServiceImpl(SequenceStore *store, PagedAttentionBackend *backend, WorkerPool *workers,
                      const BatchSchedulerOptions &batching = {});

  grpc::ServerUnaryReactor *CreateSequence(
      grpc::CallbackServerContext *context, const attention::v1::CreateSequenceRequest *request,
      attention::v1::CreateSequenceResponse *response) override;
  grpc::ServerUnaryReactor *Extend(grpc::CallbackServerContext *context,
                                   const attention::v1::ExtendRequest *request,
                                   attention::v1::ExtendResponse *response) override;
  grpc::ServerUnaryReactor *ExtendBatch(grpc::CallbackServerContext *context,
                                        const attention::v1::ExtendBatchRequest *request,
                                        attention::v1::ExtendBatchResponse *response) override;
  /// Raw: each message is parsed by the stream reactor (a message that fails to parse is
  /// answered with an INVALID_ARGUMENT ExtendResult, and the stream goes on).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> *ExtendStream(
      grpc::CallbackServerContext *context) override;
  /// Raw as ExtendStream: each message is one ExtendBatchRequest, answered by one tagged
  /// ExtendBatchResponse when it completes (request-level errors in its code and message).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> *ExtendBatchStream(
      grpc::CallbackServerContext *context) override;
  /// Raw: the first message (a SharedMemoryLeaseRequest) registers the region, later ones are
  /// ignored; the region is released when the stream ends (shm_lease.cc).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> *SharedMemoryLease(
      grpc::CallbackServerContext *context) override;
  grpc::ServerUnaryReactor *TruncateSequence(
      grpc::CallbackServerContext *context, const attention::v1::TruncateSequenceRequest *request,
      attention::v1::TruncateSequenceResponse *response) override;
  grpc::ServerUnaryReactor *ForkSequence(grpc::CallbackServerContext *context,
                                         const attention::v1::ForkSequenceRequest *request,
                                         attention::v1::ForkSequenceResponse *response) override;
  grpc::ServerUnaryReactor *ReleaseSequence(
      grpc::CallbackServerContext *context, const attention::v1::ReleaseSequenceRequest *request,
      attention::v1::ReleaseSequenceResponse *response) override;
  grpc::ServerUnaryReactor *GetSequence(grpc::CallbackServerContext *context,
                                        const attention::v1::GetSequenceRequest *request,
                                        attention::v1::GetSequenceResponse *response) override;

  /// ExtendBatchStream: requests of one stream worked on at a time (>= 1; default 4,
  /// --max-batches-in-flight); a request counts from its read until its response is written.
  /// Set before serving.
  void SetMaxBatchesInFlight(int n) { max_batches_in_flight_ = n < 1 ? 1 : n; }
  /// Work bound of one sequence call (all its steps; validation/work_bound.h): over it,
  /// RESOURCE_EXHAUSTED before anything is queued. Default: unlimited. Set before serving.
  void SetWorkBounds(const WorkBounds &bounds) { work_bounds_ = bounds; }
  /// Authentication and request limits every call passes first (not owned;
  /// default: security::OpenGate()). Set before serving.
  void SetCallGate(const security::CallGate *gate) { gate_ = gate; }
  /// Counts every finished call in attn_requests_total / attn_request_duration_seconds
  /// (backend="none"), every step that reaches the step batcher in attn_sequence_steps_total /
  /// attn_sequence_step_duration_seconds and its phases in attn_phase_duration_seconds, and
  /// every step batch (Metrics::ObserveStepBatch), under the KV backend's name; not owned, may
  /// be null. Set before serving.
  void SetMetrics(metrics::Metrics *metrics);
  /// The host shared-memory regions SharedMemoryLease registers into and packed batches resolve
  /// their *_region fields in, in the caller's identity's regions (not owned; must outlive the
  /// service). Unset: every lease gets UNIMPLEMENTED and every region field INVALID_ARGUMENT.
  /// Set before serving.
  void SetSharedMemory(shm::RegionRegistry *regions) { shm_regions_ = regions; }
  /// From now on CreateSequence and ForkSequence get UNAVAILABLE; calls on existing
  /// sequences (and new ExtendStreams and ExtendBatchStreams) are still served.
  void StartDraining() { draining_.store(true); }
  /// Waits until no sequence is live (released, expired or evicted; expiry is swept while
  /// waiting) and no call is in flight, or `timeout` passes; true when none is left.
  bool WaitSequencesGone(std::chrono::milliseconds timeout);
  /// Ends every open ExtendStream and ExtendBatchStream for shutdown (a batch stream with
  /// requests in progress once they are answered): one waiting for its next message ends now, one
  /// with a step in progress right after that step's result is written; each ends with
  /// UNAVAILABLE ("server is shutting down"), and any stream opened later too. Without this an
  /// idle open stream held the drain until --drain-timeout-s (exit code 3). Open
  /// SharedMemoryLeases end likewise (their regions released; calls using one finish first).
  void EndStreams();
  /// For identities that lost their last token (SIGHUP reload): ends each one's open
  /// ExtendStreams and ExtendBatchStreams with UNAUTHENTICATED (one waiting for its next message at
  /// once, one with a step in progress right after that step's result is written) and releases
  /// every sequence it holds (SequenceStore::ReleaseOwner; a later call on one gets NOT_FOUND
  /// "revoked"), and ends its SharedMemoryLeases (UNAUTHENTICATED, regions released), logging a
  /// warning per identity. Returns the sequences released.
  int64_t RevokeIdentities(const std::vector<std::string> &identities);
  /// Waits until no call or stream is in flight or `timeout` passes; true when
  /// idle.
  bool WaitIdle(std::chrono::milliseconds timeout);
  int64_t in_flight() const { return in_flight_.load(); }
  /// Sequence steps waiting in the batching queue, and their query tokens.
  int64_t queued_requests() const { return steps_->queued_requests(); }
  int64_t queued_tokens() const { return steps_->queued_tokens(); }
  /// `on_fault()` runs when a sequence step's launch fails with INTERNAL (a device fault; the
  /// server turns health NOT_SERVING, as for Attend). Set before serving.
  void SetFaultHandler(std::function<void()> on_fault) {
    steps_->SetFaultHandler(std::move(on_fault));
  }
  /// The step batcher (for tests and shutdown).
  StepBatcher *step_batcher() { return steps_.get(); }

 private:
  class StreamReactor;
  class LeaseReactor;
  /// Ends every open lease (EndStreams) / `identity`'s leases, returning how many (shm_lease.cc).
  void EndLeases();
  int64_t RevokeLeases(const std::string &identity);
  class BatchStreamReactor;
  /// How an ExtendBatch ends: OK (the response is filled) or a request-level error.
  using BatchDone = std::function<void(const Status &status)>;
  /// Runs one ExtendBatchRequest of either form for `owner` on the call `context` (its
  /// cancellation and deadline), its steps counted under `method`; `done` is called exactly
  /// once (maybe before this returns), with the steps' results in `response` (tag copied).
  /// `request` and `response` must live until then. Shared by ExtendBatch and
  /// ExtendBatchStream.
  void RunExtendBatch(grpc::CallbackServerContext *context, const std::string &owner,
                      metrics::Method method, const attention::v1::ExtendBatchRequest *request,
                      attention::v1::ExtendBatchResponse *response, BatchDone done);
  /// The per-step form of RunExtendBatch.
  void RunStepBatch(grpc::CallbackServerContext *context, const std::string &owner,
                    metrics::Method method, const attention::v1::ExtendBatchRequest *request,
                    attention::v1::ExtendBatchResponse *response, BatchDone done);
  /// The packed form of RunExtendBatch (packed_extend_batch.cc).
  void RunPackedBatch(grpc::CallbackServerContext *context, const std::string &owner,
                      metrics::Method method, const attention::v1::ExtendBatchRequest *request,
                      attention::v1::ExtendBatchResponse *response, BatchDone done);
  /// Runs `fn` on a worker and finishes the call with its status. A full worker queue refuses
  /// the call with RESOURCE_EXHAUSTED, except with `run_here_when_full` (ReleaseSequence: a
  /// release frees memory, so load never refuses it; it runs on the gRPC thread instead).
  template <typename Fn>
  grpc::ServerUnaryReactor *Submit(grpc::CallbackServerContext *context, metrics::Method method,
                                   Fn fn, bool run_here_when_full = false);
  /// Records one finished call of `method` that started at `start` (no-op without metrics).
  void Observe(metrics::Method method, StatusCode code,
               std::chrono::steady_clock::time_point start) const;
  /// Wraps `r->done` (set) so that the step is counted and timed from `r->received` when it
  /// ends, before the original `done` runs (no-op without metrics).
  void InstrumentStep(metrics::Method method, StepRequest *r) const;
  /// A step of the call `context` (its cancellation and deadline) for `owner`; `done` unset.
  static StepRequest NewStep(grpc::CallbackServerContext *context, const std::string &owner,
                             ExtendArgs args);
  void CallStarted() { in_flight_.fetch_add(1); }
  /// Finishes a CreateSequence/ForkSequence with UNAVAILABLE (draining).
  grpc::ServerUnaryReactor *RefuseNewSequence(grpc::CallbackServerContext *context);
  void CallDone();

  SequenceStore *const store_;
  PagedAttentionBackend *const backend_;
  WorkerPool *const workers_;
  const security::CallGate *gate_ = &security::OpenGate();
  metrics::Metrics *metrics_ = nullptr;
  int metrics_backend_ = 0;  // metrics_->BackendIndex(backend_->name())
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
  int max_batches_in_flight_ = 4;
  WorkBounds work_bounds_;
  /// CheckStepsWorkBound for `pairs` query-key pairs of head dim `head_dim` on this backend.
  Status CheckWork(double pairs, int64_t head_dim) const {
    return CheckStepsWorkBound(pairs, head_dim, backend_->device() == "cpu", work_bounds_);
  }
  /// CheckStepReach against this server's KV pool (FAILED_PRECONDITION for a position no layer
  /// can have; run before CheckWork so such a step is not reported as too costly).
  Status CheckReach(const ExtendArgs &a) const {
    return CheckStepReach(a, store_->pool()->pool_bytes());
  }
  /// ValidateExtend, then CheckReach: the per-step checks of Extend, ExtendBatch and the stream.
  StatusOr<ExtendArgs> ValidateStep(const attention::v1::ExtendRequest &r) const {
    auto args = ValidateExtend(r);
    if (!args.ok()) return args;
    if (Status s = CheckReach(*args); !s.ok()) return s;
    return args;
  }
  // Open ExtendStreams and ExtendBatchStreams (registered after admission, removed in OnDone),
  // for EndStreams and RevokeIdentities.
  std::mutex streams_mu_;
  std::unordered_set<internal::EndableStream *> streams_;
  std::atomic<bool> ending_streams_{false};  // EndStreams ran: streams and leases end
  // Open SharedMemoryLeases (registered after admission, removed in OnDone), and their regions.
  std::mutex leases_mu_;
  std::unordered_set<LeaseReactor *> leases_;
  shm::RegionRegistry *shm_regions_ = nullptr;
  std::unique_ptr<StepBatcher> steps_;  // last: its threads stop first
};

/// Fills GetServerInfoResponse.kv_cache from the store and its page pool, after sweeping
/// expired sequences (they are never counted).
void FillKvCacheInfo(SequenceStore &store, attention::v1::KvCacheInfo *info);

}  // namespace attn
