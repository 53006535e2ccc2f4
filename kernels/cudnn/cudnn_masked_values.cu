// Non-finite V values at masked keys for the cudnn family's fp16/bf16 graph (DESIGN.md §4: a
// key a row cannot see has no effect on it, NaN and ±Inf included). See cudnn_internal.h.
//
// cuDNN's SDPA multiplies masked probabilities (exact zeros) by their V rows, and in IEEE
// arithmetic 0 · NaN = 0 · Inf = NaN: with a NaN in V at a causally masked key, rows that cannot
// see that key came out NaN (measured on an H200; keys past kv_lengths were fine). cuDNN's
// kernels cannot be changed, so two kernels wrap its run:
//   - FlagKernel, before the graph: flags[u] = 1 when unit u = (batch entry b, kv head kh) has
//     a non-finite element in V at one of the entry's first S_b keys (flags zeroed first);
//   - RepairKernel, after the graph and its fix-up pass: every query row of a flagged unit is
//     recomputed in fp32 over exactly the keys BandKeyRange gives it (two passes: max of the
//     scaled logits, then Σ exp and Σ exp · v), so a masked key is never read; o is written in
//     the request dtype and lse (if requested) in attention_problem.h's layout. A row that sees
//     no key gets o = 0, lse = -inf; a row that sees a non-finite K or V gets what IEEE
//     arithmetic gives (NaN/±Inf in the affected elements), as the float64 reference does.
// Cost for finite inputs: one cudaMemsetAsync of B·K int32, one read of V's visible keys
// (16-byte loads, bandwidth-bound: ~0.1 ms per 512 MB of V on an H200), and one launch of at
// most max(B·K, 8192) blocks that each load one flag and exit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "../common/nonfinite.cuh"
#include "cudnn_internal.h"

namespace attn::kernels::cudnn_detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChunks = 8;  // head dim <= 256: 8 elements per lane
constexpr int64_t kMaxRepairBlocks = 8192;
constexpr int64_t kMaxFlagBlocks = 4096;

__device__ __forceinline__ int64_t ClampLen(const int32_t* lengths, int64_t b, int64_t full) {
  if (lengths == nullptr) return full;
  const int64_t x = lengths[b] < 0 ? 0 : static_cast<int64_t>(lengths[b]);
  return x < full ? x : full;
}

template <typename T>
__device__ __forceinline__ float ToFloat(T x);
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
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

struct FlagArgs {
  const uint16_t* v;          // fp16/bf16 bits, padded (B, S, K, H) or varlen (total_kv, K, H)
  const int32_t* kv_lengths;  // padded: (B) or null (full extent S)
  const int64_t* kv_offsets;  // varlen: (B+1)
  int32_t* flags;             // (B·K), zeroed before the launch
  uint32_t groups;            // rows · K · H / 8 (8-element groups; H % 8 == 0)
  uint32_t groups_per_row;    // K · H / 8
  uint32_t groups_per_head;   // H / 8
  int64_t batch, S, K;
  bool varlen;
};

/// Grid-stride over 8-element groups of V (a group never straddles a (key, kv head)). Padded:
/// groups of keys j >= S_b are not read. Varlen: rows past kv_offsets[B] are ignored.
template <bool kBF16, bool kVec16>
__global__ void __launch_bounds__(kThreads) FlagKernel(FlagArgs a) {
  const uint32_t stride = gridDim.x * kThreads;
  for (uint32_t g = blockIdx.x * kThreads + threadIdx.x; g < a.groups; g += stride) {
    const uint32_t row = g / a.groups_per_row;
    int64_t b = 0;
    if (!a.varlen) {
      b = row / static_cast<uint32_t>(a.S);
      const int64_t j = row - b * a.S;
      if (a.kv_lengths != nullptr && j >= ClampLen(a.kv_lengths, b, a.S)) continue;
    }
    uint32_t w[4];
    const uint16_t* p = a.v + static_cast<uint64_t>(g) * 8;
    if (kVec16) {
      const uint4 x = *reinterpret_cast<const uint4*>(p);
      w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] = p[2 * e] | (static_cast<uint32_t>(p[2 * e + 1]) << 16);
    }
    bool bad = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) bad |= common::AnyNonFinite16x2<kBF16>(w[e]);
    if (!bad) continue;
    // Rare path: which unit owns the group.
    const int64_t kh = (g % a.groups_per_row) / a.groups_per_head;
    if (a.varlen) {
      int64_t lo = 0, hi = a.batch - 1;  // last entry starting at or before `row`
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (a.kv_offsets[mid] <= row)
          lo = mid;
        else
          hi = mid - 1;
      }
      if (row < a.kv_offsets[lo] || row >= a.kv_offsets[lo + 1]) continue;
      b = lo;
    }
    a.flags[b * a.K + kh] = 1;
  }
}

