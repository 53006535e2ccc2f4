// The FP8 (E4M3) attention kernel: FlashAttention-2's algorithm on the sm_89+ e4m3 tensor-core
// MMA (mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32), plus the Vᵀ pre-pass.
//
// One block computes BLOCK_M query rows of one (batch entry, query head):
//   - Q (e4m3) tile -> shared memory (cp.async, zero-filled past T_b) -> registers (16-row warps)
//     or re-read per tile (32-row warps);
//   - K tiles (BLOCK_N keys × H) and Vᵀ tiles (H × BLOCK_N keys, from the pre-pass workspace,
//     fp8_params.h) stream through a two-stage cp.async ring, one barrier per tile;
//   - S = Q·Kᵀ with m16n8k32 e4m3 MMAs (fp32 accumulation); operands through ldmatrix (b16
//     view: an 8x8 b16 matrix is 8 rows × 16 e4m3 values, and the e4m3 A/B fragment layouts of
//     m16n8k32 are byte-for-byte those of bf16 m16n8k16), from the same XOR-swizzled tiles as
//     the fused kernel (fused::TileLayout of the equal row size in bytes);
//   - online softmax: running max and sums in fp32, exp2 domain, q_descale·k_descale·scale·
//     log2(e) in one separately rounded multiply, log2(kPScale) added to the exponent; the
//     exponentials P' = 448·exp(logit − max) ∈ [0, 448] in f16x2 (two per MUFU op, see the tile
//     body);
//   - P' -> e4m3 (cvt.rn.satfinite.e4m3x2.f16x2) directly in the S accumulator layout: the
//     key permutation of the Vᵀ workspace makes that layout the m16n8k32 A layout;
//   - O += P'·Vᵀ with m16n8k32 e4m3 MMAs; O = acc · v_descale / Σ P' (the 448 cancels, Σ P'
//     taken over the fp32 P'); lse = max·scale' + ln(Σ P') − ln 448;
//   - O is staged through shared memory and written in the output dtype with 16-byte stores.
// Rows past T_b and rows that see no key are written as zeros with lse = −inf (the fused
// kernel's convention).
//
// INT8 Q·Kᵀ modes (Traits::kMode, fp8_params.h; host API attn/kernels/int8_attention.h): Q and K
// are per-token INT8 (attn/kernels/int8_prepass.h) and S = Q·Kᵀ runs on
// mma.sync.m16n8k32.row.col.s32.s8.s8.s32, whose A/B fragment layouts are byte for byte those of
// the e4m3 m16n8k32 (same tiles, ldmatrix addressing and swizzle). The int32 accumulators (exact:
// |acc| <= 127²·H < 2^24, so the conversion to fp32 is exact too) are dequantised per element
// with the key's scale, s_ij = float(acc_ij)·k_scale[j] (the tile's BN key scales ride the K
// tile's cp.async group into shared memory), and the row's q_scale[i]·scale·log2(e) becomes that
// row's exponent factor: the running max is taken over s_ij (the logits up to the row's positive
// factor, so the same argmax), exponents are (s·f_i, rounded) − (max·f_i, rounded) as above.
// P·V is then either the E4M3 path above (Vᵀ workspace, per-tensor V descale) or, in the 16-bit
// modes, the fused kernel's: V tiles of BN rows × H bf16/fp16 read from the input, P in the
// input dtype (fp32 exponentials, as fused), mma.sync m16n8k16 with ldmatrix.trans for V, and the
// fused kernel's guard against non-finite V at masked keys (masked_values.cuh). No per-tensor
// scale touches a row there: its output depends only on the keys it sees.
// P·V accumulates in fp32 across all tiles in the MMA's own accumulator registers (the
// tensor-core adds are fp32, unlike Hopper FP8 wgmma's reduced-precision accumulation that makes
// FlashAttention-3/SageAttention2 flush to a second fp32 level every few blocks), rescaled by
// exp2(old max − new max) <= 1 only when a row's max moves: one level is enough at any S.
// Included only by kernels/fp8/fp8_launch.cuh (the launch wrappers and the Vᵀ pre-pass).
#pragma once

#include <cuda_fp8.h>

#include "../fused/fused_kernel.cuh"  // PTX wrappers, TileLayout, LoadTile, Exp2
#include "fp8_mma.cuh"
#include "fp8_params.h"

