// PagedAppendRun: the one kernel that writes the paged KV page format (paged_kv.h, DESIGN.md §7).
//
// Grid: (x: chunks of new tokens × kv heads × 16-byte output chunks, y: sequence b). Each thread
// writes one 16-byte chunk of one (token, kv head) row of K and the same chunk of V:
//   16-bit pools: 8 elements copied bit for bit (one 16-byte load, one 16-byte store);
//   FP8 pools:    16 elements: two 16-byte loads of the input, x / scale in fp32 (IEEE
//                 division), cvt.rn.satfinite to e4m3 (±448 on overflow), one 16-byte store;
//                 elements with |x / scale| > 448 are counted (one atomic per warp).
// All offsets are 64-bit. Token t of the new rows of b goes to position S_b - new_b + t.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "attn/kernels/paged_decode.h"
#include "decode_params.h"

namespace attn::kernels {
namespace decode {
namespace {

template <bool kBf16>
__device__ __forceinline__ float ElemToFloat(uint32_t word, int half) {
  const uint16_t bits = static_cast<uint16_t>(half ? word >> 16 : word & 0xffffu);
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

/// Quantises 8 16-bit inputs (one uint4) to 8 e4m3 bytes (uint2); counts saturations.
template <bool kBf16>
__device__ __forceinline__ uint2 QuantizeEight(const uint4 in, float scale, int& saturated) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t out[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = ElemToFloat<kBf16>(w[i], 0) / scale;
    const float c = ElemToFloat<kBf16>(w[i], 1) / scale;
    saturated += (fabsf(a) > 448.f) + (fabsf(c) > 448.f);
    const __nv_fp8x2_storage_t q =
        __nv_cvt_float2_to_fp8x2(make_float2(a, c), __NV_SATFINITE, __NV_E4M3);
    out[i >> 1] |= static_cast<uint32_t>(q) << ((i & 1) * 16);
  }
  return make_uint2(out[0], out[1]);
}

template <int kDType, bool kFp8>
__global__ void __launch_bounds__(256) AppendKernel(const __grid_constant__ AppendParams p) {
  constexpr bool kBf16 = kDType == static_cast<int>(DType::kBFloat16);
  // Output elements per 16-byte chunk: 8 (16-bit) or 16 (FP8).
  constexpr int kElems = kFp8 ? 16 : 8;
  const int b = blockIdx.y;
  const int64_t row0 = p.new_offsets[b];
  const int64_t new_len = p.new_offsets[b + 1] - row0;
  const int64_t kv_len = p.kv_lengths[b];
  const int chunks = p.head_dim / kElems;
  const int64_t per_token = static_cast<int64_t>(p.num_kv_heads) * chunks;
  const int64_t items = new_len * per_token;
  const int32_t* bt = p.block_tables + static_cast<int64_t>(b) * p.bt_stride;
  const int64_t page_mask = (int64_t{1} << p.page_shift) - 1;
  int saturated = 0;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < items;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / per_token;
    const int h = static_cast<int>((idx / chunks) % p.num_kv_heads);
    const int c = static_cast<int>(idx % chunks);
    const int64_t pos = kv_len - new_len + t;
    if (pos < 0) continue;  // new_b > S_b: a caller error; write nothing rather than corrupt
    const int64_t page = bt[pos >> p.page_shift];
    const int64_t dst = ((((page * p.num_kv_heads + h) << p.page_shift) | (pos & page_mask)) *
                         p.head_dim) + static_cast<int64_t>(c) * kElems;
    const int64_t src = ((row0 + t) * p.num_kv_heads + h) * p.head_dim + static_cast<int64_t>(c) * kElems;
    const uint16_t* ks = static_cast<const uint16_t*>(p.k) + src;
    const uint16_t* vs = static_cast<const uint16_t*>(p.v) + src;
    if constexpr (!kFp8) {
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.k_pages) + dst) =
          *reinterpret_cast<const uint4*>(ks);
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.v_pages) + dst) =
          *reinterpret_cast<const uint4*>(vs);
    } else {
      const int64_t sidx = static_cast<int64_t>(b) * p.num_kv_heads + h;
      const float k_scale = p.k_scales[sidx];
      const float v_scale = p.v_scales[sidx];
      const uint2 k_lo = QuantizeEight<kBf16>(*reinterpret_cast<const uint4*>(ks), k_scale, saturated);
      const uint2 k_hi = QuantizeEight<kBf16>(*reinterpret_cast<const uint4*>(ks + 8), k_scale, saturated);
      const uint2 v_lo = QuantizeEight<kBf16>(*reinterpret_cast<const uint4*>(vs), v_scale, saturated);
      const uint2 v_hi = QuantizeEight<kBf16>(*reinterpret_cast<const uint4*>(vs + 8), v_scale, saturated);
      *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.k_pages) + dst) =
          make_uint4(k_lo.x, k_lo.y, k_hi.x, k_hi.y);
      *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.v_pages) + dst) =
          make_uint4(v_lo.x, v_lo.y, v_hi.x, v_hi.y);
    }
  }
  if constexpr (kFp8) {
    if (p.saturations != nullptr) {
      const int total = __reduce_add_sync(0xffffffffu, saturated);
      if ((threadIdx.x & 31) == 0 && total > 0) {
        atomicAdd(p.saturations, static_cast<unsigned long long>(total));
      }
    }
  }
}

