// `fused`: our FlashAttention-2-style tensor-core kernel (kernels/fused): Q tile on chip, K/V
// streamed through shared memory, online softmax, never materialising scores. fp16/bf16, head
// dims 32/64/80/96/128/256, every band mask, GQA/MQA, padded and packed varlen, LSE.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"
#include "backends/gpu_context.h"

namespace attn {

class FusedBackend final : public Backend {
 public:
  /// `gpu` null: unavailable with `unavailable_reason`.
  FusedBackend(std::shared_ptr<GpuContext> gpu, std::string unavailable_reason);
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
  std::string name_ = "fused";
  std::shared_ptr<GpuContext> gpu_;
  std::string unavailable_reason_;
};

}  // namespace attn
