#include "backends/fp8_backend.h"

#include "attn/kernels/fp8_attention.h"
#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/int8_attention.h"
#include "attn/kernels/int8_prepass.h"
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

Fp8Backend::Route Fp8Backend::RouteFor(const AttentionShape& shape) const {
  using kernels::Fp8PvFormat;
  using kernels::Fp8QkFormat;
  Route r;
  if (shape.dtype == DType::kFloat8E4M3) {  // client-quantised, per tensor (the validator
    r.path = Path::kCudnn;                   // refused the INT8 and 16-bit formats for it)
    return r;
  }
  Fp8QkFormat qk = shape.fp8.qk;
  if (qk == Fp8QkFormat::kAuto) {
    qk = (UseCudnn() && shape.fp8.pv != Fp8PvFormat::k16Bit) ? Fp8QkFormat::kE4M3PerTensor
                                                              : Fp8QkFormat::kInt8PerToken;
  }
  if (qk == Fp8QkFormat::kE4M3PerTensor) {
    r.path = UseCudnn() ? Path::kCudnn : Path::kOwnE4M3;
    return r;
  }
  r.path = Path::kInt8;
  // Auto P·V: E4M3 where the e4m3 MMA is native (sm_89), 16-bit where it is emulated (sm_90).
  const bool e4m3_pv = shape.fp8.pv == Fp8PvFormat::kE4M3 ||
                       (shape.fp8.pv == Fp8PvFormat::kAuto && !UseCudnn());
  r.pv = e4m3_pv ? kernels::Int8PvFormat::kE4M3 : kernels::Int8PvFormat::k16Bit;
  return r;
}

std::string Fp8Backend::Recipe(const AttentionShape& shape) const {
  if (shape.dtype == DType::kFloat8E4M3) return "e4m3 per-tensor, client-quantised";
  const Route r = RouteFor(shape);
  if (r.path == Path::kInt8) return kernels::Int8RecipeName(shape.fp8, r.pv);
  return kernels::Fp8RecipeName(shape.fp8);
}

BackendCapabilities Fp8Backend::Capabilities() const {
  BackendCapabilities c;
  c.dtypes = {DType::kFloat16, DType::kBFloat16};
  if (UseCudnn()) c.dtypes.push_back(DType::kFloat8E4M3);
  c.gqa = true;
  c.lse = true;
  c.device = gpu_ ? gpu_->info().name : "none";
  for (const bool rotate : {true, false}) {
    for (const bool smooth_k : {true, false}) {
      kernels::Fp8Options o;
      o.rotate = rotate;
      o.smooth_k = smooth_k;
      c.recipes.push_back(kernels::Fp8RecipeName(o));
    }
  }
  for (const bool rotate : {true, false}) {
    for (const bool smooth_k : {true, false}) {
      kernels::Fp8Options o;
      o.rotate = rotate;
      o.smooth_k = smooth_k;
      c.recipes.push_back(kernels::Int8RecipeName(o, kernels::Int8PvFormat::kE4M3));
      c.recipes.push_back(kernels::Int8RecipeName(o, kernels::Int8PvFormat::k16Bit));
    }
  }
  if (UseCudnn()) c.recipes.push_back("e4m3 per-tensor, client-quantised");
  if (UseCudnn()) {
    for (int h = 16; h <= 256; h += 16) c.head_dims.push_back(h);  // multiples of 16
    c.max_head_dim = 256;
    c.varlen = false;
    c.causal = {CausalAlignment::kNone, CausalAlignment::kTopLeft};
    c.window = true;  // top-left windows only
    c.description =
        "E4M3 through cuDNN's FP8 SDPA: fp16/bf16 inputs quantised on the GPU with per-tensor "
        "scales over valid positions, Hadamard-rotated q/k and smoothed k by default "
        "(AttendRequest.fp8 turns them off), output converted to the request dtype; "
        "FLOAT8_E4M3 inputs as given, o in E4M3 with v's scale; padded layout; no bottom-right "
        "diagonal on Hopper. AttendRequest.fp8.qk_format QK_INT8_PER_TOKEN runs our kernel "
        "instead (INT8 per-token q/k on the native s8 mma.sync, 16-bit P·V by default; head "
        "dims 64 and 128, varlen and every mask)";
  } else {
    c.head_dims = {64, 128};
    c.max_head_dim = 128;
    c.varlen = true;
    c.causal = {CausalAlignment::kNone, CausalAlignment::kTopLeft,
                CausalAlignment::kBottomRight};
    c.window = true;
    c.description =
        "Our 8-bit kernel (sm_89), fp32 accumulation: by default INT8 per-token q/k "
        "(mma.sync s8) and E4M3 P·V (mma.sync e4m3), fp16/bf16 inputs quantised on the GPU, "
        "Hadamard-rotated q/k and smoothed k (AttendRequest.fp8 turns them off, and chooses "
        "per-tensor E4M3 Q·Kᵀ or 16-bit P·V); FLOAT8_E4M3 inputs are refused here (cuDNN path "
        "only)";
  }
  return c;
}

