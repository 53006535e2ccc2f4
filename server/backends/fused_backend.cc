#include "backends/fused_backend.h"

#include "attn/kernels/fused_attention.h"

namespace attn {

FusedBackend::FusedBackend(std::shared_ptr<GpuContext> gpu, std::string unavailable_reason)
    : gpu_(std::move(gpu)), unavailable_reason_(std::move(unavailable_reason)) {}

BackendCapabilities FusedBackend::Capabilities() const {
  BackendCapabilities c;
  c.dtypes = {DType::kFloat16, DType::kBFloat16};
  c.head_dims = {32, 64, 80, 96, 128, 256};
  c.max_head_dim = 256;
  c.varlen = true;
  c.gqa = true;
  c.causal = {CausalAlignment::kNone, CausalAlignment::kTopLeft, CausalAlignment::kBottomRight};
  c.window = true;
  c.lse = true;
  c.device = gpu_ ? gpu_->info().name : "none";
  c.description =
      "FlashAttention-2 algorithm: mma.sync tensor cores, cp.async double buffering, "
      "online softmax";
  return c;
}

Status FusedBackend::Supports(const AttentionShape& shape) const {
  return kernels::FusedSupports(shape);
}

Status FusedBackend::Execute(const AttentionShape& shape, const AttentionTensors& host,
                             ExecuteTimes* times) {
  return Run(shape, GpuContext::Io{&host, nullptr}, times);
}

Status FusedBackend::ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                                   ExecuteTimes* times) {
  return Run(shape, GpuContext::Io{nullptr, &problem}, times);
}

Status FusedBackend::Run(const AttentionShape& shape, const GpuContext::Io& io,
                         ExecuteTimes* times) {
  if (!gpu_) return FailedPrecondition("fused is unavailable: " + unavailable_reason_);
  auto plan = kernels::FusedPlanFor(shape, gpu_->info().index);
  if (!plan.ok()) return plan.status();
  const kernels::FusedPlan& p = *plan;
  return gpu_->Dispatch(
      shape, io, /*workspace_bytes=*/0,
      [&p](const AttentionTensors& dev, void*, uint64_t, cublasContext*, cudaStream_t stream) {
        return kernels::FusedRun(p, dev, stream);
      },
      times);
}

}  // namespace attn
