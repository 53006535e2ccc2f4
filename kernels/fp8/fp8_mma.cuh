// The PTX wrappers of our 8-bit attention kernel (fp8_kernel.cuh): the m16n8k32 e4m3 and s8
// tensor-core MMAs, a 4-byte cp.async, an 8-byte shared load, and the f16x2 / e4m3 conversions
// and exponentials of its online softmax. Device code only.
//
// Internal to kernels/fp8/.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace attn::kernels::fp8 {

/// c += a·b for one m16n8k32 e4m3 tile; a: 4 regs (row-major 16x32), b: 2 regs (col 32x8).
__device__ __forceinline__ void MmaE4M3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // never launched: Fp8AttentionPlanFor refuses devices below sm_89
#endif
}

/// c += a·b for one m16n8k32 s8 tile (int32 accumulation); fragment layouts as MmaE4M3's.
__device__ __forceinline__ void MmaS8(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                      uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // never launched: Int8AttentionPlanFor refuses devices below sm_89
#endif
}

/// 4-byte async copy global -> shared; zeros when !pred (src-size 0 reads nothing).
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ float2 LdShared2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

/// Two fp32 -> packed f16x2 (x0 in the low half), round to nearest.
__device__ __forceinline__ uint32_t F32x2ToF16x2(float x0, float x1) {
  uint32_t h;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(h) : "f"(x1), "f"(x0));
  return h;
}
/// 2^x on both halves of an f16x2 (one MUFU operation for two values).
__device__ __forceinline__ uint32_t Exp2F16x2(uint32_t x) {
  uint32_t y;
  asm("ex2.approx.f16x2 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ uint32_t AddF16x2(uint32_t a, uint32_t b) {
  uint32_t c;
  asm("add.rn.f16x2 %0, %1, %2;\n" : "=r"(c) : "r"(a), "r"(b));
  return c;
}
/// Two f16x2 pairs -> four e4m3 bytes (lo's low half in byte 0), round to nearest, saturating.
__device__ __forceinline__ uint32_t F16x2PairToE4M3x4(uint32_t lo, uint32_t hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t a, b;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(a) : "r"(lo));
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(b) : "r"(hi));
  return static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16);
#else
  return 0u;
#endif
}

}  // namespace attn::kernels::fp8
