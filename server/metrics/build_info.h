// Labels of attn_build_info: the build, the device and the configuration that matter when
// reading the other metrics.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace attn::metrics {

/// What attn_build_info reports besides the build itself; filled by main.cc from the
/// configuration, ServerFacts (backends/server_facts.h) and the backend registry, so that
/// metrics/ needs neither backends/ nor config/ (docs/architecture.md, the include rule).
struct BuildInfo {
  std::string device = "cpu";
  std::string compute_capability;  ///< "9.0"; empty: "none"
  std::string backends;            ///< available backends, comma-separated
  std::string default_backend;
  int worker_threads = 0;
  int64_t max_queue_requests = 0;
  int64_t max_message_bytes = 0;
  double gpu_memory_fraction = 0;
  double shadow_check_fraction = 0;
};

/// version, build, device, compute_capability, driver (CUDA driver "major.minor", or "none"),
/// cudnn ("none" until a cuDNN backend exists), backends (available ones, comma-separated),
/// default_backend, worker_threads, max_queue_requests, max_message_bytes,
/// gpu_memory_fraction, shadow_check_fraction.
std::vector<std::pair<std::string, std::string>> BuildInfoLabels(const BuildInfo& info);

/// The CUDA driver version as "major.minor", or "none" (CPU build or no driver).
std::string CudaDriverVersion();

}  // namespace attn::metrics
