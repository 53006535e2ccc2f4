// The per-token INT8 pre-pass on the GPU (attn/kernels/int8_prepass.h). Blocks of
// (kFp8PrepassChunk tokens, head, entry) as the per-tensor pre-pass (fp8_prepass_geometry.h), the
// same row transform (fp8_prepass_device.cuh: LoadTransformed), one launch per tensor for Q and K
// (each row's amax is reduced across the row's lanes, then the row is quantised from registers:
// one pass), and two for V in the E4M3 P·V format (amax over valid rows, then quantisation). K's
// mean comes from fp8::EnqueueKMean (fp8_kmean.h). Fixed reduction orders, no float atomics.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#include "attn/kernels/int8_prepass.h"
#include "fp8_kmean.h"
#include "fp8_prepass_device.cuh"
#include "fp8_prepass_geometry.h"

namespace attn::kernels {
namespace {

using fp8::BlockAt;
using fp8::kPrepassThreads;
using fp8::LoadTransformed;
using fp8::Locate;
using fp8::Transform;

constexpr uint32_t kInfBits = 0x7f800000u;

/// max of the fp32 bits of |x| over this thread's elements (0 when it holds none).
__device__ __forceinline__ uint32_t AbsMaxBits(const float x[8]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = max(m, __float_as_uint(fabsf(x[i])));
  return m;
}

/// Per-token INT8: for every written row (valid rows quantised, padding rows zeros with scale 0)
/// of one (chunk, head, entry): the row's amax across its lanes, scale = amax/127 (header), x8.
template <bool kBf16>
__global__ void __launch_bounds__(kPrepassThreads)
    PerTokenInt8Kernel(Transform tr, int8_t* __restrict__ dst, float* __restrict__ row_scale) {
  const BlockAt at = Locate(false);
  const int64_t H = tr.t.head_dim;
  const int lanes = fp8::LanesPerRow(H), rpp = fp8::RowsPerPass(H);
  const int lane = threadIdx.x % lanes, r = threadIdx.x / lanes;
  const int64_t len = tr.t.Length(at.entry), written = tr.t.WrittenRows(at.entry);
  for (int p = 0; p < kFp8PrepassChunk / rpp; ++p) {
    const int64_t tok = at.chunk * kFp8PrepassChunk + p * rpp + r;
    if (at.chunk * kFp8PrepassChunk + p * rpp >= written) break;  // uniform over the block
    const bool ok = r < rpp && tok < len;
    float x[8];
    LoadTransformed<kBf16>(tr, at, tok, ok, lane, x);
    uint32_t m = (ok && lane * 8 < H) ? AbsMaxBits(x) : 0u;
    // The row's lanes are an aligned group of `lanes` (a power of two <= 32) in the warp.
    for (int o = lanes / 2; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (r >= rpp || tok >= written || lane * 8 >= H) continue;
    float scale = 0.f;  // padding rows
    bool quantise = false;
    if (ok) {
      if (m >= kInfBits) {
        scale = __int_as_float(0x7fffffff);  // ±inf or NaN in the row: NaN scale, zeros
      } else {
        scale = __fdiv_rn(__uint_as_float(m), kInt8Max);
        quantise = scale > 0.f;
        if (!quantise) scale = 1.f;  // all-zero row (or amax/127 underflowed)
      }
    }
    uint32_t w[2] = {0u, 0u};
    if (quantise) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int q = min(max(__float2int_rn(__fdiv_rn(x[i], scale)), -127), 127);
        w[i / 4] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * (i % 4));
      }
    }
    const int64_t row = tr.t.RowBase(at.entry) + tok;
    *reinterpret_cast<uint2*>(dst + (row * tr.t.heads + at.head) * H + lane * 8) =
        make_uint2(w[0], w[1]);
    if (lane == 0) row_scale[row * tr.t.heads + at.head] = scale;
  }
}

