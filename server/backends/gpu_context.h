// Shared GPU state for the stateless CUDA backends: the opened device (device/gpu_device.h), its
// memory pool, one lane (device/lane.h: a stream, its events, a pinned host staging buffer and
// the fault latch) and a cuBLAS handle on the lane's stream whose workspace comes from the pool.
//
// Execute() runs one problem as one round trip on the lane: carves q/k/v/o/lse/lengths/offsets
// and the kernel's workspace from the pool, copies inputs host→device through the pinned
// buffer (inputs that do not fit it are copied from where they are), calls the family's
// enqueue-only run function between CUDA events, copies outputs back and reports the time of
// each phase from the events. Launches are serialised on the one lane (batching of concurrent
// calls is the batcher's job). ExecuteStaged (Backend::ExecuteStaged of the GPU backends) lets
// the caller pack its inputs straight into the held lane's pinned staging and read the outputs
// where the download left them, so a coalesced Attend costs one host copy each way.
// Thread-safety: Execute and ExecuteStaged are thread-safe (internally serialised).
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

  /// Backend::ExecuteStaged on the lane: holds it, lets `problem.pack` write q, k and v
  /// straight into its pinned staging (q at offset 0, k and v after it, each 256-byte
  /// aligned), runs ExecuteHeld (the index arrays are bounced through staging after v, as
  /// Execute does), then `problem.unpack` reads o at staging offset 0 and lse after it (where
  /// the download left them, over the inputs' bytes, which are uploaded by then) before the
  /// lane is released. A problem whose inputs (q, k, v) or outputs (o, lse) do not fit the
  /// staging, or a lane without staging, takes the host-vector path (ExecuteStagedOnHost over
  /// Execute). problem.should_stop is not asked (a launch is not interrupted). Errors as
  /// Execute (INTERNAL at once, before packing, when the context is faulted); `unpack` is not
  /// called on error.
  Status ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                       uint64_t workspace_bytes, const RunFn& run, ExecuteTimes* times);

  /// Where one call's tensors are, for the GPU backends' one Execute/ExecuteStaged body:
  /// exactly one of `host` (Execute) and `staged` (ExecuteStaged) is set.
  struct Io {
    const AttentionTensors* host = nullptr;
    const StagedProblem* staged = nullptr;
  };
  /// ExecuteStaged when io.staged is set, else Execute with *io.host. Errors as those.
  Status Dispatch(const AttentionShape& shape, const Io& io, uint64_t workspace_bytes,
                  const RunFn& run, ExecuteTimes* times) {
    return io.staged != nullptr ? ExecuteStaged(shape, *io.staged, workspace_bytes, run, times)
                                : Execute(shape, *io.host, workspace_bytes, run, times);
  }

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
