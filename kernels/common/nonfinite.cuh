// Bit tests for non-finite 16-bit floats, shared by the tile kernels (fused, decode).
//
// Why the kernels need them (DESIGN.md §4): a key a query row cannot see (causal, window)
// must have no effect on that row whatever it holds. Tensor-core kernels multiply the masked
// probabilities (exact zeros) by the V tile, and 0 · NaN = 0 · Inf = NaN in IEEE arithmetic,
// so a non-finite V row inside a boundary tile would reach rows that never see it. The kernels
// therefore test the V tiles of boundary tiles with these functions and, in the rare case that
// one holds ±Inf or NaN, zero those elements in shared memory and mark the rows that do see
// them (their output row becomes NaN). Keys past S_b never reach shared memory (zero-filled
// copies), so only causal/window-masked keys need this.
#pragma once

#include <cstdint>

namespace attn::kernels::common {

/// Exponent mask of one 16-bit float: all ones means ±Inf or NaN.
/// fp16 (IEEE binary16): 5 exponent bits 0x7c00; bf16: 8 exponent bits 0x7f80.
template <bool kBF16>
constexpr uint16_t kExpMask16 = kBF16 ? 0x7f80u : 0x7c00u;

/// True when either 16-bit float packed in `x` (low and high half) is ±Inf or NaN.
template <bool kBF16>
__device__ __forceinline__ bool AnyNonFinite16x2(uint32_t x) {
  constexpr uint32_t m = kExpMask16<kBF16>;
  return (x & m) == m || ((x >> 16) & m) == m;
}

/// `x` with each non-finite 16-bit half replaced by +0.
template <bool kBF16>
__device__ __forceinline__ uint32_t ZeroNonFinite16x2(uint32_t x) {
  constexpr uint32_t m = kExpMask16<kBF16>;
  if ((x & m) == m) x &= 0xffff0000u;
  if (((x >> 16) & m) == m) x &= 0x0000ffffu;
  return x;
}

/// True when any of the four E4M3 bytes in `x` is NaN (S.1111.111; E4M3 has no infinities).
__device__ __forceinline__ bool AnyNaNE4M3x4(uint32_t x) {
  return __vcmpeq4(x & 0x7f7f7f7fu, 0x7f7f7f7fu) != 0u;
}

/// `x` with each NaN E4M3 byte replaced by +0.
__device__ __forceinline__ uint32_t ZeroNaNE4M3x4(uint32_t x) {
  return x & ~__vcmpeq4(x & 0x7f7f7f7fu, 0x7f7f7f7fu);
}

}  // namespace attn::kernels::common