struct RepairArgs {
  AttentionShape shape;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;                 // null unless shape.return_lse
  const int32_t* q_lengths;   // padded: (B) or null
  const int32_t* kv_lengths;  // padded: (B) or null
  const int64_t* q_offsets;   // varlen: (B+1)
  const int64_t* kv_offsets;  // varlen: (B+1)
  const int32_t* flags;       // (B·K)
};

__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;  // the butterfly leaves the same value on every lane
}

/// scale · q · k_j for the key row `kr` (lane-strided elements d = lane + 32c).
template <typename T>
__device__ __forceinline__ float Logit(const float (&qv)[kMaxChunks], const T* kr, int64_t H,
                                       int lane, float scale) {
  float dot = 0.f;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < H) dot += qv[c] * ToFloat<T>(kr[d]);
  }
  return scale * WarpSum(dot);
}

/// grid (B·K units, row chunks); one warp per (query head, query row) of the unit at a time.
template <typename T>
__global__ void __launch_bounds__(kThreads) RepairKernel(RepairArgs a) {
  const int64_t u = blockIdx.x;
  if (a.flags[u] == 0) return;  // finite V: the whole block exits here
  const AttentionShape& s = a.shape;
  const int64_t K = s.num_kv_heads, N = s.num_heads, H = s.head_dim, G = N / K;
  // 32-bit divisions (64-bit ones are calls that spill): B·K and G·T fit (q, v < 2^31 elements).
  const int64_t b = static_cast<uint32_t>(u) / static_cast<uint32_t>(K);
  const int64_t kh = u - b * K;
  const bool varlen = s.layout == Layout::kVarlen;
  int64_t rows, tq, tk, q_row0, kv_row0;
  if (varlen) {
    q_row0 = a.q_offsets[b];
    kv_row0 = a.kv_offsets[b];
    rows = tq = a.q_offsets[b + 1] - q_row0;
    tk = a.kv_offsets[b + 1] - kv_row0;
  } else {
    q_row0 = b * s.max_q_len;
    kv_row0 = b * s.max_kv_len;
    rows = s.max_q_len;
    tq = ClampLen(a.q_lengths, b, s.max_q_len);
    tk = ClampLen(a.kv_lengths, b, s.max_kv_len);
  }
  const int lane = threadIdx.x & 31;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  T* o = static_cast<T*>(a.o);
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kWarps + (threadIdx.x >> 5); r < G * rows;
       r += static_cast<int64_t>(gridDim.y) * kWarps) {
    const int64_t g = static_cast<uint32_t>(r) / static_cast<uint32_t>(rows);
    const int64_t i = r - g * rows, h = kh * G + g;
    const int64_t q_at = ((q_row0 + i) * N + h) * H;
    const KeyRange kr = BandKeyRange(s.mask, i, tq, tk);
    float acc[kMaxChunks] = {};
    float lse = -INFINITY;
    if (!kr.empty()) {
      float qv[kMaxChunks];
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        const int64_t d = lane + 32 * c;
        qv[c] = d < H ? ToFloat<T>(q[q_at + d]) : 0.f;
      }
      // Pass 1: the max of the visible logits (NaN logits skipped, as std::max does; they
      // still poison the sums below).
      float m = -INFINITY;
      for (int64_t j = kr.lo; j <= kr.hi; ++j) {
        const float x = Logit<T>(qv, k + ((kv_row0 + j) * K + kh) * H, H, lane, s.scale);
        m = m < x ? x : m;
      }
      // Pass 2: p_j = exp(logit_j - m), Σ p_j and Σ p_j v_j.
      float l = 0.f;
      for (int64_t j = kr.lo; j <= kr.hi; ++j) {
        const int64_t kv_at = ((kv_row0 + j) * K + kh) * H;
        const float p = expf(Logit<T>(qv, k + kv_at, H, lane, s.scale) - m);
        l += p;
#pragma unroll
        for (int c = 0; c < kMaxChunks; ++c) {
          const int64_t d = lane + 32 * c;
          if (d < H) acc[c] += p * ToFloat<T>(v[kv_at + d]);
        }
      }
      const float inv = 1.f / l;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) acc[c] *= inv;
      lse = m + logf(l);
    }
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < H) o[q_at + d] = FromFloat<T>(acc[c]);
    }
    if (a.lse != nullptr && lane == 0) {
      a.lse[varlen ? h * s.total_q + q_row0 + i : (b * N + h) * s.max_q_len + i] = lse;
    }
  }
}

Status LaunchError(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok();
  return Internal(std::string("cudnn ") + what + ": " + cudaGetErrorName(e));
}

