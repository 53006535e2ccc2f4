// The attention.v1 AttentionService on gRPC's callback API.
//
// Attend: the callback thread validates the request (INVALID_ARGUMENT before any work),
// resolves the backend (FAILED_PRECONDITION with the reason), and hands the call to the worker
// pool (RESOURCE_EXHAUSTED when its queue is full). A worker checks cancellation and deadline,
// runs the backend straight into the response's buffers, fills the ExecutionReport and
// finishes the call. While draining, new calls get UNAVAILABLE and in-flight calls finish.
// A device fault (INTERNAL) calls `on_fault`, which turns health NOT_SERVING.
// Thread-safety: all methods are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "attention/v1/attention.grpc.pb.h"
#include "backends/backend_registry.h"
#include "config/server_config.h"
#include "service/worker_pool.h"
#include "validation/attend_validator.h"

namespace attn {

namespace metrics {
class Metrics;
class ShadowChecker;
}  // namespace metrics

/// Facts for GetServerInfo that the service does not own.
struct ServerFacts {
  std::string device_name = "cpu";
  std::string compute_capability;
  int64_t device_memory_bytes = 0;
  /// Returns {pool capacity, pool used} in bytes; null when there is no pool.
  std::function<std::pair<int64_t, int64_t>()> pool_usage;
  /// Fills more of GetServerInfoResponse (e.g. kv_cache from SequenceService); may be null.
  std::function<void(attention::v1::GetServerInfoResponse*)> extra_info;
};

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

  /// From now on new calls get UNAVAILABLE.
  void StartDraining();
  /// Waits until no call is in flight or `timeout` passes; true when idle.
  bool WaitIdle(std::chrono::milliseconds timeout);
  int64_t in_flight() const { return in_flight_.load(); }

 private:
  struct AttendCall;
  void RunAttend(AttendCall* call);
  void Finish(AttendCall* call, const Status& status);
  void CallDone();

  const ServerConfig config_;
  const BackendRegistry* registry_;
  WorkerPool* workers_;
  const ServerFacts facts_;
  std::function<void()> on_fault_;
  metrics::Metrics* metrics_;       // null: no metrics
  metrics::ShadowChecker* shadow_;  // null: no shadow checks
  std::vector<std::pair<const Backend*, int>> metrics_backends_;  // backend → metrics index
  std::vector<std::pair<const Backend*, std::string>> backend_devices_;  // backend → device
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
};

/// Converts our Status to a grpc::Status with the same code and message.
grpc::Status ToGrpc(const Status& status);

}  // namespace attn
