#include "metrics/build_info.h"

#include <cstdio>

#include "version.h"

#if defined(ATTN_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace attn::metrics {
namespace {

std::string Num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

}  // namespace

std::string CudaDriverVersion() {
#if defined(ATTN_HAVE_CUDA)
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) {
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  }
#endif
  return "none";
}

std::vector<std::pair<std::string, std::string>> BuildInfoLabels(const ServerConfig& config,
                                                                 const ServerFacts& facts,
                                                                 const BackendRegistry& registry,
                                                                 int worker_threads) {
  std::string backends;
  for (Backend* b : registry.All()) {
    if (!b->available()) continue;
    backends += (backends.empty() ? "" : ",") + b->name();
  }
  return {
      {"version", kAttnVersion},
      {"build", kAttnBuild},
      {"device", facts.device_name},
      {"compute_capability", facts.compute_capability.empty() ? "none" : facts.compute_capability},
      {"driver", CudaDriverVersion()},
      {"cudnn", "none"},
      {"backends", backends},
      {"default_backend", config.default_backend},
      {"worker_threads", std::to_string(worker_threads)},
      {"max_queue_requests", std::to_string(config.max_queue_requests)},
      {"max_message_bytes", std::to_string(config.max_message_bytes)},
      {"gpu_memory_fraction", Num(config.gpu_memory_fraction)},
      {"shadow_check_fraction", Num(config.shadow_check_fraction)},
  };
}

}  // namespace attn::metrics
