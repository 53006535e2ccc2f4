// The fused attention kernel: FlashAttention-2's algorithm with mma.sync tensor cores.
//
// One block computes BLOCK_M query rows of one (batch entry, query head):
//   - Q tile -> shared memory (cp.async, zero-filled past T_b) -> registers (16-row warps) or
//     re-read per tile (32-row warps);
//   - K/V tiles of BLOCK_N keys stream through a two-stage cp.async ring (tile j+1's K and V
//     are issued at the top of tile j, one commit group), zero-filled past S_b;
//   - S = Q·Kᵀ and O += P·V with mma.sync.m16n8k16 (fp16/bf16 in, fp32 accumulate), operands
//     fetched with ldmatrix (.trans for V) from XOR-swizzled (or padded) shared memory;
//   - online softmax in the exp2 domain (logits and the running max scaled by scale·log2e with
//     separately rounded multiplies, so exponents are <= 0 at any magnitude), running max and
//     sum per row, no NaN when a row has seen no key yet;
//   - boundary tiles check their V tile for ±Inf/NaN and keep it away from rows that do not
//     see it (masked_values.cuh);
//   - the band mask (BandKeyRange) bounds the key tiles a block visits; it is applied per
//     element only on boundary tiles;
//   - O is normalised, staged through shared memory and written with 16-byte stores; lse once.
// Paged K/V (PagedTraits<Tr>, FusedPagedParams): the same kernel with varlen queries, S_b from
// kv_lengths, and K/V tile rows copied from pages found through the block table, one lookup
// per tile row and pass (LookupPages / LoadPagedKV), issued before the barrier that precedes
// the copy so its latency overlaps the wait. The non-paged instantiations are unchanged.
// Included only by kernels/fused/fused_hd<H>.cu and fused_paged_hd<H>.cu, which instantiate it
// explicitly.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fused_params.h"
#include "masked_values.cuh"

