// The device kernels of the FP8 accuracy pre-pass (attn/kernels/fp8_prepass.h), launched by
// fp8_prepass.cu: pass 1 (StatsKernel: amax, or K's per-chunk sums and extremes), K's final
// step (KFinalKernel: mean and amax), pass 2 (QuantizeKernel) and the LSE shift. q, k and v
// share one launch per pass (Parts).
//
// Internal to kernels/fp8/; included only by fp8_prepass.cu (its kernels are in an unnamed
// namespace there).
#pragma once

#include <cuda_fp8.h>

#include "attn/kernels/fp8_quantize.h"
#include "fp8_prepass_device.cuh"

namespace attn::kernels {
namespace {

using fp8::BlockAt;
using fp8::kPrepassThreads;
using fp8::LoadRow;
using fp8::LoadTransformed;
using fp8::Locate;
using fp8::PrepassTensor;
using fp8::Transform;
using fp8::TransformRow;

/// One tensor of a launch: its blocks (chunk, head, entry) occupy `blocks` consecutive linear
/// block indices. Stats role: kstats (K with smoothing: per-chunk sums, maxima, minima of the
/// rotated rows into the workspace) or the amax (atomicMax of |x|'s fp32 bits into sc[2]).
/// Quantise role: dst and sc = (scale, descale, amax) of this tensor. fp8_prepass.cu launches
/// one tensor at a time (its quantise pass right after its statistics, while much of it is still
/// in L2: three tensors in one launch left only the last ~50 MB there, measured slower).
struct Part {
  Transform tr;
  int64_t blocks = 0;
  uint8_t* dst = nullptr;
  float* sc = nullptr;
  bool kstats = false;
};
/// Up to three tensors (q, k, v) in one launch, and K's statistics arrays (kstats parts).
struct Parts {
  Part part[3];
  int count = 0;
  float* sum = nullptr;  ///< (B, K, chunks, H)
  float* max = nullptr;
  float* min = nullptr;
};

/// This block's part and (chunk, head, entry); `reverse` walks the whole grid backwards.
__device__ __forceinline__ const Part& Find(const Parts& ps, bool reverse, BlockAt* at) {
  int64_t lin = blockIdx.x;
  if (reverse) lin = static_cast<int64_t>(gridDim.x) - 1 - lin;
  int i = 0;
  while (i + 1 < ps.count && lin >= ps.part[i].blocks) lin -= ps.part[i++].blocks;
  const Part& pt = ps.part[i];
  const int64_t nx = fp8::Chunks(pt.tr.t.max_len), ny = pt.tr.t.heads;
  *at = BlockAt{lin % nx, (lin / nx) % ny, lin / (nx * ny)};
  return pt;
}

/// Max and min that keep a NaN once one is seen (fmaxf/fminf would drop it).
__device__ __forceinline__ float MaxNan(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}
__device__ __forceinline__ float MinNan(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return b < a ? b : a;
}

/// Max over the threads of the block of an unsigned value (lane 0 of warp 0 gets it).
__device__ __forceinline__ uint32_t BlockMaxBits(uint32_t m) {
  __shared__ uint32_t warp_max[kPrepassThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  uint32_t b = 0;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kPrepassThreads / 32; ++w) b = max(b, warp_max[w]);
  }
  return b;
}

/// Passes per block for `head_dim`: kFp8PrepassChunk / RowsPerPass = max(1, head_dim / 32), a
/// template argument of the pass kernels so that a thread holds exactly its passes' loads.
inline int PassesFor(int64_t head_dim) {
  return static_cast<int>(kFp8PrepassChunk / fp8::RowsPerPass(head_dim));
}

/// Pass 1 over q, k and v in one launch. Each thread first issues the loads of all its passes
/// (up to 8 × 16 B), then transforms them. Amax parts: max |x| over valid rows (integer max of
/// the fp32 bits, NaN above +inf). K-stats parts: per channel the sum (per thread over its
/// passes, then over the pass's rows, a fixed order), max and min of the rotated valid rows.
template <bool kBf16, int kMaxPasses, bool kKStats>
__global__ void __launch_bounds__(kPrepassThreads) StatsKernel(Parts ps) {
  BlockAt at;
  const Part& pt = Find(ps, false, &at);
  const Transform& tr = pt.tr;
  const int64_t H = tr.t.head_dim;
  const int lanes = fp8::LanesPerRow(H), rpp = fp8::RowsPerPass(H);
  const int lane = threadIdx.x % lanes, r = threadIdx.x / lanes;
  constexpr int passes = kMaxPasses;  // == kFp8PrepassChunk / rpp (PassesFor)
  const int64_t len = tr.t.Length(at.entry), tok0 = at.chunk * kFp8PrepassChunk;
  uint4 w[kMaxPasses];
#pragma unroll
  for (int p = 0; p < kMaxPasses; ++p) {
    const int64_t tok = tok0 + p * rpp + r;
    w[p] = LoadRow(tr, at, tok, p < passes && r < rpp && tok < len && lane * 8 < H, lane);
  }
  float sum[8], mx[8], mn[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    sum[i] = 0.f;
    mx[i] = -__builtin_huge_valf();
    mn[i] = __builtin_huge_valf();
  }
  uint32_t m = 0;
#pragma unroll
  for (int p = 0; p < kMaxPasses; ++p) {
    if (p >= passes || tok0 + p * rpp >= len) break;  // uniform over the block
    const int64_t tok = tok0 + p * rpp + r;
    const bool ok = r < rpp && tok < len, mine = ok && lane * 8 < H;
    float x[8];
    TransformRow<kBf16>(tr, at, w[p], mine, lane, x);
    if (!mine) continue;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (kKStats) {
        sum[i] = __fadd_rn(sum[i], x[i]);
        mx[i] = MaxNan(mx[i], x[i]);
        mn[i] = MinNan(mn[i], x[i]);
      } else {
        m = max(m, __float_as_uint(fabsf(x[i])));
      }
    }
  }
  if constexpr (!kKStats) {
    const uint32_t b = BlockMaxBits(m);
    if (threadIdx.x == 0 && b != 0) atomicMax(reinterpret_cast<unsigned int*>(pt.sc + 2), b);
  } else {
  __shared__ float rows[3][kPrepassThreads * 8];
  if (r < rpp && lane * 8 < H) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      rows[0][r * H + lane * 8 + i] = sum[i];
      rows[1][r * H + lane * 8 + i] = mx[i];
      rows[2][r * H + lane * 8 + i] = mn[i];
    }
  }
  __syncthreads();
  if (threadIdx.x < H) {
    float s = 0.f, hi = -__builtin_huge_valf(), lo = __builtin_huge_valf();
    for (int i = 0; i < rpp; ++i) {
      s = __fadd_rn(s, rows[0][i * H + threadIdx.x]);
      hi = MaxNan(hi, rows[1][i * H + threadIdx.x]);
      lo = MinNan(lo, rows[2][i * H + threadIdx.x]);
    }
    const int64_t chunks = fp8::Chunks(tr.t.max_len);
    const int64_t at_stats = ((at.entry * tr.t.heads + at.head) * chunks + at.chunk) * H + threadIdx.x;
    ps.sum[at_stats] = s;
    ps.max[at_stats] = hi;
    ps.min[at_stats] = lo;
  }
  }
}

