// The append folded into the decode launch (16-bit pages): a decode step's T_b new K/V rows
// (positions S_b - T_b .. S_b - 1) arrive with the launch in DecodeParams::new_k / new_v
// instead of being written to the pages by a separate append launch first. Every block reads
// those keys from there (the pages do not hold them yet), and the blocks of the sequence's
// last row chunk (whose rows see every key of their partition) store the rows of their
// partition into the pages, bit for bit as PagedAppendRun would. No block reads a page slot
// that another block of the launch writes, so no ordering between blocks is needed; the next
// launch on the stream sees the stored rows.
// Included only by decode_kernel.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decode_params.h"

namespace attn::kernels::decode {

/// Stores the new rows j in [max(new_start, k0), k_end) of kv head `kvh` of sequence `b`
/// (source row q_row0 + j - new_start of new_k / new_v) into their page slots. kRowBytes: one
/// token of one head in bytes (a multiple of 16). Plain 16-byte loads and stores by all threads.
template <int kRowBytes>
__device__ __forceinline__ void StoreNewRows(const DecodeParams& p, int b, int kvh,
                                             int64_t q_row0, int new_start, int k0, int k_end) {
  constexpr int kChunks = kRowBytes / 16;
  const int j0 = max(new_start, k0);
  const int n = k_end - j0;
  if (n <= 0) return;
  const int32_t* bt = p.block_tables + static_cast<int64_t>(b) * p.bt_stride;
  const int page_mask = (1 << p.page_shift) - 1;
  // The pool is written through the pointers the kernel reads it with (DecodeParams keeps
  // them const for the read path; PagedDecodeRun passes writable pool memory).
  auto* kp = static_cast<unsigned char*>(const_cast<void*>(p.k));
  auto* vp = static_cast<unsigned char*>(const_cast<void*>(p.v));
  const auto* nk = static_cast<const unsigned char*>(p.new_k);
  const auto* nv = static_cast<const unsigned char*>(p.new_v);
  for (int idx = static_cast<int>(threadIdx.x); idx < n * kChunks; idx += kThreads) {
    const int j = j0 + idx / kChunks;
    const int c = idx % kChunks;
    const int64_t page = __ldg(bt + (j >> p.page_shift));
    const int64_t slot = ((page * p.num_kv_heads + kvh) << p.page_shift) | (j & page_mask);
    const int64_t dst = slot * kRowBytes + c * 16;
    const int64_t src = ((q_row0 + j - new_start) * p.num_kv_heads + kvh) * kRowBytes + c * 16;
    *reinterpret_cast<uint4*>(kp + dst) = __ldcg(reinterpret_cast<const uint4*>(nk + src));
    *reinterpret_cast<uint4*>(vp + dst) = __ldcg(reinterpret_cast<const uint4*>(nv + src));
  }
}

}  // namespace attn::kernels::decode
