// The INT8 Q·Kᵀ path of our 8-bit attention kernel (issue 20; DESIGN.md §5: the sm_89 recipe of
// the `fp8` backend, SageAttention's 8+8 recipe, Zhang et al. 2024). The same kernel as
// attn/kernels/fp8_attention.h (kernels/fp8/fp8_kernel.cuh) in its INT8 modes:
//
//   O = softmax(scale · (diag(q_scale)·Q8)(diag(k_scale)·K8)ᵀ + band mask) · V
//
// Q8, K8 are per-token INT8 with fp32 scales per (token, head), from Int8Prepass
// (attn/kernels/int8_prepass.h: rotation, K smoothing, scale = amax/127). S = Q8·K8ᵀ runs on
// mma.sync.m16n8k32 s8 (int32 accumulation, exact), s_ij = float(acc_ij)·k_scale[j], and the row
// factor q_scale[i]·scale·log2(e) enters the online softmax's exponent (fp32, exp2 domain).
// P·V, chosen by Int8AttentionPlanOptions::pv:
//   kE4M3   P quantised as 448·exp(logit − running max) in E4M3, V per-tensor E4M3 (Int8Prepass's
//           v8 and V descale), transposed into the workspace, mma.sync m16n8k32 e4m3: the fast
//           path on the L4 (native QMMA).
//   k16Bit  P in the input dtype, V read directly from the bf16/fp16 input (no workspace, no V
//           scale), mma.sync m16n8k16 with ldmatrix.trans (the fused kernel's P·V). With per-token
//           Q/K scales nothing per-tensor is left, so with smooth_k off a row's output depends
//           only on the keys it sees, bit for bit (the causal-invariance promise; K smoothing's
//           mean is over every valid key, so it cannot make that promise).
// Both accumulate P·V in fp32 across all key tiles in the MMA accumulators (fp32 adds on
// mma.sync; no second level is needed, unlike Hopper FP8 wgmma).
//
// Layouts (attention_problem.h), device memory, row-major:
//   kPadded: q8 (B, T, N, H) int8   k8 (B, S, K, H) int8   q_scale (B·T, N)  k_scale (B·S, K) fp32
//            v: kE4M3 (B, S, K, H) E4M3 bytes, k16Bit (B, S, K, H) shape.dtype
//            o (B, T, N, H) shape.dtype, lse (B, N, T) fp32; q_lengths, kv_lengths (B) int32 or
//            null (full extents), read only when shape.has_lengths.
//   kVarlen: q8 (total_q, N, H)  k8, v (total_kv, K, H)  q_scale (total_q, N)  k_scale
//            (total_kv, K)  o (total_q, N, H)  lse (N, total_q); q_offsets, kv_offsets (B+1)
//            int64 (required).
// shape.dtype (kFloat16 or kBFloat16) is the dtype of o and, for k16Bit, of v and P.
// Head dims 64 and 128; GQA (N % K == 0); every MaskSpec; lse is that of the scaled logits of
// the kernel's inputs (with smooth_k, Fp8PrepassLseShift adds the smoothing shift back).
// Padding and rows that see no key: zeros, lse = −inf (the fused kernel's convention); keys
// past S_b are never read (their scales are zero-filled), and scales of padding rows are 0.
// Non-finite values: a NaN scale (Int8Prepass's mark of a non-finite q or k row) makes exactly the
// rows that see that key (or that query row) NaN; k16Bit rows that see a non-finite V value are
// NaN, rows that do not see it are untouched. kE4M3's per-tensor V scale has no such isolation.
//
// Thread-safety: Int8AttentionSupports and Int8AttentionWorkspaceBytes are pure;
// Int8AttentionPlanFor touches the CUDA runtime (cudaFuncSetAttribute on `device`) and is safe to
// call concurrently; Int8AttentionRun may be called concurrently on any streams with the same
// plan and distinct workspaces. Built only when ATTN_CUDA is on.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "attn/common/status.h"
#include "attn/kernels/attention_problem.h"
#include "attn/kernels/int8_prepass.h"

