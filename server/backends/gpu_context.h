// Shared GPU state for the stateless CUDA backends: the opened device (device/gpu_device.h), its
// memory pool, one lane (device/lane.h: a stream, its events, a pinned host staging buffer and
// the fault latch) and a cuBLAS handle on the lane's stream whose workspace comes from the pool.
//
// Execute() runs one problem as one round trip on the lane: carves q/k/v/o/lse/lengths/offsets
// and the kernel's workspace from the pool, copies inputs host→device through the pinned
// buffer (inputs that do not fit it are copied from where they are), calls the family's
// enqueue-only run function between CUDA events, copies outputs back and reports the time of
// each phase from the events. Launches are serialised on the one lane (batching of concurrent
// calls is the batcher's job).
// Thread-safety: Execute is thread-safe (internally serialised).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"
#include "backends/backend.h"
#include "device/device_pool.h"
#include "device/gpu_device.h"
#include "device/lane.h"

struct cublasContext;

namespace attn {

/// The stateless backends' GPU: see the file comment.
class GpuContext {
 public:
  /// The enqueue-only part of a family: run on `stream` with device tensors and a workspace.
  using RunFn =
      std::function<Status(const AttentionTensors& device, void* workspace,
                           uint64_t workspace_bytes, cublasContext* cublas, cudaStream_t stream)>;

  /// Opens `device`, reserves `pool_fraction` of its free memory, `pinned_bytes` of pinned
  /// host memory and a 32 MiB cuBLAS workspace from the pool.
  static StatusOr<std::shared_ptr<GpuContext>> Create(int device, double pool_fraction,
                                                      uint64_t pinned_bytes);
  ~GpuContext();

  /// See the file comment. Errors: RESOURCE_EXHAUSTED when the pool cannot hold the buffers;
  /// INTERNAL on CUDA errors (the context then stays faulted: every later call gets INTERNAL).
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 uint64_t workspace_bytes, const RunFn& run, ExecuteTimes* times);

  /// Holds the context's lane for a caller that packs its inputs straight into the lane's
  /// pinned staging (lease.lane->staging(), staging_bytes() long: --pinned-staging-bytes; it
  /// does not grow) and then calls ExecuteHeld with host tensors pointing there: inputs in
  /// staging are uploaded from where they are and an o (and lse) in staging is downloaded in
  /// place, so each direction costs the caller one host copy. Other calls wait meanwhile; the
  /// staging contents outside o/lse are not kept across the call.
  LaneLease HoldLane() { return lanes_.Acquire(); }
  /// Execute on a lane held by HoldLane (`lease` stays held). Errors as Execute.
  Status ExecuteHeld(LaneLease& lease, const AttentionShape& shape, const AttentionTensors& host,
                     uint64_t workspace_bytes, const RunFn& run, ExecuteTimes* times);

  const DeviceInfo& info() const { return info_; }
  DevicePool& pool() { return *pool_; }
  bool faulted() const { return lanes_.latch().faulted(); }

 private:
  GpuContext();

  DeviceInfo info_;
  std::unique_ptr<DevicePool> pool_;
  DeviceAllocation cublas_workspace_;
  cublasContext* cublas_ = nullptr;
  LaneSet lanes_;  ///< one lane: launches are serialised
};

}  // namespace attn
