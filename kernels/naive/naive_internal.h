// Internal to the naive family: the softmax launcher and the GEMM batch decomposition shared by
// NaivePlanFor (to count calls) and NaiveRun (to issue them). Not a public header.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/naive_attention.h"

namespace attn::kernels::naive_internal {

/// One softmax launch over a chunk of units [first_unit, first_unit + units).
/// scores: float32 rows, row r = ((u - first_unit) * G + g) * T + t, `ld` elements apart.
/// probs:  same layout in `dtype` (may alias scores when dtype is float32).
/// lse:    (B, N, T) float32 or null.
struct SoftmaxParams {
  DType dtype = DType::kFloat32;
  const float* scores = nullptr;
  void* probs = nullptr;
  float* lse = nullptr;
  const int32_t* q_lengths = nullptr;   ///< null: full extent T
  const int32_t* kv_lengths = nullptr;  ///< null: full extent S
  MaskSpec mask;
  int64_t first_unit = 0;
  int64_t units = 0;
  int64_t T = 0, S = 0, ld = 0, G = 0, K = 0, N = 0;
};

/// Enqueues the mask + softmax kernel; returns the launch error (cudaSuccess when enqueued).
cudaError_t LaunchSoftmax(const SoftmaxParams& p, cudaStream_t stream);

/// Enqueues flags[u] = (V of unit u = (b, kh) holds ±Inf or NaN), for units [0, units) of a
/// padded v (B, S, K, H) in `dtype`; flags: `units` int32 on the device (naive_masked_values.cu).
cudaError_t LaunchFlagNonFiniteV(DType dtype, const void* v, int64_t units, int64_t S, int64_t K,
                                 int64_t H, int32_t* flags, cudaStream_t stream);

/// Enqueues the recomputation of the chunk's rows (p.first_unit, p.units; probabilities in
/// p.probs) whose unit is flagged: o[b, t, h, :] = Σ over the row's band of P · V, so masked keys
/// never enter. o: (B, T, N, H) in p.dtype, as written by the P·V GEMM.
cudaError_t LaunchRepairRows(const SoftmaxParams& p, const void* v, void* o, const int32_t* flags,
                             int64_t H, cudaStream_t stream);

/// One strided-batched GEMM call, in elements. The same decomposition serves both phases:
/// q_* also addresses o (same layout), kv_* addresses k for phase 1 and v for phase 2,
/// s_* addresses the chunk's scores (phase 1) and probabilities (phase 2).
struct GemmBatch {
  int64_t q_offset = 0, kv_offset = 0, s_offset = 0;
  int64_t q_stride = 0, kv_stride = 0, s_stride = 0;
  int count = 0;
};

/// Calls `f(const GemmBatch&)` for the fewest-calls decomposition of units [u0, u1):
///   D (whole batch entries in the chunk): per query head h, batched over b;
///   A (per batch entry segment): per group index g, batched over kv heads (K stride H);
///   C (per batch entry segment): per kv head, batched over g with K/V stride 0.
template <typename F>
void ForEachGemmBatch(const AttentionShape& s, int64_t ld, int64_t u0, int64_t u1, F&& f) {
  const int64_t T = s.max_q_len, S = s.max_kv_len, N = s.num_heads, K = s.num_kv_heads;
  const int64_t H = s.head_dim, G = N / K;
  const int64_t q_b = T * N * H, kv_b = S * K * H, unit_s = G * T * ld;
  // Cost of A/C: per segment min(G, segment length).
  int64_t cost_ac = 0;
  for (int64_t u = u0; u < u1;) {
    const int64_t b = u / K;
    const int64_t seg_end = std::min(u1, (b + 1) * K);
    cost_ac += std::min(G, seg_end - u);
    u = seg_end;
  }
  const bool whole_entries = (u0 % K == 0) && (u1 % K == 0);
  if (whole_entries && N < cost_ac) {
    const int64_t b0 = u0 / K;
    for (int64_t h = 0; h < N; ++h) {
      GemmBatch g;
      g.q_offset = b0 * q_b + h * H;
      g.q_stride = q_b;
      g.kv_offset = b0 * kv_b + (h / G) * H;
      g.kv_stride = kv_b;
      g.s_offset = h * T * ld;  // unit (b - b0) * K + h / G, group h % G
      g.s_stride = K * unit_s;
      g.count = static_cast<int>((u1 - u0) / K);
      f(g);
    }
    return;
  }
  for (int64_t u = u0; u < u1;) {
    const int64_t b = u / K;
    const int64_t seg_end = std::min(u1, (b + 1) * K);
    const int64_t kh0 = u - b * K, len = seg_end - u;
    if (G <= len) {  // A: per g, batch over kv heads
      for (int64_t g = 0; g < G; ++g) {
        GemmBatch gb;
        gb.q_offset = b * q_b + (kh0 * G + g) * H;
        gb.q_stride = G * H;
        gb.kv_offset = b * kv_b + kh0 * H;
        gb.kv_stride = H;
        gb.s_offset = (u - u0) * unit_s + g * T * ld;
        gb.s_stride = unit_s;
        gb.count = static_cast<int>(len);
        f(gb);
      }
    } else {  // C: per kv head, batch over g with stride-0 K/V
      for (int64_t kh = kh0; kh < kh0 + len; ++kh) {
        GemmBatch gb;
        gb.q_offset = b * q_b + kh * G * H;
        gb.q_stride = H;
        gb.kv_offset = b * kv_b + kh * H;
        gb.kv_stride = 0;
        gb.s_offset = (b * K + kh - u0) * unit_s;
        gb.s_stride = T * ld;
        gb.count = static_cast<int>(G);
        f(gb);
      }
    }
    u = seg_end;
  }
}

}  // namespace attn::kernels::naive_internal
