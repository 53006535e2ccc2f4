// Device building blocks of the FP8/INT8 accuracy pre-passes (attn/kernels/fp8_prepass.h):
// the 16-bit element decode, the block -> (chunk, head, entry) mapping, and the load of one
// token row's 8-element slice with the Hadamard rotation and K smoothing applied. Shared by
// fp8_prepass.cu (per-tensor E4M3) and the per-token INT8 pre-pass, so that both transform a
// row identically (add/sub/mul with _rn intrinsics only: the host references reproduce them).
//
// Internal to kernels/fp8/. Device code only; include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fp8_prepass_geometry.h"

namespace attn::kernels::fp8 {

/// What one launch transforms: `src` (16-bit patterns) read through `t`; K's means of the
/// rotated rows (null: no smoothing), the Hadamard order (0: no rotation) and its 1/sqrt(order).
struct Transform {
  const uint16_t* src = nullptr;
  PrepassTensor t;
  const float* mean = nullptr;  ///< (B, heads, H)
  int order = 0;
  float norm = 1.f;
};

template <bool kBf16>
__device__ __forceinline__ float ToFloat(uint32_t bits16) {
  if constexpr (kBf16) {
    return __uint_as_float(bits16 << 16);
  } else {
    __half_raw r;
    r.x = static_cast<unsigned short>(bits16);
    return __half2float(__half(r));
  }
}

/// Block (chunk, head, entry) from a linear block index; `reverse` walks the grid backwards.
struct BlockAt {
  int64_t chunk, head, entry;
};
__device__ __forceinline__ BlockAt Locate(bool reverse) {
  const int64_t nx = gridDim.x, ny = gridDim.y;
  int64_t lin = blockIdx.x + nx * (blockIdx.y + ny * static_cast<int64_t>(blockIdx.z));
  if (reverse) lin = nx * ny * gridDim.z - 1 - lin;
  return BlockAt{lin % nx, (lin / nx) % ny, lin / (nx * ny)};
}

/// x <- x·H_order·order^-1/2 over aligned blocks of `order` elements of the row held by a row's
/// lanes (8 elements per lane): the fast Walsh-Hadamard transform, stages of stride 1, 2, 4
/// inside the thread's 8 elements, then 8 .. order/2 across lanes (partner lane ^ s/8).
__device__ __forceinline__ void HadamardRotate(const Transform& tr, int lane, float x[8]) {
#pragma unroll
  for (int s = 1; s < 8; s <<= 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if ((i & s) == 0) {
        const float a = x[i], b = x[i + s];
        x[i] = __fadd_rn(a, b);
        x[i + s] = __fsub_rn(a, b);
      }
    }
  }
  for (int s = 8; s < tr.order; s <<= 1) {
    const int m = s / 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float p = __shfl_xor_sync(0xffffffffu, x[i], m);
      x[i] = (lane & m) ? __fsub_rn(p, x[i]) : __fadd_rn(x[i], p);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = __fmul_rn(x[i], tr.norm);
}

/// The 16 bytes of this thread's 8 elements of token `tok` (zeros unless `mine`: the row is
/// valid and lane·8 < head_dim). Split from TransformRow so that a thread can issue the loads
/// of all its passes before the first transform (more bytes in flight per thread).
__device__ __forceinline__ uint4 LoadRow(const Transform& tr, const BlockAt& at, int64_t tok,
                                         bool mine, int lane) {
  if (!mine) return make_uint4(0u, 0u, 0u, 0u);
  const int64_t H = tr.t.head_dim;
  const int64_t row = tr.t.RowBase(at.entry) + tok;
  return *reinterpret_cast<const uint4*>(tr.src + (row * tr.t.heads + at.head) * H + lane * 8);
}

/// Decodes the 16 bytes `w` of LoadRow, rotates them (tr.order > 0) and then subtracts the mean
/// (tr.mean non-null and `mine`: K's mean per channel IN THE ROTATED BASIS, i.e. of the rotated
/// rows). Every thread of the warp must call it (the rotation shuffles across a row's lanes).
template <bool kBf16>
__device__ __forceinline__ void TransformRow(const Transform& tr, const BlockAt& at, uint4 w,
                                             bool mine, int lane, float x[8]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x[2 * j] = ToFloat<kBf16>(words[j] & 0xffffu);
    x[2 * j + 1] = ToFloat<kBf16>(words[j] >> 16);
  }
  if (tr.order != 0) HadamardRotate(tr, lane, x);
  if (mine && tr.mean != nullptr) {
    const float* m = tr.mean + (at.entry * tr.t.heads + at.head) * tr.t.head_dim + lane * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __fsub_rn(x[i], m[i]);
  }
}

/// LoadRow then TransformRow for token `tok` (row valid: `ok`).
template <bool kBf16>
__device__ __forceinline__ void LoadTransformed(const Transform& tr, const BlockAt& at, int64_t tok,
                                                bool ok, int lane, float x[8]) {
  const bool mine = ok && lane * 8 < tr.t.head_dim;
  TransformRow<kBf16>(tr, at, LoadRow(tr, at, tok, mine, lane), mine, lane, x);
}

}  // namespace attn::kernels::fp8
