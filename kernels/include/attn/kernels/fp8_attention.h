// Our own FP8 (E4M3) attention kernel for sm_89+ (DESIGN.md §5: the L4 path of the `fp8`
// backend, where cuDNN has no FP8 attention; it also runs on Hopper through the same mma.sync).
//
//   O = softmax(scale · (q_descale·Q)(k_descale·K)ᵀ + band mask) (v_descale·V)
//
// Q, K, V are E4M3 (OCP FP8, attn/kernels/fp8_quantize.h) with one descale per tensor (device
// floats, e.g. written by Fp8QuantizePerTensor: real value = e4m3 value × descale). Both
// matrix products run on mma.sync.m16n8k32 e4m3 tensor cores with fp32 accumulation; softmax is
// online in fp32 (exp2 domain); P is re-quantised to E4M3 as 448·exp(logit − running max) for
// the P·V product (fp8_params.h explains the 448). The output is bf16 or fp16.
//
// Problem and layouts (attention_problem.h), device memory, row-major, bytes = elements for e4m3:
//   kPadded: q (B, T, N, H) e4m3   k, v (B, S, K, H) e4m3   o (B, T, N, H) shape.dtype
//            lse (B, N, T) float32; q_lengths, kv_lengths (B) int32 or null (full extents),
//            read only when shape.has_lengths, clamped to [0, T] and [0, S].
//   kVarlen: q (total_q, N, H)   k, v (total_kv, K, H)   o (total_q, N, H)   lse (N, total_q)
//            q_offsets, kv_offsets (B+1) int64 exclusive prefix sums (required).
// shape.dtype is the OUTPUT dtype (kFloat16 or kBFloat16); q, k and v are always E4M3.
// Head dims: 64 and 128. Grouped heads: query head h reads kv head h / (N / K).
// Masks: every MaskSpec (top-left / bottom-right causal, sliding windows) via BandKeyRange.
// Padding: query rows past T_b and rows that see no key (also whole query tiles with no valid
//   key) are written as zeros with lse = −inf, as the fused kernel does; keys past S_b are never
//   read. lse is the natural log of the sum of exp of the scaled, masked (dequantised) logits.
// Workspace: V is transposed (with a key permutation) into a caller-provided device workspace
//   of Fp8AttentionWorkspaceBytes(shape) bytes by a pre-pass on the same stream (V read once, Vᵀ written
//   once: 2·|V| extra bytes per call, vs re-transposing every V tile in shared memory in every
//   query block, T/128·N/K times per tile, in the tensor-core loop). 16-byte aligned.
//
// Accuracy (tests/gpu/fp8_parity_test.cc, H200): relative L2 error vs float64 of the
//   unquantised bf16/fp16 inputs median 0.044, max 0.066 on N(0,1) inputs (E4M3's rounding of
//   q, k, v dominates); 0.018 / 0.025 on inputs exactly representable in E4M3 (the kernel's own
//   error: P in E4M3). Inputs with a few ×20 head-dim channels give 0.3-0.57: E4M3's 2^-4
//   relative precision on logits of std ~60 (any per-tensor FP8 path, cuDNN's included).
// Speed: sm_89 (L4) runs native e4m3 MMAs (SASS QMMA). sm_90 has no e4m3 mma.sync: ptxas lowers
//   it to f16 HMMAs plus conversions, so on Hopper this kernel runs at ~0.7× of the bf16 fused
//   kernel (bench/NOTES.md "FP8 kernel"); the `fp8` backend uses cuDNN there.
//
// Thread-safety: Fp8AttentionSupports and Fp8AttentionWorkspaceBytes are pure. Fp8AttentionPlanFor touches the CUDA
// runtime (attributes, cudaFuncSetAttribute on `device`) and is safe to call concurrently.
// Fp8AttentionRun may be called concurrently on any streams with the same plan and distinct workspaces.
// Built only when ATTN_CUDA is on.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn::kernels {

/// Device pointers to the per-tensor descales (one float each, device memory):
/// real = e4m3 value × descale. All three required.
struct Fp8Descales {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
};

/// Optional knobs for Fp8AttentionPlanFor.
struct Fp8AttentionPlanOptions {
  /// -1: the default tile variant for the shape; otherwise an index into the variants of this
  /// head dim (Fp8AttentionVariantCount), for benchmarks and tests.
  int variant = -1;
};

