#include "backends/naive_backend.h"

#include <cublas_v2.h>

#include "attn/kernels/naive_attention.h"

namespace attn {

NaiveBackend::NaiveBackend(std::shared_ptr<GpuContext> gpu, std::string unavailable_reason,
                           uint64_t workspace_limit_bytes)
    : gpu_(std::move(gpu)),
      unavailable_reason_(std::move(unavailable_reason)),
      workspace_limit_bytes_(workspace_limit_bytes) {}

BackendCapabilities NaiveBackend::Capabilities() const {
  BackendCapabilities c;
  c.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  c.max_head_dim = 1024;
  c.varlen = false;
  c.gqa = true;
  c.causal = {CausalAlignment::kNone, CausalAlignment::kTopLeft, CausalAlignment::kBottomRight};
  c.window = true;
  c.lse = true;
  c.device = gpu_ ? gpu_->info().name : "none";
  c.description =
      "cuBLAS GEMM + mask/softmax kernel + cuBLAS GEMM; materialises scores (padded only)";
  return c;
}

Status NaiveBackend::Supports(const AttentionShape& shape) const {
  ATTN_RETURN_IF_ERROR(kernels::NaiveSupports(shape));
  auto plan = kernels::NaivePlanFor(shape, workspace_limit_bytes_);
  return plan.ok() ? Status::Ok() : plan.status();
}

Status NaiveBackend::Execute(const AttentionShape& shape, const AttentionTensors& host,
                             ExecuteTimes* times) {
  return Run(shape, GpuContext::Io{&host, nullptr}, times);
}

Status NaiveBackend::ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                                   ExecuteTimes* times) {
  return Run(shape, GpuContext::Io{nullptr, &problem}, times);
}

Status NaiveBackend::Run(const AttentionShape& shape, const GpuContext::Io& io,
                         ExecuteTimes* times) {
  if (!gpu_) return FailedPrecondition("naive is unavailable: " + unavailable_reason_);
  auto plan = kernels::NaivePlanFor(shape, workspace_limit_bytes_);
  if (!plan.ok()) return plan.status();
  const kernels::NaivePlan& p = *plan;
  return gpu_->Dispatch(
      shape, io, p.workspace_bytes,
      [&p](const AttentionTensors& dev, void* ws, uint64_t ws_bytes, cublasContext* cublas,
           cudaStream_t stream) {
        return kernels::NaiveRun(p, dev, ws, ws_bytes, cublas, stream);
      },
      times);
}

}  // namespace attn
