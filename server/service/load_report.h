// GetLoad (attention.proto): the load report routers and gateways read to place new work and to
// route sequences (DESIGN.md §12).
//
// LoadReporter gathers numbers that other components own, through sources given at start:
// calls in flight (both services), calls queued, live sequences and KV pages (SequenceStore),
// the draining flag and the replica identity. The queue depth has one entry point,
// SetQueueDepthSource(): today main.cc feeds it the worker pool's queue; the batcher feeds its
// own queue through the same call when it owns the waiting work.
// AttentionServiceImpl::GetLoad (attention_service.cc) answers with Fill() on the gRPC thread,
// without queueing, also while draining; this file does not include the service (the arrow
// runs one way: service -> load report).
// Thread-safety: Fill() and the setters may be called from any thread; sources must be
// thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "kv_cache/sequence_store.h"

namespace attn {

class LoadReporter {
 public:
  /// A number read on every report (e.g. a queue's length); must be thread-safe and cheap.
  using Source = std::function<int64_t()>;

  /// `sequences` (not owned; may be null: no KV numbers and an empty replica identity) must
  /// outlive the reporter; the replica identity (tag, --advertise-address) is its options'.
  /// `max_queue_requests` and `worker_threads` are reported as given.
  LoadReporter(SequenceStore *sequences, int64_t max_queue_requests, int worker_threads);

  /// THE queue-depth feed: calls accepted and waiting to run. Replaces the previous source.
  void SetQueueDepthSource(Source queued);
  /// Adds a source of calls in flight (each service registers its own); they are summed.
  void AddInFlightSource(Source in_flight);
  /// Marks the replica draining (reported as GetLoadResponse.draining); irreversible.
  void SetDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  /// Fills every field of `response` from the sources.
  void Fill(attention::v1::GetLoadResponse *response) const;
  /// Fills `info` (GetServerInfoResponse.replica / GetLoadResponse.replica).
  void FillReplica(attention::v1::ReplicaInfo *info) const;

 private:
  SequenceStore *const sequences_;  // not const: reading it sweeps expired sequences
  const int64_t max_queue_requests_;
  const int worker_threads_;
  const std::string address_;
  const std::string tag_hex_;
  mutable std::mutex mu_;  // guards the sources
  Source queued_;
  std::vector<Source> in_flight_;
  std::atomic<bool> draining_{false};
};

}  // namespace attn
