// ServerFacts: what BuildBackends (backend_factory.h) found about the device and the backends,
// for GetServerInfo and the attn_build_info labels. Declared here, beside the backend factory
// that fills it, so that backends, metrics and kv_cache need not include the service header.
// The proto message is only forward-declared: the callbacks take it by pointer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace attention::v1 {
class GetServerInfoResponse;
}  // namespace attention::v1

namespace attn {

/// Facts for GetServerInfo that the service does not own.
struct ServerFacts {
  std::string device_name = "cpu";
  std::string compute_capability;
  int64_t device_memory_bytes = 0;
  /// Returns {pool capacity, pool used} in bytes; null when there is no pool.
  std::function<std::pair<int64_t, int64_t>()> pool_usage;
  /// Fills more of GetServerInfoResponse (e.g. kv_cache from SequenceService); may be null.
  std::function<void(attention::v1::GetServerInfoResponse*)> extra_info;
  /// Backends' own additions (calibration table, cuDNN graph cache); may be empty.
  std::function<void(attention::v1::GetServerInfoResponse*)> backend_info;
  /// CUDA version the NVIDIA driver supports ("13.0"), or "none" (backends/driver_check.h).
  std::string cuda_driver_version = "none";
};

}  // namespace attn