/// Chunk lanes of KFinalKernel: each (entry, kv head, channel) sums its chunks in kKFinalLanes
/// interleaved streams (chunk c goes to stream c % kKFinalLanes, in increasing c), then the
/// streams in order 0, 1, ...: a fixed order the host reference repeats (fp8_prepass_reference.cc).
inline constexpr int kKFinalLanes = 8;
inline constexpr int kKFinalChannels = kPrepassThreads / kKFinalLanes;  // 32 per block

/// K with smoothing, step 2. Block (entry·K + kv head, channel group of 32), thread (channel,
/// chunk lane): mean = Σ over chunks (the order above) / S_b (0 for an entry with no keys), and
/// K's amax from the extremes. Rounding is monotonic, so over an entry's valid rows
/// max |fl(x − mean)| = max(|fl(max x − mean)|, |fl(min x − mean)|) exactly: the amax of the
/// values the quantise pass writes, without reading k a third time. Entries with no valid key
/// contribute nothing. amax_bits: null to skip the amax (EnqueueKMean).
__global__ void __launch_bounds__(kPrepassThreads)
    KFinalKernel(PrepassTensor t, const float* __restrict__ sum, const float* __restrict__ mx,
                 const float* __restrict__ mn, float* __restrict__ mean,
                 unsigned int* __restrict__ amax_bits) {
  __shared__ float part[3][kKFinalLanes][kKFinalChannels];
  const int64_t chunks = fp8::Chunks(t.max_len), unit = blockIdx.x;
  const int cl = threadIdx.x / kKFinalChannels, dl = threadIdx.x % kKFinalChannels;
  const int64_t d = static_cast<int64_t>(blockIdx.y) * kKFinalChannels + dl;
  float s = 0.f, hi = -__builtin_huge_valf(), lo = __builtin_huge_valf();
  if (d < t.head_dim) {
#pragma unroll 4  // independent loads in flight; the adds keep their order
    for (int64_t c = cl; c < chunks; c += kKFinalLanes) {
      const int64_t j = (unit * chunks + c) * t.head_dim + d;
      s = __fadd_rn(s, sum[j]);
      hi = MaxNan(hi, mx[j]);
      lo = MinNan(lo, mn[j]);
    }
  }
  part[0][cl][dl] = s;
  part[1][cl][dl] = hi;
  part[2][cl][dl] = lo;
  __syncthreads();
  uint32_t bits = 0;
  if (cl == 0 && d < t.head_dim) {
    float total = 0.f;
    for (int g = 0; g < kKFinalLanes; ++g) {
      total = __fadd_rn(total, part[0][g][dl]);
      hi = MaxNan(hi, part[1][g][dl]);
      lo = MinNan(lo, part[2][g][dl]);
    }
    const int64_t len = t.Length(unit / t.heads);
    const float m = len > 0 ? __fdiv_rn(total, static_cast<float>(len)) : 0.f;
    mean[unit * t.head_dim + d] = m;
    if (len > 0) {
      bits = max(__float_as_uint(fabsf(__fsub_rn(hi, m))), __float_as_uint(fabsf(__fsub_rn(lo, m))));
    }
  }
  if (amax_bits == nullptr) return;
  const uint32_t b = BlockMaxBits(bits);
  if (threadIdx.x == 0 && b != 0) atomicMax(amax_bits, b);
}

