// Launch parameters of the FP8 attention kernel, the Vᵀ workspace layout, and the explicit
// instantiation list (DESIGN.md §13.7).
//
// Internal to kernels/fp8/: the public API is attn/kernels/fp8_attention.h.
// Host- and device-compatible; includes no CUDA header beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attn/kernels/attention_problem.h"

namespace attn::kernels::fp8 {

// ---- The Vᵀ workspace -----------------------------------------------------------------------
// The B operand of mma.m16n8k32 (.col) needs 4 consecutive k elements (keys, for P·V) per
// register, and there is no ldmatrix.trans for 8-bit data, so V is transposed once per call by a
// pre-pass into Vᵀ: per kv head h and head-dim row d, one row of keys,
//   element (h, d, key j of batch entry b) at byte ((h·H + d)·row_len + SlotStart(b) + Perm(j)).
// Each batch entry owns a slot of SlotKeys(S_b) = roundup(S_b, 128) bytes per row (keys past S_b
// are written as zeros), so a 64- or 128-key tile never reads outside its slot and needs no
// predicate; slots start on 16-byte boundaries (cp.async).
//   padded: SlotStart(b) = b · roundup(S, 128),                 row_len = B · roundup(S, 128)
//   varlen: SlotStart(b) = roundup(kv_offsets[b], 16) + 144·b,  row_len = roundup(total_kv, 16)
//           + 144·B  (slot b ends below kv_offsets[b+1] + 144·b + 143 <= SlotStart(b+1))
// Key order inside each group of 32 keys is permuted so that the P fragment the online softmax
// leaves in registers (the m16n8 accumulator layout: thread (g, t) holds keys 2t, 2t+1 of each
// n8 tile) IS the A operand of m16n8k32 (thread t holds k = 4t..4t+3 and 16+4t..16+4t+3) without
// any register shuffle: position p = 16·h + 4·t + i (h < 2, t < 4, i < 4) holds key
//   Key(p) = 16·h + 8·(i >> 1) + 2·t + (i & 1),
// i.e. Perm(key = 16h + 8a + 2t + b) = 16h + 4t + 2a + b. Both are bijections on [0, 32) that
// keep each 16-key half in place.
inline constexpr int kVtSlotAlign = 128;
inline constexpr int kVtVarlenGap = 144;

ATTN_HD int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
ATTN_HD int PermKey(int j) {  // key index within a tile -> byte position
  const int base = j & ~31, r = j & 31;
  const int h = r >> 4, a = (r >> 3) & 1, t = (r >> 1) & 3, b = r & 1;
  return base + 16 * h + 4 * t + 2 * a + b;
}
ATTN_HD int KeyAtPos(int p) {  // byte position -> key index within a tile (inverse of PermKey)
  const int base = p & ~31, r = p & 31;
  const int h = r >> 4, t = (r >> 2) & 3, i = r & 3;
  return base + 16 * h + 8 * (i >> 1) + 2 * t + (i & 1);
}
/// Bytes per Vᵀ row (one kv head, one head-dim index, all batch entries' slots).
ATTN_HD int64_t VtRowLen(bool varlen, int64_t batch, int64_t max_kv_len, int64_t total_kv) {
  return varlen ? RoundUp(total_kv, 16) + kVtVarlenGap * batch
                : batch * RoundUp(max_kv_len, kVtSlotAlign);
}

// ---- Modes of the 8-bit kernel (Traits::kMode) ------------------------------------------------
// Q·Kᵀ in E4M3 with per-tensor descales (Fp8AttentionRun), or in INT8 with per-token scales
// (Int8AttentionRun: mma.sync m16n8k32 s8, int32 accumulation); P·V in E4M3 (Vᵀ workspace, per-
// tensor V descale) or in the 16-bit input dtype (V read directly, mma.sync m16n8k16).
inline constexpr int kModeE4M3 = 0;        ///< e4m3 q·k + e4m3 p·v (the FP8 kernel)
inline constexpr int kModeInt8E4M3Pv = 1;  ///< int8 q·k + e4m3 p·v
inline constexpr int kModeInt8Bf16Pv = 2;  ///< int8 q·k + bf16 p·v (bf16 inputs)
inline constexpr int kModeInt8F16Pv = 3;   ///< int8 q·k + fp16 p·v (fp16 inputs)

/// Everything one launch reads, by value in the kernel's parameter space. Offsets are in bytes
/// for the e4m3 tensors (one byte per element) and elements for o; all 64-bit where they scale.
struct Fp8Params {
  const uint8_t* q = nullptr;   ///< (B,T,N,H) padded or (total_q,N,H) varlen, e4m3
  const uint8_t* k = nullptr;   ///< (B,S,K,H) padded or (total_kv,K,H) varlen, e4m3
  const uint8_t* v = nullptr;   ///< same layout as k: e4m3, read by the Vᵀ pre-pass only; or,
                                ///< 16-bit P·V modes, the bf16/fp16 V read by the kernel itself
  uint8_t* vt = nullptr;        ///< the Vᵀ workspace (layout above)
  void* o = nullptr;            ///< q's layout, out dtype
  float* lse = nullptr;         ///< (B,N,T) padded or (N,total_q) varlen; null: not written
  const float* q_descale = nullptr;  ///< device scalars: real = e4m3 value × descale
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;  ///< e4m3 P·V modes only
  const float* q_scale = nullptr;  ///< INT8 modes: (q_rows, N) per-token scales (real ≈ q8·scale)
  const float* k_scale = nullptr;  ///< INT8 modes: (kv_rows, K) per-token scales
  const int32_t* q_lengths = nullptr;   ///< padded only; null: T
  const int32_t* kv_lengths = nullptr;  ///< padded only; null: S
  const int64_t* q_offsets = nullptr;   ///< varlen only: (B+1)
  const int64_t* kv_offsets = nullptr;  ///< varlen only: (B+1)
  int64_t q_row_stride = 0;   ///< N*H: elements between consecutive tokens of q/o
  int64_t kv_row_stride = 0;  ///< K*H
  int64_t total_q = 0;        ///< varlen: rows of q (lse row stride)
  int64_t vt_row_len = 0;     ///< VtRowLen
  int32_t batch = 0;          ///< B
  int32_t max_q_len = 0;      ///< T (padded extent / varlen maximum)
  int32_t max_kv_len = 0;     ///< S
  int32_t num_heads = 0;      ///< N
  int32_t num_kv_heads = 0;   ///< K
  int32_t group_size = 1;     ///< N / K
  int32_t num_m_blocks = 0;   ///< ceil(T / BLOCK_M) == gridDim.x
  int32_t varlen = 0;         ///< 1: packed varlen layout
  int32_t out_bf16 = 1;       ///< o dtype: 1 bfloat16, 0 float16
  float scale = 0.f;          ///< softmax scale (> 0), applied to the dequantised logits
  MaskSpec mask;
};

/// P is quantised as e4m3(p · kPScale) with p = exp(logit − running max) ∈ [0, 1]: the largest
/// p of every row is exactly 1 and lands on 448, E4M3's largest finite value (as SageAttention2
/// does with its static P scale 448), so the full 3-bit mantissa covers p >= 2^-6 / 448 ≈ 3.5e-5
/// and only p < 2^-10 / 448 ≈ 2.2e-6 flushes to 0 (an unscaled P would lose everything below
/// 2^-10 ≈ 1e-3 and be subnormal below 2^-6 ≈ 0.016; 256 would be exact in binary but give up
/// 0.8 bit of range for nothing: the scale cancels, see the kernel). log2(448) is folded into the
/// exponent, and the row sums are taken in the same units, so the scale never needs undoing.
inline constexpr float kPScale = 448.f;
inline constexpr float kLog2PScale = 8.807354922057604f;  // log2(448)

using Fp8LaunchFn = cudaError_t (*)(const Fp8Params& params, dim3 grid, int smem_bytes,
                                    cudaStream_t stream);
using Fp8PrepareFn = cudaError_t (*)(int smem_bytes);
/// The Vᵀ pre-pass for one head dim (grid computed inside from params).
using Fp8TransposeFn = cudaError_t (*)(const Fp8Params& params, cudaStream_t stream);

template <int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t Fp8Launch(const Fp8Params& params, dim3 grid, int smem_bytes, cudaStream_t stream);
template <int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t Fp8Prepare(int smem_bytes);
template <int kHeadDim>
cudaError_t Fp8TransposeV(const Fp8Params& params, cudaStream_t stream);

/// Dynamic shared memory: Q tile (BM × H bytes) + 2 stages of (K tile BN × H, Vᵀ tile H × BN).
/// The epilogue reuses it to stage O (BM rows of 2·H + 16 bytes).
constexpr int Fp8SmemBytes(int head_dim, int block_m, int block_n) {
  return head_dim * (block_m + 4 * block_n);
}
constexpr int Fp8EpilogueBytes(int head_dim, int block_m) { return block_m * (2 * head_dim + 16); }
/// Dynamic shared memory of any mode: Q tile + 2 stages of (K tile, V tile, INT8: the tile's BN
/// key scales). The 16-bit P·V modes' V tile is BN rows of 2·H bytes. Mode 0 is Fp8SmemBytes.
constexpr int EightBitSmemBytes(int mode, int head_dim, int block_m, int block_n) {
  return head_dim * block_m +
         2 * (block_n * head_dim * (mode >= kModeInt8Bf16Pv ? 3 : 2) +
              (mode != kModeE4M3 ? 4 * block_n : 0));
}

// ---- The explicit instantiation list -------------------------------------------------------
// X(head_dim, block_m, block_n, warps). The index of an entry among its head dim's entries is
// its variant number (Fp8AttentionPlanOptions::variant, "fp8/v<i>" in the benchmark); append new entries
// at the end. Warps own 16 rows (BM = 16·W: Q stays in registers) or 32 rows (BM = 32·W: Q is
// re-read from shared memory, every K/V fragment feeds twice the MMAs, more registers).
//   H=64:  v0 128x128/8w (16-row)  v1 128x64/4w (32-row, default)
//   H=128: v0 128x128/8w (16-row)  v1 128x64/8w (16-row, default)  v2 128x64/4w (32-row)
// Defaults and their measurement: fp8_attention.cc. Every entry fits an L4's 99 KB (checked
// below).
#define ATTN_FP8_VARIANTS_HD64(X) X(64, 128, 128, 8) X(64, 128, 64, 4)
#define ATTN_FP8_VARIANTS_HD128(X) X(128, 128, 128, 8) X(128, 128, 64, 8) X(128, 128, 64, 4)
#define ATTN_FP8_ALL_VARIANTS(X) ATTN_FP8_VARIANTS_HD64(X) ATTN_FP8_VARIANTS_HD128(X)

#define ATTN_FP8_CHECK_SMEM(H, BM, BN, W)                                                      \
  static_assert(Fp8SmemBytes(H, BM, BN) <= 101376, "fp8 variant exceeds the L4's 99 KB");      \
  static_assert(Fp8EpilogueBytes(H, BM) <= Fp8SmemBytes(H, BM, BN), "epilogue staging fits"); \
  static_assert(BN == 64 || BN == 128, "Vt slots are padded to 128 keys");
ATTN_FP8_ALL_VARIANTS(ATTN_FP8_CHECK_SMEM)
#undef ATTN_FP8_CHECK_SMEM

// INT8 Q·Kᵀ variants: X(pv16, head_dim, block_m, block_n, warps), pv16 = 0 for E4M3 P·V, 1 for
// 16-bit P·V (one kernel per input dtype). The index of an entry among those of its (pv16, head
// dim) is its variant number (Int8AttentionPlanOptions::variant); append new entries at the end.
//   e4m3 p·v,  H=64:  v0 128x64/8w (16-row warps, default)  v1 128x64/4w (32-row warps)
//   e4m3 p·v,  H=128: v0 128x64/8w (16-row, default)
//   16-bit p·v, H=64: v0 128x64/8w (16-row, default)        H=128: v0 128x64/8w (16-row)
// 16-bit P·V tiles at H=128 are 64 keys wide: 128 keys would need 115 KB (the L4 allows 99).
#define ATTN_INT8_VARIANTS_HD64(X) X(0, 64, 128, 64, 8) X(0, 64, 128, 64, 4) X(1, 64, 128, 64, 8)
#define ATTN_INT8_VARIANTS_HD128(X) X(0, 128, 128, 64, 8) X(1, 128, 128, 64, 8)
#define ATTN_INT8_ALL_VARIANTS(X) ATTN_INT8_VARIANTS_HD64(X) ATTN_INT8_VARIANTS_HD128(X)

#define ATTN_INT8_CHECK_SMEM(PV16, H, BM, BN, W)                                               \
  static_assert(EightBitSmemBytes(PV16 ? kModeInt8Bf16Pv : kModeInt8E4M3Pv, H, BM, BN) <=     \
                    101376,                                                                    \
                "int8 variant exceeds the L4's 99 KB");                                        \
  static_assert(Fp8EpilogueBytes(H, BM) <=                                                     \
                    EightBitSmemBytes(PV16 ? kModeInt8Bf16Pv : kModeInt8E4M3Pv, H, BM, BN),    \
                "epilogue staging fits");                                                      \
  static_assert(BN == 64 || BN == 128, "Vt slots are padded to 128 keys");
ATTN_INT8_ALL_VARIANTS(ATTN_INT8_CHECK_SMEM)
#undef ATTN_INT8_CHECK_SMEM

/// The INT8 Q·Kᵀ kernel of one variant; the 16-bit P·V variants pick the bf16 or fp16 kernel
/// from params.out_bf16 (the input dtype).
template <int kPv16, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t Int8Launch(const Fp8Params& params, dim3 grid, int smem_bytes, cudaStream_t stream);
template <int kPv16, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t Int8Prepare(int smem_bytes);

#define ATTN_INT8_EXTERN(PV16, H, BM, BN, W)                                                   \
  extern template cudaError_t Int8Launch<PV16, H, BM, BN, W>(const Fp8Params&, dim3, int,      \
                                                              cudaStream_t);                   \
  extern template cudaError_t Int8Prepare<PV16, H, BM, BN, W>(int);
ATTN_INT8_ALL_VARIANTS(ATTN_INT8_EXTERN)
#undef ATTN_INT8_EXTERN

#define ATTN_FP8_EXTERN(H, BM, BN, W)                                                          \
  extern template cudaError_t Fp8Launch<H, BM, BN, W>(const Fp8Params&, dim3, int,             \
                                                       cudaStream_t);                          \
  extern template cudaError_t Fp8Prepare<H, BM, BN, W>(int);
ATTN_FP8_ALL_VARIANTS(ATTN_FP8_EXTERN)
extern template cudaError_t Fp8TransposeV<64>(const Fp8Params&, cudaStream_t);
extern template cudaError_t Fp8TransposeV<128>(const Fp8Params&, cudaStream_t);

}  // namespace attn::kernels::fp8