namespace attn::kernels::fp8 {

using fused::CpAsync16;
using fused::CpAsyncCommit;
using fused::CpAsyncWait;
using fused::Exp2;
using fused::LdMatrixX4;
using fused::SmemAddr;

/// A tile layout plus a thread count, the two things fused::LoadTile reads from its traits.
template <int kRowBytes, int kThreads_>
struct TileOf {
  using Layout = fused::TileLayout<kRowBytes / 2>;  // TileLayout counts 2-byte elements
  static constexpr int kThreads = kThreads_;
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kMode_ = kModeE4M3>
struct Traits {
  static constexpr int kMode = kMode_;
  static constexpr bool kInt8Qk = kMode != kModeE4M3;
  static constexpr bool kPv16 = kMode == kModeInt8Bf16Pv || kMode == kModeInt8F16Pv;
  static constexpr int kPvDType =
      static_cast<int>(kMode == kModeInt8F16Pv ? DType::kFloat16 : DType::kBFloat16);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMT = kWarpRows / 16;  // m16 tiles per warp
  static constexpr bool kQInRegs = kMT == 1;
  static constexpr int kKSteps = kHeadDim / 32;  // k32 steps of Q·Kᵀ
  static constexpr int kPSteps = kBlockN / 32;   // k32 steps of P·V
  static constexpr int kNT = kBlockN / 8;        // n8 tiles of S
  static constexpr int kDT = kHeadDim / 8;       // n8 tiles of O
  using QK = TileOf<kHeadDim, kThreads>;  // Q and K tiles: rows of H bytes
  // V tiles: Vᵀ (H rows of BLOCK_N e4m3 bytes) or, 16-bit P·V, BLOCK_N rows of H 16-bit values.
  using VT = std::conditional_t<kPv16, TileOf<2 * kHeadDim, kThreads>, TileOf<kBlockN, kThreads>>;
  static constexpr int kQBytes = kBlockM * kHeadDim;
  static constexpr int kKBytes = kBlockN * kHeadDim;  // one K stage
  static constexpr int kVBytes = kBlockN * kHeadDim * (kPv16 ? 2 : 1);  // one V stage
  static constexpr int kKsBytes = kInt8Qk ? 4 * kBlockN : 0;  // one stage of key scales
  static constexpr int kSmemBytes = kQBytes + 2 * (kKBytes + kVBytes + kKsBytes);
  static_assert(kSmemBytes == EightBitSmemBytes(kMode, kHeadDim, kBlockM, kBlockN),
                "smem mismatch");
  static_assert(kMode != kModeE4M3 || kSmemBytes == Fp8SmemBytes(kHeadDim, kBlockM, kBlockN),
                "smem mismatch");
  /// What fused::BlockTileHasNonFinite / FlagAndZeroNonFinite read of a 16-bit V tile.
  struct MaskedV {
    using Layout = fused::TileLayout<kHeadDim>;
    static constexpr int kDType = kPvDType;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kThreads = kWarps_ * 32;
  };
  static_assert(kWarpRows == 16 || kWarpRows == 32, "warps own 16 or 32 rows");
  static_assert(kHeadDim % 64 == 0 && kBlockN % 64 == 0, "tile shapes");
  static constexpr int kMinBlocks = kThreads <= 128 ? 2 : 1;
  static constexpr int kORowBytes = 2 * kHeadDim + 16;  // epilogue staging row (padded)
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    Fp8AttentionKernel(const __grid_constant__ Fp8Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  using LQK = typename Tr::QK::Layout;
  using LVT = typename Tr::VT::Layout;
  constexpr int kBM = Tr::kBlockM;
  constexpr int kBN = Tr::kBlockN;
  constexpr int kMT = Tr::kMT;
  constexpr int kNT = Tr::kNT;
  constexpr int kDT = Tr::kDT;
  constexpr int kKSteps = Tr::kKSteps;
  constexpr float kNegInf = -__builtin_huge_valf();

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = SmemAddr(smem);
  const uint32_t s_k0 = s_q + Tr::kQBytes;
  const uint32_t s_v0 = s_k0 + 2 * Tr::kKBytes;
  const uint32_t s_ks0 = s_v0 + 2 * Tr::kVBytes;  // INT8: key scales, 2 stages

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int tig = lane & 3;

  const int m_block = p.num_m_blocks - 1 - static_cast<int>(blockIdx.x);  // heavy tiles first
  const int head = blockIdx.y;
  const int b = blockIdx.z;
  const int kv_head = head / p.group_size;

  int64_t q_row0, kv_row0, vt_slot;
  int q_len, kv_len;
  if (p.varlen) {
    const int64_t qo = p.q_offsets[b], qe = p.q_offsets[b + 1];
    const int64_t ko = p.kv_offsets[b], ke = p.kv_offsets[b + 1];
    q_row0 = qo;
    kv_row0 = ko;
    q_len = static_cast<int>(qe - qo);
    kv_len = static_cast<int>(ke - ko);
    vt_slot = RoundUp(ko, 16) + static_cast<int64_t>(kVtVarlenGap) * b;
  } else {
    q_row0 = static_cast<int64_t>(b) * p.max_q_len;
    kv_row0 = static_cast<int64_t>(b) * p.max_kv_len;
    q_len = p.q_lengths ? min(max(p.q_lengths[b], 0), p.max_q_len) : p.max_q_len;
    kv_len = p.kv_lengths ? min(max(p.kv_lengths[b], 0), p.max_kv_len) : p.max_kv_len;
    vt_slot = static_cast<int64_t>(b) * RoundUp(p.max_kv_len, kVtSlotAlign);
  }
  const int m0 = m_block * kBM;
  const int store_rows = min(kBM, (p.varlen ? q_len : p.max_q_len) - m0);
  if (store_rows <= 0) return;

  const fused::BlockTiles tiles = fused::BlockKeyTiles(p.mask, m0, kBM, kBN, q_len, kv_len);
  const int n_begin = tiles.n_begin, n_end = tiles.n_end;

  const int warp_row0 = warp * Tr::kWarpRows;
  // Each row's exponent factor f: logit · log2(e) = s · f. E4M3: s = the e4m3 dot product,
  // f = scale · q_descale · k_descale · log2(e) for every row. INT8: s = float(acc) · k_scale[j],
  // f = q_scale[i] · (scale · log2(e)), each product rounded alone (0 for rows past T_b).
  float qk_descale = 1.f;
  float row_fac[kMT][2];
  if constexpr (Tr::kInt8Qk) {
    const float base = __fmul_rn(p.scale, 1.4426950408889634f);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int qi = m0 + warp_row0 + mt * 16 + g + 8 * r;
        const float qs = qi < q_len ? p.q_scale[(q_row0 + qi) * p.num_heads + head] : 0.f;
        row_fac[mt][r] = __fmul_rn(qs, base);
      }
  } else {
    qk_descale = *p.q_descale * *p.k_descale;
    const float scale_log2 = p.scale * qk_descale * 1.4426950408889634f;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) row_fac[mt][0] = row_fac[mt][1] = scale_log2;
  }
  float acc[kMT][kDT][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = kNegInf;
      row_sum[mt][r] = 0.f;
    }
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.f;
  }

