// `naive`: the baseline every tutorial starts from (kernels/naive): cuBLAS GEMM for scale·QKᵀ
// into fp32 scores, a mask+softmax kernel, cuBLAS GEMM for PV. Materialises the (T,S) scores
// per (batch entry, head); problems whose scores exceed the workspace budget are chunked over
// (batch entry, kv-head group), or refused with RESOURCE_EXHAUSTED. Padded layout only.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"
#include "backends/gpu_context.h"

namespace attn {

class NaiveBackend final : public Backend {
 public:
  /// `gpu` may be null (no device): the backend then reports itself unavailable with
  /// `unavailable_reason`. `workspace_limit_bytes` caps the scores workspace of one call.
  NaiveBackend(std::shared_ptr<GpuContext> gpu, std::string unavailable_reason,
               uint64_t workspace_limit_bytes);
  const std::string& name() const override { return name_; }
  BackendCapabilities Capabilities() const override;
  bool available() const override { return gpu_ != nullptr; }
  std::string unavailable_reason() const override { return unavailable_reason_; }
  Status Supports(const AttentionShape& shape) const override;
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 ExecuteTimes* times) override;
  /// The inputs packed straight into the lane's pinned staging (GpuContext::ExecuteStaged).
  Status ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                       ExecuteTimes* times) override;

 private:
  /// Execute's and ExecuteStaged's body: plan, then GpuContext::Dispatch with `io`.
  Status Run(const AttentionShape& shape, const GpuContext::Io& io, ExecuteTimes* times);
  std::string name_ = "naive";
  std::shared_ptr<GpuContext> gpu_;
  std::string unavailable_reason_;
  uint64_t workspace_limit_bytes_;
};

}  // namespace attn
