// GetDeviceLimits: the device's limits, clamped to an L4's under ATTN_EMULATE_L4.
#include "attn/kernels/device_limits.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

namespace attn::kernels {

StatusOr<DeviceLimits> GetDeviceLimits(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return Unavailable(std::string("device limits: no CUDA device (") +
                       (e != cudaSuccess ? cudaGetErrorName(e) : "0 devices") + ")");
  }
  if (device < 0 && (e = cudaGetDevice(&device)) != cudaSuccess) {
    return Internal(std::string("device limits: cudaGetDevice failed: ") + cudaGetErrorName(e));
  }
  DeviceLimits l;
  l.device = device;
  int major = 0, minor = 0;
  if ((e = cudaDeviceGetAttribute(&l.max_dynamic_smem_per_block_bytes,
                                  cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) !=
          cudaSuccess ||
      (e = cudaDeviceGetAttribute(&l.sm_count, cudaDevAttrMultiProcessorCount, device)) !=
          cudaSuccess ||
      (e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
          cudaSuccess ||
      (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
          cudaSuccess) {
    return Internal(std::string("device limits: cudaDeviceGetAttribute failed: ") +
                    cudaGetErrorName(e));
  }
  l.compute_capability = major * 100 + minor * 10;
  if (kEmulateL4) {
    l.emulating_l4 = true;
    l.max_dynamic_smem_per_block_bytes =
        std::min(l.max_dynamic_smem_per_block_bytes, kL4MaxDynamicSmemPerBlockBytes);
    l.sm_count = std::min(l.sm_count, kL4SmCount);
  }
  return l;
}

}  // namespace attn::kernels
