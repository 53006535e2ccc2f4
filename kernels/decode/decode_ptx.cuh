// PTX and bit-level helpers of the decode kernels (cp.async, ldmatrix, mma.sync m16n8k16,
// exp2, e4m3 -> fp16 converts, shared-memory vector loads/stores, non-finite V checks).
// Included by decode_kernel.cuh and the epilogue pieces (decode_merge.cuh, decode_fold.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/nonfinite.cuh"

namespace attn::kernels::decode {
// ---- PTX wrappers --------------------------------------------------------------------------

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte async copy global -> shared; writes zeros when !pred (src-size 0 reads nothing).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// c += a·b for one m16n8k16 tile (row.col), fp32 accumulation; bf16 or fp16 operands.
template <bool kBf16>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Packs two floats into a 16-bit pair (low half = lo), round to nearest.
template <bool kBf16>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (kBf16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}
/// The float value of one 16-bit element.
template <bool kBf16>
__device__ __forceinline__ float HalfToFloat(uint16_t bits) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

/// Two e4m3 bytes of w (bytes 0, 1 when !kHigh, bytes 2, 3 when kHigh) -> an fp16 pair, the
/// lower byte in the low half. sm_89+: cvt.rn.f16x2.e4m3x2 (F2FP.F16.E4M3.UNPACK_B), the exact
/// value. Older targets (never built here; kept so the header compiles for them): bit
/// operations giving the value × 2^-8 (s.eeee.mmm at bits 15, 13..7 of a half is the fp16
/// s.0eeee.mmm0000000, normal and subnormal alike); Fp8Unscale() undoes the factor.
template <bool kHigh>
__device__ __forceinline__ uint32_t Fp8x2ToHalf2(uint32_t w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t d;
  if constexpr (kHigh) {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n"
        : "=r"(d)
        : "r"(w));
  } else {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n"
        : "=r"(d)
        : "r"(w));
  }
  return d;
#else
  const uint32_t x = __byte_perm(w, 0u, kHigh ? 0x3424u : 0x1404u);  // byte -> high byte of a half
  return (x & 0x80008000u) | ((x >> 1) & 0x3f803f80u);
#endif
}
/// The factor the dequantised FP8 values carry relative to the stored e4m3 values (see above).
__device__ __forceinline__ float Fp8Unscale() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return 1.f;
#else
  return 256.f;
#endif
}

/// 16 bytes of shared memory at `addr` into four words.
__device__ __forceinline__ void LdShared4(uint32_t addr, uint32_t (&w)[4]) {
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "r"(addr));
}

__device__ __forceinline__ void StShared4(uint32_t addr, const uint32_t (&w)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
}

/// A 32-bit word of a V row: two fp16/bf16 values (16-bit pages) or four E4M3 bytes.
template <bool kFp8, bool kBf16>
__device__ __forceinline__ bool VWordNonFinite(uint32_t w) {
  if constexpr (kFp8) {
    return common::AnyNaNE4M3x4(w);
  } else {
    return common::AnyNonFinite16x2<kBf16>(w);
  }
}

template <bool kFp8, bool kBf16>
__device__ __forceinline__ uint32_t VWordZeroNonFinite(uint32_t w) {
  if constexpr (kFp8) {
    return common::ZeroNaNE4M3x4(w);
  } else {
    return common::ZeroNonFinite16x2<kBf16>(w);
  }
}

/// Hints the 128-byte line at `p` into L2 (no register result, never faults the loop).
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

__device__ __forceinline__ uint32_t BytePerm(uint32_t a, uint32_t b, uint32_t sel) {
  return __byte_perm(a, b, sel);
}

}  // namespace attn::kernels::decode
