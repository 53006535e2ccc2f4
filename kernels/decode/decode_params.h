// Launch parameters of the decode kernels and the explicit instantiation list (DESIGN.md §13.7).
//
// Internal to kernels/decode/: the public API is attn/kernels/paged_decode.h.
// Host- and device-compatible; includes no CUDA header beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attn/kernels/attention_problem.h"

namespace attn::kernels::decode {

/// Keys per shared-memory tile; each of the 4 warps of a block owns 16 of them.
inline constexpr int kTileTokens = 64;
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
/// Query rows per block: (query token, group head) pairs, the M of the m16n8k16 MMAs.
inline constexpr int kRowsPerBlock = 16;

/// Pipeline depth: three stages of K+V tiles for 16-bit pages, four for FP8 (half the bytes).
constexpr int DecodeStages(int kv_bytes) { return kv_bytes == 1 ? 4 : 3; }
/// Bytes of one K or V tile.
constexpr int DecodeTileBytes(int head_dim, int kv_bytes) {
  return kTileTokens * head_dim * kv_bytes;
}
/// Dynamic shared memory: `stages` × (K tile + V tile). Q (16 rows) is staged in the last
/// stage before the main loop; the cross-warp reduction of the epilogue reuses stage memory.
constexpr int DecodeSmemBytes(int head_dim, int kv_bytes) {
  return DecodeStages(kv_bytes) * 2 * DecodeTileBytes(head_dim, kv_bytes);
}
/// Floats per row of the epilogue's reduction buffer (padded against bank conflicts).
constexpr int DecodeReduceStride(int head_dim) { return head_dim + 8; }
// The reduction buffer (4 warps × 16 rows) and Q (16 rows, 2-byte elements) fit the stages.
static_assert(kWarps * kRowsPerBlock * DecodeReduceStride(64) * 4 <= DecodeSmemBytes(64, 1), "");
static_assert(kWarps * kRowsPerBlock * DecodeReduceStride(128) * 4 <= DecodeSmemBytes(128, 1),
              "");
static_assert(kRowsPerBlock * 128 * 2 <= 2 * DecodeTileBytes(128, 1), "Q fits one stage");
// Every configuration fits an L4's 99 KB per block (ATTN_EMULATE_L4 holds us to it).
static_assert(DecodeSmemBytes(128, 2) <= 101376 && DecodeSmemBytes(128, 1) <= 101376, "");

/// Everything one decode launch reads, by value in the kernel's parameter space.
/// Element offsets are 64-bit. K/V addressing, for token j of sequence b and kv head h:
///   paged:      page = block_tables[b * bt_stride + (j >> page_shift)],
///               element ((page * K + h) << page_shift | (j & page_mask)) * H
///   contiguous: element ((b * capacity + j) * K + h) * H
struct DecodeParams {
  const void* q = nullptr;              ///< (total_q, N, H) dtype
  const int64_t* q_offsets = nullptr;   ///< (B+1)
  void* o = nullptr;                    ///< (total_q, N, H) dtype
  float* lse = nullptr;                 ///< (N, total_q) or null
  const void* k = nullptr;              ///< k pages or contiguous k (kv dtype)
  const void* v = nullptr;              ///< v pages or contiguous v
  const int32_t* block_tables = nullptr;  ///< null: contiguous source
  const int32_t* kv_lengths = nullptr;    ///< (B)
  const float* k_scales = nullptr;        ///< (B, K) FP8 only
  const float* v_scales = nullptr;        ///< (B, K) FP8 only
  float* ws_o = nullptr;    ///< partitions > 1: (P, B*T, N, H) float32 normalised partials
  float* ws_lse = nullptr;  ///< partitions > 1: (P, B*T, N) float32 partial lse
  /// partitions > 1: (B, K, row_chunks) arrival counters, zero on entry, left zero: the last
  /// partition block of a (sequence, kv head, row chunk) to finish merges the partitions.
  unsigned int* counters = nullptr;
  /// Folded append (16-bit pages only), or null: (total_q, K, H) in the kv dtype; row
  /// q_offsets[b] + i is position S_b - T_b + i of sequence b. The kernel reads those keys
  /// from here and the last row chunk's blocks store them into the pages.
  const void* new_k = nullptr;
  const void* new_v = nullptr;
  int64_t bt_stride = 0;
  int64_t capacity = 0;         ///< contiguous: S_cap
  int32_t page_shift = 0;       ///< log2(page_tokens)
  int32_t num_heads = 0;        ///< N
  int32_t num_kv_heads = 0;     ///< K
  int32_t group = 1;            ///< G = N / K
  int32_t max_q_len = 1;        ///< T (workspace row stride per sequence)
  int32_t max_kv_len = 0;       ///< S bound (lengths are clamped to it)
  int32_t partitions = 1;       ///< P
  int32_t partition_tokens = 0; ///< multiple of kTileTokens
  int32_t row_chunks = 1;       ///< ceil(T*G / 16)
  int32_t batch = 0;            ///< B
  float scale = 0.f;            ///< softmax scale
  float scale_log2 = 0.f;       ///< scale * log2(e)
};

using DecodeLaunchFn = cudaError_t (*)(const DecodeParams& params, dim3 grid, int smem_bytes,
                                       cudaStream_t stream);
/// Raises the dynamic shared memory limit and returns the blocks per SM at `smem_bytes`.
using DecodePrepareFn = cudaError_t (*)(int smem_bytes, int* blocks_per_sm);

/// kDType: q/o dtype; kKvDType: storage dtype (== kDType or FP8 E4M3); kHeadDim: 64 or 128.
template <int kDType, int kKvDType, int kHeadDim>
cudaError_t DecodeLaunch(const DecodeParams& params, dim3 grid, int smem_bytes,
                         cudaStream_t stream);
template <int kDType, int kKvDType, int kHeadDim>
cudaError_t DecodePrepare(int smem_bytes, int* blocks_per_sm);
// ---- The explicit instantiation list -------------------------------------------------------
// X(dtype, kv dtype, head dim). Each head dim's entries are compiled in decode_hd<H>.cu.
#define ATTN_DECODE_DT_F16 static_cast<int>(::attn::kernels::DType::kFloat16)
#define ATTN_DECODE_DT_BF16 static_cast<int>(::attn::kernels::DType::kBFloat16)
#define ATTN_DECODE_DT_E4M3 static_cast<int>(::attn::kernels::DType::kFloat8E4M3)
#define ATTN_DECODE_VARIANTS_HD(X, H)                                                          \
  X(ATTN_DECODE_DT_F16, ATTN_DECODE_DT_F16, H)                                                 \
  X(ATTN_DECODE_DT_BF16, ATTN_DECODE_DT_BF16, H)                                               \
  X(ATTN_DECODE_DT_F16, ATTN_DECODE_DT_E4M3, H)                                                \
  X(ATTN_DECODE_DT_BF16, ATTN_DECODE_DT_E4M3, H)
#define ATTN_DECODE_VARIANTS_HD64(X) ATTN_DECODE_VARIANTS_HD(X, 64)
#define ATTN_DECODE_VARIANTS_HD128(X) ATTN_DECODE_VARIANTS_HD(X, 128)
#define ATTN_DECODE_ALL_VARIANTS(X) ATTN_DECODE_VARIANTS_HD64(X) ATTN_DECODE_VARIANTS_HD128(X)

#define ATTN_DECODE_EXTERN(DT, KDT, H)                                                         \
  extern template cudaError_t DecodeLaunch<DT, KDT, H>(const DecodeParams&, dim3, int,         \
                                                       cudaStream_t);                          \
  extern template cudaError_t DecodePrepare<DT, KDT, H>(int, int*);
ATTN_DECODE_ALL_VARIANTS(ATTN_DECODE_EXTERN)

/// The append kernel's launcher, per (input dtype, kv dtype); H is a runtime value.
struct AppendParams {
  const void* k = nullptr;
  const void* v = nullptr;
  const int64_t* new_offsets = nullptr;
  void* k_pages = nullptr;
  void* v_pages = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* kv_lengths = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  unsigned long long* saturations = nullptr;
  int64_t bt_stride = 0;
  int64_t max_new_tokens = 0;
  int32_t page_shift = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t batch = 0;
};

}  // namespace attn::kernels::decode