/// Host-side decisions for one AttentionShape on one device. A value type: cache it by shape.
struct Fp8AttentionPlan {
  AttentionShape shape;
  int device = 0;
  int variant = 0;
  int block_m = 0;        ///< query rows per block
  int block_n = 0;        ///< keys per K/Vᵀ tile
  int warps = 0;
  int smem_bytes = 0;     ///< dynamic shared memory per block
  int64_t grid_x = 0;     ///< ceil(T / block_m)
  int64_t grid_y = 0;     ///< N
  int64_t grid_z = 0;     ///< B
  int64_t workspace_bytes = 0;  ///< Fp8AttentionWorkspaceBytes(shape)
  const void* launch = nullptr;     ///< internal (opaque)
  const void* transpose = nullptr;  ///< internal (opaque)
  /// "fp8 h128 v0 bm128 bn128 w8 smem81920" for reports.
  std::string Describe() const;
};

/// Ok if this kernel can compute `shape` on a device of `compute_capability` (major*100 +
/// minor*10, e.g. 890 for an L4, 900 for an H200; 0 skips the device check); otherwise why not:
///   FAILED_PRECONDITION: output dtype other than kFloat16/kBFloat16; head dim other than 64 or
///     128 (the e4m3 MMA's k is 32 and the tiles are 64-byte rows; other head dims are not
///     instantiated); compute capability below 8.9 (no e4m3 tensor-core MMA); a scale that is
///     not positive and finite.
///   INVALID_ARGUMENT: non-positive heads or head dim, N % K != 0, negative sizes, B or N above
///     65535 (grid limits), K above 65535, T or S at or above 2^30, unknown layout.
Status Fp8AttentionSupports(const AttentionShape& shape, int compute_capability = 0);

/// Bytes of the Vᵀ workspace Fp8AttentionRun needs for `shape` (0 for an empty problem):
///   K · H · (padded: B · roundup(S, 128); varlen: roundup(total_kv, 16) + 144 · B).
int64_t Fp8AttentionWorkspaceBytes(const AttentionShape& shape);

/// Number of tile variants compiled for `head_dim` (0 when unsupported).
int Fp8AttentionVariantCount(int64_t head_dim);

/// Chooses the tile variant, grid and shared memory for `shape` on CUDA device `device`, and
/// raises the kernel's dynamic shared memory limit there. Errors: those of Fp8AttentionSupports (with
/// the device's compute capability); UNAVAILABLE without a CUDA device; FAILED_PRECONDITION
/// when the device has no kernel image or its (possibly L4-emulated) shared memory per block is
/// below the variant's need (both numbers named); INVALID_ARGUMENT for an out-of-range
/// options.variant; INTERNAL naming the cudaError_t of a failed runtime call.
StatusOr<Fp8AttentionPlan> Fp8AttentionPlanFor(const AttentionShape& shape, int device,
                             const Fp8AttentionPlanOptions& options = {});

/// Enqueues the Vᵀ pre-pass and the attention kernel on `stream` (which must belong to
/// plan.device): no allocation, no synchronisation, graph-capturable. `device_tensors`: q, k, v
/// (e4m3) and o (plan.shape.dtype) non-null and 16-byte aligned, layouts above; lse non-null iff
/// plan.shape.return_lse; offsets non-null for varlen. `descales`: three device floats.
/// `workspace`: at least plan.workspace_bytes bytes of device memory, 16-byte aligned, owned by
/// the caller, not used by anything else until the kernel has finished. o (every row < T padded,
/// every row < total_q varlen) and lse are fully overwritten; inputs are only read.
/// Errors: INVALID_ARGUMENT for missing or misaligned pointers or a workspace smaller than
/// plan.workspace_bytes (both sizes named); INTERNAL naming the cudaError_t of a failed launch.
/// An empty problem (B, T or N zero) enqueues nothing and returns Ok.
Status Fp8AttentionRun(const Fp8AttentionPlan& plan, const AttentionTensors& device_tensors,
              const Fp8Descales& descales, void* workspace, int64_t workspace_bytes,
              cudaStream_t stream);

}  // namespace attn::kernels