__device__ __forceinline__ float ScaleFor(float amax) {  // Fp8ScaleForAmax's device twin
  return (amax > 0.f && amax <= 3.402823466e38f) ? fminf(__fdiv_rn(kE4M3Max, amax), kFp8MaxScale)
                                                 : 1.f;
}

/// Pass 2 over q, k and v in one launch, the grid walked backwards (pass 1's last reads are still
/// in L2): x8 = e4m3_rn_satfinite(x · scale) for valid rows, E4M3 zeros for padding rows. Each
/// part's first block writes its scale and descale.
template <bool kBf16, int kMaxPasses>
__global__ void __launch_bounds__(kPrepassThreads) QuantizeKernel(Parts ps) {
  BlockAt at;
  const Part& pt = Find(ps, true, &at);
  const Transform& tr = pt.tr;
  const float scale = ScaleFor(pt.sc[2]);
  if (at.chunk == 0 && at.head == 0 && at.entry == 0 && threadIdx.x == 0) {
    pt.sc[0] = scale;
    pt.sc[1] = __fdiv_rn(1.f, scale);
  }
  const int64_t H = tr.t.head_dim;
  const int lanes = fp8::LanesPerRow(H), rpp = fp8::RowsPerPass(H);
  const int lane = threadIdx.x % lanes, r = threadIdx.x / lanes;
  constexpr int passes = kMaxPasses;  // == kFp8PrepassChunk / rpp (PassesFor)
  const int64_t len = tr.t.Length(at.entry), written = tr.t.WrittenRows(at.entry);
  const int64_t tok0 = at.chunk * kFp8PrepassChunk;
  uint4 w[kMaxPasses];
#pragma unroll
  for (int p = 0; p < kMaxPasses; ++p) {
    const int64_t tok = tok0 + p * rpp + r;
    w[p] = LoadRow(tr, at, tok, p < passes && r < rpp && tok < len && lane * 8 < H, lane);
  }
#pragma unroll
  for (int p = 0; p < kMaxPasses; ++p) {
    if (p >= passes || tok0 + p * rpp >= written) break;  // uniform over the block
    const int64_t tok = tok0 + p * rpp + r;
    const bool ok = r < rpp && tok < len, mine = ok && lane * 8 < H;
    float x[8];
    TransformRow<kBf16>(tr, at, w[p], mine, lane, x);
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
    *reinterpret_cast<uint2*>(pt.dst + (row * tr.t.heads + at.head) * H + lane * 8) =
        make_uint2(out[0], out[1]);
  }
}

/// lse[b, t, n] += scale · rot(q[b, t, n, :]) · mean[b, n / g, :] for finite lse of valid rows
/// (mean: of the rotated keys, so rot(q)·mean = q·mean of the unrotated keys).
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

}  // namespace
}  // namespace attn::kernels
