// PagedDecodeSupports / PagedDecodePlanFor / PagedDecodeRun / ContiguousDecodeRun: host side
// of the decode family (kernel: decode_kernel.cuh, instantiated in decode_hd<H>.cu; it merges
// its own partitions, decode_merge.cuh).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attn/kernels/device_limits.h"
#include "attn/kernels/paged_decode.h"
#include "decode_params.h"

namespace attn::kernels {
namespace {

using decode::DecodeLaunchFn;
using decode::DecodeParams;
using decode::DecodePrepareFn;

struct Variant {
  int dtype, kv_dtype, head_dim;
  DecodeLaunchFn launch;
  DecodePrepareFn prepare;
};

#define ATTN_DECODE_TABLE_ROW(DT, KDT, H) \
  Variant{DT, KDT, H, &decode::DecodeLaunch<DT, KDT, H>, &decode::DecodePrepare<DT, KDT, H>},
const Variant kVariants[] = {ATTN_DECODE_ALL_VARIANTS(ATTN_DECODE_TABLE_ROW)};
#undef ATTN_DECODE_TABLE_ROW

const Variant* FindVariant(const PagedDecodeShape& s) {
  for (const Variant& v : kVariants) {
    if (v.dtype == static_cast<int>(s.dtype) && v.kv_dtype == static_cast<int>(s.kv_dtype) &&
        v.head_dim == s.head_dim) {
      return &v;
    }
  }
  return nullptr;
}

Status CudaInternal(const char* what, cudaError_t e) {
  return Internal(std::string("decode: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

int Log2(int64_t pow2) {
  int s = 0;
  while ((int64_t{1} << s) < pow2) ++s;
  return s;
}

/// Partitions per sequence. Decode streams K/V, so what matters is that enough blocks are
/// resident to keep HBM busy, not that every slot is filled: when the B·K·row_chunks blocks of
/// one partition fill between half and all of the resident slots (at least ~one block per SM),
/// one partition, in one wave, with no merge pass. (Splitting further would add a second wave,
/// i.e. a second pipeline ramp and tail, and the merge launch: for FP8 pages at B=32 K=8 on an
/// H200, 256 blocks in 396 slots, the wave rule below picked 3 partitions = 2 waves.)
/// Otherwise the smallest count whose grid of B·K·row_chunks·P blocks runs at >= 85% of the
/// best wave efficiency (blocks / (waves rounded up × resident slots)) found over P in
/// [1, tiles / 4] (partitions of at least 4 tiles = 256 keys, at most 256 partitions), as
/// FlashAttention's split heuristic does.
int64_t ChoosePartitions(int64_t pairs, int64_t tiles, int64_t slots) {
  if (pairs <= slots && 2 * pairs >= slots) return 1;
  const int64_t max_p = std::max<int64_t>(1, std::min<int64_t>(tiles / 4, 256));
  double best = 0;
  std::vector<double> eff(static_cast<size_t>(max_p + 1), 0.0);
  for (int64_t p = 1; p <= max_p; ++p) {
    const int64_t part_tiles = (tiles + p - 1) / p;
    const int64_t real_p = (tiles + part_tiles - 1) / part_tiles;
    const double waves = static_cast<double>(pairs * real_p) / static_cast<double>(slots);
    eff[p] = waves / std::ceil(waves);
    best = std::max(best, eff[p]);
  }
  for (int64_t p = 1; p <= max_p; ++p)
    if (eff[p] >= 0.85 * best) return p;
  return 1;
}

Status CheckQueries(const PagedDecodePlan& plan, const DecodeQueries& q) {
  if (q.q == nullptr || q.o == nullptr || q.q_offsets == nullptr) {
    return InvalidArgument("decode: q, o and q_offsets must be non-null device pointers");
  }
  if (plan.shape.return_lse && q.lse == nullptr) {
    return InvalidArgument("decode: return_lse is set but lse is null");
  }
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(q.q) || misaligned(q.o)) {
    return InvalidArgument("decode: q and o must be 16-byte aligned");
  }
  if ((q.new_k == nullptr) != (q.new_v == nullptr)) {
    return InvalidArgument("decode: a folded append needs both new_k and new_v");
  }
  if (q.new_k != nullptr) {
    if (plan.shape.source != KvSource::kPaged || plan.shape.kv_dtype != plan.shape.dtype) {
      return InvalidArgument(
          "decode: a folded append (new_k, new_v) needs paged K/V stored in the query dtype "
          "(FP8 pages and contiguous K/V take none)");
    }
    if (misaligned(q.new_k) || misaligned(q.new_v)) {
      return InvalidArgument("decode: new_k and new_v must be 16-byte aligned");
    }
  }
  return Status::Ok();
}

/// Fills the shape-derived fields and launches decode (which merges its partitions itself).
Status Launch(const PagedDecodePlan& plan, DecodeParams p, const DecodeQueries& q,
              void* workspace, cudaStream_t stream) {
  const PagedDecodeShape& s = plan.shape;
  if (plan.partitions > 1) {
    if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
      return InvalidArgument("decode: the plan needs " + std::to_string(plan.workspace_bytes) +
                             " bytes of 256-byte aligned workspace");
    }
    // [counters | partial O | partial lse], each 256-byte aligned (PagedDecodePlanFor).
    auto* base = static_cast<unsigned char*>(workspace);
    const int64_t rows = s.batch * s.max_q_len * s.num_heads * plan.partitions;
    const size_t o_bytes = ((static_cast<size_t>(rows * s.head_dim) * 4 + 255) / 256) * 256;
    p.counters = reinterpret_cast<unsigned int*>(base);
    p.ws_o = reinterpret_cast<float*>(base + plan.counter_bytes);
    p.ws_lse = reinterpret_cast<float*>(base + plan.counter_bytes + o_bytes);
  }
  p.q = q.q;
  p.q_offsets = q.q_offsets;
  p.o = q.o;
  p.lse = s.return_lse ? q.lse : nullptr;
  p.new_k = q.new_k;
  p.new_v = q.new_v;
  p.num_heads = static_cast<int32_t>(s.num_heads);
  p.num_kv_heads = static_cast<int32_t>(s.num_kv_heads);
  p.group = static_cast<int32_t>(s.num_heads / s.num_kv_heads);
  p.max_q_len = static_cast<int32_t>(s.max_q_len);
  p.max_kv_len = static_cast<int32_t>(s.max_kv_len);
  p.partitions = static_cast<int32_t>(plan.partitions);
  p.partition_tokens = static_cast<int32_t>(plan.partition_tokens);
  p.row_chunks = static_cast<int32_t>(plan.row_chunks);
  p.batch = static_cast<int32_t>(s.batch);
  p.scale = s.scale;
  p.scale_log2 = static_cast<float>(static_cast<double>(s.scale) * 1.4426950408889634);

  const dim3 grid(static_cast<unsigned>(plan.row_chunks * plan.partitions),
                  static_cast<unsigned>(s.num_kv_heads), static_cast<unsigned>(s.batch));
  const auto launch = reinterpret_cast<DecodeLaunchFn>(plan.launch);
  const cudaError_t e = launch(p, grid, plan.smem_bytes, stream);
  if (e != cudaSuccess) return CudaInternal("decode kernel launch", e);
  return Status::Ok();
}

}  // namespace

std::string PagedDecodePlan::Describe() const {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "decode %s %s/%s h%lld p%lldx%lld rc%lld st%d smem%d occ%d",
                shape.source == KvSource::kPaged ? "paged" : "contig", DTypeName(shape.dtype),
                DTypeName(shape.kv_dtype), static_cast<long long>(shape.head_dim),
                static_cast<long long>(partitions), static_cast<long long>(partition_tokens),
                static_cast<long long>(row_chunks), stages, smem_bytes, blocks_per_sm);
  return buf;
}

Status PagedDecodeSupports(const PagedDecodeShape& s) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return FailedPrecondition(std::string("decode: dtype ") + DTypeName(s.dtype) +
                              " is not supported (float16 and bfloat16)");
  }
  if (s.kv_dtype != s.dtype && s.kv_dtype != DType::kFloat8E4M3) {
    return FailedPrecondition(std::string("decode: kv dtype ") + DTypeName(s.kv_dtype) +
                              " must be the query dtype " + DTypeName(s.dtype) +
                              " or float8_e4m3");
  }
  if (s.head_dim <= 0 || s.num_heads <= 0 || s.num_kv_heads <= 0) {
    return InvalidArgument("decode: head_dim, num_heads and num_kv_heads must be positive");
  }
  if (s.head_dim != 64 && s.head_dim != 128) {
    return FailedPrecondition("decode: head dim " + std::to_string(s.head_dim) +
                              " is not supported (64 and 128 only: the tile and fragment "
                              "layouts are compiled for those)");
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return InvalidArgument("decode: num_heads " + std::to_string(s.num_heads) +
                           " is not a multiple of num_kv_heads " +
                           std::to_string(s.num_kv_heads));
  }
  if (s.batch < 0 || s.max_q_len < 0 || s.max_kv_len < 0) {
    return InvalidArgument("decode: negative sizes");
  }
  if (s.max_q_len > kPagedDecodeMaxQueryLen) {
    return FailedPrecondition("decode: max_q_len " + std::to_string(s.max_q_len) +
                              " is above the decode limit of " +
                              std::to_string(kPagedDecodeMaxQueryLen) +
                              " query tokens per sequence (use the fused prefill kernel)");
  }
  if (s.batch > 65535 || s.num_kv_heads > 65535) {
    return InvalidArgument("decode: batch and num_kv_heads must be at most 65535 (grid limits)");
  }
  if (s.max_kv_len >= (int64_t{1} << 30)) {
    return InvalidArgument("decode: max_kv_len must be below 2^30");
  }
  if (s.source == KvSource::kPaged &&
      (s.page_tokens < 1 || s.page_tokens > 65536 || (s.page_tokens & (s.page_tokens - 1)) != 0)) {
    return FailedPrecondition("decode: page_tokens " + std::to_string(s.page_tokens) +
                              " must be a power of two in [1, 65536]");
  }
  if (!(s.scale > 0.f) || !std::isfinite(s.scale)) {
    return FailedPrecondition("decode: the softmax scale must be positive and finite (got " +
                              std::to_string(s.scale) + ")");
  }
  return Status::Ok();
}

