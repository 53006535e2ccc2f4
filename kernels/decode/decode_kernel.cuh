// The split-KV decode kernel (flash-decoding over a paged or contiguous KV cache), which also
// merges its partitions (decode_merge.cuh) and can store a folded append's new rows
// (decode_fold.cuh). Semantics and API: attn/kernels/paged_decode.h.
//
// One block (4 warps) = one (sequence b, kv head h, KV partition p, chunk of 16 query rows).
// Row r of the chunk is the pair (query token t, group head gq) with mc*16 + r = t*G + gq, so
// the G query heads that share kv head h (and the T_b query tokens) form the M = 16 rows of
// the m16n8k16 MMAs and every K/V byte is read from memory once per block.
//
//   - K/V tiles of 64 tokens stream through a cp.async ring of kStages stages (16-byte copies;
//     rows >= S_b are zero-filled by copies that read nothing, their source addresses kept
//     inside the pool / tensor all the same). Each thread copies one 16-byte column chunk
//     of kRowsPerThread CONSECUTIVE tile rows, so with pages of >= kRowsPerThread tokens its
//     rows are consecutive slots of one page: one block-table entry per thread per tile, row i
//     at a constant byte offset from row 0. That entry is loaded one tile ahead of its use (and
//     its 128-byte line prefetched into L2 kBtPrefetchTiles ahead), so page lookups never stall
//     the loop. Smaller pages look every row up at issue time; contiguous K/V rows are a
//     runtime stride apart.
//   - Warp w owns keys 16w..16w+15 of every tile: S = Q·Kᵀ (16 x 16), online softmax in the
//     exp2 domain with its own running max/sum, O += P·V (16 x H), fp32 accumulators. O is
//     rescaled only when some row of the warp raised its max in this tile (otherwise the
//     factor is exactly 1).
//   - 16-bit pages: K and V fragments come from ldmatrix (.trans for V) on XOR-swizzled tiles.
//     FP8 pages: plain 16-byte shared loads, converted in registers to fp16 pairs with the
//     hardware cvt.rn.f16x2.e4m3x2 (sm_89+; one instruction per two bytes, exact: every e4m3
//     value is an fp16). The Q·Kᵀ reduction dimension and the P·V output dimension are
//     permuted per thread so that each thread's K/V bytes are contiguous (the permutation is
//     applied to Q and undone when O is stored); V bytes of two keys are paired with byte
//     permutes. The K scale is folded into the logit scale, the V scale into the output.
//     Queries (bf16 or fp16) are converted to fp16 once (bf16 beyond ±65504 is clamped), so
//     the FP8 MMAs run in fp16 with fp32 accumulation for both query dtypes.
//   - Epilogue: the 4 warps' (max, sum, O) are combined through shared memory; the block
//     writes O (dtype) and lse directly when its sequence has one partition, otherwise the
//     normalised partial O (fp32) and its lse into the workspace; the last partition block of
//     the chunk to finish merges them (decode_merge.cuh).
// Masking: key j is visible to row (t, gq) iff j <= t + S_b - T_b (bottom-right causal; also
// bounds j < S_b). Only tiles reaching past the first row's diagonal are masked per element;
// in those each warp also checks its 16 V rows for ±Inf/NaN (NaN for FP8 pages) and keeps them
// away from rows that cannot see them (common/nonfinite.cuh); a row that sees one outputs NaN.
// Exponents are formed with separately rounded products (finite at any logit magnitude).
// Rows that see no key: zeros and lse = -inf (never NaN: the running max is replaced by 0
// while a row has seen nothing, and fully masked rows keep sum 0).
// Included only by kernels/decode/decode_hd<H>.cu, which instantiate it explicitly.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decode_fold.cuh"
#include "decode_merge.cuh"
#include "decode_params.h"
#include "decode_ptx.cuh"

