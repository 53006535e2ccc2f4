// The FP8 accuracy pre-pass on the GPU (attn/kernels/fp8_prepass.h; geometry and workspace:
// fp8_prepass_geometry.h). Five kernels, each over blocks of (kFp8PrepassChunk tokens, head,
// entry): the K mean's partial sums and their reduction, the amax of a transformed tensor, its
// quantisation, and the LSE shift. Every reduction has a fixed order (no float atomics), so
// runs are deterministic and the host reference reproduces them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#include "fp8_prepass_geometry.h"

namespace attn::kernels {
namespace {

using fp8::kPrepassThreads;
using fp8::PrepassTensor;

/// What one launch transforms: `src` (16-bit patterns) read through `t`; K's means (null: no
/// smoothing), the Hadamard order (0: no rotation) and its 1/sqrt(order).
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

/// Loads this thread's 8 elements of token `tok` (row valid: `ok`; zeros otherwise, and for
/// lanes past head_dim), subtracts the mean and rotates. Every thread of the warp must call it
/// (the rotation shuffles across the row's lanes).
template <bool kBf16>
__device__ __forceinline__ void LoadTransformed(const Transform& tr, const BlockAt& at, int64_t tok,
                                                bool ok, int lane, float x[8]) {
  const int64_t H = tr.t.head_dim;
  const bool mine = ok && lane * 8 < H;
  if (mine) {
    const int64_t row = tr.t.RowBase(at.entry) + tok;
    const uint4 w =
        *reinterpret_cast<const uint4*>(tr.src + (row * tr.t.heads + at.head) * H + lane * 8);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[2 * j] = ToFloat<kBf16>(words[j] & 0xffffu);
      x[2 * j + 1] = ToFloat<kBf16>(words[j] >> 16);
    }
    if (tr.mean != nullptr) {
      const float* m = tr.mean + (at.entry * tr.t.heads + at.head) * H + lane * 8;
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = __fsub_rn(x[i], m[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = 0.f;
  }
  if (tr.order == 0) return;
    // Fast Walsh-Hadamard transform over aligned blocks of `order` elements: stages of stride 1,
    // 2, 4 inside the thread's 8 elements, then 8 .. order/2 across lanes (partner lane ^ s/8).
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

/// K mean, step 1: the sum of each (entry, kv head, chunk)'s valid rows per channel, into
/// partial (B, K, chunks, H). Order: per thread over its passes, then over the pass's rows.
template <bool kBf16>
__global__ void __launch_bounds__(kPrepassThreads)
    MeanPartialKernel(Transform tr, float* __restrict__ partial) {
  __shared__ float rows[kPrepassThreads * 8];
  const BlockAt at = Locate(false);
  const int64_t H = tr.t.head_dim;
  const int lanes = fp8::LanesPerRow(H), rpp = fp8::RowsPerPass(H);
  const int lane = threadIdx.x % lanes, r = threadIdx.x / lanes;
  const int64_t len = tr.t.Length(at.entry);
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  Transform raw = tr;
  raw.mean = nullptr;
  raw.order = 0;
  for (int p = 0; p < kFp8PrepassChunk / rpp; ++p) {
    const int64_t tok = at.chunk * kFp8PrepassChunk + p * rpp + r;
    if (r >= rpp || tok >= len) break;  // idle row (head_dim < 32) or past the entry
    float x[8];
    LoadTransformed<kBf16>(raw, at, tok, true, lane, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], x[i]);
  }
  if (r < rpp && lane * 8 < H) {
#pragma unroll
    for (int i = 0; i < 8; ++i) rows[r * H + lane * 8 + i] = acc[i];
  }
  __syncthreads();
  if (threadIdx.x < H) {
    float s = 0.f;
    for (int i = 0; i < rpp; ++i) s = __fadd_rn(s, rows[i * H + threadIdx.x]);
    const int64_t chunks = gridDim.x;
    partial[((at.entry * tr.t.heads + at.head) * chunks + at.chunk) * H + threadIdx.x] = s;
  }
}

/// K mean, step 2: mean (B, K, H) = Σ over chunks in order / S_b (0 for an entry with no keys).
__global__ void MeanFinalKernel(PrepassTensor t, int64_t chunks, const float* __restrict__ partial,
                                float* __restrict__ mean) {
  const int64_t n = t.batch * t.heads * t.head_dim;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t d = i % t.head_dim, unit = i / t.head_dim, b = unit / t.heads;
  float s = 0.f;
  for (int64_t c = 0; c < chunks; ++c)
    s = __fadd_rn(s, partial[(unit * chunks + c) * t.head_dim + d]);
  const int64_t len = t.Length(b);
  mean[i] = len > 0 ? __fdiv_rn(s, static_cast<float>(len)) : 0.f;
}

/// max |x| over the valid rows of the transformed tensor: integer max of the fp32 bits of |x|
/// (NaN bits exceed +inf's), warp, block, then atomicMax into *amax_bits.
template <bool kBf16>
__global__ void __launch_bounds__(kPrepassThreads)
    AmaxKernel(Transform tr, unsigned int* __restrict__ amax_bits) {
  const BlockAt at = Locate(false);
  const int lanes = fp8::LanesPerRow(tr.t.head_dim), rpp = fp8::RowsPerPass(tr.t.head_dim);
  const int lane = threadIdx.x % lanes, r = threadIdx.x / lanes;
  const int64_t len = tr.t.Length(at.entry);
  uint32_t m = 0;
  for (int p = 0; p < kFp8PrepassChunk / rpp; ++p) {
    const int64_t tok = at.chunk * kFp8PrepassChunk + p * rpp + r;
    if (at.chunk * kFp8PrepassChunk + p * rpp >= len) break;  // uniform over the block
    const bool ok = r < rpp && tok < len;
    float x[8];
    LoadTransformed<kBf16>(tr, at, tok, ok, lane, x);
    if (ok && lane * 8 < tr.t.head_dim) {
#pragma unroll
      for (int i = 0; i < 8; ++i) m = max(m, __float_as_uint(fabsf(x[i])));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ uint32_t warp_max[kPrepassThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t b = 0;
#pragma unroll
    for (int w = 0; w < kPrepassThreads / 32; ++w) b = max(b, warp_max[w]);
    if (b != 0) atomicMax(amax_bits, b);
  }
}

__device__ __forceinline__ float ScaleFor(float amax) {  // Fp8ScaleForAmax's device twin
  return (amax > 0.f && amax <= 3.402823466e38f) ? fminf(__fdiv_rn(kE4M3Max, amax), kFp8MaxScale)
                                                 : 1.f;
}

/// x8 = e4m3_rn_satfinite(x · scale) for valid rows, E4M3 zeros for padding rows; the block grid
/// walked backwards (the amax pass's last reads are still in L2). Block 0 writes scale/descale.
template <bool kBf16>
__global__ void __launch_bounds__(kPrepassThreads)
    QuantizeKernel(Transform tr, const float* __restrict__ amax, uint8_t* __restrict__ dst,
                   float* __restrict__ scale_out, float* __restrict__ descale_out) {
  const BlockAt at = Locate(true);
  const float scale = ScaleFor(*amax);
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) {
    *scale_out = scale;
    *descale_out = __fdiv_rn(1.f, scale);
  }
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
    if (r >= rpp || tok >= written || lane * 8 >= H) continue;
    uint32_t out[2] = {0u, 0u};
    if (ok) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float2 f01 = make_float2(__fmul_rn(x[4 * j], scale), __fmul_rn(x[4 * j + 1], scale));
        const float2 f23 =
            make_float2(__fmul_rn(x[4 * j + 2], scale), __fmul_rn(x[4 * j + 3], scale));
        const uint32_t p01 = __nv_cvt_float2_to_fp8x2(f01, __NV_SATFINITE, __NV_E4M3);
        const uint32_t p23 = __nv_cvt_float2_to_fp8x2(f23, __NV_SATFINITE, __NV_E4M3);
        out[j] = (p01 & 0xffffu) | (p23 << 16);
      }
    }
    const int64_t row = tr.t.RowBase(at.entry) + tok;
    *reinterpret_cast<uint2*>(dst + (row * tr.t.heads + at.head) * H + lane * 8) =
        make_uint2(out[0], out[1]);
  }
}

/// lse[b, n, t] += scale · q[b, t, n, :] · mean[b, n / g, :] for finite lse of valid rows.
template <bool kBf16>
__global__ void __launch_bounds__(kPrepassThreads)
    LseShiftKernel(Transform tr, int64_t group, int64_t kv_heads, int64_t total_q, float scale,
                   float* __restrict__ lse) {
  const BlockAt at = Locate(false);
  const int64_t H = tr.t.head_dim;
  const int lanes = fp8::LanesPerRow(H), rpp = fp8::RowsPerPass(H);
  const int lane = threadIdx.x % lanes, r = threadIdx.x / lanes;
  const int64_t len = tr.t.Length(at.entry);
  Transform raw = tr;
  raw.mean = nullptr;
  raw.order = 0;
  const float* m = tr.mean + (at.entry * kv_heads + at.head / group) * H + lane * 8;
  for (int p = 0; p < kFp8PrepassChunk / rpp; ++p) {
    const int64_t tok = at.chunk * kFp8PrepassChunk + p * rpp + r;
    if (at.chunk * kFp8PrepassChunk + p * rpp >= len) break;
    const bool ok = r < rpp && tok < len;
    float x[8];
    LoadTransformed<kBf16>(raw, at, tok, ok, lane, x);
    float dot = 0.f;
    if (ok && lane * 8 < H) {
#pragma unroll
      for (int i = 0; i < 8; ++i) dot = fmaf(x[i], m[i], dot);
    }
    for (int o = lanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (ok && lane == 0) {
      const int64_t idx = tr.t.varlen ? at.head * total_q + tr.t.RowBase(at.entry) + tok
                                      : (at.entry * tr.t.heads + at.head) * tr.t.max_len + tok;
      const float l = lse[idx];
      if (isfinite(l)) lse[idx] = l + scale * dot;
    }
  }
}

Status CudaInternal(const char* what, cudaError_t e) {
  return Internal(std::string("fp8 pre-pass: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

bool Misaligned(const void* p, int a) { return reinterpret_cast<uintptr_t>(p) % a != 0; }

Status CheckShape(const AttentionShape& s) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return InvalidArgument(std::string("fp8 pre-pass: input dtype ") + DTypeName(s.dtype) +
                           " (float16 or bfloat16 only)");
  }
  if (Fp8HadamardOrder(s.head_dim) == 0 || s.head_dim > 256) {
    return InvalidArgument("fp8 pre-pass: head_dim " + std::to_string(s.head_dim) +
                           " must be a multiple of 8 up to 256");
  }
  if (s.batch > 65535 || s.num_heads > 65535) {
    return InvalidArgument("fp8 pre-pass: batch and num_heads must be at most 65535");
  }
  return Status::Ok();
}

dim3 GridFor(const PrepassTensor& t) {
  return dim3(static_cast<unsigned>(fp8::Chunks(t.max_len)), static_cast<unsigned>(t.heads),
              static_cast<unsigned>(t.batch));
}

template <bool kBf16>
Status PrepassTyped(const AttentionShape& s, const AttentionTensors& dev, uint8_t* q8, uint8_t* k8,
                    uint8_t* v8, float* sc, char* ws, cudaStream_t stream) {
  const fp8::PrepassWorkspace w = fp8::PrepassWorkspaceLayout(s);
  const int order = s.fp8.rotate ? Fp8HadamardOrder(s.head_dim) : 0;
  const float norm = order ? fp8::HadamardNorm(order) : 1.f;
  Transform q{static_cast<const uint16_t*>(dev.q), fp8::QTensor(s, dev), nullptr, order, norm};
  Transform k{static_cast<const uint16_t*>(dev.k), fp8::KvTensor(s, dev), nullptr, order, norm};
  Transform v{static_cast<const uint16_t*>(dev.v), fp8::KvTensor(s, dev), nullptr, 0, 1.f};
  cudaError_t e = cudaMemsetAsync(sc, 0, sizeof(float) * kFp8NumScalars, stream);
  if (e != cudaSuccess) return CudaInternal("cudaMemsetAsync", e);
  auto* bits = reinterpret_cast<unsigned int*>(sc);
  const bool any_q = s.batch > 0 && s.max_q_len > 0, any_kv = s.batch > 0 && s.max_kv_len > 0;
  if (any_q) {
    AmaxKernel<kBf16><<<GridFor(q.t), kPrepassThreads, 0, stream>>>(q, bits + kFp8AmaxQ);
    QuantizeKernel<kBf16><<<GridFor(q.t), kPrepassThreads, 0, stream>>>(
        q, sc + kFp8AmaxQ, q8, sc + kFp8ScaleQ, sc + kFp8DescaleQ);
  }
  if (any_kv) {
    if (s.fp8.smooth_k) {
      auto* partial = reinterpret_cast<float*>(ws + w.partial_offset);
      auto* mean = reinterpret_cast<float*>(ws + w.mean_offset);
      MeanPartialKernel<kBf16><<<GridFor(k.t), kPrepassThreads, 0, stream>>>(k, partial);
      const int64_t n = s.batch * s.num_kv_heads * s.head_dim;
      MeanFinalKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
          k.t, fp8::Chunks(k.t.max_len), partial, mean);
      k.mean = mean;
    }
    AmaxKernel<kBf16><<<GridFor(k.t), kPrepassThreads, 0, stream>>>(k, bits + kFp8AmaxK);
    QuantizeKernel<kBf16><<<GridFor(k.t), kPrepassThreads, 0, stream>>>(
        k, sc + kFp8AmaxK, k8, sc + kFp8ScaleK, sc + kFp8DescaleK);
    AmaxKernel<kBf16><<<GridFor(v.t), kPrepassThreads, 0, stream>>>(v, bits + kFp8AmaxV);
    QuantizeKernel<kBf16><<<GridFor(v.t), kPrepassThreads, 0, stream>>>(
        v, sc + kFp8AmaxV, v8, sc + kFp8ScaleV, sc + kFp8DescaleV);
  }
  if (!any_q || !any_kv) {  // scale = descale = 1 for the tensors without rows
    const float ones[kFp8NumScalars] = {1.f, 1.f, 0.f, 1.f, 1.f, 0.f, 1.f, 1.f, 0.f};
    const int first = any_q ? kFp8ScaleK : 0, count = any_q ? 6 : (any_kv ? 3 : 9);
    e = cudaMemcpyAsync(sc + first, ones + first, sizeof(float) * count, cudaMemcpyHostToDevice,
                        stream);
    if (e != cudaSuccess) return CudaInternal("cudaMemcpyAsync", e);
  }
  e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
}

}  // namespace

int Fp8HadamardOrder(int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 8 != 0) return 0;
  int64_t n = head_dim & -head_dim;  // largest power of two dividing head_dim
  return static_cast<int>(n > head_dim ? head_dim : n);
}

std::string Fp8RecipeName(const Fp8Options& o) {
  std::string name = "e4m3 per-tensor";
  if (o.rotate) name += ", hadamard q/k";
  if (o.smooth_k) name += ", k-smoothing";
  return name;
}

int64_t Fp8PrepassWorkspaceBytes(const AttentionShape& s) {
  return fp8::PrepassWorkspaceLayout(s).bytes;
}

Status Fp8Prepass(const AttentionShape& s, const AttentionTensors& dev, void* q8, void* k8,
                  void* v8, float* scalars, void* workspace, int64_t workspace_bytes,
                  cudaStream_t stream) {
  ATTN_RETURN_IF_ERROR(CheckShape(s));
  if (scalars == nullptr) return InvalidArgument("fp8 pre-pass: scalars must be non-null");
  if (s.q_rows() > 0 && s.kv_rows() > 0 &&
      (dev.q == nullptr || dev.k == nullptr || dev.v == nullptr || q8 == nullptr || k8 == nullptr ||
       v8 == nullptr)) {
    return InvalidArgument("fp8 pre-pass: q, k, v and their E4M3 outputs must be non-null");
  }
  if (Misaligned(dev.q, 16) || Misaligned(dev.k, 16) || Misaligned(dev.v, 16) ||
      Misaligned(q8, 8) || Misaligned(k8, 8) || Misaligned(v8, 8) || Misaligned(workspace, 16)) {
    return InvalidArgument(
        "fp8 pre-pass: inputs and workspace must be 16-byte aligned, the "
        "E4M3 outputs 8-byte aligned");
  }
  if (s.layout == Layout::kVarlen && (dev.q_offsets == nullptr || dev.kv_offsets == nullptr)) {
    return InvalidArgument("fp8 pre-pass: varlen needs q_offsets and kv_offsets");
  }
  const int64_t need = Fp8PrepassWorkspaceBytes(s);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
    return InvalidArgument("fp8 pre-pass: workspace of " + std::to_string(workspace_bytes) +
                           " bytes, need " + std::to_string(need));
  }
  auto* ws = static_cast<char*>(workspace);
  auto* q = static_cast<uint8_t*>(q8);
  auto* k = static_cast<uint8_t*>(k8);
  auto* v = static_cast<uint8_t*>(v8);
  return s.dtype == DType::kBFloat16 ? PrepassTyped<true>(s, dev, q, k, v, scalars, ws, stream)
                                     : PrepassTyped<false>(s, dev, q, k, v, scalars, ws, stream);
}

