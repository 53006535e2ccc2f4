#include "backends/fp8_backend.h"

#include "attn/kernels/fp8_attention.h"
#include "attn/kernels/fp8_quantize.h"
#if defined(ATTN_HAVE_CUDNN)
#include "attn/kernels/cudnn_attention.h"
#endif

namespace attn {
namespace {

uint64_t Up(uint64_t x) { return (x + 255) / 256 * 256; }

}  // namespace

Fp8Backend::Fp8Backend(std::shared_ptr<GpuContext> gpu,
                       std::shared_ptr<kernels::CudnnAttention> cudnn,
                       std::string unavailable_reason)
    : gpu_(std::move(gpu)), cudnn_(std::move(cudnn)) {
  if (!gpu_) {
    unavailable_reason_ = unavailable_reason.empty() ? "no GPU" : unavailable_reason;
    return;
  }
  sm_ = gpu_->info().major * 10 + gpu_->info().minor;
  if (sm_ < 89) {
    unavailable_reason_ = "FP8 (E4M3) tensor cores need sm_89 or newer; this GPU is sm_" +
                          std::to_string(sm_);
  } else if (sm_ >= 90 && !cudnn_) {
    unavailable_reason_ = "on sm_" + std::to_string(sm_) +
                          " fp8 runs cuDNN's FP8 SDPA, and cuDNN is unavailable: " +
                          unavailable_reason;
  }
}

bool Fp8Backend::UseCudnn() const { return sm_ >= 90; }

BackendCapabilities Fp8Backend::Capabilities() const {
  BackendCapabilities c;
  c.dtypes = {DType::kFloat16, DType::kBFloat16};
  c.gqa = true;
  c.lse = true;
  c.device = gpu_ ? gpu_->info().name : "none";
  if (UseCudnn()) {
    for (int h = 16; h <= 256; h += 16) c.head_dims.push_back(h);  // multiples of 16
    c.max_head_dim = 256;
    c.varlen = false;
    c.causal = {CausalAlignment::kNone, CausalAlignment::kTopLeft};
    c.window = true;  // top-left windows only
    c.description =
        "E4M3 (per-tensor amax scales, quantised on the GPU) through cuDNN's FP8 SDPA; output "
        "converted to the request dtype; padded layout; no bottom-right diagonal on Hopper";
  } else {
    c.head_dims = {64, 128};
    c.max_head_dim = 128;
    c.varlen = true;
    c.causal = {CausalAlignment::kNone, CausalAlignment::kTopLeft,
                CausalAlignment::kBottomRight};
    c.window = true;
    c.description =
        "E4M3 (per-tensor amax scales, quantised on the GPU) on our mma.sync m16n8k32 e4m3 "
        "kernel (sm_89), fp32 accumulation";
  }
  return c;
}

Status Fp8Backend::Supports(const AttentionShape& shape) const {
  if (!available()) return FailedPrecondition("fp8 is unavailable: " + unavailable_reason_);
  if (shape.dtype != DType::kFloat16 && shape.dtype != DType::kBFloat16) {
    return FailedPrecondition(std::string("fp8 takes float16 or bfloat16 requests (quantised "
                                          "to E4M3 on the GPU), got ") +
                              kernels::DTypeName(shape.dtype));
  }
#if defined(ATTN_HAVE_CUDNN)
  if (UseCudnn()) return cudnn_->Supports(shape, /*fp8=*/true);
#endif
  // Own kernel: shape.dtype is its output dtype; inputs are quantised first.
  return kernels::Fp8AttentionSupports(shape, sm_ * 10);
}

Status Fp8Backend::Execute(const AttentionShape& shape, const AttentionTensors& host,
                           ExecuteTimes* times) {
  return Run(shape, GpuContext::Io{&host, nullptr}, times);
}

Status Fp8Backend::ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                                 ExecuteTimes* times) {
  return Run(shape, GpuContext::Io{nullptr, &problem}, times);
}

Status Fp8Backend::Run(const AttentionShape& shape, const GpuContext::Io& io, ExecuteTimes* times) {
  ATTN_RETURN_IF_ERROR(Supports(shape));
#if defined(ATTN_HAVE_CUDNN)
  if (UseCudnn()) {
    auto plan = cudnn_->Plan(shape, /*fp8=*/true);
    if (!plan.ok()) return plan.status();
    const kernels::CudnnPlan& p = *plan;
    kernels::CudnnAttention* cd = cudnn_.get();
    kernels::CudnnFp8Inputs in;
    in.out_dtype = shape.dtype;
    return gpu_->Dispatch(
        shape, io, p.workspace_bytes,
        [&p, cd, in](const AttentionTensors& dev, void* ws, uint64_t ws_bytes, cublasContext*,
                     cudaStream_t stream) { return cd->Run(p, dev, in, ws, ws_bytes, stream); },
        times);
  }
#endif
  return ExecuteOwnKernel(shape, io, times);
}

Status Fp8Backend::ExecuteOwnKernel(const AttentionShape& shape, const GpuContext::Io& io,
                                    ExecuteTimes* times) {
  auto plan = kernels::Fp8AttentionPlanFor(shape, gpu_->info().index);
  if (!plan.ok()) return plan.status();
  const kernels::Fp8AttentionPlan& p = *plan;
  // Workspace: q8 | k8 | v8 | 9 scalars (scale, descale, amax per tensor) | kernel workspace.
  const uint64_t q8 = 0, k8 = Up(shape.q_elements()), v8 = k8 + Up(shape.kv_elements()),
                 sc = v8 + Up(shape.kv_elements()), kw = sc + Up(9 * sizeof(float)),
                 total = kw + Up(static_cast<uint64_t>(p.workspace_bytes));
  return gpu_->Dispatch(
      shape, io, total,
      [&](const AttentionTensors& dev, void* ws, uint64_t, cublasContext*, cudaStream_t stream) {
        char* w = static_cast<char*>(ws);
        float* s = reinterpret_cast<float*>(w + sc);
        ATTN_RETURN_IF_ERROR(kernels::Fp8QuantizePerTensor(dev.q, shape.dtype, shape.q_elements(),
                                                           w + q8, s + 0, s + 1, s + 2, stream));
        ATTN_RETURN_IF_ERROR(kernels::Fp8QuantizePerTensor(
            dev.k, shape.dtype, shape.kv_elements(), w + k8, s + 3, s + 4, s + 5, stream));
        ATTN_RETURN_IF_ERROR(kernels::Fp8QuantizePerTensor(
            dev.v, shape.dtype, shape.kv_elements(), w + v8, s + 6, s + 7, s + 8, stream));
        AttentionTensors t = dev;
        t.q = w + q8;
        t.k = w + k8;
        t.v = w + v8;
        kernels::Fp8Descales d{s + 1, s + 4, s + 7};
        return kernels::Fp8AttentionRun(p, t, d, w + kw, p.workspace_bytes, stream);
      },
      times);
}

}  // namespace attn
