// The paged KV-cache page format (DESIGN.md §7) and the views kernels read it through.
//
// A sub-pool holds the pages of one KV layout class (num_kv_heads K, head_dim H, kv dtype).
// K and V live in two arrays of identical shape, so cuDNN's paged SDPA can read them through
// strides:
//   k_pages, v_pages: [num_pages, K, page_tokens, H] of kv_dtype, row-major
//   element (page p, head h, slot t, dim d) at ((p*K + h)*page_tokens + t)*H + d   (int64)
// A sequence's layer owns a block table: logical block i (tokens [i*page_tokens,
// (i+1)*page_tokens)) lives in physical page block_table[i]. Token j of the layer is at
// page block_table[j / page_tokens], slot j % page_tokens. Slots past the layer's length hold
// garbage and are never read.
// FP8 (kFloat8E4M3) storage: real value = stored value × scale, with one scale per
// (sequence layer, kv head) for K and one for V (the `*_scales` arrays below).
// All offsets are 64-bit. This header is host- and device-compatible.
#pragma once

#include <cstdint>

#include "attn/kernels/attention_problem.h"

namespace attn::kernels {

/// One sub-pool's page arrays (device pointers) and their geometry.
struct PagedKvPool {
  void* k_pages = nullptr;     ///< [num_pages, K, page_tokens, H] kv_dtype
  void* v_pages = nullptr;     ///< same shape as k_pages
  int64_t num_pages = 0;
  int32_t page_tokens = 0;     ///< tokens per page (a power of two, e.g. 16)
  int32_t num_kv_heads = 0;    ///< K
  int32_t head_dim = 0;        ///< H
  DType kv_dtype = DType::kBFloat16;  ///< kFloat16, kBFloat16 or kFloat8E4M3

  /// Element offset of (page, head, slot, dim 0).
  ATTN_HD int64_t Offset(int64_t page, int64_t head, int64_t slot) const {
    return ((page * num_kv_heads + head) * page_tokens + slot) * head_dim;
  }
};

/// A batch of sequences' layers to read (attention) or write (append) through block tables.
struct PagedBatch {
  int64_t batch = 0;                   ///< B sequences (each one layer)
  const int32_t* block_tables = nullptr;  ///< (B, block_table_stride) int32 page indices
  int64_t block_table_stride = 0;      ///< entries per row (>= max blocks of any sequence)
  const int32_t* kv_lengths = nullptr; ///< (B) tokens in the cache after the append
  const float* k_scales = nullptr;     ///< (B, K) FP8 only: dequantisation scales of K
  const float* v_scales = nullptr;     ///< (B, K) FP8 only: dequantisation scales of V
};

}  // namespace attn::kernels
