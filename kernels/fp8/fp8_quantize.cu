// Per-tensor E4M3 quantisation and dequantisation (attn/kernels/fp8_quantize.h).
//
// amax is reduced exactly on the 16-bit patterns: for fp16 and bf16, |x| is the pattern with the
// sign bit cleared, and non-negative patterns order like their values (NaN above inf), so an
// integer max finds max |x| (and propagates NaN, which fmaxf would drop). Blocks combine with
// atomicMax on the float bits of the block's maximum (non-negative float bits order like values
// too), into the caller's workspace float zeroed by a memset on the same stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "attn/kernels/fp8_quantize.h"

namespace attn::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // grid-stride beyond: ~8 blocks per SM on an H200

/// float value of a 16-bit pattern of `kBf16 ? bfloat16 : float16`.
template <bool kBf16>
__device__ __forceinline__ float ToFloat(uint16_t bits) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  } else {
    __half_raw r;
    r.x = bits;
    return __half2float(__half(r));
  }
}

/// The scale of the header's formula, from the amax float (Fp8ScaleForAmax's device twin).
__device__ __forceinline__ float ScaleFor(float amax) {
  return (amax > 0.f && amax <= 3.402823466e38f) ? fminf(kE4M3Max / amax, kFp8MaxScale) : 1.f;
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) AmaxKernel(const uint16_t* __restrict__ src,
                                                       int64_t n, bool vec,
                                                       unsigned int* __restrict__ amax_bits) {
  uint32_t m = 0;  // max of (bits & 0x7fff)
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t start = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  int64_t tail = 0;
  if (vec) {
    const int64_t groups = n / 8;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    for (int64_t i = start; i < groups; i += stride) {
      const uint4 w = s4[i];
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        m = max(m, words[j] & 0x7fffu);
        m = max(m, (words[j] >> 16) & 0x7fffu);
      }
    }
    tail = groups * 8;
  }
  for (int64_t i = tail + start; i < n; i += stride) m = max(m, src[i] & 0x7fffu);
  // Warp, then block.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ uint32_t warp_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t b = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) b = max(b, warp_max[w]);
    // The float value of the block's maximum pattern; NaN patterns give a NaN float whose bits
    // (0x7fc00000 or above) still win the integer max over every finite value and inf.
    const float f = ToFloat<kBf16>(static_cast<uint16_t>(b));
    uint32_t fb = __float_as_uint(f);
    if (f != f) fb = 0x7fffffffu;
    atomicMax(amax_bits, fb);
  }
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(const uint16_t* __restrict__ src, int64_t n, bool vec,
                   const float* __restrict__ amax, uint8_t* __restrict__ dst,
                   float* __restrict__ d_scale, float* __restrict__ d_descale) {
  const float a = *amax;
  const float scale = ScaleFor(a);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *d_scale = scale;
    *d_descale = 1.f / scale;
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  int64_t tail = 0;
  if (vec) {
    const int64_t groups = n / 8;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint2* d2 = reinterpret_cast<uint2*>(dst);
    for (int64_t i = start; i < groups; i += stride) {
      const uint4 w = s4[i];
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
      uint32_t out[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t lo = words[2 * j], hi = words[2 * j + 1];
        const float2 f01 = make_float2(ToFloat<kBf16>(lo & 0xffffu) * scale,
                                       ToFloat<kBf16>(lo >> 16) * scale);
        const float2 f23 = make_float2(ToFloat<kBf16>(hi & 0xffffu) * scale,
                                       ToFloat<kBf16>(hi >> 16) * scale);
        const uint32_t p01 = __nv_cvt_float2_to_fp8x2(f01, __NV_SATFINITE, __NV_E4M3);
        const uint32_t p23 = __nv_cvt_float2_to_fp8x2(f23, __NV_SATFINITE, __NV_E4M3);
        out[j] = (p01 & 0xffffu) | (p23 << 16);
      }
      d2[i] = make_uint2(out[0], out[1]);
    }
    tail = groups * 8;
  }
  for (int64_t i = tail + start; i < n; i += stride) {
    dst[i] = static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(ToFloat<kBf16>(src[i]) * scale, __NV_SATFINITE, __NV_E4M3));
  }
}

/// n == 0: scale = descale = 1, amax = 0 (one thread).
__global__ void EmptyScales(float* d_scale, float* d_descale, float* amax) {
  *d_scale = 1.f;
  *d_descale = 1.f;
  *amax = 0.f;
}

template <int kDst>  // 0 float32, 1 float16, 2 bfloat16
__device__ __forceinline__ void StoreDequantized(void* dst, int64_t i, float f) {
  if constexpr (kDst == 0) {
    static_cast<float*>(dst)[i] = f;
  } else if constexpr (kDst == 1) {
    static_cast<__half*>(dst)[i] = __float2half_rn(f);
  } else {
    static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(f);
  }
}

