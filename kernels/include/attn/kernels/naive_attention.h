// The `naive` family (DESIGN.md §5): the seeds' baseline. It materialises the scores.
//
//   1. cuBLAS strided-batched GEMM:  scores = scale · Q Kᵀ            (float32, fp32 compute)
//   2. mask + softmax kernel:        P = softmax(scores + band mask)   (input dtype), lse
//   3. cuBLAS strided-batched GEMM:  O = P V                           (input dtype, fp32 compute)
//
// Problem and layouts: attention_problem.h. Only Layout::kPadded:
//   q, o  (B, T, N, H)  dtype      k, v (B, S, K, H)  dtype      lse (B, N, T) float32
//   q_lengths, kv_lengths  (B) int32 in device memory, or null (full extents T, S); they are
//   read only when shape.has_lengths.
// dtypes: kFloat32, kFloat16, kBFloat16 (q, k, v, o share it). fp32 GEMMs use
// CUBLAS_COMPUTE_32F_PEDANTIC (true fp32, never TF32, whatever the handle's math mode);
// fp16/bf16 GEMMs use CUBLAS_COMPUTE_32F (fp32 accumulation on tensor cores).
// Grouped heads (GQA/MQA) are handled with GEMM strides; K/V are never repeated in memory.
// Masks: every MaskSpec (both causal alignments, sliding windows) via BandKeyRange, per-batch
// lengths. Rows past q_lengths[b] and rows that see no key get zero output and lse = -inf.
//
// Work decomposition. A *unit* is one (batch entry b, kv head kh) pair: the G = N/K query heads
// kh*G .. kh*G+G-1 that read kv head kh. Units are numbered u = b*K + kh. The plan groups
// consecutive units into chunks so that the chunk's scores (float32) and probabilities (input
// dtype; in place over the scores for float32) fit the caller's workspace limit; each chunk is
// 2 GEMM phases (a few strided-batched calls each, the variant with the fewest calls is picked
// per chunk) and one softmax launch.
//
// Precondition (documented limitation of a materialising baseline): the padded parts of k and
// v (positions >= kv_lengths[b]) and of q must hold finite values. They are multiplied by zero
// probabilities, and 0 · NaN = NaN. Fused families do not read them.
//
// Thread-safety: NaivePlanFor/NaiveSupports are pure. NaiveRun may be called concurrently with
// different workspaces and handles; a cuBLAS handle must not be shared across concurrent calls.
// This header needs the CUDA toolkit headers (it is only built when ATTN_CUDA is on).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn::kernels {

/// Host-side decisions for one AttentionShape. A value type: cache it by shape.
struct NaivePlan {
  AttentionShape shape;
  /// Leading dimension (elements) of a scores/probabilities row: S rounded up to 8.
  int64_t scores_ld = 0;
  /// Total units B*K, units per chunk (the last chunk may be shorter), and chunk count.
  int64_t num_units = 0;
  int64_t units_per_chunk = 0;
  int64_t num_chunks = 0;
  /// Bytes of one unit's float32 scores (G*T*scores_ld*4) and of its probabilities (G*T*
  /// scores_ld*sizeof(dtype); 0 for float32, which overwrites the scores in place).
  size_t unit_scores_bytes = 0;
  size_t unit_probs_bytes = 0;
  /// Offset of the probabilities inside the workspace (256-byte aligned).
  size_t probs_offset_bytes = 0;
  /// Offset of the per-unit non-finite V flags (B*K int32, 4-byte aligned): units whose V
  /// holds ±Inf/NaN get their rows recomputed over the visible keys only (DESIGN.md §4).
  size_t flags_offset_bytes = 0;
  /// Device workspace NaiveRun needs (>= 1 chunk's scores + probabilities, then the flags).
  size_t workspace_bytes = 0;
  /// cuBLAS calls one NaiveRun issues (both GEMM phases, all chunks), for reports.
  int64_t gemm_calls = 0;
};

/// Ok if the naive family can compute `shape`; otherwise why not:
///   FAILED_PRECONDITION: Layout::kVarlen (packed varlen is not supported: the family
///     materialises padded (B, N, T, S) scores; pad the batch or use the fused family), or
///     dtype kFloat8E4M3.
///   INVALID_ARGUMENT: non-positive sizes, N % K != 0, a non-finite scale, or extents that do
///     not fit cuBLAS's int32 dimensions (T, S, N*H, K*H).
Status NaiveSupports(const AttentionShape& shape);

/// Plans `shape` so that the workspace fits `workspace_limit_bytes`, using as few chunks as
/// possible. Errors: those of NaiveSupports; RESOURCE_EXHAUSTED (naming the bytes one unit
/// needs and the limit) when a single (batch entry, kv head) unit does not fit.
StatusOr<NaivePlan> NaivePlanFor(const AttentionShape& shape, size_t workspace_limit_bytes);

/// Enqueues the computation on `stream`: no allocation, no synchronisation, graph-capturable.
///   device_tensors: device pointers, layouts above; q, k, v, o non-null; lse non-null iff
///     plan.shape.return_lse; lengths as above. o and lse are fully overwritten.
///   workspace: device memory of at least plan.workspace_bytes, 256-byte aligned, owned by the
///     caller and not used by anything else until the stream has passed this run.
///   handle: caller-owned cuBLAS handle already bound to `stream` (cublasSetStream) and, to
///     keep cuBLAS allocation-free, given its own workspace (cublasSetWorkspace). The handle's
///     pointer mode is set to host for the calls and restored.
/// Errors: INVALID_ARGUMENT for null pointers, a small or misaligned workspace, or a handle
/// bound to another stream; INTERNAL naming the cudaError_t / cublasStatus_t when a launch or
/// cuBLAS call fails (the stream may then hold part of the work).
Status NaiveRun(const NaivePlan& plan, const AttentionTensors& device_tensors, void* workspace,
                size_t workspace_bytes, cublasHandle_t handle, cudaStream_t stream);

}  // namespace attn::kernels
