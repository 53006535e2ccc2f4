#include "health/health_fanout.h"

namespace attn::health {

HealthFanout::HealthFanout(std::vector<grpc::HealthCheckServiceInterface*> targets) {
  for (auto* t : targets) {
    if (t != nullptr) targets_.push_back(t);
  }
}

void HealthFanout::SetServingStatus(const std::string& service_name, bool serving) {
  for (auto* t : targets_) t->SetServingStatus(service_name, serving);
}

void HealthFanout::SetServingStatus(bool serving) {
  for (auto* t : targets_) t->SetServingStatus(serving);
}

void HealthFanout::Shutdown() {
  for (auto* t : targets_) t->Shutdown();
}

}  // namespace attn::health
