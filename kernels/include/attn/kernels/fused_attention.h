// The `fused` family (DESIGN.md §5): our FlashAttention-2-style kernel on tensor cores.
//
//   O = softmax(scale · Q Kᵀ + band mask) V    without ever writing the (T, S) scores.
//
// One block keeps a BLOCK_M × H tile of Q on chip and streams BLOCK_N × H tiles of K and V
// through shared memory (cp.async, two stages); Q·Kᵀ and P·V run on mma.sync m16n8k16
// (fp16/bf16 inputs, fp32 accumulation); softmax is online (running max and sum, exp2 domain).
// Key tiles outside a block's band are skipped (causal does about half the work); the mask is
// applied element-wise only on boundary tiles.
//
// Problem and layouts (attention_problem.h), all device memory, row-major:
//   kPadded: q, o (B, T, N, H) dtype   k, v (B, S, K, H) dtype   lse (B, N, T) float32
//            q_lengths, kv_lengths (B) int32 or null (full extents T, S); read only when
//            shape.has_lengths. Values are clamped to [0, T] and [0, S].
//   kVarlen: q, o (total_q, N, H)      k, v (total_kv, K, H)     lse (N, total_q) float32
//            q_offsets, kv_offsets (B+1) int64, exclusive prefix sums (required); per-entry
//            lengths must not exceed shape.max_q_len / shape.max_kv_len.
// dtypes: kFloat16 and kBFloat16 (q, k, v, o share it). Head dims: 32, 64, 80, 96, 128, 256.
// Grouped heads: query head h reads kv head h / (N / K) directly (no repeated K/V).
// Masks: every MaskSpec via BandKeyRange (top-left / bottom-right causal, sliding windows; the
//   bottom-right diagonal offset is S_b − T_b per batch entry).
// Padding: keys past S_b are never read (zero-filled on chip); query rows past T_b and rows
//   that see no key are written as zeros with lse = −inf (padded layout: every row < T is
//   written). lse is the natural log of the sum of exp of the scaled, masked logits.
// Memory traffic: q, k, v read (K/V once per BLOCK_M query rows and query head), o and lse
//   written once. No workspace.
//
// Paged K/V (FusedPagedPlanFor / FusedPagedRun, below): the same kernel reading K and V through
//   a paged KV cache's block tables (paged_kv.h), for prefill over the cache: varlen queries,
//   S_b from kv_lengths, one tile variant per head dim (64 and 128), fp16/bf16 pages only.
//
// Thread-safety: FusedSupports and FusedPagedSupports are pure. FusedPlanFor and
// FusedPagedPlanFor touch the CUDA runtime (attribute queries, cudaFuncSetAttribute for the
// chosen kernel on `device`) and are safe to call concurrently. FusedRun and FusedPagedRun may
// be called concurrently on any streams with the same plan.
// Built only when ATTN_CUDA is on; this header needs cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/paged_kv.h"
#include "attn/common/status.h"