Status CheckShape(const AttentionShape& s, const AttentionTensors& dev, const char* who) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return InvalidArgument(std::string(who) + ": fp16 or bf16 only");
  }
  if (s.head_dim % 8 != 0 || s.head_dim > 32 * kMaxChunks || s.num_kv_heads <= 0) {
    return InvalidArgument(std::string(who) + ": head dim must be a multiple of 8 and <= 256");
  }
  if (s.kv_elements() >= 0x7fffffff) return InvalidArgument(std::string(who) + ": V too large");
  if (s.layout == Layout::kVarlen && (dev.q_offsets == nullptr || dev.kv_offsets == nullptr)) {
    return InvalidArgument(std::string(who) + ": varlen needs q_offsets and kv_offsets");
  }
  return Status::Ok();
}

}  // namespace

Status LaunchFlagNonFiniteV(const AttentionShape& shape, const AttentionTensors& dev,
                            int32_t* flags, cudaStream_t stream) {
  ATTN_RETURN_IF_ERROR(CheckShape(shape, dev, "non-finite flags"));
  const int64_t units = shape.batch * shape.num_kv_heads;
  if (units == 0) return Status::Ok();
  if (cudaMemsetAsync(flags, 0, sizeof(int32_t) * units, stream) != cudaSuccess) {
    return LaunchError("non-finite flags memset");
  }
  FlagArgs a{};
  a.v = static_cast<const uint16_t*>(dev.v);
  a.varlen = shape.layout == Layout::kVarlen;
  a.kv_lengths = !a.varlen && shape.has_lengths ? dev.kv_lengths : nullptr;
  a.kv_offsets = dev.kv_offsets;
  a.flags = flags;
  a.groups = static_cast<uint32_t>(shape.kv_elements() / 8);
  a.groups_per_row = static_cast<uint32_t>(shape.num_kv_heads * shape.head_dim / 8);
  a.groups_per_head = static_cast<uint32_t>(shape.head_dim / 8);
  a.batch = shape.batch;
  a.S = shape.max_kv_len;
  a.K = shape.num_kv_heads;
  if (a.groups == 0) return Status::Ok();
  const int64_t need = (a.groups + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(need < kMaxFlagBlocks ? need : kMaxFlagBlocks);
  const bool vec = reinterpret_cast<uintptr_t>(dev.v) % 16 == 0;  // load width only
  if (shape.dtype == DType::kBFloat16) {
    if (vec)
      FlagKernel<true, true><<<blocks, kThreads, 0, stream>>>(a);
    else
      FlagKernel<true, false><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    if (vec)
      FlagKernel<false, true><<<blocks, kThreads, 0, stream>>>(a);
    else
      FlagKernel<false, false><<<blocks, kThreads, 0, stream>>>(a);
  }
  return LaunchError("non-finite flags launch");
}

Status LaunchRepairFlaggedRows(const AttentionShape& shape, const AttentionTensors& dev,
                               const int32_t* flags, cudaStream_t stream) {
  ATTN_RETURN_IF_ERROR(CheckShape(shape, dev, "masked-value repair"));
  const int64_t units = shape.batch * shape.num_kv_heads;
  if (units == 0 || shape.max_q_len == 0) return Status::Ok();
  if (units > 0x7fffffff) return InvalidArgument("cudnn masked-value repair: too many units");
  RepairArgs a{};
  a.shape = shape;
  a.q = dev.q;
  a.k = dev.k;
  a.v = dev.v;
  a.o = dev.o;
  a.lse = shape.return_lse ? dev.lse : nullptr;
  const bool lengths = shape.layout == Layout::kPadded && shape.has_lengths;
  a.q_lengths = lengths ? dev.q_lengths : nullptr;
  a.kv_lengths = lengths ? dev.kv_lengths : nullptr;
  a.q_offsets = dev.q_offsets;
  a.kv_offsets = dev.kv_offsets;
  a.flags = flags;
  // Row chunks per unit: enough warps for a unit's G·T rows, at most kMaxRepairBlocks blocks
  // in all (each exits after one flag load when V is finite) and at most 65535 (grid y).
  const int64_t rows = shape.group_size() * shape.max_q_len;
  int64_t gy = (rows + kWarps - 1) / kWarps;
  const int64_t cap = kMaxRepairBlocks / units;
  if (gy > cap) gy = cap;
  if (gy > 65535) gy = 65535;
  if (gy < 1) gy = 1;
  const dim3 grid(static_cast<unsigned>(units), static_cast<unsigned>(gy));
  if (shape.dtype == DType::kBFloat16) {
    RepairKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  } else {
    RepairKernel<__half><<<grid, kThreads, 0, stream>>>(a);
  }
  return LaunchError("masked-value repair launch");
}

}  // namespace attn::kernels::cudnn_detail
