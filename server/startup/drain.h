// The drain of attention-server after SIGTERM/SIGINT (README "Drain"): health NOT_SERVING
// (liveness stays SERVING unless a device fault happened), new calls UNAVAILABLE, with
// --drain-wait-sequences the live sequences served until released or expired, open
// ExtendStreams ended with UNAVAILABLE after their current step, and the calls in flight
// finished, all within one --drain-timeout-s deadline. Part of main.cc's shutdown; called once.
#pragma once

#include <grpcpp/health_check_service_interface.h>

#include <string>

#include "config/server_config.h"
#include "kv_cache/sequence_store.h"
#include "service/attention_service.h"
#include "service/load_report.h"
#include "service/sequence_service.h"

namespace attn::startup {

/// What the drain stops (not owned).
struct DrainTargets {
  AttentionServiceImpl* service;
  SequenceServiceImpl* sequence_service;
  SequenceStore* sequences;
  LoadReporter* load;
  grpc::HealthCheckServiceInterface* health;  ///< both listeners' state (HealthFanout)
  bool faulted;                               ///< a device fault happened: liveness stays off
};

/// Drains after signal `sig`. Returns when every call has finished; when the deadline passes
/// first, answers the queued calls and steps UNAVAILABLE and exits the process with code 3
/// (removing `socket_path` first when it is not empty): started computations cannot be
/// interrupted, and the orchestrator's grace period must not be outlived.
void DrainOrExit(const ServerConfig& config, const DrainTargets& t, int sig,
                 const std::string& socket_path);

}  // namespace attn::startup
