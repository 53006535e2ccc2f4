// CUDA IPC regions at start (issue 18 item 3): gives the shared-memory registry an opener of
// device leases over device/ipc_region.h when the server's KV cache is on a GPU (its paged
// steps copy device regions' q/k/v/o device to device, backends/paged/gpu_paged_device_io.h),
// and otherwise the reason such leases are refused (FAILED_PRECONDITION): a build without
// CUDA, no GPU opened, or --kv-device=cpu (the paged-cpu backend reads only host memory).
// Part of main.cc's start-up (layer main: it joins shm/ and device/, which do not include each
// other). Thread-safety: call once, before serving.
#pragma once

#include <string>

#include "backends/backend_factory.h"
#include "backends/paged/kv_runtime.h"
#include "shm/region_registry.h"

namespace attn::startup {

/// What InstallCudaIpc found, for GetServerInfo.
struct CudaIpcFacts {
  std::string device_uuid;  ///< the server's GPU ("GPU-..."), empty without one
  bool accepted = false;    ///< device leases are accepted
};

/// Installs the opener (or the refusal) on `regions` and logs which. Never fails: a GPU whose
/// UUID cannot be read refuses device leases with that reason.
CudaIpcFacts InstallCudaIpc(const BuiltBackends &built, const KvRuntime &kv,
                            shm::RegionRegistry *regions);

}  // namespace attn::startup