/// V's per-tensor amax over valid rows: integer max of the fp32 bits of |v|, warp, block, then
/// atomicMax into *amax_bits (zeroed before).
template <bool kBf16>
__global__ void __launch_bounds__(kPrepassThreads)
    ValidAmaxKernel(Transform tr, unsigned int* __restrict__ amax_bits) {
  const BlockAt at = Locate(false);
  const int64_t H = tr.t.head_dim;
  const int lanes = fp8::LanesPerRow(H), rpp = fp8::RowsPerPass(H);
  const int lane = threadIdx.x % lanes, r = threadIdx.x / lanes;
  const int64_t len = tr.t.Length(at.entry);
  uint32_t m = 0;
  for (int p = 0; p < kFp8PrepassChunk / rpp; ++p) {
    const int64_t tok = at.chunk * kFp8PrepassChunk + p * rpp + r;
    if (at.chunk * kFp8PrepassChunk + p * rpp >= len) break;
    const bool ok = r < rpp && tok < len;
    float x[8];
    LoadTransformed<kBf16>(tr, at, tok, ok, lane, x);
    if (ok && lane * 8 < H) m = max(m, AbsMaxBits(x));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ uint32_t warp_max[kPrepassThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t b = 0;
    for (int w = 0; w < kPrepassThreads / 32; ++w) b = max(b, warp_max[w]);
    if (b != 0) atomicMax(amax_bits, b);
  }
}

/// v8 = e4m3_rn_satfinite(v · scale) on valid rows, zeros on padding rows; the first block
/// writes scale and descale next to the amax (v_scalars = scale, descale, amax).
template <bool kBf16>
__global__ void __launch_bounds__(kPrepassThreads)
    E4M3Kernel(Transform tr, uint8_t* __restrict__ dst, float* __restrict__ v_scalars) {
  const BlockAt at = Locate(true);  // backwards: the amax pass's last reads are still in L2
  const float amax = v_scalars[2];
  const float scale = (amax > 0.f && amax <= 3.402823466e38f)
                          ? fminf(__fdiv_rn(kE4M3Max, amax), kFp8MaxScale)
                          : 1.f;  // Fp8ScaleForAmax (fp8_quantize.h)
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) {
    v_scalars[0] = scale;
    v_scalars[1] = __fdiv_rn(1.f, scale);
  }
  const int64_t H = tr.t.head_dim;
  const int lanes = fp8::LanesPerRow(H), rpp = fp8::RowsPerPass(H);
  const int lane = threadIdx.x % lanes, r = threadIdx.x / lanes;
  const int64_t len = tr.t.Length(at.entry), written = tr.t.WrittenRows(at.entry);
  for (int p = 0; p < kFp8PrepassChunk / rpp; ++p) {
    const int64_t tok = at.chunk * kFp8PrepassChunk + p * rpp + r;
    if (at.chunk * kFp8PrepassChunk + p * rpp >= written) break;
    const bool ok = r < rpp && tok < len;
    float x[8];
    LoadTransformed<kBf16>(tr, at, tok, ok, lane, x);
    if (r >= rpp || tok >= written || lane * 8 >= H) continue;
    uint32_t w[2] = {0u, 0u};
    if (ok) {
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const float2 f = make_float2(__fmul_rn(x[i], scale), __fmul_rn(x[i + 1], scale));
        const uint32_t pair = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3) & 0xffffu;
        w[i / 4] |= pair << (8 * (i % 4));
      }
    }
    const int64_t row = tr.t.RowBase(at.entry) + tok;
    *reinterpret_cast<uint2*>(dst + (row * tr.t.heads + at.head) * H + lane * 8) =
        make_uint2(w[0], w[1]);
  }
}

__global__ void InitVScalarsKernel(float* v_scalars) {
  v_scalars[0] = 1.f;
  v_scalars[1] = 1.f;
  v_scalars[2] = 0.f;
}

Status CudaInternal(const char* what, cudaError_t e) {
  return Internal(std::string("int8 pre-pass: ") + what + " failed: " + cudaGetErrorName(e) +
                  " (" + cudaGetErrorString(e) + ")");
}

bool Misaligned(const void* p, int a) { return reinterpret_cast<uintptr_t>(p) % a != 0; }

dim3 GridFor(const fp8::PrepassTensor& t) {
  return dim3(static_cast<unsigned>(fp8::Chunks(t.max_len)), static_cast<unsigned>(t.heads),
              static_cast<unsigned>(t.batch));
}