  // fused::LoadTile addresses in 2-byte units: all byte strides here are even (H % 64 == 0,
  // row_len % 16 == 0) and every tile start is 16-byte aligned.
  const uint16_t* q_base = reinterpret_cast<const uint16_t*>(
      p.q + (q_row0 + m0) * p.q_row_stride + static_cast<int64_t>(head) * Tr::kHeadDim);
  const int64_t k_off = kv_row0 * p.kv_row_stride + static_cast<int64_t>(kv_head) * Tr::kHeadDim;
  const int64_t vt_off = static_cast<int64_t>(kv_head) * Tr::kHeadDim * p.vt_row_len + vt_slot;
  auto k_tile = [&](int n0) {
    return reinterpret_cast<const uint16_t*>(p.k + k_off + n0 * p.kv_row_stride);
  };
  auto vt_tile = [&](int n0) { return reinterpret_cast<const uint16_t*>(p.vt + vt_off + n0); };
  const int64_t k_stride2 = p.kv_row_stride / 2;
  const int64_t vt_stride2 = p.vt_row_len / 2;
  // The V tile of keys [n0, n0 + BN): Vᵀ (H rows, all inside the slot: keys past S_b are zeros
  // there) or 16-bit V rows (zero-filled past S_b; element strides, 2-byte units).
  auto load_v = [&](uint32_t s_v, int n0) {
    if constexpr (Tr::kPv16) {
      const uint16_t* v16 = reinterpret_cast<const uint16_t*>(p.v) + kv_row0 * p.kv_row_stride +
                            static_cast<int64_t>(kv_head) * Tr::kHeadDim + n0 * p.kv_row_stride;
      fused::LoadTile<typename Tr::VT, kBN>(s_v, v16, p.kv_row_stride, kv_len - n0, tid);
    } else {
      fused::LoadTile<typename Tr::VT, Tr::kHeadDim>(s_v, vt_tile(n0), vt_stride2, Tr::kHeadDim,
                                                      tid);
    }
  };
  // INT8: the tile's key scales, one 4-byte copy per key (zeros past S_b).
  auto load_ks = [&](uint32_t s_ks, int n0) {
    if constexpr (Tr::kInt8Qk) {
      if (tid < kBN) {
        const bool pred = tid < kv_len - n0;
        const float* src =
            p.k_scale + (pred ? (kv_row0 + n0 + tid) * p.num_kv_heads + kv_head : 0);
        CpAsync4(s_ks + tid * 4, src, pred);
      }
    }
  };

