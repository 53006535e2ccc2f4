#include "backends/cudnn_backend.h"

#include "attn/kernels/cudnn_version.h"

namespace attn {

CudnnBackend::CudnnBackend(std::shared_ptr<GpuContext> gpu,
                           std::shared_ptr<kernels::CudnnAttention> cudnn,
                           std::string unavailable_reason)
    : gpu_(std::move(gpu)),
      cudnn_(std::move(cudnn)),
      unavailable_reason_(std::move(unavailable_reason)) {}

BackendCapabilities CudnnBackend::Capabilities() const {
  BackendCapabilities c;
  c.dtypes = {DType::kFloat16, DType::kBFloat16};
  for (int h = 8; h <= 256; h += 8) c.head_dims.push_back(h);  // multiples of 8
  c.max_head_dim = 256;
  c.varlen = true;
  c.gqa = true;
  c.causal = {CausalAlignment::kNone, CausalAlignment::kTopLeft, CausalAlignment::kBottomRight};
  c.window = true;
  c.lse = true;
  c.device = gpu_ ? gpu_->info().name : "none";
  c.description = "cuDNN fused SDPA (cudnn-frontend graph API), head dims multiple of 8";
  if (cudnn_) {
    c.description += "; cuDNN " + kernels::CudnnVersionString(cudnn_->runtime_version()) +
                     " (built with " +
                     kernels::CudnnVersionString(kernels::CudnnAttention::BuildVersion()) + ")";
  }
  return c;
}

Status CudnnBackend::Supports(const AttentionShape& shape) const {
  if (!available()) return FailedPrecondition("cudnn is unavailable: " + unavailable_reason_);
  return cudnn_->Supports(shape, /*fp8=*/false);
}

Status CudnnBackend::Execute(const AttentionShape& shape, const AttentionTensors& host,
                             ExecuteTimes* times) {
  return Run(shape, GpuContext::Io{&host, nullptr}, times);
}

Status CudnnBackend::ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                                   ExecuteTimes* times) {
  return Run(shape, GpuContext::Io{nullptr, &problem}, times);
}

Status CudnnBackend::Run(const AttentionShape& shape, const GpuContext::Io& io,
                         ExecuteTimes* times) {
  if (!available()) return FailedPrecondition("cudnn is unavailable: " + unavailable_reason_);
  auto plan = cudnn_->Plan(shape, /*fp8=*/false);
  if (!plan.ok()) return plan.status();
  const kernels::CudnnPlan& p = *plan;
  kernels::CudnnAttention* cd = cudnn_.get();
  return gpu_->Dispatch(
      shape, io, p.workspace_bytes,
      [&p, cd](const AttentionTensors& dev, void* ws, uint64_t ws_bytes, cublasContext*,
               cudaStream_t stream) {
        return cd->Run(p, dev, kernels::CudnnFp8Inputs{}, ws, ws_bytes, stream);
      },
      times);
}

}  // namespace attn