template <int kDType, bool kFp8>
cudaError_t AppendLaunch(const AppendParams& p, cudaStream_t stream) {
  constexpr int kElems = kFp8 ? 16 : 8;
  const int64_t items = p.max_new_tokens * p.num_kv_heads * (p.head_dim / kElems);
  const int64_t blocks = (items + 255) / 256;
  const dim3 grid(static_cast<unsigned>(blocks < 65535 ? blocks : 65535),
                  static_cast<unsigned>(p.batch));
  AppendKernel<kDType, kFp8><<<grid, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace
}  // namespace decode

Status PagedAppendRun(const PagedKvPool& pool, const PagedBatch& batch, const AppendRows& rows,
                      cudaStream_t stream) {
  if (rows.dtype != DType::kFloat16 && rows.dtype != DType::kBFloat16) {
    return InvalidArgument(std::string("paged append: input dtype ") + DTypeName(rows.dtype) +
                           " is not supported (float16, bfloat16)");
  }
  const bool fp8 = pool.kv_dtype == DType::kFloat8E4M3;
  if (!fp8 && pool.kv_dtype != rows.dtype) {
    return InvalidArgument(std::string("paged append: pool kv dtype ") + DTypeName(pool.kv_dtype) +
                           " must be the input dtype " + DTypeName(rows.dtype) +
                           " or float8_e4m3");
  }
  if (pool.num_kv_heads <= 0 || pool.head_dim <= 0 || pool.page_tokens <= 0 ||
      (pool.page_tokens & (pool.page_tokens - 1)) != 0 || pool.page_tokens > 65536) {
    return InvalidArgument("paged append: the pool needs positive heads and head dim and a "
                           "power-of-two page size up to 65536");
  }
  if (pool.head_dim % (fp8 ? 16 : 8) != 0) {
    return InvalidArgument("paged append: head dim " + std::to_string(pool.head_dim) +
                           " must be a multiple of " + (fp8 ? "16 (FP8 pools)" : "8"));
  }
  if (batch.batch < 0 || batch.batch > 65535 || rows.max_new_tokens < 0) {
    return InvalidArgument("paged append: batch must be in [0, 65535], max_new_tokens >= 0");
  }
  if (batch.batch == 0 || rows.max_new_tokens == 0) return Status::Ok();
  if (pool.k_pages == nullptr || pool.v_pages == nullptr || rows.k == nullptr ||
      rows.v == nullptr || rows.new_offsets == nullptr || batch.block_tables == nullptr ||
      batch.kv_lengths == nullptr) {
    return InvalidArgument("paged append: pages, rows, new_offsets, block tables and kv_lengths "
                           "must be non-null device pointers");
  }
  if (fp8 && (batch.k_scales == nullptr || batch.v_scales == nullptr)) {
    return InvalidArgument("paged append: FP8 pools need k_scales and v_scales");
  }
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(pool.k_pages) || misaligned(pool.v_pages) || misaligned(rows.k) ||
      misaligned(rows.v)) {
    return InvalidArgument("paged append: pages and rows must be 16-byte aligned");
  }
  decode::AppendParams p;
  p.k = rows.k;
  p.v = rows.v;
  p.new_offsets = rows.new_offsets;
  p.k_pages = pool.k_pages;
  p.v_pages = pool.v_pages;
  p.block_tables = batch.block_tables;
  p.kv_lengths = batch.kv_lengths;
  p.k_scales = batch.k_scales;
  p.v_scales = batch.v_scales;
  p.saturations = rows.saturations;
  p.bt_stride = batch.block_table_stride;
  p.max_new_tokens = rows.max_new_tokens;
  int shift = 0;
  while ((1 << shift) < pool.page_tokens) ++shift;
  p.page_shift = shift;
  p.num_kv_heads = pool.num_kv_heads;
  p.head_dim = pool.head_dim;
  p.batch = static_cast<int32_t>(batch.batch);
  const bool bf16 = rows.dtype == DType::kBFloat16;
  constexpr int kF16 = static_cast<int>(DType::kFloat16);
  constexpr int kBF16 = static_cast<int>(DType::kBFloat16);
  cudaError_t e;
  if (fp8) {
    e = bf16 ? decode::AppendLaunch<kBF16, true>(p, stream) : decode::AppendLaunch<kF16, true>(p, stream);
  } else {
    e = bf16 ? decode::AppendLaunch<kBF16, false>(p, stream)
             : decode::AppendLaunch<kF16, false>(p, stream);
  }
  if (e != cudaSuccess) {
    return Internal(std::string("paged append: kernel launch failed: ") + cudaGetErrorName(e) +
                    " (" + cudaGetErrorString(e) + ")");
  }
  return Status::Ok();
}

}  // namespace attn::kernels
