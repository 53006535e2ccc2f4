// Paged KV-cache append and split-KV decode attention (DESIGN.md §4, §5, §7).
//
// Two operations on the page format of paged_kv.h ([pages, K, page_tokens, H] per sub-pool,
// block tables, FP8 scales per (sequence, kv head)):
//
// 1. PagedAppendRun: the kernel that writes the page format (a decode launch can also store
//    its own steps' new rows: DecodeQueries::new_k, 16-bit pages). New k, v rows of each
//    sequence, packed (total_new, K, H) in dtype (fp16/bf16), go to token positions
//    [S_b - new_b, S_b) of sequence b (S_b = batch.kv_lengths[b], the length AFTER the append;
//    new_b = new_offsets[b+1] - new_offsets[b]) through its block table. kv dtype equal to the
//    input dtype: a bit copy. kv dtype kFloat8E4M3: stored = e4m3(x / scale) (round to nearest
//    even, IEEE division) with scale = batch.k_scales[b*K + h] (v_scales for V); values with
//    |x / scale| > 448 saturate to ±448 and are counted into *saturations (NaN stays NaN).
//    Only the slots of the new tokens are written; every other byte of the pool is untouched.
//
// 2. Decode attention: queries packed (total_q, N, H), T_b = q_offsets[b+1] - q_offsets[b]
//    rows per sequence (1 for plain decode; up to kPagedDecodeMaxQueryLen for speculative or
//    chunked decode), keys/values = the first S_b tokens of the sequence's cache. Bottom-right
//    causal: query row i of sequence b sees key j iff j <= i + S_b - T_b (DESIGN.md §4); a
//    row that sees no key gets zeros and lse = -inf. Output o has q's layout in dtype; lse
//    (optional) is (N, total_q) float32 (the varlen layout of attention_problem.h), natural
//    log. Keys are read either from pages (PagedDecodeRun) or from contiguous (B, S_cap, K, H)
//    tensors (ContiguousDecodeRun), with the same kernel.
//
//    Algorithm (flash-decoding): the keys of each sequence are cut into plan.partitions
//    partitions of plan.partition_tokens tokens; one block handles one (sequence, kv head,
//    partition, chunk of 16 query rows), where the 16 rows are (query token, query head of the
//    kv head's group) pairs, so each K/V page is loaded from memory once for all G = N/K query
//    heads. K/V tiles of 64 tokens stream through shared memory with cp.async (3-4 stages,
//    16-byte copies; each thread copies a run of consecutive rows, so with pages of at least
//    that many tokens one block-table entry per thread and tile, loaded a tile ahead; smaller
//    pages look every row up); S = Q·Kᵀ and O += P·V run on mma.sync m16n8k16 tensor cores
//    with fp32 accumulation (FP8 pages are converted to fp16 in registers with
//    cvt.rn.f16x2.e4m3x2 on sm_89+; the K scale is applied once to the logits and the V scale once to the output).
//    With one partition the kernel writes o and lse directly; otherwise each block writes its
//    partition's normalised partial output (fp32) and lse into the workspace and counts itself
//    in on an arrival counter per (sequence, kv head, row chunk); the last block to arrive
//    combines the partitions by lse into o (dtype) and lse and resets the counter (one launch,
//    no merge kernel). A sequence whose keys fit one partition is written directly.
//
// 3. Folded append (16-bit pages): a decode launch given DecodeQueries::new_k / new_v reads
//    the T_b newest keys of sequence b from there and stores them into their page slots (as
//    PagedAppendRun would, a bit copy) in the same launch, so a decode step needs one kernel.
//
// dtypes: q, o, new k/v: kFloat16 or kBFloat16; kv dtype: the same, or kFloat8E4M3.
// Head dims 64 and 128. Page sizes: powers of two from 1 to 65536 tokens.
// Thread-safety: Supports is pure; PlanFor touches the CUDA runtime (attribute and occupancy
// queries, cudaFuncSetAttribute) and is safe to call concurrently; the Run functions only
// enqueue (no allocation, no synchronisation, graph-capturable) and may run concurrently on
// different streams with the same plan but different workspaces.
// Built only when ATTN_CUDA is on; this header needs cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/paged_kv.h"
#include "attn/common/status.h"

