// `fp8`: 8-bit attention with fp32 accumulation, output in the request's dtype (DESIGN.md §5;
// docs/fp8.md). fp16/bf16 q, k, v are quantised on the GPU by a pre-pass counted in the kernel
// time (statistics over valid positions, a Hadamard rotation of q and k and K smoothing unless
// AttendRequest.fp8 turns them off). Three routes (RouteFor), by AttendRequest.fp8's formats:
//   cuDNN's FP8 SDPA (kernels/cudnn, CudnnGraphKind::kFp8), per-tensor E4M3 (Fp8Prepass):
//     sm_90's default; padded layouts; Hopper has no bottom-right diagonal in FP8 (refused by
//     Supports with the reason). FLOAT8_E4M3 requests (the client quantised, Tensor.scale the
//     descales) run here as given and get o back in E4M3 with v's scale.
//   our e4m3 kernel (Fp8AttentionRun), per-tensor E4M3: sm_89 with QK_E4M3_PER_TENSOR.
//   our INT8 Q·Kᵀ kernel (Int8Prepass + Int8AttentionRun), per-token INT8 q/k and E4M3 or
//     16-bit P·V: sm_89's default (E4M3 P·V) and sm_90 with QK_INT8_PER_TOKEN (16-bit P·V
//     unless PV_E4M3: e4m3 mma.sync is emulated on Hopper).
// Error against float64 (H200, docs/fp8.md): cuDNN route 0.05-0.06 relative L2 on normal
// inputs, up to 0.12-0.15 on ×20 outlier channels; INT8 route 0.028-0.037 (E4M3 P·V) and
// 0.007-0.015 (16-bit P·V) on normal, outlier and key-bias inputs. Requests that need the bf16
// tolerance should not use fp8 (auto never picks it: it fails the bf16 parity check).
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