Status Fp8PrepassLseShift(const AttentionShape& s, const AttentionTensors& dev,
                          const void* workspace, cudaStream_t stream) {
  if (!s.fp8.smooth_k || !s.return_lse || s.batch == 0 || s.max_q_len == 0) return Status::Ok();
  ATTN_RETURN_IF_ERROR(CheckShape(s));
  if (dev.q == nullptr || dev.lse == nullptr || workspace == nullptr || Misaligned(dev.q, 16)) {
    return InvalidArgument(
        "fp8 pre-pass: the lse shift needs q (16-byte aligned), lse and the "
        "pre-pass workspace");
  }
  const fp8::PrepassWorkspace w = fp8::PrepassWorkspaceLayout(s);
  Transform q{static_cast<const uint16_t*>(dev.q), fp8::QTensor(s, dev),
              reinterpret_cast<const float*>(static_cast<const char*>(workspace) + w.mean_offset),
              0, 1.f};
  const int64_t group = s.num_heads / s.num_kv_heads;
  if (s.dtype == DType::kBFloat16) {
    LseShiftKernel<true><<<GridFor(q.t), kPrepassThreads, 0, stream>>>(q, group, s.num_kv_heads,
                                                                       s.total_q, s.scale, dev.lse);
  } else {
    LseShiftKernel<false><<<GridFor(q.t), kPrepassThreads, 0, stream>>>(
        q, group, s.num_kv_heads, s.total_q, s.scale, dev.lse);
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
}

}  // namespace attn::kernels