namespace attn::kernels {

/// Device pointers to the scales (device memory), as Int8Prepass writes them.
struct Int8Scales {
  const float* q = nullptr;          ///< (q_rows, N) per-token q scales; required
  const float* k = nullptr;          ///< (kv_rows, K) per-token k scales; required
  const float* v_descale = nullptr;  ///< kE4M3 only: one float (Int8PrepassOutputs::v_scalars + 1)
};

/// Optional knobs for Int8AttentionPlanFor.
struct Int8AttentionPlanOptions {
  Int8PvFormat pv = Int8PvFormat::kE4M3;  ///< P·V format (above)
  /// -1: the default tile variant; otherwise an index into the variants of (pv, head dim)
  /// (Int8AttentionVariantCount), for benchmarks and tests.
  int variant = -1;
};

/// Host-side decisions for one AttentionShape on one device. A value type: cache it by shape.
struct Int8AttentionPlan {
  AttentionShape shape;
  int device = 0;
  Int8PvFormat pv = Int8PvFormat::kE4M3;
  int variant = 0;
  int block_m = 0;              ///< query rows per block
  int block_n = 0;              ///< keys per tile
  int warps = 0;
  int smem_bytes = 0;           ///< dynamic shared memory per block
  int64_t grid_x = 0;           ///< ceil(T / block_m)
  int64_t grid_y = 0;           ///< N
  int64_t grid_z = 0;           ///< B
  int64_t workspace_bytes = 0;  ///< Int8AttentionWorkspaceBytes(shape, pv)
  const void* launch = nullptr;     ///< internal (opaque)
  const void* transpose = nullptr;  ///< internal (opaque; kE4M3 only)
  /// "int8 e4m3-pv h128 v0 bm128 bn64 w8 smem49664" for reports.
  std::string Describe() const;
};

/// Ok if the INT8 path can compute `shape` with P·V format `pv` on a device of
/// `compute_capability` (major·100 + minor·10; 0 skips the device check); otherwise why not:
///   FAILED_PRECONDITION: dtype other than kFloat16/kBFloat16; head dim other than 64 or 128
///     (the s8/e4m3 MMAs' k is 32, the tiles are instantiated for 64- and 128-byte rows);
///     compute capability below 8.9 (mma.sync m16n8k32 s8 exists from sm_80, but the e4m3 one
///     and this kernel's build need sm_89; sm_90 runs the s8 MMA natively, the e4m3 one emulated);
///     a scale that is not positive and finite.
///   INVALID_ARGUMENT: unknown pv; non-positive heads or head dim; N % K != 0; negative sizes;
///     B or N above 65535; T or S at or above 2^30; unknown layout.
Status Int8AttentionSupports(const AttentionShape& shape, Int8PvFormat pv,
                             int compute_capability = 0);

/// Bytes of the workspace Int8AttentionRun needs: the Vᵀ workspace of Fp8AttentionWorkspaceBytes
/// for kE4M3, 0 for k16Bit (V is read in place).
int64_t Int8AttentionWorkspaceBytes(const AttentionShape& shape, Int8PvFormat pv);

/// Number of tile variants compiled for (pv, head_dim) (0 when unsupported).
int Int8AttentionVariantCount(Int8PvFormat pv, int64_t head_dim);

/// Chooses the tile variant, grid and shared memory, and raises the kernel's dynamic shared
/// memory limit on `device`. Errors: those of Int8AttentionSupports (with the device's compute
/// capability); UNAVAILABLE without a CUDA device; FAILED_PRECONDITION when the device has no
/// kernel image or too little shared memory per block (both numbers named); INVALID_ARGUMENT for
/// an out-of-range options.variant; INTERNAL naming a failed runtime call.
StatusOr<Int8AttentionPlan> Int8AttentionPlanFor(const AttentionShape& shape, int device,
                                                 const Int8AttentionPlanOptions& options = {});

/// Enqueues (kE4M3: the Vᵀ pre-pass, then) the attention kernel on `stream` (of plan.device): no
/// allocation, no synchronisation, graph-capturable. `device_tensors`: q = q8, k = k8 (int8),
/// v (kE4M3: E4M3 v8; k16Bit: shape.dtype), o (shape.dtype) non-null and 16-byte aligned,
/// layouts above; lse non-null iff shape.return_lse; offsets for varlen; lengths as
/// shape.has_lengths. `scales`: q and k always, v_descale for kE4M3. `workspace`: at least
/// plan.workspace_bytes bytes of device memory, 16-byte aligned, unused by anything else until
/// the kernel has finished (may be null when plan.workspace_bytes is 0). o (every row < T
/// padded, < total_q varlen) and lse are fully overwritten.
/// Errors: INVALID_ARGUMENT for missing or misaligned pointers or a small workspace (both sizes
/// named); INTERNAL naming the cudaError_t of a failed launch. An empty problem enqueues nothing.
Status Int8AttentionRun(const Int8AttentionPlan& plan, const AttentionTensors& device_tensors,
                        const Int8Scales& scales, void* workspace, int64_t workspace_bytes,
                        cudaStream_t stream);

}  // namespace attn::kernels