namespace attn::kernels::decode {

// ---- Kernel traits -----------------------------------------------------------------------------
template <int kDType_, int kKvDType_, int kHeadDim_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kFp8 = kKvDType_ == static_cast<int>(DType::kFloat8E4M3);
  static constexpr bool kInBf16 = kDType_ == static_cast<int>(DType::kBFloat16);
  /// The MMAs run in bf16 only for bf16 pages; FP8 pages are dequantised to fp16.
  static constexpr bool kMmaBf16 = kInBf16 && !kFp8;
  static constexpr int kKvBytes = kFp8 ? 1 : 2;
  static constexpr int kRowBytes = kHeadDim * kKvBytes;  // one token of one head
  static constexpr int kRowChunks = kRowBytes / 16;
  static constexpr int kTileBytes = DecodeTileBytes(kHeadDim, kKvBytes);
  static constexpr int kStages = DecodeStages(kKvBytes);
  static constexpr int kSmemBytes = DecodeSmemBytes(kHeadDim, kKvBytes);
  static constexpr int kKSteps = kHeadDim / 16;  // k16 steps of Q·Kᵀ
  static constexpr int kDT = kHeadDim / 8;       // n8 tiles of O
  /// Loader: thread t copies chunk t % kRowChunks of tile rows (t / kRowChunks) ·
  /// kRowsPerThread + i, i < kRowsPerThread (consecutive rows).
  static constexpr int kLoadGroups = kThreads / kRowChunks;
  static constexpr int kRowsPerThread = kTileTokens / kLoadGroups;
  static constexpr int kRowsPerThreadLog2 =
      kRowsPerThread == 8 ? 3 : (kRowsPerThread == 4 ? 2 : (kRowsPerThread == 2 ? 1 : 0));
  static constexpr int kQRowBytes = kHeadDim * 2;
  static constexpr int kQChunks = kQRowBytes / 16;
  static constexpr int kRedStride = DecodeReduceStride(kHeadDim);
  // Blocks per SM the registers must allow (shared memory allows about this many).
  static constexpr int kMinBlocks = kSmemBytes >= 96 * 1024 ? 2 : (kSmemBytes >= 64 * 1024 ? 3 : 4);
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128");
  static_assert(kLoadGroups * kRowsPerThread == kTileTokens, "tile rows split evenly");
  static_assert((1 << kRowsPerThreadLog2) == kRowsPerThread, "a power of two up to 8");

  /// Byte offset of 16-byte chunk `chunk` of K/V tile row `row`.
  /// 16-bit: chunk ^ (row & 7) (the 8 rows of an ldmatrix 8x8 matrix hit 8 bank groups).
  /// FP8: the tile is a sequence of 128-byte lines; chunk slot l of line L moves to l ^ s(L),
  ///   chosen so that the per-thread 16-byte K reads (rows 2i, 2i+1 of a phase) and V reads
  ///   (rows 2t + e for t = 0..3) of one phase land in distinct bank groups.
  __device__ static __forceinline__ uint32_t TileOffset(int row, int chunk) {
    if constexpr (!kFp8) {
      return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
    } else {
      const int linear = row * kRowChunks + chunk;
      const int line = linear >> 3;
      int s;
      if constexpr (kRowChunks == 8) {
        s = (((line >> 1) & 3) << 1) ^ ((line & 1) << 2);
      } else {
        s = (line & 3) << 1;
      }
      return static_cast<uint32_t>((line << 7) | (((linear & 7) ^ s) << 4));
    }
  }
  /// Byte offset of chunk `chunk` of Q row `row` (16-bit, XOR-8 as above).
  __device__ static __forceinline__ uint32_t QOffset(int row, int chunk) {
    return static_cast<uint32_t>(row * kQRowBytes + ((chunk ^ (row & 7)) << 4));
  }
};

/// Tiles ahead of its use at which a block-table entry's 128-byte line is prefetched into L2
/// (the entry itself is loaded one tile ahead; this turns that load into an L2 hit).
inline constexpr int kBtPrefetchTiles = 8;

