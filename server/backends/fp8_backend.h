// `fp8`: attention with E4M3 inputs and fp32 accumulation, output in the request's dtype
// (DESIGN.md §5). fp16/bf16 q, k, v are quantised on the GPU by the accuracy pre-pass
// (kernels/include/attn/kernels/fp8_prepass.h: per-tensor scales from the amax over valid
// positions, K smoothing and a Hadamard rotation of q and k unless the request turns them off),
// counted in the kernel time. FLOAT8_E4M3 requests (the client quantised, Tensor.scale the
// descales) run on the cuDNN path as given and get o back in E4M3 with v's scale.
//   sm_90 and newer: cuDNN's FP8 SDPA (kernels/cudnn, CudnnGraphKind::kFp8); padded layouts;
//     Hopper has no bottom-right diagonal in FP8 (refused by Supports with the reason).
//   sm_89 (L4): our own e4m3 mma.sync kernel (kernels/fp8, Fp8AttentionRun).
// Error against float64, measured on an H200 (cuDNN 9.19 path): 0.050-0.060 relative L2 on random
// normal inputs (E4M3 keeps 3 mantissa bits, and cuDNN on Hopper writes O in E4M3: DESIGN.md §4's
// 6e-2 is met only just, one T=4096 H=128 shape measured 0.0601); 0.25-0.41 on the
// outlier-channel set (×20 channels in q/k: logits of O(100) move by units). Requests that need
// the bf16 tolerance should not use fp8 (auto never picks it: it fails the bf16 parity check).
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"
#include "attn/kernels/int8_prepass.h"  // Int8PvFormat
#include "backends/gpu_context.h"

namespace attn {
namespace kernels {
class CudnnAttention;
}

class Fp8Backend final : public Backend {
 public:
  /// `gpu` null: unavailable with `unavailable_reason`. `cudnn` may be null (no cuDNN): then
  /// sm_90 devices report why, while sm_89 devices still use the own kernel.
  Fp8Backend(std::shared_ptr<GpuContext> gpu, std::shared_ptr<kernels::CudnnAttention> cudnn,
             std::string unavailable_reason);
  const std::string& name() const override { return name_; }
  BackendCapabilities Capabilities() const override;
  bool available() const override { return unavailable_reason_.empty(); }
  std::string unavailable_reason() const override { return unavailable_reason_; }
  /// Never coalesced: the per-tensor quantisation scales come from the amax of the whole launch,
  /// so a call packed with others would get a different result than alone.
  bool coalescable() const override { return false; }
  /// Fp8RecipeName(shape.fp8) for fp16/bf16 inputs (attn/kernels/fp8_prepass.h), "e4m3
  /// per-tensor, client-quantised" for FLOAT8_E4M3 inputs.
  std::string Recipe(const AttentionShape& shape) const override;
  Status Supports(const AttentionShape& shape) const override;
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 ExecuteTimes* times) override;
  /// The same, the inputs packed straight into the lane's pinned staging
  /// (GpuContext::ExecuteStaged). The batcher never calls it (coalescable() is false).
  Status ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                       ExecuteTimes* times) override;

 private:
  bool UseCudnn() const;
  /// Which kernel runs a request: cuDNN's FP8 SDPA, our per-tensor e4m3 kernel, or our INT8
  /// Q·Kᵀ kernel with its P·V format (AttendRequest.fp8's formats, kAuto resolved per device).
  enum class Path { kCudnn, kOwnE4M3, kInt8 };
  struct Route {
    Path path = Path::kCudnn;
    kernels::Int8PvFormat pv = kernels::Int8PvFormat::kE4M3;
  };
  Route RouteFor(const AttentionShape& shape) const;
  /// Execute's and ExecuteStaged's body: cuDNN's FP8 SDPA or ExecuteOwnKernel, through
  /// GpuContext::Dispatch with `io`.
  Status Run(const AttentionShape& shape, const GpuContext::Io& io, ExecuteTimes* times);
  Status ExecuteOwnKernel(const AttentionShape& shape, const GpuContext::Io& io,
                          ExecuteTimes* times);
  /// Int8Prepass, Int8AttentionRun, and the lse's smoothing shift undone.
  Status ExecuteInt8(const AttentionShape& shape, kernels::Int8PvFormat pv,
                     const GpuContext::Io& io, ExecuteTimes* times);

  std::string name_ = "fp8";
  std::shared_ptr<GpuContext> gpu_;
  std::shared_ptr<kernels::CudnnAttention> cudnn_;
  std::string unavailable_reason_;
  int sm_ = 0;  ///< major*10 + minor
};

}  // namespace attn
