// Non-finite V values at masked keys of a boundary tile (DESIGN.md §4: a key a row cannot see
// has no effect on it, NaN and ±Inf included). See kernels/common/nonfinite.cuh for why the
// tensor-core P·V needs this: masked probabilities are exact zeros, and 0 · NaN is NaN.
//
// Only boundary (masked) tiles are checked: interior tiles have no masked key, and keys past
// S_b are zero-filled by the copies. Per boundary tile the common case costs one pass over the
// V tile in shared memory (H/8 16-byte loads per thread for 64-key tiles at 128 threads, fewer
// at 256) and one barrier (__syncthreads_or). Only when the tile holds ±Inf or NaN:
//   1. every warp computes the per-key flags of the whole tile (lane l: keys l + 32i), so no
//      shared scratch is needed, then a barrier;
//   2. the non-finite elements are zeroed in place, then a barrier (before any ldmatrix of V);
//   3. rows that see a flagged key get their O accumulator set to NaN: such a row's output is
//      NaN in every element (not per element as IEEE arithmetic on the exact sum would give,
//      and NaN also where the exact sum is ±Inf). The proto documents this.
// Included by fused_kernel.cuh only.
#pragma once

#include <cstdint>

#include "../common/nonfinite.cuh"
#include "fused_params.h"

namespace attn::kernels::fused {

/// True on every thread of the block when the V tile at shared address `s_v` (kBlockN rows of
/// the tile layout) holds a non-finite element. Contains one barrier: call from all threads.
template <class Tr>
__device__ __forceinline__ bool BlockTileHasNonFinite(uint32_t s_v, int tid) {
  using L = typename Tr::Layout;
  constexpr bool kBF16 = Tr::kDType == static_cast<int>(DType::kBFloat16);
  constexpr int kTotal = Tr::kBlockN * L::kChunks;
  bool bad = false;
#pragma unroll
  for (int it = 0; it < (kTotal + Tr::kThreads - 1) / Tr::kThreads; ++it) {
    const int idx = tid + it * Tr::kThreads;
    if (kTotal % Tr::kThreads == 0 || idx < kTotal) {
      uint32_t w[4];
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                   : "r"(s_v + L::Offset(idx / L::kChunks, idx % L::kChunks)));
#pragma unroll
      for (int e = 0; e < 4; ++e) bad |= common::AnyNonFinite16x2<kBF16>(w[e]);
    }
  }
  return __syncthreads_or(bad) != 0;
}

/// The rare path: fills `key_bad` (bit j % 32 of word j / 32 set when key j of the tile holds a
/// non-finite element; the same on every thread) and then zeroes those elements in the tile.
/// Two barriers: call from all threads, after BlockTileHasNonFinite returned true.
template <class Tr>
__device__ __noinline__ void FlagAndZeroNonFinite(uint32_t s_v, int tid,
                                                  uint32_t (&key_bad)[Tr::kBlockN / 32]) {
  using L = typename Tr::Layout;
  constexpr bool kBF16 = Tr::kDType == static_cast<int>(DType::kBFloat16);
  const int lane = tid & 31;
#pragma unroll
  for (int w = 0; w < Tr::kBlockN / 32; ++w) {
    bool kb = false;
    for (int c = 0; c < L::kChunks; ++c) {
      uint32_t x[4];
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                   : "r"(s_v + L::Offset(32 * w + lane, c)));
#pragma unroll
      for (int e = 0; e < 4; ++e) kb |= common::AnyNonFinite16x2<kBF16>(x[e]);
    }
    key_bad[w] = __ballot_sync(0xffffffffu, kb);
  }
  __syncthreads();  // every warp has read the tile before any element is zeroed
  constexpr int kTotal = Tr::kBlockN * L::kChunks;
  for (int idx = tid; idx < kTotal; idx += Tr::kThreads) {
    const uint32_t addr = s_v + L::Offset(idx / L::kChunks, idx % L::kChunks);
    uint32_t x[4];
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(addr));
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = common::ZeroNonFinite16x2<kBF16>(x[e]);
    asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(x[0]), "r"(x[1]),
                 "r"(x[2]), "r"(x[3])
                 : "memory");
  }
  __syncthreads();  // the zeros are visible to every warp's ldmatrix of V
}

/// True when a key in [lo, hi] (tile-relative, clipped to the tile) is flagged in `key_bad`.
template <int kBlockN>
__device__ __forceinline__ bool RangeHasFlaggedKey(const uint32_t (&key_bad)[kBlockN / 32], int lo,
                                                   int hi) {
  lo = max(lo, 0);
  hi = min(hi, kBlockN - 1);
  bool any = false;
#pragma unroll
  for (int w = 0; w < kBlockN / 32; ++w) {
    const int a = max(lo - 32 * w, 0), z = min(hi - 32 * w, 31);
    if (a <= z) {
      const uint32_t upto = z == 31 ? 0xffffffffu : ((1u << (z + 1)) - 1u);
      any |= (key_bad[w] & upto & ~((1u << a) - 1u)) != 0u;
    }
  }
  return any;
}

}  // namespace attn::kernels::fused