template <class Tr>
__global__ void __launch_bounds__(kThreads, Tr::kMinBlocks)
    DecodeKernel(const __grid_constant__ DecodeParams p) {
  constexpr bool kFp8 = Tr::kFp8;
  constexpr bool kMmaBf16 = Tr::kMmaBf16;
  constexpr bool kInBf16 = Tr::kInBf16;
  constexpr int H = Tr::kHeadDim;
  constexpr int kStages = Tr::kStages;
  constexpr float kNegInf = -__builtin_huge_valf();

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_base = SmemAddr(smem);
  auto stage_k = [&](int stage) { return s_base + stage * 2 * Tr::kTileBytes; };
  auto stage_v = [&](int stage) { return s_base + stage * 2 * Tr::kTileBytes + Tr::kTileBytes; };
  const uint32_t s_q = stage_k(kStages - 1);  // Q waits in the last stage until the loop

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;   // row within an 8-row group of an mma fragment
  const int tig = lane & 3;  // thread in group

  const int mc = static_cast<int>(blockIdx.x) % p.row_chunks;
  const int part = static_cast<int>(blockIdx.x) / p.row_chunks;
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const int G = p.group;

  const int64_t q_row0 = p.q_offsets[b];
  // Lengths are clamped to the plan's extents (larger ones are caller errors: never a wild write).
  const int q_len = static_cast<int>(min(p.q_offsets[b + 1] - q_row0, int64_t{p.max_q_len}));
  const int kv_len = min(max(p.kv_lengths[b], 0), p.max_kv_len);
  const int row_begin = mc * kRowsPerBlock;  // first (t, gq) pair of this block
  const int rows_valid = min(q_len * G - row_begin, kRowsPerBlock);
  if (rows_valid <= 0) return;  // no such query rows
  const int k0 = part * p.partition_tokens;
  // Partitions that hold keys of this sequence (at least one: a sequence without keys still
  // writes zeros and lse = -inf). With one, the block writes o directly.
  const int parts =
      p.partitions == 1
          ? 1
          : max(1, min(p.partitions, (kv_len + p.partition_tokens - 1) / p.partition_tokens));
  if (part >= parts) return;
  // Folded append (decode_fold.cuh): keys from new_start on are read from new_k / new_v.
  // FP8 pages never take one (PagedDecodeRun refuses it): compiled out there.
  const bool fold = !kFp8 && p.new_k != nullptr;
  const int new_start = fold ? max(kv_len - q_len, 0) : 0x7fffffff;

  // Keys this block visits: its partition, cut at the last valid row's diagonal.
  const int diag0 = kv_len - q_len;  // row (t, .) sees keys j <= t + diag0
  const int t_first = row_begin / G;
  const int t_last = (row_begin + rows_valid - 1) / G;
  const int k_end = min(min(kv_len, k0 + p.partition_tokens), t_last + diag0 + 1);
  const int num_tiles = k_end > k0 ? (k_end - k0 + kTileTokens - 1) / kTileTokens : 0;
  // Tiles starting past this key need the per-element mask.
  const int unmasked_end = t_first + diag0;  // keys <= this are visible to every row

  // This thread's two fragment rows (g and g + 8): the last key each may see.
  const int hi_row0 = (row_begin + g) / G + diag0;
  const int hi_row1 = (row_begin + g + 8) / G + diag0;

  float k_scale = 1.f, out_scale = 1.f;
  if constexpr (kFp8) {
    // The converted values are the stored ones × 1 / Fp8Unscale() (1 with the hardware cvt).
    k_scale = p.k_scales[static_cast<int64_t>(b) * p.num_kv_heads + kvh] * Fp8Unscale();
    out_scale = p.v_scales[static_cast<int64_t>(b) * p.num_kv_heads + kvh] * Fp8Unscale();
  }
  const float sl2 = p.scale_log2 * k_scale;  // raw logit -> exp2 units

  // ---- K/V tile addressing --------------------------------------------------------------------
  // Thread t copies 16-byte chunk ld_chunk of tile rows ld_row0 .. ld_row0 + R - 1 (consecutive
  // tokens) of K and of V.
  constexpr int R = Tr::kRowsPerThread;
  constexpr int64_t kRowBytes = Tr::kRowBytes;
  const int ld_chunk = tid % Tr::kRowChunks;
  const int ld_row0 = (tid / Tr::kRowChunks) * R;
  const unsigned char* kg = static_cast<const unsigned char*>(p.k) + ld_chunk * 16;
  const unsigned char* vg = static_cast<const unsigned char*>(p.v) + ld_chunk * 16;
  const unsigned char* nkg =
      p.new_k != nullptr ? static_cast<const unsigned char*>(p.new_k) + ld_chunk * 16 : kg;
  const unsigned char* nvg =
      p.new_v != nullptr ? static_cast<const unsigned char*>(p.new_v) + ld_chunk * 16 : vg;
  // Byte offset of new row j (>= new_start) in new_k / new_v.
  auto new_row = [&](int j) {
    return ((q_row0 + (j - new_start)) * p.num_kv_heads + kvh) * kRowBytes;
  };
  uint32_t ld_soff[R];  // shared-memory byte offsets of those rows' chunks within a tile
#pragma unroll
  for (int i = 0; i < R; ++i) ld_soff[i] = Tr::TileOffset(ld_row0 + i, ld_chunk);
  const bool paged = p.block_tables != nullptr;
  // Pages of >= R tokens: the thread's R rows of a tile are consecutive slots of one page
  // (ld_row0 and every tile start are multiples of R), so one block-table entry addresses them.
  const bool page_runs = paged && p.page_shift >= Tr::kRowsPerThreadLog2;
  const int32_t* bt = p.block_tables + (paged ? static_cast<int64_t>(b) * p.bt_stride : 0);
  const int page_mask = (1 << p.page_shift) - 1;
  auto first_row = [&](int tile) { return k0 + tile * kTileTokens + ld_row0; };
  // page_runs: the block-table entry of the thread's rows of `tile`; 0 (page 0, whose slots
  // the zero-filled copies below then address without reading) when they are all past k_end.
  auto page_of = [&](int tile) -> int32_t {
    const int j = first_row(tile);
    return j < k_end ? __ldg(bt + (j >> p.page_shift)) : 0;
  };
  // page_runs: copies the thread's rows of `tile`, which live in page `page`, into `stage`.
  auto issue_run = [&](int stage, int tile, int32_t page) {
    const int j = first_row(tile);
    const int valid = min(max(k_end - j, 0), R);  // rows before k_end
    const int64_t row0 =
        ((static_cast<int64_t>(page) * p.num_kv_heads + kvh) << p.page_shift | (j & page_mask)) *
        kRowBytes;
    const unsigned char* ks = kg + row0;
    const unsigned char* vs = vg + row0;
    if (!fold || j + R <= new_start) {  // always, without a folded append
#pragma unroll
      for (int i = 0; i < R; ++i) {
        CpAsync16(stage_k(stage) + ld_soff[i], ks + i * kRowBytes, i < valid);
        CpAsync16(stage_v(stage) + ld_soff[i], vs + i * kRowBytes, i < valid);
      }
    } else {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const bool nw = i < valid && j + i >= new_start;
        const int64_t n_off = nw ? new_row(j + i) : 0;
        CpAsync16(stage_k(stage) + ld_soff[i], nw ? nkg + n_off : ks + i * kRowBytes, i < valid);
        CpAsync16(stage_v(stage) + ld_soff[i], nw ? nvg + n_off : vs + i * kRowBytes, i < valid);
      }
    }
  };
  // Contiguous K/V: the thread's rows are a runtime stride (K·H elements) apart. Rows past
  // k_end are zero-filled; their copies address row max(k_end - 1, 0), which exists.
  auto issue_strided = [&](int stage, int tile) {
    const int j = first_row(tile);
    const int valid = min(max(k_end - j, 0), R);
    const int64_t stride = static_cast<int64_t>(p.num_kv_heads) * kRowBytes;
    const int64_t row = static_cast<int64_t>(b) * p.capacity + min(j, max(k_end - 1, 0));
    const int64_t row0 = (row * p.num_kv_heads + kvh) * kRowBytes;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t off = row0 + (i < valid ? i : 0) * stride;
      CpAsync16(stage_k(stage) + ld_soff[i], kg + off, i < valid);
      CpAsync16(stage_v(stage) + ld_soff[i], vg + off, i < valid);
    }
  };
  // Pages of fewer than R tokens: every row looked up on its own (all lookups first: one
  // latency, not R); rows past k_end are zero-filled from the pool's base address.
  auto issue_small_pages = [&](int stage, int tile) {
    const int j0 = first_row(tile);
    int32_t page[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      page[i] = j0 + i < k_end ? __ldg(bt + ((j0 + i) >> p.page_shift)) : 0;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int j = j0 + i;
      const bool ok = j < k_end;
      const int64_t slot =
          (static_cast<int64_t>(page[i]) * p.num_kv_heads + kvh) << p.page_shift | (j & page_mask);
      const int64_t off = ok ? slot * kRowBytes : 0;
      const bool nw = fold && ok && j >= new_start;
      const int64_t n_off = nw ? new_row(j) : 0;
      CpAsync16(stage_k(stage) + ld_soff[i], nw ? nkg + n_off : kg + off, ok);
      CpAsync16(stage_v(stage) + ld_soff[i], nw ? nvg + n_off : vg + off, ok);
    }
  };
  auto issue_rows = [&](int stage, int tile) {
    if (paged) {
      issue_small_pages(stage, tile);
    } else {
      issue_strided(stage, tile);
    }
  };

  // ---- Prologue: Q, then the first kStages - 1 tiles ------------------------------------------
  {
    const uint16_t* qg = static_cast<const uint16_t*>(p.q);
    constexpr int kQItems = kRowsPerBlock * Tr::kQChunks;
#pragma unroll
    for (int it = 0; it < (kQItems + kThreads - 1) / kThreads; ++it) {
      const int idx = tid + it * kThreads;
      if (kQItems % kThreads == 0 || idx < kQItems) {
        const int r = idx / Tr::kQChunks;
        const int c = idx % Tr::kQChunks;
        const bool ok = r < rows_valid;
        const int pair = row_begin + (ok ? r : 0);
        const int t = pair / G;
        const int head = kvh * G + pair % G;
        const uint16_t* src = qg + ((q_row0 + t) * p.num_heads + head) * H + c * 8;
        CpAsync16(s_q + Tr::QOffset(r, c), src, ok);
      }
    }
    CpAsyncCommit();
  }
  int32_t next_page = 0;  // page_runs: the entry of the next tile to issue (loaded a tile ahead)
  if (page_runs) {
    int32_t first[kStages];
#pragma unroll
    for (int s = 0; s < kStages; ++s) first[s] = page_of(s);  // independent loads
#pragma unroll
    for (int t = kStages; t < kStages + kBtPrefetchTiles; t += 4) {
      if (first_row(t) < k_end) PrefetchL2(bt + (first_row(t) >> p.page_shift));
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_tiles) issue_run(s, s, first[s]);
      CpAsyncCommit();
    }
    next_page = first[kStages - 1];
  } else {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_tiles) issue_rows(s, s);
      CpAsyncCommit();
    }
  }

  // Q fragments (A operand of Q·Kᵀ), kept in registers for the whole loop.
  uint32_t qf[Tr::kKSteps][4];
  CpAsyncWait<kStages - 1>();  // Q has landed
  __syncthreads();
  if constexpr (!kFp8) {
    // ldmatrix x4: lane supplies row lane & 15, chunk 2 ks + (lane >> 4).
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks)
      LdMatrixX4(s_q + Tr::QOffset(lane & 15, 2 * ks + (lane >> 4)), qf[ks]);
  } else {
    // Permuted reduction dimension (matches the K reads below): k-step ks = 4c + i covers, for
    // thread tig, dims d0 = 64c + 16 tig + 4i .. d0 + 3 as mma k = (2tig, 2tig+1, 2tig+8,
    // 2tig+9) <- d0 + (0, 1, 2, 3). Q is converted to fp16 (clamped to ±65504).
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks) {
      const int d0 = (ks >> 2) * 64 + tig * 16 + (ks & 3) * 4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h;
        const uint2 raw = *reinterpret_cast<const uint2*>(
            smem + (s_q - s_base) + Tr::QOffset(r, d0 >> 3) + (d0 & 7) * 2);
        float x[4];
        x[0] = HalfToFloat<kInBf16>(static_cast<uint16_t>(raw.x & 0xffffu));
        x[1] = HalfToFloat<kInBf16>(static_cast<uint16_t>(raw.x >> 16));
        x[2] = HalfToFloat<kInBf16>(static_cast<uint16_t>(raw.y & 0xffffu));
        x[3] = HalfToFloat<kInBf16>(static_cast<uint16_t>(raw.y >> 16));
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = fminf(fmaxf(x[e], -65504.f), 65504.f);
        qf[ks][h] = PackPair<false>(x[0], x[1]);      // a0 / a1: k = 2tig, 2tig+1
        qf[ks][2 + h] = PackPair<false>(x[2], x[3]);  // a2 / a3: k = 2tig+8, 2tig+9
      }
    }
  }

  // ---- Main loop ---------------------------------------------------------------------------------
  float acc[Tr::kDT][4];