StatusOr<PagedDecodePlan> PagedDecodePlanFor(const PagedDecodeShape& shape, int device,
                                             const PagedDecodeOptions& options) {
  ATTN_RETURN_IF_ERROR(PagedDecodeSupports(shape));
  if (options.partitions < 0) return InvalidArgument("decode: options.partitions must be >= 0");
  StatusOr<DeviceLimits> limits = GetDeviceLimits(device);
  if (!limits.ok()) return limits.status();
  if (limits->compute_capability < 800) {
    return FailedPrecondition("decode: needs compute capability 8.0 or newer (device has " +
                              std::to_string(limits->compute_capability / 100) + "." +
                              std::to_string(limits->compute_capability % 100 / 10) + ")");
  }
  const Variant* v = FindVariant(shape);
  const int kv_bytes = shape.kv_dtype == DType::kFloat8E4M3 ? 1 : 2;
  const int smem = decode::DecodeSmemBytes(static_cast<int>(shape.head_dim), kv_bytes);
  if (smem > limits->max_dynamic_smem_per_block_bytes) {
    return FailedPrecondition("decode: needs " + std::to_string(smem) +
                              " bytes of shared memory per block, the device allows " +
                              std::to_string(limits->max_dynamic_smem_per_block_bytes) +
                              (limits->emulating_l4 ? " (L4 emulation)" : ""));
  }

  int previous = 0;
  cudaError_t e = cudaGetDevice(&previous);
  if (e != cudaSuccess) return CudaInternal("cudaGetDevice", e);
  if (previous != device && (e = cudaSetDevice(device)) != cudaSuccess) {
    return CudaInternal("cudaSetDevice", e);
  }
  int blocks_per_sm = 0;
  e = v->prepare(smem, &blocks_per_sm);
  if (previous != device) (void)cudaSetDevice(previous);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
    (void)cudaGetLastError();
    return FailedPrecondition("decode: no kernel image for this device (compute capability " +
                              std::to_string(limits->compute_capability) + ")");
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaInternal("cudaFuncSetAttribute/occupancy", e);
  }
  if (blocks_per_sm < 1) return Internal("decode: the kernel cannot be resident on this device");

  PagedDecodePlan plan;
  plan.shape = shape;
  plan.device = device;
  plan.tile_tokens = decode::kTileTokens;
  plan.stages = decode::DecodeStages(kv_bytes);
  plan.smem_bytes = smem;
  plan.blocks_per_sm = blocks_per_sm;
  plan.sm_count = limits->sm_count;
  plan.launch = reinterpret_cast<const void*>(v->launch);
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  plan.row_chunks = std::max<int64_t>(
      1, (shape.max_q_len * group + decode::kRowsPerBlock - 1) / decode::kRowsPerBlock);
  const int64_t tiles =
      std::max<int64_t>(1, (shape.max_kv_len + decode::kTileTokens - 1) / decode::kTileTokens);
  const int64_t pairs = std::max<int64_t>(1, shape.batch * shape.num_kv_heads * plan.row_chunks);
  int64_t want = options.partitions > 0
                     ? std::min(options.partitions, tiles)
                     : ChoosePartitions(pairs, tiles,
                                        static_cast<int64_t>(limits->sm_count) * blocks_per_sm);
  const int64_t part_tiles = (tiles + want - 1) / want;
  plan.partitions = (tiles + part_tiles - 1) / part_tiles;
  plan.partition_tokens = part_tiles * decode::kTileTokens;
  plan.grid_blocks = shape.batch * shape.num_kv_heads * plan.row_chunks * plan.partitions;
  if (plan.partitions > 1) {
    const int64_t rows = shape.batch * shape.max_q_len * shape.num_heads * plan.partitions;
    const size_t o_bytes = ((static_cast<size_t>(rows * shape.head_dim) * 4 + 255) / 256) * 256;
    const size_t lse_bytes = ((static_cast<size_t>(rows) * 4 + 255) / 256) * 256;
    const int64_t counters = shape.batch * shape.num_kv_heads * plan.row_chunks;
    plan.counter_bytes = ((static_cast<size_t>(counters) * 4 + 255) / 256) * 256;
    plan.workspace_bytes = plan.counter_bytes + o_bytes + lse_bytes;
  }
  if (plan.row_chunks * plan.partitions > 0x7fffffff) {
    return InvalidArgument("decode: too many blocks for the grid");
  }
  return plan;
}