Status Fp8Backend::Supports(const AttentionShape& shape) const {
  if (!available()) return FailedPrecondition("fp8 is unavailable: " + unavailable_reason_);
  const bool e4m3_in = shape.dtype == DType::kFloat8E4M3;
  if (e4m3_in && !UseCudnn()) {
    return FailedPrecondition("fp8 takes FLOAT8_E4M3 requests on sm_90 and newer (cuDNN's FP8 "
                              "SDPA) only; on sm_" + std::to_string(sm_) +
                              " send float16 or bfloat16 (quantised to E4M3 on the GPU)");
  }
  if (!e4m3_in && shape.dtype != DType::kFloat16 && shape.dtype != DType::kBFloat16) {
    return FailedPrecondition(std::string("fp8 takes float16 or bfloat16 requests (quantised "
                                          "to E4M3 on the GPU) or FLOAT8_E4M3, got ") +
                              kernels::DTypeName(shape.dtype));
  }
  if (!e4m3_in && (kernels::Fp8HadamardOrder(shape.head_dim) == 0 || shape.head_dim > 256)) {
    return FailedPrecondition("fp8 quantises head dims that are multiples of 8 up to 256, got " +
                              std::to_string(shape.head_dim));
  }
  const Route r = RouteFor(shape);
  if (r.path == Path::kInt8) return kernels::Int8AttentionSupports(shape, r.pv, sm_ * 10);
#if defined(ATTN_HAVE_CUDNN)
  if (r.path == Path::kCudnn) return cudnn_->Supports(shape, /*fp8=*/true);
#endif
  // Own e4m3 kernel: shape.dtype is its output dtype; inputs are quantised first.
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
  const Route route = RouteFor(shape);
  if (route.path == Path::kInt8) return ExecuteInt8(shape, route.pv, io, times);
#if defined(ATTN_HAVE_CUDNN)
  if (route.path == Path::kCudnn) {
    auto plan = cudnn_->Plan(shape, /*fp8=*/true);
    if (!plan.ok()) return plan.status();
    const kernels::CudnnPlan& p = *plan;
    kernels::CudnnAttention* cd = cudnn_.get();
    kernels::CudnnFp8Inputs in;
    in.out_dtype = shape.dtype;  // E4M3 inputs: o in E4M3 too, with v's scale
    in.q_descale = shape.fp8.q_descale;
    in.k_descale = shape.fp8.k_descale;
    in.v_descale = shape.fp8.v_descale;
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
  // Workspace: q8 | k8 | v8 | 9 scalars (Fp8Scalar order) | pre-pass | kernel workspace.
  const uint64_t q8 = 0, k8 = Up(shape.q_elements()), v8 = k8 + Up(shape.kv_elements()),
                 sc = v8 + Up(shape.kv_elements()),
                 pw = sc + Up(kernels::kFp8NumScalars * sizeof(float)),
                 pw_bytes = Up(static_cast<uint64_t>(kernels::Fp8PrepassWorkspaceBytes(shape))),
                 kw = pw + pw_bytes, total = kw + Up(static_cast<uint64_t>(p.workspace_bytes));
  return gpu_->Dispatch(
      shape, io, total,
      [&](const AttentionTensors& dev, void* ws, uint64_t, cublasContext*, cudaStream_t stream) {
        char* w = static_cast<char*>(ws);
        float* s = reinterpret_cast<float*>(w + sc);
        ATTN_RETURN_IF_ERROR(kernels::Fp8Prepass(shape, dev, w + q8, w + k8, w + v8, s, w + pw,
                                                 static_cast<int64_t>(pw_bytes), stream));
        AttentionTensors t = dev;
        t.q = w + q8;
        t.k = w + k8;
        t.v = w + v8;
        kernels::Fp8Descales d{s + kernels::kFp8DescaleQ, s + kernels::kFp8DescaleK,
                               s + kernels::kFp8DescaleV};
        ATTN_RETURN_IF_ERROR(kernels::Fp8AttentionRun(p, t, d, w + kw, p.workspace_bytes, stream));
        return kernels::Fp8PrepassLseShift(shape, dev, w + pw, stream);
      },
      times);
}

Status Fp8Backend::ExecuteInt8(const AttentionShape& shape, kernels::Int8PvFormat pv,
                               const GpuContext::Io& io, ExecuteTimes* times) {
  kernels::Int8AttentionPlanOptions options;
  options.pv = pv;
  auto plan = kernels::Int8AttentionPlanFor(shape, gpu_->info().index, options);
  if (!plan.ok()) return plan.status();
  const kernels::Int8AttentionPlan& p = *plan;
  const bool e4m3_pv = pv == kernels::Int8PvFormat::kE4M3;
  // Workspace: q8 | k8 | q scales | k scales | v8 and V's 3 scalars (E4M3 P·V) | pre-pass |
  // kernel workspace (Vᵀ for E4M3 P·V).
  const uint64_t kv = static_cast<uint64_t>(shape.kv_elements());
  const uint64_t q8 = 0, k8 = Up(shape.q_elements()), qs = k8 + Up(kv),
                 ks = qs + Up(4 * static_cast<uint64_t>(shape.q_rows() * shape.num_heads)),
                 v8 = ks + Up(4 * static_cast<uint64_t>(shape.kv_rows() * shape.num_kv_heads)),
                 vs = v8 + (e4m3_pv ? Up(kv) : 0), pw = vs + (e4m3_pv ? Up(3 * sizeof(float)) : 0),
                 pw_bytes = Up(static_cast<uint64_t>(kernels::Int8PrepassWorkspaceBytes(shape))),
                 kw = pw + pw_bytes, total = kw + Up(static_cast<uint64_t>(p.workspace_bytes));
  return gpu_->Dispatch(
      shape, io, total,
      [&](const AttentionTensors& dev, void* ws, uint64_t, cublasContext*, cudaStream_t stream) {
        char* w = static_cast<char*>(ws);
        kernels::Int8PrepassOutputs out;
        out.q8 = reinterpret_cast<int8_t*>(w + q8);
        out.k8 = reinterpret_cast<int8_t*>(w + k8);
        out.q_scale = reinterpret_cast<float*>(w + qs);
        out.k_scale = reinterpret_cast<float*>(w + ks);
        if (e4m3_pv) {
          out.v8 = reinterpret_cast<uint8_t*>(w + v8);
          out.v_scalars = reinterpret_cast<float*>(w + vs);
        }
        ATTN_RETURN_IF_ERROR(kernels::Int8Prepass(shape, dev, pv, out, w + pw,
                                                  static_cast<int64_t>(pw_bytes), stream));
        AttentionTensors t = dev;
        t.q = out.q8;
        t.k = out.k8;
        if (e4m3_pv) t.v = out.v8;
        kernels::Int8Scales sc{out.q_scale, out.k_scale, e4m3_pv ? out.v_scalars + 1 : nullptr};
        ATTN_RETURN_IF_ERROR(
            kernels::Int8AttentionRun(p, t, sc, w + kw, p.workspace_bytes, stream));
        return kernels::Fp8PrepassLseShift(shape, dev, w + pw, stream);
      },
      times);
}

}  // namespace attn