namespace attn::kernels {

/// Largest T_b (query tokens per sequence) the decode kernels accept.
inline constexpr int64_t kPagedDecodeMaxQueryLen = 64;

/// Where decode reads K/V from.
enum class KvSource : int {
  kPaged = 0,       ///< a PagedKvPool through block tables
  kContiguous = 1,  ///< k, v (B, S_cap, K, H) tensors (for comparison and prefill-free tests)
};

/// What PagedDecodePlanFor is keyed on.
struct PagedDecodeShape {
  KvSource source = KvSource::kPaged;
  DType dtype = DType::kBFloat16;     ///< q and o
  DType kv_dtype = DType::kBFloat16;  ///< K/V storage: dtype or kFloat8E4M3
  int64_t batch = 0;                  ///< B
  int64_t max_q_len = 1;              ///< max T_b (<= kPagedDecodeMaxQueryLen)
  int64_t max_kv_len = 0;             ///< max S_b (bounds the partitions; longer S_b is an error)
  int64_t num_heads = 0;              ///< N
  int64_t num_kv_heads = 0;           ///< K, N % K == 0
  int64_t head_dim = 0;               ///< H: 64 or 128
  int64_t page_tokens = 16;           ///< paged only: the pool's page_tokens
  float scale = 0.f;                  ///< softmax scale (> 0); callers resolve 1/sqrt(H)
  bool return_lse = false;
};

/// Optional knobs (defaults are the tuned choice).
struct PagedDecodeOptions {
  /// 0: chosen from B·K, S and the SM count; otherwise the number of KV partitions wanted
  /// (clamped to the number of 64-token tiles of max_kv_len). Tests and benchmarks.
  int64_t partitions = 0;
};

/// Host decisions for one PagedDecodeShape on one device. A value type: cache it by shape.
struct PagedDecodePlan {
  PagedDecodeShape shape;
  int device = 0;
  int64_t partitions = 1;        ///< KV partitions per sequence (1: no merge pass)
  int64_t partition_tokens = 0;  ///< keys per partition, a multiple of tile_tokens
  int tile_tokens = 64;          ///< keys per shared-memory tile
  int stages = 0;                ///< cp.async pipeline depth
  int64_t row_chunks = 1;        ///< chunks of 16 (query token, group head) rows
  int smem_bytes = 0;            ///< dynamic shared memory per block
  int blocks_per_sm = 0;         ///< occupancy of the decode kernel
  int sm_count = 0;              ///< SMs the grid was sized for (L4-clamped when emulating)
  int64_t grid_blocks = 0;       ///< decode blocks launched (B · K · partitions · row_chunks)
  size_t workspace_bytes = 0;    ///< device workspace PagedDecodeRun needs (0 when partitions==1)
  /// The first counter_bytes of the workspace: arrival counters (uint32 per sequence, kv head
  /// and row chunk) that must be zero when a launch starts; every completed launch leaves them
  /// zero, so zeroing once after allocation suffices (0 when partitions == 1).
  size_t counter_bytes = 0;
  const void* launch = nullptr;  ///< internal: the instantiated launcher (opaque)
  /// "decode bf16/bf16 h128 p4x2048 st3 smem98304 occ2" for reports.
  std::string Describe() const;
};

/// Queries and outputs of one decode launch (device pointers).
struct DecodeQueries {
  const void* q = nullptr;            ///< (total_q, N, H) dtype, 16-byte aligned
  const int64_t* q_offsets = nullptr; ///< (B+1) int64, exclusive prefix sum of T_b, q_offsets[0]=0
  void* o = nullptr;                  ///< (total_q, N, H) dtype, 16-byte aligned; fully written
  float* lse = nullptr;               ///< (N, total_q) float32; non-null iff shape.return_lse
  /// Folded append, or both null: (total_q, K, H) in the kv dtype (paged K/V stored in the
  /// query dtype only), 16-byte aligned. Row q_offsets[b] + i is the key (new_k) and value
  /// (new_v) of position S_b - T_b + i of sequence b (its T_b newest tokens, T_b <= S_b): the
  /// launch reads those keys from here, not from the pages, and stores them into the pages
  /// (block-table entries must exist for them); afterwards the pool holds what PagedAppendRun
  /// of the same rows followed by decode would have left, and o is bit-identical to that.
  const void* new_k = nullptr;
  const void* new_v = nullptr;
};

/// Contiguous K/V for ContiguousDecodeRun (device pointers).
struct ContiguousKv {
  const void* k = nullptr;              ///< (B, capacity, K, H) kv dtype, 16-byte aligned
  const void* v = nullptr;              ///< same shape
  int64_t capacity = 0;                 ///< S_cap >= every S_b
  const int32_t* kv_lengths = nullptr;  ///< (B) S_b
  const float* k_scales = nullptr;      ///< (B, K) FP8 only: real = stored × scale
  const float* v_scales = nullptr;      ///< (B, K) FP8 only
};

/// Ok if the decode kernels can compute `shape`; otherwise why not:
///   FAILED_PRECONDITION: dtype not fp16/bf16, kv dtype neither dtype nor FP8 E4M3, head dim
///     other than 64/128, max_q_len above kPagedDecodeMaxQueryLen, a page size that is not a
///     power of two in [1, 65536], a scale that is not positive and finite.
///   INVALID_ARGUMENT: non-positive heads or head dim, N % K != 0, negative sizes, B or K above
///     65535 (grid limits), max_kv_len at or above 2^30.
Status PagedDecodeSupports(const PagedDecodeShape& shape);

/// Chooses partitions, tile pipeline and grid for `shape` on CUDA device `device` (raises the
/// kernel's dynamic shared memory limit there). Errors: those of PagedDecodeSupports;
/// UNAVAILABLE without a device; FAILED_PRECONDITION below sm_80 (mma.sync, cp.async) or
/// without a kernel image for the device (built for sm_89 and sm_90a); INTERNAL naming the
/// cudaError_t of a failed runtime call.
StatusOr<PagedDecodePlan> PagedDecodePlanFor(const PagedDecodeShape& shape, int device,
                                             const PagedDecodeOptions& options = {});

/// Enqueues paged decode on `stream` (of plan.device). `pool` must match the shape (K, H,
/// kv dtype, page_tokens); batch.batch == shape.batch; every S_b = batch.kv_lengths[b] must be
/// in [0, shape.max_kv_len] with block table entries for its ceil(S_b / page_tokens) blocks
/// (entries past those are never read); batch.k_scales / v_scales are required for FP8 and
/// must be positive and finite. `workspace`: plan.workspace_bytes of device memory, 256-byte
/// aligned (may be null when 0), owned by the caller, not shared between concurrent launches;
/// its first plan.counter_bytes must be zero when the launch starts (see PagedDecodePlan).
/// Errors: INVALID_ARGUMENT for mismatches or missing pointers; INTERNAL naming the
/// cudaError_t of a failed launch. B == 0 or N == 0 enqueues nothing.
Status PagedDecodeRun(const PagedDecodePlan& plan, const PagedKvPool& pool,
                      const PagedBatch& batch, const DecodeQueries& queries, void* workspace,
                      cudaStream_t stream);

/// The same computation with K/V read from contiguous tensors (plan.shape.source must be
/// kContiguous). Errors as PagedDecodeRun.
Status ContiguousDecodeRun(const PagedDecodePlan& plan, const ContiguousKv& kv,
                           const DecodeQueries& queries, void* workspace, cudaStream_t stream);

/// New K/V rows for PagedAppendRun (device pointers).
struct AppendRows {
  DType dtype = DType::kBFloat16;        ///< of k and v: kFloat16 or kBFloat16
  const void* k = nullptr;               ///< (total_new, K, H) dtype, 16-byte aligned
  const void* v = nullptr;               ///< same shape
  const int64_t* new_offsets = nullptr;  ///< (B+1) int64 exclusive prefix sum of new_b
  int64_t max_new_tokens = 0;            ///< >= every new_b (sizes the grid)
  /// FP8 pools: incremented by the number of saturated elements (K and V); may be null.
  unsigned long long* saturations = nullptr;
};

/// Enqueues the append (see 1. above) on `stream`: no allocation, no synchronisation.
/// Requirements: pool.kv_dtype is rows.dtype or kFloat8E4M3; k_pages/v_pages 16-byte aligned;
/// H a multiple of 16 (FP8) or 8 (16-bit); new_b <= S_b for every b, and the block table has
/// entries for blocks up to ceil(S_b / page_tokens). Errors: INVALID_ARGUMENT for mismatches
/// and missing pointers; INTERNAL naming the cudaError_t of a failed launch.
Status PagedAppendRun(const PagedKvPool& pool, const PagedBatch& batch, const AppendRows& rows,
                      cudaStream_t stream);

}  // namespace attn::kernels
