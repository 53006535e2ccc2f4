#include "device/device_pool.h"

#include <cuda_runtime.h>

#include <string>

namespace attn {

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& o) noexcept {
  if (this != &o) {
    Reset();
    pool_ = o.pool_;
    offset_ = o.offset_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.pool_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceAllocation::Reset() {
  if (pool_ != nullptr) pool_->Release(offset_);
  pool_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(int device, double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return InvalidArgument("--gpu-memory-fraction must be in (0, 1], got " +
                           std::to_string(fraction));
  }
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    return Unavailable(std::string("cudaSetDevice: ") + cudaGetErrorString(err));
  }
  size_t free_bytes = 0, total_bytes = 0;
  err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (err != cudaSuccess) {
    return Unavailable(std::string("cudaMemGetInfo: ") + cudaGetErrorString(err));
  }
  const uint64_t bytes = static_cast<uint64_t>(static_cast<double>(free_bytes) * fraction) /
                         (2u << 20) * (2u << 20);
  void* base = nullptr;
  err = cudaMalloc(&base, bytes);
  if (err != cudaSuccess) {
    return ResourceExhausted("device pool: cudaMalloc of " + std::to_string(bytes) +
                             " bytes failed: " + cudaGetErrorString(err));
  }
  return std::unique_ptr<DevicePool>(new DevicePool(base, bytes));
}

DevicePool::~DevicePool() { cudaFree(base_); }

StatusOr<DeviceAllocation> DevicePool::Allocate(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<uint64_t> off = allocator_.Allocate(bytes);
  if (!off.ok()) return off.status();
  return DeviceAllocation(this, *off, static_cast<char*>(base_) + *off, bytes);
}

void DevicePool::Release(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  allocator_.Free(offset);
}

uint64_t DevicePool::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.capacity();
}

uint64_t DevicePool::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.used();
}

}  // namespace attn