/// dst[i] = e4m3(src[i]) · descale in dst's dtype. `vec8` (src 8-byte and dst 16-byte aligned):
/// each thread converts 8 elements per step (one 8-byte load, 16- or 32-byte stores), the last
/// n % 8 one by one; otherwise one element per step. The same per-element arithmetic either way.
template <int kDst>
__global__ void __launch_bounds__(kThreads)
    DequantizeKernel(const uint8_t* __restrict__ src, int64_t n,
                     const float* __restrict__ d_descale, void* __restrict__ dst, bool vec8) {
  const float ds = d_descale ? *d_descale : 1.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  auto convert = [&](uint8_t b) {
    __half_raw hr = __nv_cvt_fp8_to_halfraw(b, __NV_E4M3);
    return __half2float(__half(hr)) * ds;  // e4m3 -> fp16 is exact
  };
  const int64_t n8 = vec8 ? n / 8 : 0;
  for (int64_t v = first; v < n8; v += stride) {
    const uint2 w = reinterpret_cast<const uint2*>(src)[v];
    float f[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[j] = convert(static_cast<uint8_t>(w.x >> (8 * j)));
      f[4 + j] = convert(static_cast<uint8_t>(w.y >> (8 * j)));
    }
    if constexpr (kDst == 0) {
      float4* d = reinterpret_cast<float4*>(dst) + 2 * v;
      d[0] = make_float4(f[0], f[1], f[2], f[3]);
      d[1] = make_float4(f[4], f[5], f[6], f[7]);
    } else {
      uint32_t h[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (kDst == 1) {
          const __half2 p = __floats2half2_rn(f[2 * j], f[2 * j + 1]);
          h[j] = *reinterpret_cast<const uint32_t*>(&p);
        } else {
          const __nv_bfloat162 p = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
          h[j] = *reinterpret_cast<const uint32_t*>(&p);
        }
      }
      reinterpret_cast<uint4*>(dst)[v] = make_uint4(h[0], h[1], h[2], h[3]);
    }
  }
  for (int64_t i = 8 * n8 + first; i < n; i += stride) StoreDequantized<kDst>(dst, i, convert(src[i]));
}

int BlocksFor(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

Status CudaInternal(const char* what, cudaError_t e) {
  return Internal(std::string("fp8 quantize: ") + what + " failed: " + cudaGetErrorName(e) +
                  " (" + cudaGetErrorString(e) + ")");
}

}  // namespace

Status Fp8QuantizePerTensor(const void* src, DType src_dtype, int64_t n, void* dst_e4m3,
                            float* d_scale, float* d_descale, float* d_amax_ws,
                            cudaStream_t stream) {
  if (src_dtype != DType::kFloat16 && src_dtype != DType::kBFloat16) {
    return InvalidArgument(std::string("fp8 quantize: source dtype ") + DTypeName(src_dtype) +
                           " is not supported (float16 and bfloat16 only)");
  }
  if (n < 0) return InvalidArgument("fp8 quantize: negative element count");
  if (d_scale == nullptr || d_descale == nullptr || d_amax_ws == nullptr) {
    return InvalidArgument("fp8 quantize: d_scale, d_descale and d_amax_ws must be non-null");
  }
  if (n == 0) {
    EmptyScales<<<1, 1, 0, stream>>>(d_scale, d_descale, d_amax_ws);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
  }
  if (src == nullptr || dst_e4m3 == nullptr) {
    return InvalidArgument("fp8 quantize: src and dst must be non-null");
  }
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(dst_e4m3) % 8 == 0;
  const uint16_t* s = static_cast<const uint16_t*>(src);
  const int blocks = BlocksFor(vec ? (n + 7) / 8 : n);
  cudaError_t e = cudaMemsetAsync(d_amax_ws, 0, sizeof(float), stream);
  if (e != cudaSuccess) return CudaInternal("cudaMemsetAsync", e);
  auto* amax_bits = reinterpret_cast<unsigned int*>(d_amax_ws);
  auto* dst = static_cast<uint8_t*>(dst_e4m3);
  if (src_dtype == DType::kBFloat16) {
    AmaxKernel<true><<<blocks, kThreads, 0, stream>>>(s, n, vec, amax_bits);
    QuantizeKernel<true><<<blocks, kThreads, 0, stream>>>(s, n, vec, d_amax_ws, dst, d_scale,
                                                          d_descale);
  } else {
    AmaxKernel<false><<<blocks, kThreads, 0, stream>>>(s, n, vec, amax_bits);
    QuantizeKernel<false><<<blocks, kThreads, 0, stream>>>(s, n, vec, d_amax_ws, dst, d_scale,
                                                           d_descale);
  }
  e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
}

Status Fp8Dequantize(const void* src_e4m3, int64_t n, const float* d_descale, DType dst_dtype,
                     void* dst, cudaStream_t stream) {
  if (n < 0) return InvalidArgument("fp8 dequantize: negative element count");
  if (dst_dtype == DType::kFloat8E4M3) {
    return InvalidArgument("fp8 dequantize: destination dtype must be float32, float16 or "
                           "bfloat16");
  }
  if (n == 0) return Status::Ok();
  if (src_e4m3 == nullptr || dst == nullptr) {
    return InvalidArgument("fp8 dequantize: src and dst must be non-null");
  }
  const auto* s = static_cast<const uint8_t*>(src_e4m3);
  const bool vec8 = reinterpret_cast<uintptr_t>(s) % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int blocks = BlocksFor(vec8 ? (n + 7) / 8 : n);
  switch (dst_dtype) {
    case DType::kFloat32:
      DequantizeKernel<0><<<blocks, kThreads, 0, stream>>>(s, n, d_descale, dst, vec8);
      break;
    case DType::kFloat16:
      DequantizeKernel<1><<<blocks, kThreads, 0, stream>>>(s, n, d_descale, dst, vec8);
      break;
    default:
      DequantizeKernel<2><<<blocks, kThreads, 0, stream>>>(s, n, d_descale, dst, vec8);
      break;
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
}

}  // namespace attn::kernels
