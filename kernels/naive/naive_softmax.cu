// Mask + softmax over materialised scores: one warp per (unit, group, query row).
// Reads float32 scores (already scaled by cuBLAS), keeps the keys BandKeyRange allows for the
// row's batch entry lengths, writes probabilities in the input dtype (zeros outside the band,
// on padding rows and on rows with no key) and lse = max + log(sum) (natural log, -inf empty).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "naive_internal.h"

namespace attn::kernels::naive_internal {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

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

/// Merges two (max, sum of exp(x - max)) pairs; -inf max means an empty pair.
__device__ __forceinline__ void Merge(float& m, float& l, float m2, float l2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    l = l2;
    return;
  }
  const float mn = fmaxf(m, m2);
  l = l * expf(m - mn) + l2 * expf(m2 - mn);
  m = mn;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) MaskSoftmaxKernel(SoftmaxParams p, T* probs) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = p.units * p.G * p.T;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); r < rows;
       r += warps_total) {
    const int64_t t = r % p.T;
    const int64_t g = (r / p.T) % p.G;
    const int64_t u = p.first_unit + r / (p.T * p.G);
    const int64_t b = u / p.K;
    const int64_t h = (u % p.K) * p.G + g;
    int64_t q_len = LengthOr(p.q_lengths, b, p.T);
    int64_t kv_len = LengthOr(p.kv_lengths, b, p.S);
    q_len = q_len < 0 ? 0 : (q_len > p.T ? p.T : q_len);
    kv_len = kv_len < 0 ? 0 : (kv_len > p.S ? p.S : kv_len);
    const KeyRange kr = BandKeyRange(p.mask, t, q_len, kv_len);
    const float* s = p.scores + r * p.ld;
    T* out = probs + r * p.ld;

    float m = -INFINITY, l = 0.f;
    if (!kr.empty()) {
      for (int64_t j = kr.lo + lane; j <= kr.hi; j += 32) {
        const float x = s[j];
        if (x > m) {
          l = (m == -INFINITY ? 0.f : l * expf(m - x)) + 1.f;
          m = x;
        } else {
          l += expf(x - m);
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, off);
        Merge(m, l, m2, l2);
      }
    }
    const bool empty = kr.empty() || l == 0.f;  // NaN l (a visible NaN logit) propagates
    const float inv = empty ? 0.f : 1.f / l;
    // Each lane reads s[j] before writing out[j] for the same j, so float32 may run in place.
    for (int64_t j = lane; j < p.S; j += 32) {
      float v = 0.f;
      if (!empty && j >= kr.lo && j <= kr.hi) v = expf(s[j] - m) * inv;
      out[j] = FromFloat<T>(v);
    }
    if (p.lse != nullptr && lane == 0) {
      p.lse[(b * p.N + h) * p.T + t] = empty ? -INFINITY : m + logf(l);
    }
  }
}

}  // namespace

cudaError_t LaunchSoftmax(const SoftmaxParams& p, cudaStream_t stream) {
  const int64_t rows = p.units * p.G * p.T;
  if (rows <= 0) return cudaSuccess;
  const int64_t blocks64 = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const unsigned blocks = static_cast<unsigned>(blocks64 < (1 << 20) ? blocks64 : (1 << 20));
  switch (p.dtype) {
    case DType::kFloat32:
      MaskSoftmaxKernel<float><<<blocks, kThreads, 0, stream>>>(p, static_cast<float*>(p.probs));
      break;
    case DType::kFloat16:
      MaskSoftmaxKernel<__half><<<blocks, kThreads, 0, stream>>>(p, static_cast<__half*>(p.probs));
      break;
    case DType::kBFloat16:
      MaskSoftmaxKernel<__nv_bfloat16>
          <<<blocks, kThreads, 0, stream>>>(p, static_cast<__nv_bfloat16*>(p.probs));
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace attn::kernels::naive_internal
