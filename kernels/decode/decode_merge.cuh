// The split-KV merge, done in the decode launch itself (no second kernel): every partition
// block of a (sequence b, kv head, chunk of 16 query rows) writes its normalised partial O
// (fp32) and lse into the workspace, then counts itself in on that chunk's arrival counter;
// the block that arrives last (it sees parts - 1) merges all partitions of the chunk's rows
// into o and lse and resets the counter to 0 for the next launch. This is the "last block"
// reduction of the CUDA programming guide's threadfence example (B.5, memory fence
// functions): each block's writes are fenced (__threadfence) before its arrival, and the last
// block reads the partials through L2 (__ldcg), so it sees every other block's writes.
//
// Merge arithmetic (per row and 4 output dims): O = Σ_p w_p O_p / Σ_p w_p with
// w_p = exp(lse_p − max_p lse_p) and lse = max + log Σ w_p, partitions in ascending order:
// the same expression, in the same order, as the separate merge kernel this replaced, so the
// outputs are bit-identical to it.
// Included only by decode_kernel.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decode_params.h"
#include "decode_ptx.cuh"

namespace attn::kernels::decode {

/// Counts this block in on its chunk's counter; true in the one block that arrives last (of
/// `parts`), which then owns the merge (the counter is back at 0). Called by every thread of
/// the block after its partial is written.
__device__ __forceinline__ bool ArriveLast(unsigned int* counter, int parts) {
  __threadfence();  // this thread's partial is visible device-wide before the arrival
  __syncthreads();  // ... and every thread's
  bool last = false;
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == static_cast<unsigned int>(parts - 1);
    if (last) atomicExch(counter, 0u);  // every block of the chunk has arrived: reset
  }
  last = __syncthreads_or(last) != 0;
  if (last) __threadfence();  // order the reads of the other blocks' partials after it
  return last;
}

/// The last block's merge: rows [row_begin, row_begin + rows_valid) of the (query token,
/// group head) pairs of kv head `kvh` of sequence `b` (query rows from q_row0; total_q rows in
/// all), over partitions [0, parts) of the workspace, into o (dtype) and lse.
template <int kHeadDim, bool kBf16>
__device__ __forceinline__ void MergePartitions(const DecodeParams& p, int b, int kvh,
                                                int row_begin, int rows_valid, int parts,
                                                int64_t q_row0, int64_t total_q) {
  constexpr float kNegInf = -__builtin_huge_valf();
  constexpr int kQuads = kHeadDim / 4;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.max_q_len;  // workspace rows per part
  for (int idx = static_cast<int>(threadIdx.x); idx < rows_valid * kQuads; idx += kThreads) {
    const int pair = row_begin + idx / kQuads;
    const int d = (idx % kQuads) * 4;
    const int t = pair / p.group;
    const int head = kvh * p.group + pair % p.group;
    const int64_t wrow0 = static_cast<int64_t>(b) * p.max_q_len + t;
    float m = kNegInf;
    for (int q = 0; q < parts; ++q) {
      m = fmaxf(m, __ldcg(p.ws_lse + (q * rows + wrow0) * p.num_heads + head));
    }
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
    if (m != kNegInf) {
      for (int q = 0; q < parts; ++q) {
        const int64_t wr = (q * rows + wrow0) * p.num_heads + head;
        const float lq = __ldcg(p.ws_lse + wr);
        if (lq == kNegInf) continue;
        const float w = __expf(lq - m);
        const float4 x = __ldcg(reinterpret_cast<const float4*>(p.ws_o + wr * kHeadDim + d));
        o.x += w * x.x;
        o.y += w * x.y;
        o.z += w * x.z;
        o.w += w * x.w;
        wsum += w;
      }
    }
    const bool seen = wsum != 0.f;  // NaN (a visible NaN/+Inf logit) propagates
    const float inv = seen ? 1.f / wsum : 0.f;
    uint2 packed;
    packed.x = PackPair<kBf16>(seen ? o.x * inv : 0.f, seen ? o.y * inv : 0.f);
    packed.y = PackPair<kBf16>(seen ? o.z * inv : 0.f, seen ? o.w * inv : 0.f);
    uint16_t* og = static_cast<uint16_t*>(p.o) + ((q_row0 + t) * p.num_heads + head) * kHeadDim + d;
    *reinterpret_cast<uint2*>(og) = packed;
    if (d == 0 && p.lse != nullptr) {
      p.lse[static_cast<int64_t>(head) * total_q + q_row0 + t] = seen ? m + __logf(wsum) : kNegInf;
    }
  }
}

}  // namespace attn::kernels::decode
