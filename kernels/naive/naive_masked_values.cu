// Non-finite V values at masked keys for the naive family (DESIGN.md §4: a key a row cannot see
// has no effect on it, NaN and ±Inf included).
//
// The P·V GEMM multiplies every masked probability (an exact zero) by its V row, and in IEEE
// arithmetic 0 · NaN = 0 · Inf = NaN, so a non-finite V row would reach rows that never see
// it. Two kernels keep the GEMMs as they are for every finite input:
//   - FlagNonFiniteV, once per call: flags[u] = 1 when unit u = (batch entry, kv head) has a
//     non-finite element anywhere in its V (all S rows: padding keys are multiplied too);
//   - RepairRows, after each chunk's P·V GEMM: for the rows of flagged units only, recomputes
//     O = Σ_{j in the row's band} P[j] · V[j] (fp32 accumulation) over the visible keys, so a
//     masked key's value is never touched; rows of unflagged units return at once.
// Cost for finite inputs: one read of V and one early-exit launch per chunk.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "naive_internal.h"

namespace attn::kernels::naive_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

template <typename T>
__device__ __forceinline__ float ToFloat(T x);
template <>
__device__ __forceinline__ float ToFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// One block per unit (grid-stride): flags[u] = any non-finite in V[b, 0:S, kh, 0:H].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    FlagNonFiniteV(const T* v, int64_t units, int64_t S, int64_t K, int64_t H, int32_t* flags) {
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t b = u / K, kh = u % K;
    bool bad = false;
    for (int64_t i = threadIdx.x; i < S * H; i += kThreads) {
      const int64_t j = i / H, d = i % H;
      bad |= !isfinite(ToFloat<T>(v[((b * S + j) * K + kh) * H + d]));
    }
    const int any = __syncthreads_or(bad);
    if (threadIdx.x == 0) flags[u] = any;
  }
}

/// One warp per probabilities row of the chunk (SoftmaxParams' row order); rows of flagged
/// units are recomputed over their band only and written to o (B, T, N, H).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RepairRows(SoftmaxParams p, const T* probs, const T* v, T* o, const int32_t* flags, int64_t H) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = p.units * p.G * p.T;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); r < rows;
       r += warps_total) {
    const int64_t u = p.first_unit + r / (p.T * p.G);
    if (flags[u] == 0) continue;
    const int64_t t = r % p.T;
    const int64_t g = (r / p.T) % p.G;
    const int64_t b = u / p.K, kh = u % p.K;
    const int64_t h = kh * p.G + g;
    int64_t q_len = LengthOr(p.q_lengths, b, p.T);
    int64_t kv_len = LengthOr(p.kv_lengths, b, p.S);
    q_len = q_len < 0 ? 0 : (q_len > p.T ? p.T : q_len);
    kv_len = kv_len < 0 ? 0 : (kv_len > p.S ? p.S : kv_len);
    const KeyRange kr = BandKeyRange(p.mask, t, q_len, kv_len);
    const T* pr = probs + r * p.ld;
    for (int64_t d = lane; d < H; d += 32) {
      float acc = 0.f;
      for (int64_t j = kr.lo; j <= kr.hi; ++j) {
        acc += ToFloat<T>(pr[j]) * ToFloat<T>(v[((b * p.S + j) * p.K + kh) * H + d]);
      }
      o[((b * p.T + t) * p.N + h) * H + d] = FromFloat<T>(acc);
    }
  }
}

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(n < (1 << 20) ? (n < 1 ? 1 : n) : (1 << 20));
}

}  // namespace

cudaError_t LaunchFlagNonFiniteV(DType dtype, const void* v, int64_t units, int64_t S, int64_t K,
                                 int64_t H, int32_t* flags, cudaStream_t stream) {
  if (units <= 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32:
      FlagNonFiniteV<float><<<Blocks(units), kThreads, 0, stream>>>(static_cast<const float*>(v),
                                                                    units, S, K, H, flags);
      break;
    case DType::kFloat16:
      FlagNonFiniteV<__half><<<Blocks(units), kThreads, 0, stream>>>(static_cast<const __half*>(v),
                                                                     units, S, K, H, flags);
      break;
    case DType::kBFloat16:
      FlagNonFiniteV<__nv_bfloat16><<<Blocks(units), kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(v), units, S, K, H, flags);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchRepairRows(const SoftmaxParams& p, const void* v, void* o, const int32_t* flags,
                             int64_t H, cudaStream_t stream) {
  const int64_t rows = p.units * p.G * p.T;
  if (rows <= 0) return cudaSuccess;
  const unsigned blocks = Blocks((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  switch (p.dtype) {
    case DType::kFloat32:
      RepairRows<float><<<blocks, kThreads, 0, stream>>>(p, static_cast<const float*>(p.probs),
                                                         static_cast<const float*>(v),
                                                         static_cast<float*>(o), flags, H);
      break;
    case DType::kFloat16:
      RepairRows<__half><<<blocks, kThreads, 0, stream>>>(p, static_cast<const __half*>(p.probs),
                                                          static_cast<const __half*>(v),
                                                          static_cast<__half*>(o), flags, H);
      break;
    case DType::kBFloat16:
      RepairRows<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
          p, static_cast<const __nv_bfloat16*>(p.probs), static_cast<const __nv_bfloat16*>(v),
          static_cast<__nv_bfloat16*>(o), flags, H);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace attn::kernels::naive_internal
