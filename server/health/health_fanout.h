// One health state published to several gRPC servers: the main listener's
// grpc.health.v1 service and the plaintext health-only listener's
// (HealthListener), so probes on either port see the same SERVING /
// NOT_SERVING. Thread-safety: as grpc::HealthCheckServiceInterface (each
// target is itself thread-safe); targets are fixed before use.
#pragma once

#include <string>
#include <vector>

#include <grpcpp/health_check_service_interface.h>

namespace attn::health {

/// The grpc.health.v1 service names attention-server publishes: readiness per service (and
/// the "" service), and "liveness" for kubelet liveness probes (SERVING until a device fault,
/// and still SERVING while draining).
inline constexpr char kAttentionServiceName[] = "attention.v1.AttentionService";
inline constexpr char kSequenceServiceName[] = "attention.v1.SequenceService";
inline constexpr char kLivenessServiceName[] = "liveness";

class HealthFanout final : public grpc::HealthCheckServiceInterface {
 public:
  /// Null targets are skipped; targets are not owned and must outlive this.
  explicit HealthFanout(std::vector<grpc::HealthCheckServiceInterface*> targets);

  void SetServingStatus(const std::string& service_name, bool serving) override;
  void SetServingStatus(bool serving) override;
  void Shutdown() override;

 private:
  std::vector<grpc::HealthCheckServiceInterface*> targets_;
};

}  // namespace attn::health