template <bool kBf16>
Status Typed(const AttentionShape& s, const AttentionTensors& dev, Int8PvFormat pv,
             const Int8PrepassOutputs& out, void* workspace, cudaStream_t stream) {
  const int order = s.fp8.rotate ? Fp8HadamardOrder(s.head_dim) : 0;
  const float norm = order ? fp8::HadamardNorm(order) : 1.f;
  Transform q{static_cast<const uint16_t*>(dev.q), fp8::QTensor(s, dev), nullptr, order, norm};
  Transform k{static_cast<const uint16_t*>(dev.k), fp8::KvTensor(s, dev), nullptr, order, norm};
  Transform v{static_cast<const uint16_t*>(dev.v), fp8::KvTensor(s, dev), nullptr, 0, 1.f};
  const bool any_q = s.batch > 0 && s.max_q_len > 0, any_kv = s.batch > 0 && s.max_kv_len > 0;
  if (pv == Int8PvFormat::kE4M3) {
    // scale = descale = 1, amax = 0 (the amax pass's atomicMax target, and what an empty V keeps).
    InitVScalarsKernel<<<1, 1, 0, stream>>>(out.v_scalars);
  }
  if (any_q) {
    PerTokenInt8Kernel<kBf16><<<GridFor(q.t), kPrepassThreads, 0, stream>>>(q, out.q8,
                                                                            out.q_scale);
  }
  if (any_kv) {
    if (s.fp8.smooth_k) {
      ATTN_RETURN_IF_ERROR(fp8::EnqueueKMean(s, dev, workspace, stream));
      k.mean = reinterpret_cast<const float*>(static_cast<const char*>(workspace) +
                                              fp8::PrepassWorkspaceLayout(s).mean_offset);
    }
    PerTokenInt8Kernel<kBf16><<<GridFor(k.t), kPrepassThreads, 0, stream>>>(k, out.k8,
                                                                            out.k_scale);
    if (pv == Int8PvFormat::kE4M3) {
      ValidAmaxKernel<kBf16><<<GridFor(v.t), kPrepassThreads, 0, stream>>>(
          v, reinterpret_cast<unsigned int*>(out.v_scalars + 2));
      E4M3Kernel<kBf16><<<GridFor(v.t), kPrepassThreads, 0, stream>>>(v, out.v8, out.v_scalars);
    }
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
}

}  // namespace

int64_t Int8PrepassWorkspaceBytes(const AttentionShape& s) {
  return fp8::PrepassWorkspaceLayout(s).bytes;
}

Status Int8Prepass(const AttentionShape& s, const AttentionTensors& dev, Int8PvFormat pv,
                   const Int8PrepassOutputs& out, void* workspace, int64_t workspace_bytes,
                   cudaStream_t stream) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return InvalidArgument(std::string("int8 pre-pass: input dtype ") + DTypeName(s.dtype) +
                           " (float16 or bfloat16 only)");
  }
  if (Fp8HadamardOrder(s.head_dim) == 0 || s.head_dim > 256) {
    return InvalidArgument("int8 pre-pass: head_dim " + std::to_string(s.head_dim) +
                           " must be a multiple of 8 up to 256");
  }
  if (s.batch > 65535 || s.num_heads > 65535) {
    return InvalidArgument("int8 pre-pass: batch and num_heads must be at most 65535");
  }
  if (pv != Int8PvFormat::kE4M3 && pv != Int8PvFormat::k16Bit) {
    return InvalidArgument("int8 pre-pass: unknown P·V format");
  }
  const bool e4m3 = pv == Int8PvFormat::kE4M3;
  if ((s.q_rows() > 0 && (dev.q == nullptr || out.q8 == nullptr || out.q_scale == nullptr)) ||
      (s.kv_rows() > 0 && (dev.k == nullptr || out.k8 == nullptr || out.k_scale == nullptr)) ||
      (e4m3 && (out.v_scalars == nullptr || (s.kv_rows() > 0 && (!dev.v || !out.v8))))) {
    return InvalidArgument("int8 pre-pass: q, k (and v, v8, v_scalars for E4M3 P·V) and their "
                           "outputs must be non-null");
  }
  if (Misaligned(dev.q, 16) || Misaligned(dev.k, 16) || Misaligned(dev.v, 16) ||
      Misaligned(out.q8, 8) || Misaligned(out.k8, 8) || Misaligned(out.v8, 8) ||
      Misaligned(out.q_scale, 4) || Misaligned(out.k_scale, 4) || Misaligned(out.v_scalars, 4) ||
      Misaligned(workspace, 16)) {
    return InvalidArgument("int8 pre-pass: inputs and workspace must be 16-byte aligned, q8, k8 "
                           "and v8 8-byte aligned, the scales 4-byte aligned");
  }
  if (s.layout == Layout::kVarlen && (dev.q_offsets == nullptr || dev.kv_offsets == nullptr)) {
    return InvalidArgument("int8 pre-pass: varlen needs q_offsets and kv_offsets");
  }
  const int64_t need = Int8PrepassWorkspaceBytes(s);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
    return InvalidArgument("int8 pre-pass: workspace of " + std::to_string(workspace_bytes) +
                           " bytes, need " + std::to_string(need));
  }
  return s.dtype == DType::kBFloat16 ? Typed<true>(s, dev, pv, out, workspace, stream)
                                     : Typed<false>(s, dev, pv, out, workspace, stream);
}

}  // namespace attn::kernels
