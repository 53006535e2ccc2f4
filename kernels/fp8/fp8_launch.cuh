// The host-side launch wrappers of our 8-bit attention kernel (fp8_kernel.cuh) in its modes
// (e4m3, INT8 Q·Kᵀ with E4M3 or 16-bit P·V), the Vᵀ pre-pass kernel, and the explicit
// instantiation macros the per-head-dim files use (fp8_hd<H>.cu, int8_hd<H>.cu; list:
// fp8_params.h).
//
// Internal to kernels/fp8/.
#pragma once

#include "fp8_kernel.cuh"

namespace attn::kernels::fp8 {

// ---- The Vᵀ pre-pass --------------------------------------------------------------------------
// One block per (64-key chunk, kv head, batch entry): 64 rows of V (H bytes each, zero past
// S_b) -> shared memory -> H rows of 64 permuted keys in the workspace. Chunks past the slot
// (roundup(S_b, 128) keys) return at once.
constexpr int kTransposeKeys = 64;
constexpr int kTransposeThreads = 256;

template <int kHeadDim>
__global__ void __launch_bounds__(kTransposeThreads)
    Fp8TransposeVKernel(const __grid_constant__ Fp8Params p) {
  constexpr int kRowBytes = kHeadDim + 16;  // padded shared row
  __shared__ __align__(16) uint8_t tile[kTransposeKeys * kRowBytes];
  const int b = blockIdx.z;
  const int kv_head = blockIdx.y;
  const int j0 = blockIdx.x * kTransposeKeys;
  int64_t kv_row0, slot;
  int kv_len;
  if (p.varlen) {
    const int64_t ko = p.kv_offsets[b];
    kv_row0 = ko;
    kv_len = static_cast<int>(p.kv_offsets[b + 1] - ko);
    slot = RoundUp(ko, 16) + static_cast<int64_t>(kVtVarlenGap) * b;
  } else {
    kv_row0 = static_cast<int64_t>(b) * p.max_kv_len;
    kv_len = p.kv_lengths ? min(max(p.kv_lengths[b], 0), p.max_kv_len) : p.max_kv_len;
    slot = static_cast<int64_t>(b) * RoundUp(p.max_kv_len, kVtSlotAlign);
  }
  if (j0 >= RoundUp(kv_len, kVtSlotAlign)) return;
  // Load: 16-byte chunks, consecutive threads along a row.
  constexpr int kRowChunks = kHeadDim / 16;
  for (int idx = threadIdx.x; idx < kTransposeKeys * kRowChunks; idx += kTransposeThreads) {
    const int r = idx / kRowChunks, c = idx % kRowChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (j0 + r < kv_len) {
      v = *reinterpret_cast<const uint4*>(p.v + (kv_row0 + j0 + r) * p.kv_row_stride +
                                          static_cast<int64_t>(kv_head) * kHeadDim + c * 16);
    }
    *reinterpret_cast<uint4*>(&tile[r * kRowBytes + c * 16]) = v;
  }
  __syncthreads();
  // Store: thread -> (head-dim row d, 4 consecutive byte positions); 16 threads per row.
  uint8_t* out = p.vt + static_cast<int64_t>(kv_head) * kHeadDim * p.vt_row_len + slot + j0;
  for (int idx = threadIdx.x; idx < kHeadDim * (kTransposeKeys / 4); idx += kTransposeThreads) {
    const int d = idx / (kTransposeKeys / 4), w = idx % (kTransposeKeys / 4);
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = KeyAtPos(4 * w + i);
      word |= static_cast<uint32_t>(tile[key * kRowBytes + d]) << (8 * i);
    }
    *reinterpret_cast<uint32_t*>(out + d * p.vt_row_len + 4 * w) = word;
  }
}

template <int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t Fp8Launch(const Fp8Params& params, dim3 grid, int smem_bytes, cudaStream_t stream) {
  using Tr = Traits<kHeadDim, kBlockM, kBlockN, kWarps>;
  Fp8AttentionKernel<Tr><<<grid, Tr::kThreads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

template <int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t Fp8Prepare(int smem_bytes) {
  using Tr = Traits<kHeadDim, kBlockM, kBlockN, kWarps>;
  return cudaFuncSetAttribute(Fp8AttentionKernel<Tr>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
}

template <int kHeadDim>
cudaError_t Fp8TransposeV(const Fp8Params& p, cudaStream_t stream) {
  const int64_t chunks = RoundUp(p.max_kv_len, kVtSlotAlign) / kTransposeKeys;
  if (chunks == 0 || p.batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.batch));
  Fp8TransposeVKernel<kHeadDim><<<grid, kTransposeThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int kPv16, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t Int8Launch(const Fp8Params& params, dim3 grid, int smem_bytes, cudaStream_t stream) {
  if constexpr (kPv16 != 0) {
    if (params.out_bf16) {
      using Tr = Traits<kHeadDim, kBlockM, kBlockN, kWarps, kModeInt8Bf16Pv>;
      Fp8AttentionKernel<Tr><<<grid, Tr::kThreads, smem_bytes, stream>>>(params);
    } else {
      using Tr = Traits<kHeadDim, kBlockM, kBlockN, kWarps, kModeInt8F16Pv>;
      Fp8AttentionKernel<Tr><<<grid, Tr::kThreads, smem_bytes, stream>>>(params);
    }
  } else {
    using Tr = Traits<kHeadDim, kBlockM, kBlockN, kWarps, kModeInt8E4M3Pv>;
    Fp8AttentionKernel<Tr><<<grid, Tr::kThreads, smem_bytes, stream>>>(params);
  }
  return cudaGetLastError();
}

template <int kPv16, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t Int8Prepare(int smem_bytes) {
  constexpr auto kAttr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  if constexpr (kPv16 != 0) {
    const cudaError_t e = cudaFuncSetAttribute(
        Fp8AttentionKernel<Traits<kHeadDim, kBlockM, kBlockN, kWarps, kModeInt8Bf16Pv>>, kAttr,
        smem_bytes);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(
        Fp8AttentionKernel<Traits<kHeadDim, kBlockM, kBlockN, kWarps, kModeInt8F16Pv>>, kAttr,
        smem_bytes);
  } else {
    return cudaFuncSetAttribute(
        Fp8AttentionKernel<Traits<kHeadDim, kBlockM, kBlockN, kWarps, kModeInt8E4M3Pv>>, kAttr,
        smem_bytes);
  }
}

#define ATTN_INT8_INSTANTIATE(PV16, H, BM, BN, W)                                              \
  template cudaError_t Int8Launch<PV16, H, BM, BN, W>(const Fp8Params&, dim3, int,             \
                                                       cudaStream_t);                          \
  template cudaError_t Int8Prepare<PV16, H, BM, BN, W>(int);

#define ATTN_FP8_INSTANTIATE(H, BM, BN, W)                                                     \
  template cudaError_t Fp8Launch<H, BM, BN, W>(const Fp8Params&, dim3, int, cudaStream_t);     \
  template cudaError_t Fp8Prepare<H, BM, BN, W>(int);

}  // namespace attn::kernels::fp8