Status PagedDecodeRun(const PagedDecodePlan& plan, const PagedKvPool& pool,
                      const PagedBatch& batch, const DecodeQueries& queries, void* workspace,
                      cudaStream_t stream) {
  const PagedDecodeShape& s = plan.shape;
  if (plan.launch == nullptr) return InvalidArgument("decode: plan was not made by PagedDecodePlanFor");
  if (s.source != KvSource::kPaged) return InvalidArgument("decode: the plan is for contiguous K/V");
  if (batch.batch != s.batch) {
    return InvalidArgument("decode: batch.batch " + std::to_string(batch.batch) +
                           " differs from the plan's " + std::to_string(s.batch));
  }
  if (pool.num_kv_heads != s.num_kv_heads || pool.head_dim != s.head_dim ||
      pool.kv_dtype != s.kv_dtype || pool.page_tokens != s.page_tokens) {
    return InvalidArgument("decode: the pool (K " + std::to_string(pool.num_kv_heads) + ", H " +
                           std::to_string(pool.head_dim) + ", " + DTypeName(pool.kv_dtype) +
                           ", page " + std::to_string(pool.page_tokens) +
                           ") does not match the plan");
  }
  if (s.batch == 0 || s.num_heads == 0) return Status::Ok();
  ATTN_RETURN_IF_ERROR(CheckQueries(plan, queries));
  if (pool.k_pages == nullptr || pool.v_pages == nullptr || batch.block_tables == nullptr ||
      batch.kv_lengths == nullptr) {
    return InvalidArgument("decode: pages, block tables and kv_lengths must be non-null");
  }
  if (reinterpret_cast<uintptr_t>(pool.k_pages) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(pool.v_pages) % 16 != 0) {
    return InvalidArgument("decode: pages must be 16-byte aligned");
  }
  if (s.kv_dtype == DType::kFloat8E4M3 && (batch.k_scales == nullptr || batch.v_scales == nullptr)) {
    return InvalidArgument("decode: FP8 pages need k_scales and v_scales");
  }
  DecodeParams p;
  p.k = pool.k_pages;
  p.v = pool.v_pages;
  p.block_tables = batch.block_tables;
  p.bt_stride = batch.block_table_stride;
  p.kv_lengths = batch.kv_lengths;
  p.k_scales = batch.k_scales;
  p.v_scales = batch.v_scales;
  p.page_shift = Log2(s.page_tokens);
  return Launch(plan, p, queries, workspace, stream);
}

