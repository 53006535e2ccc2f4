// Labels of attn_build_info: the build, the device and the configuration that matter when
// reading the other metrics.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backends/backend_registry.h"
#include "backends/server_facts.h"
#include "config/server_config.h"

namespace attn::metrics {

/// version, build, device, compute_capability, driver (CUDA driver "major.minor", or "none"),
/// cudnn ("none" until a cuDNN backend exists), backends (available ones, comma-separated),
/// default_backend, worker_threads, max_queue_requests, max_message_bytes,
/// gpu_memory_fraction, shadow_check_fraction.
std::vector<std::pair<std::string, std::string>> BuildInfoLabels(const ServerConfig& config,
                                                                 const ServerFacts& facts,
                                                                 const BackendRegistry& registry,
                                                                 int worker_threads);

/// The CUDA driver version as "major.minor", or "none" (CPU build or no driver).
std::string CudaDriverVersion();

}  // namespace attn::metrics