#pragma unroll
  for (int dt = 0; dt < Tr::kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dt][e] = 0.f;
  float row_max[2] = {kNegInf, kNegInf};  // raw logits (before sl2)
  float row_sum[2] = {0.f, 0.f};          // this thread's partial sums (quad-reduced at the end)
  const int wkey = warp * 16;             // this warp's first key within a tile
  // FP8: this thread's shared-memory read offsets within a tile, invariant over the loop. K:
  // key row wkey + g, chunk 4c + tig; V: key rows wkey + 2tig (+1), H/8 bytes at dim g·H/8.
  // Rows 8 further are 8 · kRowBytes further (the FP8 swizzle depends on the line mod 8 only).
  uint32_t fk_off[H / 64], fv_off[2];
  if constexpr (kFp8) {
#pragma unroll
    for (int c = 0; c < H / 64; ++c) {
      fk_off[c] = Tr::TileOffset(wkey + g, 4 * c + tig);
      asm("" : "+r"(fk_off[c]));  // opaque: kept in a register, not recomputed every tile
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      fv_off[e] = H == 128 ? Tr::TileOffset(wkey + 2 * tig + e, g)
                           : Tr::TileOffset(wkey + 2 * tig + e, g >> 1) + (g & 1) * 8;
    }
  }

  int stage = 0;           // stage of tile `it`
  int fill = kStages - 1;  // stage of tile it + kStages - 1 (the one freed last iteration)
  for (int it = 0; it < num_tiles; ++it) {
    CpAsyncWait<kStages - 2>();  // tile `it` has landed (for this thread's copies)
    __syncthreads();             // ... for every thread's; and the stage refilled below is free
    const int next = it + kStages - 1;
    if (next < num_tiles) {
      if (page_runs) {
        issue_run(fill, next, next_page);  // its entry was loaded an iteration ago
        next_page = page_of(next + 1);     // consumed next iteration: never waited on here
        const int jp = first_row(next + 1 + kBtPrefetchTiles);
        if (jp < k_end) PrefetchL2(bt + (jp >> p.page_shift));
      } else {
        issue_rows(fill, next);
      }
    }
    CpAsyncCommit();
    const uint32_t sk = stage_k(stage);
    const uint32_t sv = stage_v(stage);
    const int n0 = k0 + it * kTileTokens;

    // S = Q·Kᵀ for this warp's 16 keys: n8 tile nt holds keys wkey + 8 nt + (0..7).
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
    if constexpr (!kFp8) {
      // ldmatrix x4: matrices (keys 0-7, d lo), (keys 0-7, d hi), (keys 8-15, d lo), (8-15, hi).
      const int krow = wkey + (lane & 7) + ((lane >> 4) << 3);
      const int khalf = (lane >> 3) & 1;
#pragma unroll
      for (int ks = 0; ks < Tr::kKSteps; ++ks) {
        uint32_t kb[4];
        LdMatrixX4(sk + Tr::TileOffset(krow, 2 * ks + khalf), kb);
        Mma16816<kMmaBf16>(s[0], qf[ks], kb[0], kb[1]);
        Mma16816<kMmaBf16>(s[1], qf[ks], kb[2], kb[3]);
      }
    } else {
      // Thread (g, tig) reads 16 bytes (dims 64c + 16 tig ..) of key rows g and g + 8; word i
      // is k-step 4c + i: its low byte pair is b0 (k = 2tig, 2tig+1), its high pair b1.
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int c = 0; c < H / 64; ++c) {
          const uint4 w = *reinterpret_cast<const uint4*>(smem + (sk - s_base) + fk_off[c] +
                                                          nt * 8 * Tr::kRowBytes);
          const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            Mma16816<false>(s[nt], qf[4 * c + i], Fp8x2ToHalf2<false>(ww[i]),
                            Fp8x2ToHalf2<true>(ww[i]));
          }
        }
      }
    }

    // Mask (only tiles reaching past the first row's diagonal): key j > hi(row) -> -inf.
    if (n0 + kTileTokens - 1 > unmasked_end) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = n0 + wkey + 8 * nt + 2 * tig + (e & 1);
          if (j > ((e >> 1) ? hi_row1 : hi_row0)) s[nt][e] = kNegInf;
        }
    }

    // Non-finite V at keys that some row of a masked tile cannot see (common/nonfinite.cuh).
    // Only this warp reads its 16 V rows, so it checks, zeroes and flags them itself: lane l
    // scans half of row wkey + (l & 15). Rare path: rows that see a flagged key get O = NaN.
    if (n0 + kTileTokens - 1 > unmasked_end) {
      constexpr int kHalfChunks = Tr::kRowChunks / 2;
      const int vr = wkey + (lane & 15);
      const int c0 = (lane >> 4) * kHalfChunks;
      bool kb = false;
#pragma unroll
      for (int c = 0; c < kHalfChunks; ++c) {
        uint32_t w[4];
        LdShared4(sv + Tr::TileOffset(vr, c0 + c), w);
#pragma unroll
        for (int e = 0; e < 4; ++e) kb |= VWordNonFinite<kFp8, kMmaBf16>(w[e]);
      }
      const uint32_t ballot = __ballot_sync(0xffffffffu, kb);
      const uint32_t bad = (ballot | (ballot >> 16)) & 0xffffu;  // bit i: key wkey + i
      if (bad != 0u) {
#pragma unroll
        for (int c = 0; c < kHalfChunks; ++c) {
          const uint32_t addr = sv + Tr::TileOffset(vr, c0 + c);
          uint32_t w[4];
          LdShared4(addr, w);
#pragma unroll
          for (int e = 0; e < 4; ++e) w[e] = VWordZeroNonFinite<kFp8, kMmaBf16>(w[e]);
          StShared4(addr, w);
        }
        __syncwarp();  // the zeros are visible to the warp's V reads below
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int last = (r ? hi_row1 : hi_row0) - (n0 + wkey);  // keys wkey + i, i <= last
          const uint32_t seen = last < 0 ? 0u : (last >= 15 ? 0xffffu : (2u << last) - 1u);
          if ((bad & seen) != 0u) {
#pragma unroll
            for (int dt = 0; dt < Tr::kDT; ++dt) {
              acc[dt][2 * r] = __int_as_float(0x7fffffff);
              acc[dt][2 * r + 1] = __int_as_float(0x7fffffff);
            }
          }
        }
      }
    }

    // Online softmax for rows g (e = 0, 1) and g + 8 (e = 2, 3).
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[r], mx);
      // 0 while the row has seen no key: exp2(-inf - 0) = 0, never inf - inf.
      // Exponents are (s · sl2, rounded) − (max · sl2, rounded), each product rounded alone
      // (__fmul_rn is never contracted into an FMA): <= 0 and exactly 0 at the max whatever
      // the logits' magnitude (a contracted fma leaves up to half an ulp of the scaled max,
      // which overflows exp2 for logits ~1e12 and makes a single-key row's p differ from 1).
      const float m_use = m_new == kNegInf ? 0.f : __fmul_rn(m_new, sl2);
      // Exactly 1 when the max stayed, so that the rescale below can be skipped; also while
      // the row has seen nothing (acc and row_sum are 0 then).
      alpha[r] = m_new == row_max[r] ? 1.f : Exp2(__fmul_rn(row_max[r], sl2) - m_use);
      row_max[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = Exp2(__fmul_rn(s[nt][2 * r + e], sl2) - m_use);
          s[nt][2 * r + e] = pv;
          sum += pv;
        }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
    // Rescale O only when a row of the warp raised its max (after the first tiles a rare event:
    // for a new key maximum among n + 64 keys, about 64 / (n + 64)).
    if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
      for (int dt = 0; dt < Tr::kDT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] *= alpha[e >> 1];
    }

    // P as the A operand of P·V (k = this warp's 16 keys in tile order).
    uint32_t pf[4];
    pf[0] = PackPair<kMmaBf16>(s[0][0], s[0][1]);
    pf[1] = PackPair<kMmaBf16>(s[0][2], s[0][3]);
    pf[2] = PackPair<kMmaBf16>(s[1][0], s[1][1]);
    pf[3] = PackPair<kMmaBf16>(s[1][2], s[1][3]);

    if constexpr (!kFp8) {
      // ldmatrix x4 .trans: matrices (keys 0-7, d 2dp), (keys 8-15, d 2dp), (0-7, 2dp+1), ...
      const int vrow = wkey + (lane & 7) + (((lane >> 3) & 1) << 3);
      const int vhalf = lane >> 4;
#pragma unroll
      for (int dp = 0; dp < Tr::kDT / 2; ++dp) {
        uint32_t vb[4];
        LdMatrixX4Trans(sv + Tr::TileOffset(vrow, 2 * dp + vhalf), vb);
        Mma16816<kMmaBf16>(acc[2 * dp], pf, vb[0], vb[1]);
        Mma16816<kMmaBf16>(acc[2 * dp + 1], pf, vb[2], vb[3]);
      }
    } else {
      // Thread (g, tig) reads H/8 bytes (dims g·H/8 ..) of keys 2tig, 2tig+1, 2tig+8, 2tig+9;
      // byte dt of those is output n8 tile dt, column g (O dim g·H/8 + dt). A byte permute
      // pairs the same dim of two keys (b0: keys 2tig, 2tig+1; b1: keys 2tig+8, 2tig+9).
      constexpr int kWords = H / 32;  // 32-bit words per key row slice
      uint32_t kw[4][kWords];
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // keys 2tig, 2tig+1, 2tig+8, 2tig+9
        const unsigned char* src =
            smem + (sv - s_base) + fv_off[q & 1] + (q >> 1) * 8 * Tr::kRowBytes;
        if constexpr (kWords == 4) {
          const uint4 w = *reinterpret_cast<const uint4*>(src);
          kw[q][0] = w.x;
          kw[q][1] = w.y;
          kw[q][2] = w.z;
          kw[q][3] = w.w;
        } else {
          const uint2 w = *reinterpret_cast<const uint2*>(src);
          kw[q][0] = w.x;
          kw[q][1] = w.y;
        }
      }
