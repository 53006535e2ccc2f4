// The plaintext health-only listener (--health-address, DESIGN.md §12):
// kubelet gRPC probes cannot speak mutual TLS, so a second gRPC server on its
// own port serves grpc.health.v1.Health and nothing else (no attention.v1
// service, no reflection; other methods get UNIMPLEMENTED). Its state is set
// through health() (normally via HealthFanout, mirroring the main listener).
// Thread-safety: health() is thread-safe; Start/Shutdown from one thread.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "attn/common/status.h"

namespace attn::health {

class HealthListener {
 public:
  /// Binds `address` (host:port; port 0 picks one) and starts serving. Errors:
  /// INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot be bound.
  static StatusOr<std::unique_ptr<HealthListener>> Start(const std::string& address);
  ~HealthListener();

  int port() const { return port_; }
  /// The listener's health service (NOT_SERVING after Shutdown).
  grpc::HealthCheckServiceInterface* health() { return server_->GetHealthCheckService(); }
  /// Stops serving (in-flight probes get `deadline` to finish).
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  HealthListener() = default;
  // Answers every other method with UNIMPLEMENTED; also gives the server the callback
  // completion queue that gRPC's health service needs to be polled.
  grpc::CallbackGenericService unimplemented_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace attn::health