namespace attn::kernels::fused {

template <int kDType>
struct ElemOf;
template <>
struct ElemOf<static_cast<int>(DType::kFloat16)> {
  using Pair = __half2;
  __device__ static __forceinline__ uint32_t Pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <>
struct ElemOf<static_cast<int>(DType::kBFloat16)> {
  using Pair = __nv_bfloat162;
  __device__ static __forceinline__ uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// ---- PTX wrappers --------------------------------------------------------------------------

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte async copy global -> shared; copies zeros when !pred (src-size 0 reads nothing).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                           uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

/// c += a·b for one m16n8k16 tile; a: 4 regs (row-major 16x16), b: 2 regs (col-major 16x8).
template <int kDType>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (kDType == static_cast<int>(DType::kBFloat16)) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- Shared-memory tile layout -------------------------------------------------------------
// A tile is `rows` rows of H elements, addressed in 16-byte chunks (8 elements).
//   H % 64 == 0: row stride H/8 chunks, chunk c of row r stored at c ^ (r & 7);
//   H == 32:     row stride 4 chunks (two rows per 128-byte line), chunk c at c ^ ((r>>1) & 3);
//   otherwise:   row stride H/8 + 1 chunks (odd), no swizzle.
// Either way the 8 row addresses of one ldmatrix 8x8 matrix (8 consecutive rows, one logical
// chunk) and 8 consecutive 16-byte cp.async writes of a row land in 8 distinct bank groups.
template <int kHeadDim>
struct TileLayout {
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr bool kXor8 = kHeadDim % 64 == 0;
  static constexpr bool kXor4 = kHeadDim == 32;
  static constexpr int kStride = (kXor8 || kXor4) ? kChunks : kChunks + 1;
  static constexpr int kRowBytes = kStride * 16;
  static_assert(kRowBytes == FusedRowBytes(kHeadDim), "row bytes disagree with the plan");
  /// Byte offset of logical chunk `chunk` of row `row`.
  __device__ static __forceinline__ uint32_t Offset(int row, int chunk) {
    int phys = chunk;
    if constexpr (kXor8) phys = chunk ^ (row & 7);
    if constexpr (kXor4) phys = chunk ^ ((row >> 1) & 3);
    return static_cast<uint32_t>((row * kStride + phys) * 16);
  }
  // ldmatrix lanes read logical chunks 2*c2 + lane_chunk of row lane_row + row_add. The
  // swizzle repeats every kPeriod chunks, so a lane needs at most kPeriod/2 offsets; the rest is
  // an immediate. XOR-8 needs a single one: with r = row & 7, physical chunk
  // (2q | lane_chunk) ^ r = ((lane_chunk) ^ r) ^ 2q, i.e. the byte offsets of the four chunk
  // pairs of a period differ only by XOR (q << 5), and because tiles start on 128-byte
  // boundaries the XOR can be applied to the full shared address (tile base + offset). One
  // register per operand instead of four lives across the main loop; the three XORs per tile
  // are recomputed from the tile's base.
  static constexpr int kPeriod = kXor8 ? 8 : (kXor4 ? 4 : 2);
  static constexpr int kLaneOffsets = kXor8 ? 1 : kPeriod / 2;
  struct Lane {
    uint32_t off[kLaneOffsets];
  };
  __device__ static __forceinline__ Lane MakeLane(int row, int lane_chunk) {
    Lane l;
#pragma unroll
    for (int q = 0; q < kLaneOffsets; ++q) l.off[q] = Offset(row, 2 * q + lane_chunk);
    return l;
  }
  /// Shared address of chunk pair c2 of row (lane row + row_add), row_add a multiple of 8, in
  /// the tile starting at `base` (128-byte aligned). c2 and row_add are compile-time after
  /// unrolling.
  __device__ static __forceinline__ uint32_t At(uint32_t base, const Lane& l, int c2,
                                                int row_add) {
    if constexpr (kXor8) {
      return ((base + l.off[0]) ^ static_cast<uint32_t>((c2 % 4) << 5)) + (c2 / 4) * 128 +
             row_add * kRowBytes;
    } else {
      return base + l.off[c2 % kLaneOffsets] + (c2 / kLaneOffsets) * kPeriod * 16 +
             row_add * kRowBytes;
    }
  }
};

// ---- Kernel traits ---------------------------------------------------------------------------
template <int kDType_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct Traits {
  static constexpr int kDType = kDType_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMT = kWarpRows / 16;  // m16 tiles per warp
  // Q fragments stay in registers for 16-row warps up to H = 128 (H = 256 would spill).
  static constexpr bool kQInRegs = kMT == 1 && kHeadDim_ <= 128;
  static constexpr int kKSteps = kHeadDim / 16;  // k16 steps of Q·Kᵀ
  static constexpr int kNT = kBlockN / 8;        // n8 tiles of S
  static constexpr int kDT = kHeadDim / 8;       // n8 tiles of O
  using Layout = TileLayout<kHeadDim>;
  static constexpr int kQBytes = kBlockM * Layout::kRowBytes;
  static constexpr int kKVBytes = kBlockN * Layout::kRowBytes;
  static constexpr int kSmemBytes = kQBytes + 4 * kKVBytes;
  static_assert(kSmemBytes == FusedSmemBytes(kHeadDim, kBlockM, kBlockN), "smem mismatch");
  static_assert(kWarpRows == 16 || kWarpRows == 32, "warps own 16 or 32 rows");
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "tile shapes");
  // Registers: with 16-row warps and large tiles one block of 8 warps per SM; otherwise two.
  static constexpr int kMinBlocks = (kThreads <= 128 && kMT == 1 && kHeadDim <= 128) ? 2 : 1;
  static constexpr bool kPaged = false;
  using Params = FusedParams;
};

/// The paged variant of a kernel: K/V through block tables (FusedPagedParams). The XOR-8 copy
/// (H % 64 == 0) is the only one it implements: 8 threads per 128-byte line, whole passes.
template <class Base>
struct PagedTraits : Base {
  static constexpr bool kPaged = true;
  using Params = FusedPagedParams;
  static constexpr int kPassRows = Base::kThreads / 8;  // tile rows per copy pass
  static constexpr int kPasses = Base::kBlockN / kPassRows;
  static_assert(Base::Layout::kXor8 && kPassRows % 8 == 0 && Base::kBlockN % kPassRows == 0,
                "paged K/V: head dims 64/128/256 with whole copy passes only");
};

/// Copies `kRows` rows (row r at `gbase + r*row_stride`, rows >= `valid_rows` zero-filled) into
/// the tile at shared address `sbase`. All threads of the block take part.
///
/// XOR-8 layout (H % 64 == 0) with kRows a multiple of the rows per pass: 8 threads per
/// 128-byte line; thread t copies chunks (t % 8) + 8·i (i < H/64) of rows t/8 + R·j, R =
/// threads/8 (a multiple of 8, so the swizzle, which depends on row & 7 only, is the same for
/// all of a thread's rows). Every shared destination is then one per-thread offset plus an
/// immediate, and every global source is one pointer per pass plus an immediate: no per-chunk
/// 64-bit address is computed, and none is kept alive across the main loop (the opaque step
/// stops the compiler from hoisting R·j·row_stride out of it, which cost 16+ registers).
/// Other layouts: one chunk per thread and iteration, consecutive threads on consecutive
/// chunks.
template <class Tr, int kRows>
__device__ __forceinline__ void LoadTile(uint32_t sbase, const uint16_t* gbase,
                                         int64_t row_stride, int valid_rows, int tid) {
  using L = typename Tr::Layout;
  constexpr int kLineThreads = 8;
  constexpr int kPassRows = Tr::kThreads / kLineThreads;
  if constexpr (L::kXor8 && kPassRows % 8 == 0 && kRows % kPassRows == 0) {
    constexpr int kPerRow = L::kChunks / kLineThreads;
    // Opaque copies: the per-thread row offset and the pass step are recomputed per call
    // (a few integer ops per tile) instead of being hoisted out of the main loop.
    int row = tid / kLineThreads;
    asm volatile("" : "+r"(row));
    int64_t step = kPassRows * row_stride;
    asm volatile("" : "+l"(step));
    const int chunk = tid % kLineThreads;
    const uint32_t sdst = sbase + L::Offset(row, chunk);
    const uint16_t* src = gbase + row * row_stride + chunk * 8;
#pragma unroll
    for (int j = 0; j < kRows / kPassRows; ++j) {
      const bool pred = row + j * kPassRows < valid_rows;
      // Rows past the valid range point at the tile's first row: never dereferenced.
      const uint16_t* s = pred ? src : gbase;
#pragma unroll
      for (int i = 0; i < kPerRow; ++i)
        CpAsync16(sdst + j * kPassRows * L::kRowBytes + i * 128, s + i * 64, pred);
      src += step;
      asm volatile("" : "+l"(src));
    }
  } else {
    constexpr int kTotal = kRows * L::kChunks;
    constexpr int kIters = (kTotal + Tr::kThreads - 1) / Tr::kThreads;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int idx = tid + it * Tr::kThreads;
      if (kTotal % Tr::kThreads == 0 || idx < kTotal) {
        const int row = idx / L::kChunks;
        const int chunk = idx % L::kChunks;
        const bool pred = row < valid_rows;
        // Rows past the valid range point at the tile's first row: never dereferenced.
        const uint16_t* src = gbase + (pred ? row * row_stride : 0) + chunk * 8;
        CpAsync16(sbase + L::Offset(row, chunk), src, pred);
      }
    }
  }
}

/// The pages of one K/V tile's rows as this thread copies them (LoadPagedKV's mapping: rows
/// tid/8 + kPassRows·j), looked up one tile ahead of the copy.
template <class Tr>
struct TilePages {
  int32_t page[Tr::kPasses];
};

/// Reads the block-table entries of this thread's rows of the tile starting at key `n0`; rows
/// >= `valid_rows` (past S_b) read nothing (their entry may not exist).
template <class Tr>
__device__ __forceinline__ void LookupPages(TilePages<Tr>& t, const FusedPagedParams& p, int b,
                                            int n0, int valid_rows, int tid) {
  const int32_t* bt = p.block_tables + static_cast<int64_t>(b) * p.bt_stride;
  const int row = tid / 8;
#pragma unroll
  for (int j = 0; j < Tr::kPasses; ++j) {
    const int r = row + j * Tr::kPassRows;
    t.page[j] = r < valid_rows ? __ldg(bt + ((n0 + r) >> p.page_shift)) : 0;
  }
}

/// Copies the K and V tiles of keys [n0, n0 + kBlockN) of kv head `kv_head` from their pages
/// (`t`, from LookupPages with the same n0 and valid_rows) into the tiles at `s_k` and `s_v`;
/// rows >= `valid_rows` are zero-filled and never dereferenced (their source is the page
/// array's base, with a source size of 0). Thread t copies 16-byte chunks (t % 8) + 8·i of rows
/// t/8 + kPassRows·j, as LoadTile's XOR-8 path does, so every shared destination is one offset
/// plus immediates; each row's global source is computed from its own page.
template <class Tr>
__device__ __forceinline__ void LoadPagedKV(uint32_t s_k, uint32_t s_v, const TilePages<Tr>& t,
                                            const FusedPagedParams& p, int kv_head, int n0,
                                            int valid_rows, int tid) {
  using L = typename Tr::Layout;
  constexpr int kPerRow = L::kChunks / 8;
  const int row = tid / 8;
  const int chunk = tid % 8;
  const uint32_t sdst = L::Offset(row, chunk);
  const uint16_t* kp = static_cast<const uint16_t*>(p.k);
  const uint16_t* vp = static_cast<const uint16_t*>(p.v);
#pragma unroll
  for (int j = 0; j < Tr::kPasses; ++j) {
    const int r = row + j * Tr::kPassRows;
    const bool pred = r < valid_rows;
    const int64_t off = pred ? PagedRowElement(t.page[j], p.num_kv_heads, kv_head, p.page_shift,
                                               n0 + r, Tr::kHeadDim) +
                                   chunk * 8
                             : 0;
    const uint32_t d = sdst + j * Tr::kPassRows * L::kRowBytes;
#pragma unroll
    for (int i = 0; i < kPerRow; ++i) {
      CpAsync16(s_k + d + i * 128, kp + off + i * 64, pred);
      CpAsync16(s_v + d + i * 128, vp + off + i * 64, pred);
    }
  }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    FusedAttentionKernel(const __grid_constant__ typename Tr::Params p) {
  using L = typename Tr::Layout;
  using E = ElemOf<Tr::kDType>;
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
  const uint32_t s_v0 = s_k0 + 2 * Tr::kKVBytes;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;   // row within an 8-row group of the mma fragment
  const int tig = lane & 3;  // thread in group: column pair

  // Heavy tiles first: under a causal band later query tiles see more keys.
  const int m_block = p.num_m_blocks - 1 - static_cast<int>(blockIdx.x);
  const int head = blockIdx.y;
  const int b = blockIdx.z;
  const int kv_head = head / p.group_size;

  int64_t q_row0, kv_row0;  // first token row of this batch entry in q/o and k/v
  int q_len, kv_len;
  if constexpr (Tr::kPaged) {
    // Varlen queries; the keys are the first S_b tokens of the sequence's pages.
    q_row0 = p.q_offsets[b];
    q_len = static_cast<int>(p.q_offsets[b + 1] - q_row0);
    kv_row0 = 0;
    kv_len = min(max(p.kv_lengths[b], 0), p.max_kv_len);
  } else if (p.varlen) {
    const int64_t qo = p.q_offsets[b], qe = p.q_offsets[b + 1];
    const int64_t ko = p.kv_offsets[b], ke = p.kv_offsets[b + 1];
    q_row0 = qo;
    kv_row0 = ko;
    q_len = static_cast<int>(qe - qo);
    kv_len = static_cast<int>(ke - ko);
  } else {
    q_row0 = static_cast<int64_t>(b) * p.max_q_len;
    kv_row0 = static_cast<int64_t>(b) * p.max_kv_len;
    q_len = p.q_lengths ? min(max(p.q_lengths[b], 0), p.max_q_len) : p.max_q_len;
    kv_len = p.kv_lengths ? min(max(p.kv_lengths[b], 0), p.max_kv_len) : p.max_kv_len;
  }
  const int m0 = m_block * kBM;
  // Rows this block writes: padded writes every row < T (zeros past T_b); varlen rows < T_b.
  const int store_rows = min(kBM, ((Tr::kPaged || p.varlen) ? q_len : p.max_q_len) - m0);
  if (store_rows <= 0) return;

  // Key tiles this block visits; interior tiles skip the mask.
  const BlockTiles tiles = BlockKeyTiles(p.mask, m0, kBM, kBN, q_len, kv_len);
  const int n_begin = tiles.n_begin, n_end = tiles.n_end;

  // Per-thread rows: warp rows + mt*16 + g + 8*r.
  const int warp_row0 = warp * Tr::kWarpRows;
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

  const uint16_t* q_base = static_cast<const uint16_t*>(p.q) +
                           (q_row0 + m0) * p.q_row_stride +
                           static_cast<int64_t>(head) * Tr::kHeadDim;
  // K and V share layout and strides: one element offset (this batch entry's first key row
  // and this kv head) serves both, and the tile pointers are rebuilt from the kernel
  // parameters per tile (two 64-bit pointers fewer alive across the main loop).
  const int64_t kv_off =
      kv_row0 * p.kv_row_stride + static_cast<int64_t>(kv_head) * Tr::kHeadDim;
  auto k_tile = [&](int n0) {
    return static_cast<const uint16_t*>(p.k) + kv_off + n0 * p.kv_row_stride;
  };
  auto v_tile = [&](int n0) {
    return static_cast<const uint16_t*>(p.v) + kv_off + n0 * p.kv_row_stride;
  };

  if (n_begin < n_end) {
    // Prologue: Q, then K and V of the first visited tile (the last index: diagonal first).
    LoadTile<Tr, kBM>(s_q, q_base, p.q_row_stride, q_len - m0, tid);
    CpAsyncCommit();
    {
      const int n0 = (n_end - 1) * kBN;
      if constexpr (Tr::kPaged) {
        TilePages<Tr> pages;
        LookupPages<Tr>(pages, p, b, n0, kv_len - n0, tid);
        LoadPagedKV<Tr>(s_k0, s_v0, pages, p, kv_head, n0, kv_len - n0, tid);
      } else {
        LoadTile<Tr, kBN>(s_k0, k_tile(n0), p.kv_row_stride, kv_len - n0, tid);
        LoadTile<Tr, kBN>(s_v0, v_tile(n0), p.kv_row_stride, kv_len - n0, tid);
      }
      CpAsyncCommit();
    }

    // ldmatrix lane addressing (offsets within a tile; see TileLayout::At):
    //   A (Q, 16x16 at rows R, chunk pair c2): row R + (lane & 15), chunk 2*c2 + (lane >> 4).
    //   B (K, two n8 tiles x k16 at keys N):   row N + (lane & 7) + ((lane >> 4) << 3),
    //                                          chunk 2*c2 + ((lane >> 3) & 1).
    //   B (V, trans, k16 x two n8 tiles):      row K + (lane & 7) + (((lane >> 3) & 1) << 3),
    //                                          chunk 2*c2 + (lane >> 4).
    const typename L::Lane q_lane = L::MakeLane(warp_row0 + (lane & 15), lane >> 4);
    const typename L::Lane k_lane = L::MakeLane((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    const typename L::Lane v_lane =
        L::MakeLane((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);

    uint32_t q_frag[Tr::kQInRegs ? kKSteps : 1][4];
    if constexpr (Tr::kQInRegs) {
      CpAsyncWait<1>();  // Q landed (K/V of the first tile may be in flight)
      __syncthreads();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        LdMatrixX4(L::At(s_q, q_lane, ks, 0), q_frag[ks][0], q_frag[ks][1], q_frag[ks][2],
                   q_frag[ks][3]);
    }

    // One tile: S = Q·Kᵀ, mask (boundary tiles only), online softmax, O += P·V.
    auto tile = [&](const uint32_t s_k, const uint32_t s_v, const int n0, auto masked) {
      // Q's tile base, opaque so that the Q fragment addresses derived from it (32-row warps
      // re-read Q every tile) are recomputed per tile instead of held in registers.
      uint32_t s_qt = s_q;
      asm volatile("" : "+r"(s_qt));
      if constexpr (decltype(masked)::value) {
        // Masked keys of this tile may hold ±Inf/NaN in V (masked_values.cuh): rare path only.
        if (BlockTileHasNonFinite<Tr>(s_v, tid)) {
          uint32_t key_bad[kBN / 32];
          FlagAndZeroNonFinite<Tr>(s_v, tid, key_bad);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const KeyRange kr =
                  BandKeyRange(p.mask, m0 + warp_row0 + mt * 16 + g + 8 * r, q_len, kv_len);
              if (!kr.empty() && RangeHasFlaggedKey<kBN>(key_bad, static_cast<int>(kr.lo) - n0,
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
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (Tr::kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[ks][e];
          } else {
            LdMatrixX4(L::At(s_qt, q_lane, ks, mt * 16), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
          }
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b0, b1, b2, b3;
          LdMatrixX4(L::At(s_k, k_lane, ks, np * 16), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            Mma16816<Tr::kDType>(s[mt][2 * np], a[mt], b0, b1);
            Mma16816<Tr::kDType>(s[mt][2 * np + 1], a[mt], b2, b3);
          }
        }
      }

      if constexpr (decltype(masked)::value) {
        // Keys outside each row's band (and past S_b) get -inf. The per-row ranges are
        // recomputed here rather than kept in registers across the loop (boundary tiles are
        // few; registers are not).
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

      // Online softmax. Row r of m-tile mt lives in s[mt][*][2r..2r+1] of the 4 threads of a
      // quad. m_use is the running max in exp2 units, 0 while the row has seen no key, so
      // masked logits give exp2(-inf) = 0 and the rescale factor is never inf - inf.
      uint32_t pf[kMT][kNT / 2][4];
      float jsum[kMT][2][kNT / 2];
      float alpha[kMT][2];
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
          // Every exp2 argument is (s · scale_log2, rounded) − (max · scale_log2, rounded),
          // each product rounded alone (__fmul_rn is never contracted into an FMA): rounding
          // is monotonic, so the argument is <= 0 and exactly 0 at the max, whatever the
          // logits' magnitude. A contracted fmaf(s, c, −m_use) leaves the product's rounding
          // error, up to half an ulp of m_use (8192 at logits ~1e12: exp2 overflows to inf,
          // inf/inf = NaN), and makes a single-key row's p differ from 1.
          float m_use = __fmul_rn(mx, p.scale_log2);
          if constexpr (decltype(masked)::value) m_use = mx == kNegInf ? 0.f : m_use;
          // exp2(0) = 1 exactly when the max did not move.
          alpha[mt][r] = Exp2(__fmul_rn(row_max[mt][r], p.scale_log2) - m_use);
          rescale |= alpha[mt][r] != 1.f;
          row_max[mt][r] = mx;
          // Row sums per k16 step j of P·V (keys 16j..16j+15), see `fence` below.
          float part[kNT];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            const float p0 = Exp2(__fmul_rn(s[mt][nt][2 * r], p.scale_log2) - m_use);
            const float p1 = Exp2(__fmul_rn(s[mt][nt][2 * r + 1], p.scale_log2) - m_use);
            s[mt][nt][2 * r] = p0;
            s[mt][nt][2 * r + 1] = p1;
            part[nt] = p0 + p1;
          }
#pragma unroll
          for (int j = 0; j < kNT / 2; ++j) jsum[mt][r][j] = part[2 * j] + part[2 * j + 1];
        }
      }
      // Rescale O only when some row of the warp raised its max (rare once rows have seen
      // many keys); the branch is warp-uniform.
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][dt][e] *= alpha[mt][e >> 1];
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        // P as the A operand of P·V: k16 step j covers n8 tiles 2j and 2j+1.
#pragma unroll
        for (int j = 0; j < kNT / 2; ++j) {
          pf[mt][j][0] = E::Pack(s[mt][2 * j][0], s[mt][2 * j][1]);
          pf[mt][j][1] = E::Pack(s[mt][2 * j][2], s[mt][2 * j][3]);
          pf[mt][j][2] = E::Pack(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
          pf[mt][j][3] = E::Pack(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
        }
      }

      // O += P·V. ptxas schedules the row-sum additions after P·V, keeping all float P alive
      // next to the packed copy (tens of registers at the peak; 32-row warps spilled much
      // more). For 32-row warps `fence` ties the V fragment addresses of step j to the
      // partial sums of step j, so every float P of step j is consumed before its MMAs. It is
      // always +0: min(0, sums) with sums >= 0 (exp2 results; fminf(0, NaN) is 0 as well).
      // 16-row warps have registers to spare and keep ptxas' free schedule.
#pragma unroll
      for (int j = 0; j < kNT / 2; ++j) {
        uint32_t fence = 0;
        if constexpr (kMT > 1) {
          float lo = 0.f;
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) lo = fminf(lo, jsum[mt][r][j]);
          fence = __float_as_uint(lo);
        }
#pragma unroll
        for (int dp = 0; dp < kDT / 2; ++dp) {
          uint32_t b0, b1, b2, b3;
          LdMatrixX4Trans(L::At(s_v + fence, v_lane, dp, j * 16), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            Mma16816<Tr::kDType>(acc[mt][2 * dp], pf[mt][j], b0, b1);
            Mma16816<Tr::kDType>(acc[mt][2 * dp + 1], pf[mt][j], b2, b3);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float sum = jsum[mt][r][0];
#pragma unroll
          for (int j = 1; j < kNT / 2; ++j) sum += jsum[mt][r][j];
          row_sum[mt][r] = row_sum[mt][r] * alpha[mt][r] + sum;
        }
    };

    // Tiles from the last (diagonal) to the first. One barrier per tile: K/V(it) is waited for
    // at the top, and the barrier also proves every warp is done with tile it-1, whose stage
    // the prefetch of tile it+1 then overwrites.
    const int num_tiles = n_end - n_begin;
    for (int it = 0; it < num_tiles; ++it) {
      const int n0 = (n_end - 1 - it) * kBN;
      const int stage = it & 1;
      // Paged: the next tile's block-table entries are read before the wait and the barrier,
      // which hide their latency (the copies below need them).
      [[maybe_unused]] std::conditional_t<Tr::kPaged, TilePages<Tr>, int> next_pages;
      if constexpr (Tr::kPaged) {
        if (it + 1 < num_tiles) LookupPages<Tr>(next_pages, p, b, n0 - kBN, kv_len - n0 + kBN, tid);
      }
      CpAsyncWait<0>();
      __syncthreads();
      if (it + 1 < num_tiles) {
        const int nn0 = n0 - kBN;
        const uint32_t off = (stage ^ 1) * Tr::kKVBytes;
        if constexpr (Tr::kPaged) {
          LoadPagedKV<Tr>(s_k0 + off, s_v0 + off, next_pages, p, kv_head, nn0, kv_len - nn0, tid);
        } else {
          LoadTile<Tr, kBN>(s_k0 + off, k_tile(nn0), p.kv_row_stride, kv_len - nn0, tid);
          LoadTile<Tr, kBN>(s_v0 + off, v_tile(nn0), p.kv_row_stride, kv_len - nn0, tid);
        }
      }
      CpAsyncCommit();
      const uint32_t s_k = s_k0 + stage * Tr::kKVBytes;
      const uint32_t s_v = s_v0 + stage * Tr::kKVBytes;
      // Interior tiles (inside every row's band) skip the mask.
      if (tiles.Interior(n_end - 1 - it, kBN)) {
        tile(s_k, s_v, n0, std::false_type{});
      } else {
        tile(s_k, s_v, n0, std::true_type{});
      }
    }
  }

  // Epilogue. Each warp stages its own rows of O in the Q tile's shared memory (it alone read
  // those rows), then writes them with 16-byte stores.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = warp_row0 + mt * 16 + g + 8 * r;  // within the block
      // l == 0 exactly: the row saw no key (zeros, lse -inf). A NaN l (a visible key gave a
      // NaN or +Inf logit) is a row that saw keys: its NaN must reach the output.
      const bool valid = m0 + row < q_len && l != 0.f;
      const float inv = valid ? 1.f / l : 0.f;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        // Selects, not a multiply by 0: padding rows' accumulators are never trusted.
        const uint32_t packed =
            valid ? E::Pack(acc[mt][dt][2 * r] * inv, acc[mt][dt][2 * r + 1] * inv) : 0u;
        const uint32_t addr = s_q + L::Offset(row, dt) + tig * 4;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(packed) : "memory");
      }
      if (p.lse != nullptr && tig == 0 && row < store_rows) {
        const float lse = valid ? row_max[mt][r] * p.scale + __logf(l) : kNegInf;
        const int64_t qi = m0 + row;
        const int64_t idx = (Tr::kPaged || p.varlen)
                                ? static_cast<int64_t>(head) * p.total_q + q_row0 + qi
                                     : (static_cast<int64_t>(b) * p.num_heads + head) *
                                               p.max_q_len + qi;
        p.lse[idx] = lse;
      }
    }
  }
  __syncwarp();
  constexpr int kWarpChunks = Tr::kWarpRows * L::kChunks;
  uint16_t* o_base = static_cast<uint16_t*>(p.o) + (q_row0 + m0) * p.q_row_stride +
                     static_cast<int64_t>(head) * Tr::kHeadDim;
#pragma unroll
  for (int it = 0; it < (kWarpChunks + 31) / 32; ++it) {
    const int idx = lane + it * 32;
    if (kWarpChunks % 32 == 0 || idx < kWarpChunks) {
      const int row = warp_row0 + idx / L::kChunks;
      const int chunk = idx % L::kChunks;
      if (row < store_rows) {
        uint4 v;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(s_q + L::Offset(row, chunk)));
        *reinterpret_cast<uint4*>(o_base + row * p.q_row_stride + chunk * 8) = v;
      }
    }
  }
}

template <int kDType, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t FusedLaunch(const FusedParams& params, dim3 grid, int smem_bytes,
                        cudaStream_t stream) {
  using Tr = Traits<kDType, kHeadDim, kBlockM, kBlockN, kWarps>;
  FusedAttentionKernel<Tr><<<grid, Tr::kThreads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

template <int kDType, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t FusedPrepare(int smem_bytes) {
  using Tr = Traits<kDType, kHeadDim, kBlockM, kBlockN, kWarps>;
  return cudaFuncSetAttribute(FusedAttentionKernel<Tr>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
}

template <int kDType, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t FusedPagedLaunch(const FusedPagedParams& params, dim3 grid, int smem_bytes,
                             cudaStream_t stream) {
  using Tr = PagedTraits<Traits<kDType, kHeadDim, kBlockM, kBlockN, kWarps>>;
  FusedAttentionKernel<Tr><<<grid, Tr::kThreads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

template <int kDType, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
cudaError_t FusedPagedPrepare(int smem_bytes) {
  using Tr = PagedTraits<Traits<kDType, kHeadDim, kBlockM, kBlockN, kWarps>>;
  return cudaFuncSetAttribute(FusedAttentionKernel<Tr>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
}

#define ATTN_FUSED_INSTANTIATE_ONE(DT, H, BM, BN, W)                                          \
  template cudaError_t FusedLaunch<DT, H, BM, BN, W>(const FusedParams&, dim3, int,          \
                                                      cudaStream_t);                         \
  template cudaError_t FusedPrepare<DT, H, BM, BN, W>(int);
#define ATTN_FUSED_INSTANTIATE(H, BM, BN, W)                                                  \
  ATTN_FUSED_INSTANTIATE_ONE(static_cast<int>(DType::kFloat16), H, BM, BN, W)                 \
  ATTN_FUSED_INSTANTIATE_ONE(static_cast<int>(DType::kBFloat16), H, BM, BN, W)

#define ATTN_FUSED_PAGED_INSTANTIATE_ONE(DT, H, BM, BN, W)                                    \
  template cudaError_t FusedPagedLaunch<DT, H, BM, BN, W>(const FusedPagedParams&, dim3, int, \
                                                           cudaStream_t);                    \
  template cudaError_t FusedPagedPrepare<DT, H, BM, BN, W>(int);
#define ATTN_FUSED_PAGED_INSTANTIATE(H, BM, BN, W)                                            \
  ATTN_FUSED_PAGED_INSTANTIATE_ONE(static_cast<int>(DType::kFloat16), H, BM, BN, W)           \
  ATTN_FUSED_PAGED_INSTANTIATE_ONE(static_cast<int>(DType::kBFloat16), H, BM, BN, W)

}  // namespace attn::kernels::fused
