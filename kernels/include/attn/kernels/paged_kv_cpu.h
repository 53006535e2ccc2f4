// Host (CPU) code that owns the paged KV-cache page format of paged_kv.h:
// append new K/V rows through a block table, gather a layer's K/V back into
// contiguous (S, K, H) buffers, copy a page (copy-on-write), poison a page
// (debug), and the FP8 E4M3 conversions the cache uses.
//
// The CUDA append/decode kernels (kernels/decode/) read and write exactly the
// same bytes:
//   k_pages, v_pages: [num_pages, K, page_tokens, H] of kv_dtype, element
//   offset
//   ((page*K + head)*page_tokens + slot)*H + dim (64-bit), token j of a layer
//   at page block_table[j / page_tokens], slot j % page_tokens.
// FP8 (kFloat8E4M3) storage: stored = saturate(round_to_nearest_even(real /
// scale)), real = stored × scale, with one scale per (layer, kv head) for K and
// one for V. Values whose |real / scale| exceeds 448 (E4M3's largest finite)
// are stored as ±448 and counted as saturations. NaN inputs are stored as NaN
// (0x7F). Besides the kv dtypes of paged_kv.h, the CPU path also accepts
// kFloat32 pages. All pointers here are host pointers. Functions are pure over
// their arguments and thread-safe as long as concurrent calls write disjoint
// pages.
#pragma once

#include <cstdint>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/paged_kv.h"
#include "attn/common/status.h"

namespace attn::kernels {

/// Largest finite E4M3 magnitude.
constexpr float kFp8E4M3Max = 448.f;

/// E4M3 bits -> float (exact). 0x7F/0xFF are NaN.
float Fp8E4M3ToFloat(uint8_t bits);

/// float -> E4M3 bits, round to nearest even, saturating to ±448. Sets
/// *saturated (when not null) to true if |x| > 448 (x is then stored as ±448).
/// NaN maps to 0x7F.
uint8_t FloatToFp8E4M3(float x, bool *saturated = nullptr);

/// Bytes of one page of K (or of V): K * page_tokens * H * sizeof(kv_dtype).
inline int64_t PageBytes(const PagedKvPool &pool) {
  return static_cast<int64_t>(pool.num_kv_heads) * pool.page_tokens * pool.head_dim *
         DTypeSize(pool.kv_dtype);
}

/// Writes `num_tokens` rows of k and v (each (num_tokens, K, H) of `src_dtype`,
/// row-major) at token positions [start, start + num_tokens) of the layer whose
/// pages are `block_table`
/// (`num_blocks` entries, enough to cover start + num_tokens tokens). Converts
/// to the pool's kv dtype; FP8 pools quantise with `k_scales` / `v_scales` ((K)
/// each, > 0) and add the number of saturated elements to *saturations
/// (nullable). Errors: INVALID_ARGUMENT for a null pointer, a src dtype of FP8,
/// too few blocks, a page index outside [0, num_pages) or a
/// missing/non-positive FP8 scale. Nothing is written then.
Status PagedAppendCpu(const PagedKvPool &pool, const int32_t *block_table, int64_t num_blocks,
                      int64_t start, int64_t num_tokens, const void *k, const void *v,
                      DType src_dtype, const float *k_scales, const float *v_scales,
                      int64_t *saturations);

/// Reads tokens [0, kv_len) of a layer into contiguous k_out/v_out ((kv_len, K,
/// H) of `out_dtype`: the pool's dtype, or kFloat32, kFloat16, kBFloat16 with
/// conversion; FP8 pools are dequantised with the scales). Same-dtype gathers
/// are plain copies (bit-exact). Errors: INVALID_ARGUMENT as for PagedAppendCpu
/// (out_dtype FP8 is refused).
Status PagedGatherCpu(const PagedKvPool &pool, const int32_t *block_table, int64_t num_blocks,
                      int64_t kv_len, const float *k_scales, const float *v_scales, DType out_dtype,
                      void *k_out, void *v_out);

/// Copies slots [0, tokens) of page `src` to page `dst` for K and V, every head
/// (copy-on-write of a shared partial page). Errors: INVALID_ARGUMENT for bad
/// page indices or token count.
Status PagedCopyPageCpu(const PagedKvPool &pool, int32_t src, int32_t dst, int64_t tokens);

/// Fills page `page` (K and V, every slot) with NaN of the kv dtype: a debug
/// aid proving that slots past a layer's length, and freed pages, are never
/// read.
void PagedPoisonPageCpu(const PagedKvPool &pool, int32_t page);

}  // namespace attn::kernels