  if (n_begin < n_end) {
    fused::LoadTile<typename Tr::QK, kBM>(s_q, q_base, p.q_row_stride / 2, q_len - m0, tid);
    CpAsyncCommit();
    {
      const int n0 = (n_end - 1) * kBN;
      fused::LoadTile<typename Tr::QK, kBN>(s_k0, k_tile(n0), k_stride2, kv_len - n0, tid);
      load_v(s_v0, n0);
      load_ks(s_ks0, n0);
      CpAsyncCommit();
    }

    // ldmatrix lane addressing (as the fused kernel's, in 16-byte chunks):
    //   A (Q, 16 rows x k32 at rows R, chunk pair c2): row R + (lane & 15), chunk 2c2 + (lane>>4)
    //   B (K rows / Vᵀ rows, two n8 tiles x k32):       row N + (lane & 7) + ((lane >> 4) << 3),
    //                                                   chunk 2c2 + ((lane >> 3) & 1)
    const typename LQK::Lane q_lane = LQK::MakeLane(warp_row0 + (lane & 15), lane >> 4);
    const typename LQK::Lane k_lane =
        LQK::MakeLane((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    //   B (16-bit V, trans, k16 x two n8 tiles): row K + (lane & 7) + (((lane >> 3) & 1) << 3),
    //                                            chunk 2c2 + (lane >> 4)   (the fused kernel's)
    const typename LVT::Lane v_lane =
        Tr::kPv16 ? LVT::MakeLane((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4)
                  : LVT::MakeLane((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

    uint32_t q_frag[Tr::kQInRegs ? kKSteps : 1][4];
    if constexpr (Tr::kQInRegs) {
      CpAsyncWait<1>();
      __syncthreads();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        LdMatrixX4(LQK::At(s_q, q_lane, ks, 0), q_frag[ks][0], q_frag[ks][1], q_frag[ks][2],
                   q_frag[ks][3]);
    }

    auto tile = [&](const uint32_t s_k, const uint32_t s_v, const uint32_t s_ks, const int n0,
                    auto masked) {
      uint32_t s_qt = s_q;
      asm volatile("" : "+r"(s_qt));
      if constexpr (Tr::kPv16 && decltype(masked)::value) {
        // 16-bit V of masked keys may hold ±Inf/NaN (masked_values.cuh): rare path only.
        using MV = typename Tr::MaskedV;
        if (fused::BlockTileHasNonFinite<MV>(s_v, tid)) {
          uint32_t key_bad[kBN / 32];
          fused::FlagAndZeroNonFinite<MV>(s_v, tid, key_bad);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const KeyRange kr =
                  BandKeyRange(p.mask, m0 + warp_row0 + mt * 16 + g + 8 * r, q_len, kv_len);
              if (!kr.empty() &&
                  fused::RangeHasFlaggedKey<kBN>(key_bad, static_cast<int>(kr.lo) - n0,
                                                 static_cast<int>(kr.hi) - n0)) {
#pragma unroll
                for (int dt = 0; dt < kDT; ++dt) {
                  acc[mt][dt][2 * r] = __int_as_float(0x7fffffff);
                  acc[mt][dt][2 * r + 1] = __int_as_float(0x7fffffff);
                }
              }
            }
        }
      }
      float s[kMT][kNT][4];
      // INT8: int32 accumulators, dequantised below; E4M3: fp32 accumulators in s directly.
      [[maybe_unused]] int32_t si[Tr::kInt8Qk ? kMT : 1][Tr::kInt8Qk ? kNT : 1][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if constexpr (Tr::kInt8Qk) {
              si[mt][nt][e] = 0;
            } else {
              s[mt][nt][e] = 0.f;
            }
          }
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (Tr::kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[ks][e];
          } else {
            LdMatrixX4(LQK::At(s_qt, q_lane, ks, mt * 16), a[mt][0], a[mt][1], a[mt][2],
                       a[mt][3]);
          }
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b0, b1, b2, b3;
          LdMatrixX4(LQK::At(s_k, k_lane, ks, np * 16), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            if constexpr (Tr::kInt8Qk) {
              MmaS8(si[mt][2 * np], a[mt], b0, b1);
              MmaS8(si[mt][2 * np + 1], a[mt], b2, b3);
            } else {
              MmaE4M3(s[mt][2 * np], a[mt], b0, b1);
              MmaE4M3(s[mt][2 * np + 1], a[mt], b2, b3);
            }
          }
        }
      }
      if constexpr (Tr::kInt8Qk) {
        // s_ij = float(acc_ij) · k_scale[j]: keys 2t, 2t+1 of each n8 tile (one 8-byte load).
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const float2 kscale = LdShared2(s_ks + (nt * 8 + 2 * tig) * 4);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mt][nt][e] = __fmul_rn(__int2float_rn(si[mt][nt][e]), (e & 1) ? kscale.y : kscale.x);
        }
      }

      if constexpr (decltype(masked)::value) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const KeyRange kr =
                BandKeyRange(p.mask, m0 + warp_row0 + mt * 16 + g + 8 * r, q_len, kv_len);
            const int lo = static_cast<int>(kr.lo) - n0;
            const int hi = static_cast<int>(kr.hi) - n0;
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int j = nt * 8 + 2 * tig + e;
                if (j < lo || j > hi) s[mt][nt][2 * r + e] = kNegInf;
              }
          }
      }

      // Online softmax (as the fused kernel's), P' = 448 · exp2(s·scale_log2 − m). The exponent
      // is formed in fp32 (a separately rounded product, then two adds), then P' is computed
      // in f16x2: ex2.approx.f16x2 does two exponentials per MUFU operation (the MUFU, not the
      // tensor cores, bounds an FP8 kernel: 1 exp per 2·2·H MMA FLOPs), and 10 mantissa bits are
      // far more than the 3 that P keeps in E4M3 (the exponent's fp16 rounding, ≤ 2^-8 for
      // |x| < 16, moves P' by ≤ 0.3 %; x → -inf, masked keys, gives 0). Row sums: f16x2 per
      // thread and tile (≤ 16 values of ≤ 448 per half: ≤ 7168, exact to 2^-8 relative), then
      // fp32 across tiles.
      float alpha[kMT][2];
      // P' as f16x2 (E4M3 P·V only): [.][nt][r] = keys 2t, 2t+1 of tile nt, row r.
      [[maybe_unused]] uint32_t ph[kMT][Tr::kPv16 ? 1 : kNT][2];
      bool rescale = false;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = row_max[mt][r];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
            mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // Separately rounded products (__fmul_rn is never contracted): every exponent is
          // <= log2(448) and exactly that at the max, whatever the logits' magnitude (as in
          // the fused kernel; a contracted fma overflows for logits ~1e12).
          const float fac = row_fac[mt][r];
          float m_use = __fmul_rn(mx, fac);
          if constexpr (decltype(masked)::value) m_use = mx == kNegInf ? 0.f : m_use;
          alpha[mt][r] = Exp2(__fmul_rn(row_max[mt][r], fac) - m_use);
          rescale |= alpha[mt][r] != 1.f;
          row_max[mt][r] = mx;
          if constexpr (Tr::kPv16) {
            // 16-bit P·V: P = exp2(s·f − m) ∈ [0, 1] in fp32 (one MUFU op each, as the fused
            // kernel: P keeps the input dtype's 8/11 bits), sums over the fp32 P.
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              const float p0 = Exp2(__fmul_rn(s[mt][nt][2 * r], fac) - m_use);
              const float p1 = Exp2(__fmul_rn(s[mt][nt][2 * r + 1], fac) - m_use);
              s[mt][nt][2 * r] = p0;
              s[mt][nt][2 * r + 1] = p1;
              sum += p0 + p1;
            }
            row_sum[mt][r] = row_sum[mt][r] * alpha[mt][r] + sum;
          } else {
            uint32_t hsum = 0u;
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              const uint32_t x =
                  F32x2ToF16x2((__fmul_rn(s[mt][nt][2 * r], fac) - m_use) + kLog2PScale,
                               (__fmul_rn(s[mt][nt][2 * r + 1], fac) - m_use) + kLog2PScale);
              ph[mt][nt][r] = Exp2F16x2(x);
              hsum = AddF16x2(hsum, ph[mt][nt][r]);
            }
            __half2 h2 = *reinterpret_cast<__half2*>(&hsum);
            row_sum[mt][r] =
                row_sum[mt][r] * alpha[mt][r] + (__low2float(h2) + __high2float(h2));
          }
        }
      }
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][dt][e] *= alpha[mt][e >> 1];
      }

      // O += P'·Vᵀ, one k32 step (32 keys = n8 tiles 4j..4j+3) at a time. The A fragment is
      // the accumulator layout in place (see the Vᵀ key permutation in fp8_params.h):
      //   a0 = row g:   keys 2t, 2t+1 (tile 4j), 8+2t, 9+2t (tile 4j+1)  -> k = 4t..4t+3
      //   a1 = row g+8: the same keys;  a2/a3: tiles 4j+2, 4j+3          -> k = 16+4t..
      if constexpr (Tr::kPv16) {
        // O += P·V as the fused kernel: k16 step j covers n8 tiles 2j, 2j+1 (keys 16j..16j+15),
        // P packed into the m16n8k16 A layout, V through ldmatrix.trans.
        using E = fused::ElemOf<Tr::kPvDType>;
#pragma unroll
        for (int j = 0; j < kNT / 2; ++j) {
          uint32_t pf[kMT][4];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            pf[mt][0] = E::Pack(s[mt][2 * j][0], s[mt][2 * j][1]);
            pf[mt][1] = E::Pack(s[mt][2 * j][2], s[mt][2 * j][3]);
            pf[mt][2] = E::Pack(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
            pf[mt][3] = E::Pack(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
          }
#pragma unroll
          for (int dp = 0; dp < kDT / 2; ++dp) {
            uint32_t b0, b1, b2, b3;
            fused::LdMatrixX4Trans(LVT::At(s_v, v_lane, dp, j * 16), b0, b1, b2, b3);
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              fused::Mma16816<Tr::kPvDType>(acc[mt][2 * dp], pf[mt], b0, b1);
              fused::Mma16816<Tr::kPvDType>(acc[mt][2 * dp + 1], pf[mt], b2, b3);
            }
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < Tr::kPSteps; ++j) {
          uint32_t pa[kMT][4];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            pa[mt][0] = F16x2PairToE4M3x4(ph[mt][4 * j][0], ph[mt][4 * j + 1][0]);
            pa[mt][1] = F16x2PairToE4M3x4(ph[mt][4 * j][1], ph[mt][4 * j + 1][1]);
            pa[mt][2] = F16x2PairToE4M3x4(ph[mt][4 * j + 2][0], ph[mt][4 * j + 3][0]);
            pa[mt][3] = F16x2PairToE4M3x4(ph[mt][4 * j + 2][1], ph[mt][4 * j + 3][1]);
          }
#pragma unroll
          for (int dp = 0; dp < kDT / 2; ++dp) {
            uint32_t b0, b1, b2, b3;
            LdMatrixX4(LVT::At(s_v, v_lane, j, dp * 16), b0, b1, b2, b3);
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              MmaE4M3(acc[mt][2 * dp], pa[mt], b0, b1);
              MmaE4M3(acc[mt][2 * dp + 1], pa[mt], b2, b3);
            }
          }
        }
      }
    };

    const int num_tiles = n_end - n_begin;
    for (int it = 0; it < num_tiles; ++it) {
      const int n0 = (n_end - 1 - it) * kBN;
      const int stage = it & 1;
      CpAsyncWait<0>();
      __syncthreads();
      if (it + 1 < num_tiles) {
        const int nn0 = n0 - kBN;
        const uint32_t off = (stage ^ 1) * Tr::kKBytes;
        fused::LoadTile<typename Tr::QK, kBN>(s_k0 + off, k_tile(nn0), k_stride2, kv_len - nn0,
                                              tid);
        load_v(s_v0 + (stage ^ 1) * Tr::kVBytes, nn0);
        load_ks(s_ks0 + (stage ^ 1) * Tr::kKsBytes, nn0);
      }
      CpAsyncCommit();
      const uint32_t s_k = s_k0 + stage * Tr::kKBytes;
      const uint32_t s_v = s_v0 + stage * Tr::kVBytes;
      const uint32_t s_ks = s_ks0 + stage * Tr::kKsBytes;
      if (tiles.Interior(n_end - 1 - it, kBN)) {
        tile(s_k, s_v, s_ks, n0, std::false_type{});
      } else {
        tile(s_k, s_v, s_ks, n0, std::true_type{});
      }
    }
  }

  // Epilogue: every warp is done with shared memory after this barrier (blocks that visited no
  // tile reach it too: the condition above is block-uniform). Rows are staged with a 16-byte
  // pad (conflict-free 4-byte writes), then written with 16-byte stores.
  __syncthreads();
  // 16-bit P·V: no V descale and no P scale (P ∈ [0, 1]).
  const float v_descale = Tr::kPv16 ? 1.f : *p.v_descale;
  constexpr float kLnPScale = Tr::kPv16 ? 0.f : 6.104793232414985f;  // ln(448)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = warp_row0 + mt * 16 + g + 8 * r;
      const bool valid = m0 + row < q_len && l != 0.f;  // NaN l propagates (as fused)
      const float mul = valid ? v_descale / l : 0.f;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        const float x0 = acc[mt][dt][2 * r] * mul, x1 = acc[mt][dt][2 * r + 1] * mul;
        uint32_t packed = 0u;
        if (valid) {
          if (p.out_bf16) {
            __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
            packed = *reinterpret_cast<uint32_t*>(&h);
          } else {
            __half2 h = __floats2half2_rn(x0, x1);
            packed = *reinterpret_cast<uint32_t*>(&h);
          }
        }
        const uint32_t addr = s_q + row * Tr::kORowBytes + dt * 16 + tig * 4;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(packed) : "memory");
      }
      if (p.lse != nullptr && tig == 0 && row < store_rows) {
        const int64_t qi = m0 + row;
        // The raw logit per unit of the running max: scale · q_descale · k_descale (E4M3) or
        // scale · q_scale[i] (INT8: the max is over float(acc) · k_scale).
        float logit_scale = p.scale * qk_descale;
        if constexpr (Tr::kInt8Qk) {
          logit_scale = valid ? __fmul_rn(p.scale, p.q_scale[(q_row0 + qi) * p.num_heads + head])
                              : 0.f;
        }
        const float lse =
            valid ? row_max[mt][r] * logit_scale + __logf(l) - kLnPScale : kNegInf;
        const int64_t idx = p.varlen ? static_cast<int64_t>(head) * p.total_q + q_row0 + qi
                                     : (static_cast<int64_t>(b) * p.num_heads + head) *
                                               p.max_q_len + qi;
        p.lse[idx] = lse;
      }
    }
  }
  __syncwarp();
  constexpr int kChunks = Tr::kHeadDim * 2 / 16;  // 16-byte chunks per output row
  constexpr int kWarpChunks = Tr::kWarpRows * kChunks;
  uint16_t* o_base = static_cast<uint16_t*>(p.o) + (q_row0 + m0) * p.q_row_stride +
                     static_cast<int64_t>(head) * Tr::kHeadDim;
#pragma unroll
  for (int it = 0; it < kWarpChunks / 32; ++it) {
    const int idx = lane + it * 32;
    const int row = warp_row0 + idx / kChunks;
    const int chunk = idx % kChunks;
    if (row < store_rows) {
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(s_q + row * Tr::kORowBytes + chunk * 16));
      *reinterpret_cast<uint4*>(o_base + row * p.q_row_stride + chunk * 8) = v;
    }
  }
#endif  // __CUDA_ARCH__ >= 890
}

}  // namespace attn::kernels::fp8
