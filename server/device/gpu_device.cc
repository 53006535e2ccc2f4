#include "device/gpu_device.h"

#include <cuda_runtime.h>

namespace attn {

int CudaDeviceCount(std::string* why_none) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_none) *why_none = std::string("no CUDA device: ") + cudaGetErrorString(err);
    cudaGetLastError();
    return 0;
  }
  if (count == 0 && why_none) *why_none = "no CUDA device found";
  return count;
}

StatusOr<DeviceInfo> OpenDevice(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return Unavailable("CUDA device " + std::to_string(device) + " not found");
  }
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.total_memory_bytes = prop.totalGlobalMem;
  info.sm_count = prop.multiProcessorCount;
  return info;
}

}  // namespace attn
