// Launch parameters of the fused kernel and the explicit instantiation list (DESIGN.md §13.7).
//
// Internal to kernels/fused/: the public API is attn/kernels/fused_attention.h.
// Host- and device-compatible; includes no CUDA header beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attn/kernels/attention_problem.h"

namespace attn::kernels::fused {

/// Everything one launch reads, by value in the kernel's parameter space.
/// Element strides are in elements of the q/k/v dtype; offsets and row indices are 64-bit.
struct FusedParams {
  const void* q = nullptr;  ///< (B,T,N,H) padded or (total_q,N,H) varlen
  const void* k = nullptr;  ///< (B,S,K,H) padded or (total_kv,K,H) varlen
  const void* v = nullptr;
  void* o = nullptr;       ///< q's layout
  float* lse = nullptr;    ///< (B,N,T) padded or (N,total_q) varlen; null: not written
  const int32_t* q_lengths = nullptr;   ///< padded only; null: T
  const int32_t* kv_lengths = nullptr;  ///< padded only; null: S
  const int64_t* q_offsets = nullptr;   ///< varlen only: (B+1)
  const int64_t* kv_offsets = nullptr;  ///< varlen only: (B+1)
  int64_t q_row_stride = 0;   ///< N*H: elements between consecutive tokens of q/o
  int64_t kv_row_stride = 0;  ///< K*H: elements between consecutive tokens of k/v
  int64_t total_q = 0;        ///< varlen: rows of q (lse row stride)
  int32_t max_q_len = 0;      ///< T (padded extent / varlen maximum)
  int32_t max_kv_len = 0;     ///< S
  int32_t num_heads = 0;      ///< N
  int32_t group_size = 1;     ///< N / K
  int32_t num_m_blocks = 0;   ///< ceil(T / BLOCK_M) == gridDim.x
  int32_t varlen = 0;         ///< 1: packed varlen layout
  float scale = 0.f;          ///< softmax scale (> 0)
  float scale_log2 = 0.f;     ///< scale * log2(e)
  MaskSpec mask;
};

/// Paged K/V (FusedPagedLaunch): the fields FusedParams lacks. The base's q, o, lse, q_offsets
/// (B+1), kv_lengths (B, clamped to [0, max_kv_len]), total_q, max_q_len, max_kv_len,
/// num_heads, group_size, num_m_blocks, scale(s) and mask keep their meaning (varlen queries);
/// k and v are the page arrays [num_pages, K, page_tokens, H] of the pool (paged_kv.h);
/// kv_offsets and kv_row_stride are unused. For token j of sequence b and kv head h:
///   page = block_tables[b * bt_stride + (j >> page_shift)],
///   element ((page * K + h) << page_shift | (j & page_mask)) * H       (64-bit)
/// Block-table entries are read only for tokens j < S_b.
struct FusedPagedParams : FusedParams {
  const int32_t* block_tables = nullptr;  ///< (B, bt_stride) int32 page indices
  int64_t bt_stride = 0;                  ///< entries per block-table row
  int32_t page_shift = 0;                 ///< log2(page_tokens)
  int32_t num_kv_heads = 0;               ///< K
};

/// Element offset of dimension 0 of token `j`'s row (kv head `h`) in page `page`: the page
/// format of paged_kv.h written with shifts (page_tokens = 1 << page_shift). Shared by the
/// kernel and its host tests.
ATTN_HD int64_t PagedRowElement(int64_t page, int64_t num_kv_heads, int64_t h, int page_shift,
                                int64_t j, int64_t head_dim) {
  return (((page * num_kv_heads + h) << page_shift) | (j & ((int64_t{1} << page_shift) - 1))) *
         head_dim;
}

/// The key tiles one block of query rows [m0, m0 + block_m) visits, and the keys inside every
/// visible row's band. lo(i) and hi(i) of BandKeyRange never decrease with i, so the union of
/// the rows' ranges is [lo(m0), hi(last)] (last = the block's last row below q_len), and a tile
/// lies inside every row's band when it lies inside [lo(last), hi(m0)]. Rows >= q_len are
/// ignored (the kernel writes them as zeros). Shared by the kernel and its host tests.
struct BlockTiles {
  int n_begin = 0;   ///< first key tile index
  int n_end = 0;     ///< one past the last key tile index (n_begin == n_end: nothing to do)
  int full_lo = 1;   ///< keys [full_lo, full_hi] are in every visible row's band
  int full_hi = 0;
  /// True when tile `n` (keys [n*block_n, (n+1)*block_n)) needs no per-element mask.
  ATTN_HD bool Interior(int n, int block_n) const {
    return n * block_n >= full_lo && n * block_n + block_n - 1 <= full_hi;
  }
};
ATTN_HD BlockTiles BlockKeyTiles(const MaskSpec& mask, int m0, int block_m, int block_n,
                                 int q_len, int kv_len) {
  BlockTiles t;
  if (m0 >= q_len || kv_len <= 0) return t;
  const int last = (m0 + block_m < q_len ? m0 + block_m : q_len) - 1;
  const KeyRange first_r = BandKeyRange(mask, m0, q_len, kv_len);
  const KeyRange last_r = BandKeyRange(mask, last, q_len, kv_len);
  if (first_r.lo > last_r.hi) return t;
  t.n_begin = static_cast<int>(first_r.lo / block_n);
  t.n_end = static_cast<int>(last_r.hi / block_n) + 1;
  t.full_lo = static_cast<int>(last_r.lo);
  t.full_hi = static_cast<int>(first_r.hi);
  return t;
}

/// A kernel variant: element dtype, head dim, rows of queries per block, keys per tile, warps.
/// kernel entry points are FusedLaunch<dtype, H, BM, BN, W> and FusedPrepare<...> below.
using FusedLaunchFn = cudaError_t (*)(const FusedParams& params, dim3 grid, int smem_bytes,
                                      cudaStream_t stream);
using FusedPrepareFn = cudaError_t (*)(int smem_bytes);

template <int kDType, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t FusedLaunch(const FusedParams& params, dim3 grid, int smem_bytes,
                        cudaStream_t stream);
template <int kDType, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t FusedPrepare(int smem_bytes);

/// Dynamic shared memory of a variant: Q tile + 2 stages of (K tile, V tile), rows padded by
/// 16 bytes for head dims that are not a multiple of 64 (except 32, which is swizzled).
constexpr int FusedRowBytes(int head_dim) {
  return (head_dim % 64 == 0 || head_dim == 32) ? head_dim * 2 : head_dim * 2 + 16;
}
constexpr int FusedSmemBytes(int head_dim, int block_m, int block_n) {
  return FusedRowBytes(head_dim) * (block_m + 4 * block_n);
}

// ---- The explicit instantiation list -------------------------------------------------------
// X(head_dim, block_m, block_n, warps). The index of an entry among its head dim's entries is
// its variant number (FusedPlanOptions::variant, "fused/v<i>" in the benchmark); append new
// entries at the end so that recorded numbers keep their meaning. Which variant runs by default
// is decided per shape by the table in fused_attention.cc (kDefaultRules), not by the order.
// Each entry is compiled for both fp16 and bf16 in kernels/fused/fused_hd<H>.cu. Warps own 16
// (BM = 16·W) or 32 (BM = 32·W) query rows each; with 16 rows Q stays in registers, with 32 rows
// Q fragments are re-read from shared memory (but every K/V fragment feeds twice as many MMAs,
// which is what makes them faster on Hopper: ldmatrix bandwidth, not the tensor cores, limits
// 16-row warps at H >= 64). Every entry must fit the L4's 99 KB (FusedSmemBytes <= 101376).
//   H=64:  v0 128x128/8w (16-row)  v1 128x64/4w (32-row)  v2 64x128/4w (16-row)
//   H=128: v0 128x64/8w (16-row)   v1 64x64/4w (16-row)   v2 128x64/4w (32-row, FA2's tile)
//          v3 128x32/4w (32-row, fewer registers than v2: no spill)
#define ATTN_FUSED_VARIANTS_HD32(X) X(32, 128, 128, 8)
#define ATTN_FUSED_VARIANTS_HD64(X) X(64, 128, 128, 8) X(64, 128, 64, 4) X(64, 64, 128, 4)
#define ATTN_FUSED_VARIANTS_HD80(X) X(80, 128, 64, 8)
#define ATTN_FUSED_VARIANTS_HD96(X) X(96, 128, 64, 8)
#define ATTN_FUSED_VARIANTS_HD128(X) \
  X(128, 128, 64, 8) X(128, 64, 64, 4) X(128, 128, 64, 4) X(128, 128, 32, 4)
#define ATTN_FUSED_VARIANTS_HD256(X) X(256, 64, 32, 4)

// Paged K/V: one tile per head dim (the kernel with PagedTraits, FusedPagedLaunch), fp16 and
// bf16, compiled in kernels/fused/fused_paged_hd<H>.cu. Each tile also appears in the list above
// (FusedPagedPlan::variant names it), so the contiguous kernel with that variant runs the same
// arithmetic on the same data. Chosen for prefill (B of a few, N = 8..32, T up to a few
// thousand, often over a cached prefix): the 64-row tiles that win at such loads (the L < 12
// causal rows of kDefaultRules), 16-row warps with Q in registers and room for the page lookups
// (128x64/4w at H=128 already spills 164 bytes contiguous). ptxas (CUDA 13.0), registers
// sm_89 / sm_90a, no spills: h64 64x128/4w 254 / 254 (contiguous 237 / 240), h128 64x64/4w
// 223 / 226 (contiguous 230 / 223); both keep 2 blocks per SM.
#define ATTN_FUSED_PAGED_VARIANTS_HD64(X) X(64, 64, 128, 4)
#define ATTN_FUSED_PAGED_VARIANTS_HD128(X) X(128, 64, 64, 4)
#define ATTN_FUSED_PAGED_ALL_VARIANTS(X) \
  ATTN_FUSED_PAGED_VARIANTS_HD64(X) ATTN_FUSED_PAGED_VARIANTS_HD128(X)

using FusedPagedLaunchFn = cudaError_t (*)(const FusedPagedParams& params, dim3 grid,
                                           int smem_bytes, cudaStream_t stream);
template <int kDType, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t FusedPagedLaunch(const FusedPagedParams& params, dim3 grid, int smem_bytes,
                             cudaStream_t stream);
template <int kDType, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t FusedPagedPrepare(int smem_bytes);

#define ATTN_FUSED_ALL_VARIANTS(X)                                                            \
  ATTN_FUSED_VARIANTS_HD32(X) ATTN_FUSED_VARIANTS_HD64(X) ATTN_FUSED_VARIANTS_HD80(X)          \
  ATTN_FUSED_VARIANTS_HD96(X) ATTN_FUSED_VARIANTS_HD128(X) ATTN_FUSED_VARIANTS_HD256(X)

// Every variant fits an L4 (sm_89: 99 KB of shared memory per block, also what
// ATTN_EMULATE_L4 enforces at plan time).
#define ATTN_FUSED_CHECK_SMEM(H, BM, BN, W)                                                    \
  static_assert(FusedSmemBytes(H, BM, BN) <= 101376, "fused variant exceeds the L4's 99 KB");
ATTN_FUSED_ALL_VARIANTS(ATTN_FUSED_CHECK_SMEM)
ATTN_FUSED_PAGED_ALL_VARIANTS(ATTN_FUSED_CHECK_SMEM)
#undef ATTN_FUSED_CHECK_SMEM

// Declarations of the explicit instantiations (defined in fused_hd<H>.cu), so no other
// translation unit instantiates the kernels implicitly.
#define ATTN_FUSED_EXTERN_ONE(DT, H, BM, BN, W)                                                  \
  extern template cudaError_t FusedLaunch<DT, H, BM, BN, W>(const FusedParams&, dim3, int,     \
                                                             cudaStream_t);                    \
  extern template cudaError_t FusedPrepare<DT, H, BM, BN, W>(int);
#define ATTN_FUSED_EXTERN(H, BM, BN, W)                                                        \
  ATTN_FUSED_EXTERN_ONE(static_cast<int>(DType::kFloat16), H, BM, BN, W)                       \
  ATTN_FUSED_EXTERN_ONE(static_cast<int>(DType::kBFloat16), H, BM, BN, W)
ATTN_FUSED_ALL_VARIANTS(ATTN_FUSED_EXTERN)
#define ATTN_FUSED_PAGED_EXTERN_ONE(DT, H, BM, BN, W)                                            \
  extern template cudaError_t FusedPagedLaunch<DT, H, BM, BN, W>(const FusedPagedParams&, dim3, \
                                                                  int, cudaStream_t);          \
  extern template cudaError_t FusedPagedPrepare<DT, H, BM, BN, W>(int);
#define ATTN_FUSED_PAGED_EXTERN(H, BM, BN, W)                                                  \
  ATTN_FUSED_PAGED_EXTERN_ONE(static_cast<int>(DType::kFloat16), H, BM, BN, W)                 \
  ATTN_FUSED_PAGED_EXTERN_ONE(static_cast<int>(DType::kBFloat16), H, BM, BN, W)
ATTN_FUSED_PAGED_ALL_VARIANTS(ATTN_FUSED_PAGED_EXTERN)

}  // namespace attn::kernels::fused