Status ContiguousDecodeRun(const PagedDecodePlan& plan, const ContiguousKv& kv,
                           const DecodeQueries& queries, void* workspace, cudaStream_t stream) {
  const PagedDecodeShape& s = plan.shape;
  if (plan.launch == nullptr) return InvalidArgument("decode: plan was not made by PagedDecodePlanFor");
  if (s.source != KvSource::kContiguous) return InvalidArgument("decode: the plan is for paged K/V");
  if (s.batch == 0 || s.num_heads == 0) return Status::Ok();
  ATTN_RETURN_IF_ERROR(CheckQueries(plan, queries));
  if (kv.k == nullptr || kv.v == nullptr || kv.kv_lengths == nullptr) {
    return InvalidArgument("decode: k, v and kv_lengths must be non-null");
  }
  if (kv.capacity < s.max_kv_len) {
    return InvalidArgument("decode: capacity " + std::to_string(kv.capacity) +
                           " is below max_kv_len " + std::to_string(s.max_kv_len));
  }
  if (reinterpret_cast<uintptr_t>(kv.k) % 16 != 0 || reinterpret_cast<uintptr_t>(kv.v) % 16 != 0) {
    return InvalidArgument("decode: k and v must be 16-byte aligned");
  }
  if (s.kv_dtype == DType::kFloat8E4M3 && (kv.k_scales == nullptr || kv.v_scales == nullptr)) {
    return InvalidArgument("decode: FP8 K/V need k_scales and v_scales");
  }
  DecodeParams p;
  p.k = kv.k;
  p.v = kv.v;
  p.block_tables = nullptr;
  p.capacity = kv.capacity;
  p.kv_lengths = kv.kv_lengths;
  p.k_scales = kv.k_scales;
  p.v_scales = kv.v_scales;
  return Launch(plan, p, queries, workspace, stream);
}

}  // namespace attn::kernels
