// `cudnn`: cuDNN's fused SDPA through the cudnn-frontend graph API (kernels/cudnn): fp16/bf16,
// head dims multiple of 8 up to 256, every band mask (alignment + window, set explicitly), GQA/MQA,
// padded (lengths as runtime tensors) and packed varlen (ragged offsets), LSE. Graphs are cached
// by a bucketed signature; `--cudnn-warmup` builds common buckets at start, and
// GetServerInfo/metrics report the cache counters (request-path builds reach 0 after warm-up).
// Workspaces come from the server's device pool (GpuContext); nothing is allocated with
// cudaMalloc on the request path.
#pragma once

#include <memory>
#include <string>

#include "attn/kernels/cudnn_attention.h"
#include "backends/backend.h"
#include "backends/gpu_context.h"

namespace attn {

class CudnnBackend final : public Backend {
 public:
  /// `cudnn` or `gpu` null: unavailable with `unavailable_reason`.
  CudnnBackend(std::shared_ptr<GpuContext> gpu, std::shared_ptr<kernels::CudnnAttention> cudnn,
               std::string unavailable_reason);
  const std::string& name() const override { return name_; }
  BackendCapabilities Capabilities() const override;
  bool available() const override { return gpu_ != nullptr && cudnn_ != nullptr; }
  std::string unavailable_reason() const override { return unavailable_reason_; }
  /// Pure checks plus cuDNN's own validation of the graph (cached per bucket).
  Status Supports(const AttentionShape& shape) const override;
  /// Plans (a cache miss builds the graph, counted as a request-path build), then runs through
  /// GpuContext with the plan's workspace from the pool.
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 ExecuteTimes* times) override;
  /// The same, the inputs packed straight into the lane's pinned staging
  /// (GpuContext::ExecuteStaged).
  Status ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                       ExecuteTimes* times) override;

 private:
  /// Execute's and ExecuteStaged's body: plan, then GpuContext::Dispatch with `io`.
  Status Run(const AttentionShape& shape, const GpuContext::Io& io, ExecuteTimes* times);
  std::string name_ = "cudnn";
  std::shared_ptr<GpuContext> gpu_;
  std::shared_ptr<kernels::CudnnAttention> cudnn_;
  std::string unavailable_reason_;
};

}  // namespace attn
