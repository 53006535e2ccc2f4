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

std::vector<std::pair<std::string, std::string>> BuildInfoLabels(const BuildInfo& info) {
  return {
      {"version", kAttnVersion},
      {"build", kAttnBuild},
      {"device", info.device},
      {"compute_capability", info.compute_capability.empty() ? "none" : info.compute_capability},
      {"driver", CudaDriverVersion()},
      {"cudnn", "none"},
      {"backends", info.backends},
      {"default_backend", info.default_backend},
      {"worker_threads", std::to_string(info.worker_threads)},
      {"max_queue_requests", std::to_string(info.max_queue_requests)},
      {"max_message_bytes", std::to_string(info.max_message_bytes)},
      {"gpu_memory_fraction", Num(info.gpu_memory_fraction)},
      {"shadow_check_fraction", Num(info.shadow_check_fraction)},
  };
}

}  // namespace attn::metrics
