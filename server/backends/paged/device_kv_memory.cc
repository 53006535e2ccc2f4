#include "backends/paged/device_kv_memory.h"

#include <cuda_runtime.h>

#include <string>

namespace attn {

StatusOr<std::unique_ptr<DeviceKvMemory>> DeviceKvMemory::Create(DevicePool *pool, int64_t bytes,
                                                                 uint64_t alignment) {
  if (bytes <= 0) {
    return InvalidArgument("--kv-cache-bytes must be > 0, got " + std::to_string(bytes));
  }
  StatusOr<DeviceAllocation> block = pool->Allocate(static_cast<uint64_t>(bytes));
  if (!block.ok()) {
    return ResourceExhausted("device KV cache: --kv-cache-bytes " + std::to_string(bytes) +
                             " does not fit the GPU memory pool (" +
                             std::to_string(pool->capacity() - pool->used()) +
                             " bytes free; raise --gpu-memory-fraction or lower "
                             "--kv-cache-bytes): " +
                             block.status().message());
  }
  return std::unique_ptr<DeviceKvMemory>(new DeviceKvMemory(std::move(*block), alignment));
}

void DeviceKvMemory::Poison(char *ptr, uint64_t bytes) {
  if (cudaMemset(ptr, 0xff, bytes) == cudaSuccess) (void)cudaDeviceSynchronize();
}

}  // namespace attn