#pragma unroll
      for (int u = 0; u < kWords; ++u) {
        // x = [a.b0 b.b0 a.b1 b.b1], y = [a.b2 b.b2 a.b3 b.b3] for keys (a, b): each 16-bit half
        // is one dim of the two keys, i.e. n8 tiles 4u .. 4u+3.
        const uint32_t x_lo = BytePerm(kw[0][u], kw[1][u], 0x5140);
        const uint32_t y_lo = BytePerm(kw[0][u], kw[1][u], 0x7362);
        const uint32_t x_hi = BytePerm(kw[2][u], kw[3][u], 0x5140);
        const uint32_t y_hi = BytePerm(kw[2][u], kw[3][u], 0x7362);
        Mma16816<false>(acc[4 * u + 0], pf, Fp8x2ToHalf2<false>(x_lo), Fp8x2ToHalf2<false>(x_hi));
        Mma16816<false>(acc[4 * u + 1], pf, Fp8x2ToHalf2<true>(x_lo), Fp8x2ToHalf2<true>(x_hi));
        Mma16816<false>(acc[4 * u + 2], pf, Fp8x2ToHalf2<false>(y_lo), Fp8x2ToHalf2<false>(y_hi));
        Mma16816<false>(acc[4 * u + 3], pf, Fp8x2ToHalf2<true>(y_lo), Fp8x2ToHalf2<true>(y_hi));
      }
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
    fill = fill + 1 == kStages ? 0 : fill + 1;
  }

  // ---- Epilogue: combine the 4 warps, then write -----------------------------------------------
  CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the stages: reuse them
  if (fold && mc == (q_len * G - 1) / kRowsPerBlock) {
    StoreNewRows<Tr::kRowBytes>(p, b, kvh, q_row0, new_start, k0, k_end);
  }
  float* red = reinterpret_cast<float*>(smem);  // [warp][16 rows][kRedStride] (unnormalised O)
  float* stat_m = red + kWarps * kRowsPerBlock * Tr::kRedStride;  // [warp][16] max, exp2 units
  float* stat_l = stat_m + kWarps * kRowsPerBlock;                 // [warp][16] sum
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = g + 8 * r;
    if (tig == 0) {
      stat_m[warp * kRowsPerBlock + row] =
          row_max[r] == kNegInf ? kNegInf : __fmul_rn(row_max[r], sl2);
      stat_l[warp * kRowsPerBlock + row] = l;
    }
    float* dst = red + (warp * kRowsPerBlock + row) * Tr::kRedStride;