namespace attn::kernels {

/// Optional knobs for FusedPlanFor (defaults are the tuned choice).
struct FusedPlanOptions {
  /// -1: the default tile variant for the shape (FusedDefaultVariant); otherwise an index into
  /// the variants of this head dim (FusedVariantCount), for benchmarks and tests.
  int variant = -1;
};

/// Host-side decisions for one AttentionShape on one device. A value type: cache it by shape.
struct FusedPlan {
  AttentionShape shape;
  int device = 0;
  int variant = 0;        ///< index among the head dim's tile variants
  int block_m = 0;        ///< query rows per block
  int block_n = 0;        ///< keys per K/V tile
  int warps = 0;          ///< warps per block (each owns block_m / warps query rows)
  int smem_bytes = 0;     ///< dynamic shared memory per block
  int64_t grid_x = 0;     ///< ceil(T / block_m): query tiles (heaviest first under causal)
  int64_t grid_y = 0;     ///< N query heads
  int64_t grid_z = 0;     ///< B batch entries
  const void* launch = nullptr;  ///< internal: the instantiated launcher (opaque)
  /// "fused h128 v2 bm128 bn64 w4 smem98304" for reports.
  std::string Describe() const;
};

/// Ok if the fused family can compute `shape`; otherwise why not:
///   FAILED_PRECONDITION: dtype kFloat32 or kFloat8E4M3 (fp16 and bf16 only), a head dim
///     other than 32/64/80/96/128/256, a scale that is not positive and finite.
///   INVALID_ARGUMENT: non-positive heads or head dim, N % K != 0, negative sizes, B or N above
///     65535 (grid limits), T or S at or above 2^30, varlen totals that are negative.
Status FusedSupports(const AttentionShape& shape);

/// Number of tile variants compiled for `head_dim` (0 when unsupported).
int FusedVariantCount(int64_t head_dim);

/// The tile variant FusedPlanFor runs when options.variant is -1, for a device with
/// `sm_count` multiprocessors: a small table in fused_attention.cc keyed on the head dim,
/// whether the mask is causal, and how many 128-row query blocks each multiprocessor would get
/// (measured on an H200; the numbers are cited there and in bench/NOTES.md). Pure; always a
/// valid index when FusedVariantCount(shape.head_dim) > 0.
int FusedDefaultVariant(const AttentionShape& shape, int sm_count);

/// Chooses the tile variant, grid and shared memory for `shape` on CUDA device `device`, and
/// raises the kernel's dynamic shared memory limit there. Errors: those of FusedSupports;
/// UNAVAILABLE without a CUDA device; FAILED_PRECONDITION when the device is older than sm_80,
/// has no kernel image for it, or its (possibly L4-emulated, ATTN_EMULATE_L4) shared memory
/// per block is below the variant's need (the message names both numbers); INVALID_ARGUMENT for
/// an out-of-range options.variant; INTERNAL naming the cudaError_t of a failed runtime call.
StatusOr<FusedPlan> FusedPlanFor(const AttentionShape& shape, int device,
                                 const FusedPlanOptions& options = {});

/// Enqueues the kernel on `stream` (which must belong to plan.device): no allocation, no
/// synchronisation, graph-capturable. `device_tensors` holds device pointers with the layouts
/// above: q, k, v, o non-null and 16-byte aligned; lse non-null iff plan.shape.return_lse;
/// offsets non-null for varlen. o (every row < T padded, every row < total_q varlen) and lse
/// are fully overwritten. Inputs are only read.
/// Errors: INVALID_ARGUMENT for missing pointers; INTERNAL naming the cudaError_t when the
/// launch fails. An empty problem (B, T or N zero) enqueues nothing and returns Ok.
Status FusedRun(const FusedPlan& plan, const AttentionTensors& device_tensors,
                cudaStream_t stream);

// ---- Paged K/V: prefill over a paged KV cache ---------------------------------------------
//
// Queries packed (total_q, N, H) in dtype, T_b = q_offsets[b+1] - q_offsets[b] rows for
// sequence b; its keys and values are the first S_b = batch.kv_lengths[b] tokens of its pages
// (token j at page block_tables[b * stride + j / page_tokens], slot j % page_tokens, format of
// paged_kv.h). The mask is shape.mask with the varlen semantics of attention_problem.h; the
// default, bottom-right causal, makes the T_b query rows the LAST T_b tokens of the S_b-token
// history (row i sees keys j <= i + S_b - T_b): a prefill step whose K/V were appended first,
// with or without a prefix already cached. Rows that see no key get zeros and lse = -inf.
// Output o (total_q, N, H) in dtype; lse (N, total_q) float32 (optional), natural log.
// Same algorithm, tiles and arithmetic as FusedRun: on the same data the contiguous kernel with
// FusedPlanOptions::variant = plan.variant (varlen K/V) gives bit-identical o and lse.
// Pages: 16-bit only, in the query dtype. FP8 E4M3 pages are not implemented here; they run on
// the paged decode kernels (paged_decode.h), which dequantise in registers.

/// What FusedPagedPlanFor is keyed on.
struct FusedPagedShape {
  DType dtype = DType::kBFloat16;     ///< q and o: kFloat16 or kBFloat16
  DType kv_dtype = DType::kBFloat16;  ///< the pool's page dtype: must equal dtype
  int64_t batch = 0;                  ///< B sequences (<= 65535)
  int64_t max_q_len = 0;              ///< >= every T_b (the grid has ceil(max_q_len/block_m) rows)
  int64_t max_kv_len = 0;             ///< >= every S_b (larger S_b are clamped to it)
  int64_t total_q = 0;                ///< Σ T_b: rows of q/o (the lse row stride)
  int64_t num_heads = 0;              ///< N
  int64_t num_kv_heads = 0;           ///< K, N % K == 0
  int64_t head_dim = 0;               ///< H: 64 or 128
  int64_t page_tokens = 16;           ///< the pool's page_tokens: a power of two in [1, 65536]
  MaskSpec mask{CausalAlignment::kBottomRight, -1, -1};
  float scale = 0.f;                  ///< softmax scale (> 0); callers resolve 1/sqrt(H)
  bool return_lse = false;
};

/// Host decisions for one FusedPagedShape on one device. A value type: cache it by shape.
struct FusedPagedPlan {
  FusedPagedShape shape;
  int device = 0;
  /// The contiguous tile variant with the same tile (FusedPlanOptions::variant): same
  /// arithmetic, so bit-identical results on the same data (tests, benchmarks).
  int variant = 0;
  int block_m = 0;     ///< query rows per block
  int block_n = 0;     ///< keys per K/V tile (any page size: pages are looked up per tile row)
  int warps = 0;       ///< warps per block
  int smem_bytes = 0;  ///< dynamic shared memory per block
  int64_t grid_x = 0;  ///< ceil(max_q_len / block_m)
  int64_t grid_y = 0;  ///< N
  int64_t grid_z = 0;  ///< B
  const void* launch = nullptr;  ///< internal: the instantiated launcher (opaque)
  /// "fused-paged bf16 h128 bm64 bn64 w4 pt16 smem40960" for reports.
  std::string Describe() const;
};

/// Queries and outputs of one paged launch (device pointers).
struct FusedPagedQueries {
  const void* q = nullptr;             ///< (total_q, N, H) dtype, 16-byte aligned
  const int64_t* q_offsets = nullptr;  ///< (B+1) int64 exclusive prefix sum of T_b, [0] = 0
  void* o = nullptr;                   ///< (total_q, N, H) dtype, 16-byte aligned; fully written
  float* lse = nullptr;                ///< (N, total_q) float32; non-null iff shape.return_lse
};

/// Ok if the paged fused kernel can compute `shape`; otherwise why not:
///   UNIMPLEMENTED: FP8 E4M3 pages (16-bit pages only; the paged decode kernels read FP8), a
///     head dim other than 64 or 128 (the only paged instantiations).
///   INVALID_ARGUMENT: a kv dtype that is neither FP8 nor the query dtype, a page size that is
///     not a power of two in [1, 65536], total_q < 0, and every INVALID_ARGUMENT of FusedSupports
///     (heads, N % K, negative sizes, grid limits, lengths at or above 2^30).
///   FAILED_PRECONDITION: as FusedSupports (a q dtype other than fp16/bf16, a scale that is not
///     positive and finite).
Status FusedPagedSupports(const FusedPagedShape& shape);

/// Chooses the tile and grid for `shape` on CUDA device `device` and raises the kernel's dynamic
/// shared memory limit there. Errors: those of FusedPagedSupports; UNAVAILABLE without a CUDA
/// device; FAILED_PRECONDITION below sm_80, without a kernel image for the device, or when the
/// (possibly L4-emulated) shared memory per block is below the tile's need; INTERNAL naming the
/// cudaError_t of a failed runtime call. Safe to call concurrently.
StatusOr<FusedPagedPlan> FusedPagedPlanFor(const FusedPagedShape& shape, int device);

/// Enqueues the paged kernel on `stream` (of plan.device): no allocation, no synchronisation,
/// graph-capturable. `pool` must match the shape (K, H, page_tokens, kv dtype == dtype; pages
/// 16-byte aligned); batch.batch == shape.batch; every S_b in [0, shape.max_kv_len] with
/// block-table entries for its ceil(S_b / page_tokens) blocks, each a page of the pool (entries
/// past those and slots past S_b are never read); every T_b <= shape.max_q_len with
/// Σ T_b == shape.total_q. Inputs are only read; o (every row < total_q) and lse are fully
/// written. Errors: INVALID_ARGUMENT for mismatches or missing pointers; INTERNAL naming the
/// cudaError_t of a failed launch. B == 0, N == 0 or max_q_len == 0 enqueues nothing.
Status FusedPagedRun(const FusedPagedPlan& plan, const PagedKvPool& pool, const PagedBatch& batch,
                     const FusedPagedQueries& queries, cudaStream_t stream);

}  // namespace attn::kernels
