// Shared GPU state for the CUDA backends: the device, its memory pool, one stream, a cuBLAS
// handle whose workspace comes from the pool, and a pinned host staging buffer.
//
// Execute() runs one problem end to end: carves q/k/v/o/lse/lengths/offsets and the kernel's
// workspace from the pool, copies inputs host→device through the pinned buffer, calls the
// family's enqueue-only run function between CUDA events, copies outputs back and reports the
// time of each phase from the events. Launches are serialised on the one stream (batching of
// concurrent calls is the batcher's job).
// Thread-safety: Execute is thread-safe (internally serialised).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/status.h"
#include "backends/backend.h"
#include "memory/device_pool.h"

struct cublasContext;

namespace attn {

/// Facts about the device, for GetServerInfo and reports.
struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0;
  int minor = 0;
  uint64_t total_memory_bytes = 0;
  int sm_count = 0;
};

/// Number of CUDA devices (0 when there is no device or no driver) and why, when 0.
int CudaDeviceCount(std::string* why_none);

class GpuContext {
 public:
  /// The enqueue-only part of a family: run on `stream` with device tensors and a workspace.
  using RunFn = std::function<Status(const AttentionTensors& device, void* workspace,
                                     uint64_t workspace_bytes, cublasContext* cublas,
                                     cudaStream_t stream)>;

  /// Opens `device`, reserves `pool_fraction` of its free memory, `pinned_bytes` of pinned
  /// host memory and a 32 MiB cuBLAS workspace from the pool.
  static StatusOr<std::shared_ptr<GpuContext>> Create(int device, double pool_fraction,
                                                      uint64_t pinned_bytes);
  ~GpuContext();

  /// See the file comment. Errors: RESOURCE_EXHAUSTED when the pool cannot hold the buffers;
  /// INTERNAL on CUDA errors (the context then stays faulted: every later call gets INTERNAL).
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 uint64_t workspace_bytes, const RunFn& run, ExecuteTimes* times);

  const DeviceInfo& info() const { return info_; }
  DevicePool& pool() { return *pool_; }
  bool faulted() const;

 private:
  GpuContext() = default;
  Status CheckCuda(cudaError_t err, const char* what);

  DeviceInfo info_;
  std::unique_ptr<DevicePool> pool_;
  DeviceAllocation cublas_workspace_;
  cudaStream_t stream_ = nullptr;
  cublasContext* cublas_ = nullptr;
  void* pinned_ = nullptr;
  uint64_t pinned_bytes_ = 0;
  cudaEvent_t events_[4] = {nullptr, nullptr, nullptr, nullptr};
  mutable std::mutex mu_;
  bool faulted_ = false;
  std::string fault_;
};

}  // namespace attn