#pragma unroll
    for (int dt = 0; dt < Tr::kDT; ++dt) {
      if constexpr (!kFp8) {
        *reinterpret_cast<float2*>(dst + dt * 8 + 2 * tig) =
            make_float2(acc[dt][2 * r], acc[dt][2 * r + 1]);
      } else {
        dst[(2 * tig) * (H / 8) + dt] = acc[dt][2 * r];
        dst[(2 * tig + 1) * (H / 8) + dt] = acc[dt][2 * r + 1];
      }
    }
  }
  __syncthreads();

  // Each item: 8 consecutive dims of one row.
  constexpr int kItems = kRowsPerBlock * (H / 8);
  const int64_t total_q = p.q_offsets[p.batch];
#pragma unroll
  for (int it = 0; it < (kItems + kThreads - 1) / kThreads; ++it) {
    const int idx = tid + it * kThreads;
    if (kItems % kThreads != 0 && idx >= kItems) break;
    const int row = idx / (H / 8);
    const int d = (idx % (H / 8)) * 8;
    if (row >= rows_valid) continue;
    float m = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, stat_m[w * kRowsPerBlock + row]);
    float f[kWarps];
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = stat_m[w * kRowsPerBlock + row];
      f[w] = mw == kNegInf ? 0.f : Exp2(mw - m);
      l += f[w] * stat_l[w * kRowsPerBlock + row];
    }
    const bool seen = l != 0.f;  // NaN l (a visible NaN/+Inf logit) propagates, never zeros
    const float inv = seen ? out_scale / l : 0.f;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (f[w] == 0.f) continue;  // a warp that saw nothing for this row holds zeros anyway
      const float* src = red + (w * kRowsPerBlock + row) * Tr::kRedStride + d;
      const float4 a = *reinterpret_cast<const float4*>(src);
      const float4 c = *reinterpret_cast<const float4*>(src + 4);
      o[0] += f[w] * a.x;
      o[1] += f[w] * a.y;
      o[2] += f[w] * a.z;
      o[3] += f[w] * a.w;
      o[4] += f[w] * c.x;
      o[5] += f[w] * c.y;
      o[6] += f[w] * c.z;
      o[7] += f[w] * c.w;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = seen ? o[e] * inv : 0.f;  // select: never 0 * NaN
    const float lse = seen ? m * 0.69314718055994531f + __logf(l) : kNegInf;

    const int pair = row_begin + row;
    const int t = pair / G;
    const int head = kvh * G + pair % G;
    if (parts == 1) {
      uint4 packed;
      packed.x = PackPair<kInBf16>(o[0], o[1]);
      packed.y = PackPair<kInBf16>(o[2], o[3]);
      packed.z = PackPair<kInBf16>(o[4], o[5]);
      packed.w = PackPair<kInBf16>(o[6], o[7]);
      uint16_t* og = static_cast<uint16_t*>(p.o) + ((q_row0 + t) * p.num_heads + head) * H + d;
      *reinterpret_cast<uint4*>(og) = packed;
      if (d == 0 && p.lse != nullptr) p.lse[static_cast<int64_t>(head) * total_q + q_row0 + t] = lse;
    } else {
      const int64_t wrow = (static_cast<int64_t>(part) * p.batch + b) * p.max_q_len + t;
      float* wo = p.ws_o + (wrow * p.num_heads + head) * H + d;
      *reinterpret_cast<float4*>(wo) = make_float4(o[0], o[1], o[2], o[3]);
      *reinterpret_cast<float4*>(wo + 4) = make_float4(o[4], o[5], o[6], o[7]);
      if (d == 0) p.ws_lse[wrow * p.num_heads + head] = lse;
    }
  }
  if (parts > 1) {  // decode_merge.cuh: the last partition block of this chunk merges
    unsigned int* counter =
        p.counters + (static_cast<int64_t>(b) * p.num_kv_heads + kvh) * p.row_chunks + mc;
    if (ArriveLast(counter, parts)) {
      MergePartitions<H, kInBf16>(p, b, kvh, row_begin, rows_valid, parts, q_row0, total_q);
    }
  }
}

template <int kDType, int kKvDType, int kHeadDim>
cudaError_t DecodeLaunch(const DecodeParams& params, dim3 grid, int smem_bytes,
                         cudaStream_t stream) {
  using Tr = Traits<kDType, kKvDType, kHeadDim>;
  DecodeKernel<Tr><<<grid, kThreads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

template <int kDType, int kKvDType, int kHeadDim>
cudaError_t DecodePrepare(int smem_bytes, int* blocks_per_sm) {
  using Tr = Traits<kDType, kKvDType, kHeadDim>;
  cudaError_t e = cudaFuncSetAttribute(DecodeKernel<Tr>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, DecodeKernel<Tr>, kThreads,
                                                       smem_bytes);
}

#define ATTN_DECODE_INSTANTIATE(DT, KDT, H)                                                    \
  template cudaError_t DecodeLaunch<DT, KDT, H>(const DecodeParams&, dim3, int, cudaStream_t); \
  template cudaError_t DecodePrepare<DT, KDT, H>(int, int*);

}  // namespace attn::kernels::decode
