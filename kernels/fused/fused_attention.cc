// FusedSupports / FusedPlanFor / FusedRun: host side of the fused family.
#include "attn/kernels/fused_attention.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "attn/kernels/device_limits.h"
#include "fused_params.h"

namespace attn::kernels {
namespace {

using fused::FusedLaunchFn;
using fused::FusedParams;
using fused::FusedPrepareFn;

struct Variant {
  int head_dim, block_m, block_n, warps;
  FusedLaunchFn launch_f16, launch_bf16;
  FusedPrepareFn prepare_f16, prepare_bf16;
};

constexpr int kF16 = static_cast<int>(DType::kFloat16);
constexpr int kBF16 = static_cast<int>(DType::kBFloat16);

#define ATTN_FUSED_TABLE_ROW(H, BM, BN, W)                                                     \
  Variant{H,                                                                                   \
          BM,                                                                                  \
          BN,                                                                                  \
          W,                                                                                   \
          &fused::FusedLaunch<kF16, H, BM, BN, W>,                                             \
          &fused::FusedLaunch<kBF16, H, BM, BN, W>,                                            \
          &fused::FusedPrepare<kF16, H, BM, BN, W>,                                            \
          &fused::FusedPrepare<kBF16, H, BM, BN, W>},
const Variant kVariants[] = {ATTN_FUSED_ALL_VARIANTS(ATTN_FUSED_TABLE_ROW)};
#undef ATTN_FUSED_TABLE_ROW
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

/// The `index`-th variant of `head_dim`, or null.
const Variant* FindVariant(int64_t head_dim, int index) {
  int seen = 0;
  for (const Variant& v : kVariants) {
    if (v.head_dim != head_dim) continue;
    if (seen++ == index) return &v;
  }
  return nullptr;
}

/// Index of the variant with this tile among `head_dim`'s variants, or -1.
int VariantIndexOf(int64_t head_dim, int block_m, int block_n, int warps) {
  int seen = 0;
  for (const Variant& v : kVariants) {
    if (v.head_dim != head_dim) continue;
    if (v.block_m == block_m && v.block_n == block_n && v.warps == warps) return seen;
    ++seen;
  }
  return -1;
}

// ---- Default tile variant by shape (FusedPlanOptions::variant == -1) ------------------------
// Source: bench/results/nvidia-h200-2026-11-29.json (H200, 132 SMs, bf16; every variant timed
// side by side by scripts/fused_bench.sh; table in bench/NOTES.md). What decides the winner:
//   - 32-row warps (BM = 128 with 4 warps) beat 16-row warps wherever the grid is large: each
//     K/V ldmatrix feeds twice as many MMAs, and ldmatrix bandwidth is what limits 16-row warps
//     (H=64: 128x64/4w 285-311 TFLOP/s vs 128x128/8w 242-279 on suite b, all 6 shapes).
//   - With few blocks per SM, 64-row blocks win: twice as many blocks to spread over the SMs,
//     and, under a causal mask, finer-grained work (block costs differ by up to BM/T) that
//     balances better. Load measure: L = ceil(T / 128) · N · B / SMs, the blocks per SM a
//     128-row tiling would give. H=64 measurements (suite a: B=4, N=8; suite b: L = 31):
//       non-causal: L = 0.97 (T=512): 64x128 165.7 vs 128x64 147.0;  L = 1.94 (T=1024):
//                   128x64 245.9 vs 64x128 227.6                       -> threshold 1.5
//       causal:     L = 7.8 (T=4096): 64x128 239.1 vs 128x64 233.5;    L = 15.5 (T=8192):
//                   128x64 275.0 vs 64x128 267.8; L = 31 (suite b): 128x64 by 7-10 %
//                                                                      -> threshold 12
//     Both candidates hold 2 blocks per SM (4 warps, <= 255 registers, <= 96 KB), at H=128
//     too, so the same thresholds are used there.
//   - H=128: today's measurement has 64x64/4w (16-row) best on every shape (it was the only
//     4-warp candidate). 128x64/4w (32-row, FA2's tile for H=128) is new in round 2 and
//     predicted to win wherever 128x64/4w wins at H=64 (bench/NOTES.md, "Round 2
//     prediction"): PREDICTION, to be confirmed by the next benchmark run; if 128x32/4w (v3)
//     measures faster, change its row below.
// Rules are tried in order; the first whose head dim and mask kind match and whose load is
// below max_load wins. Head dims without a rule use their only variant (index 0).
struct DefaultRule {
  int head_dim;
  bool causal;      ///< applies to causally masked shapes (true) or unmasked/windowed (false)
  double max_load;  ///< applies while L < max_load
  int block_m, block_n, warps;
};
constexpr double kAlways = 1e300;
constexpr DefaultRule kDefaultRules[] = {
    {64, false, 1.5, 64, 128, 4},      // measured
    {64, false, kAlways, 128, 64, 4},  // measured
    {64, true, 12.0, 64, 128, 4},      // measured
    {64, true, kAlways, 128, 64, 4},   // measured
    {128, false, 1.5, 64, 64, 4},      // measured best today; threshold from H=64
    {128, false, kAlways, 128, 64, 4}, // predicted (round 2)
    {128, true, 12.0, 64, 64, 4},      // measured best today; threshold from H=64
    {128, true, kAlways, 128, 64, 4},  // predicted (round 2)
};

Status CudaInternal(const char* what, cudaError_t e) {
  return Internal(std::string("fused: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

/// The device checks every plan makes (compute capability, shared memory) and the kernel's
/// dynamic shared memory attribute on `device`, raised through `prepare`.
Status PrepareOnDevice(int device, const DeviceLimits& limits, int head_dim, int block_m,
                       int block_n, int smem, FusedPrepareFn prepare) {
  if (limits.compute_capability < 800) {
    return FailedPrecondition("fused: needs compute capability 8.0 or newer (device " +
                              std::to_string(device) + " has " +
                              std::to_string(limits.compute_capability / 100) + "." +
                              std::to_string(limits.compute_capability % 100 / 10) + ")");
  }
  if (smem > limits.max_dynamic_smem_per_block_bytes) {
    return FailedPrecondition(
        "fused: tile bm" + std::to_string(block_m) + " bn" + std::to_string(block_n) + " h" +
        std::to_string(head_dim) + " needs " + std::to_string(smem) +
        " bytes of shared memory per block, the device allows " +
        std::to_string(limits.max_dynamic_smem_per_block_bytes) +
        (limits.emulating_l4 ? " (L4 emulation)" : ""));
  }
  int previous = 0;
  cudaError_t e = cudaGetDevice(&previous);
  if (e != cudaSuccess) return CudaInternal("cudaGetDevice", e);
  if (previous != device && (e = cudaSetDevice(device)) != cudaSuccess) {
    return CudaInternal("cudaSetDevice", e);
  }
  e = prepare(smem);
  if (previous != device) (void)cudaSetDevice(previous);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
    (void)cudaGetLastError();
    return FailedPrecondition(
        "fused: no kernel image for this device (built for sm_89 and sm_90a; compute "
        "capability " +
        std::to_string(limits.compute_capability) + ")");
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaInternal("cudaFuncSetAttribute", e);
  }
  return Status::Ok();
}

// ---- Paged K/V variants (one per head dim: ATTN_FUSED_PAGED_ALL_VARIANTS) ------------------
using fused::FusedPagedLaunchFn;
using fused::FusedPagedParams;

struct PagedVariant {
  int head_dim, block_m, block_n, warps;
  FusedPagedLaunchFn launch_f16, launch_bf16;
  FusedPrepareFn prepare_f16, prepare_bf16;
};
#define ATTN_FUSED_PAGED_TABLE_ROW(H, BM, BN, W)                                               \
  PagedVariant{H,                                                                              \
               BM,                                                                             \
               BN,                                                                             \
               W,                                                                              \
               &fused::FusedPagedLaunch<kF16, H, BM, BN, W>,                                   \
               &fused::FusedPagedLaunch<kBF16, H, BM, BN, W>,                                  \
               &fused::FusedPagedPrepare<kF16, H, BM, BN, W>,                                  \
               &fused::FusedPagedPrepare<kBF16, H, BM, BN, W>},
const PagedVariant kPagedVariants[] = {ATTN_FUSED_PAGED_ALL_VARIANTS(ATTN_FUSED_PAGED_TABLE_ROW)};
#undef ATTN_FUSED_PAGED_TABLE_ROW

const PagedVariant* FindPagedVariant(int64_t head_dim) {
  for (const PagedVariant& v : kPagedVariants) {
    if (v.head_dim == head_dim) return &v;
  }
  return nullptr;
}

bool IsPow2InRange(int64_t n, int64_t max) { return n >= 1 && n <= max && (n & (n - 1)) == 0; }

int Log2(int64_t pow2) {
  int s = 0;
  while ((int64_t{1} << s) < pow2) ++s;
  return s;
}

/// The contiguous problem a paged shape computes (varlen, same mask): FusedSupports' checks.
AttentionShape ContiguousEquivalent(const FusedPagedShape& p) {
  AttentionShape s;
  s.layout = Layout::kVarlen;
  s.dtype = p.dtype;
  s.batch = p.batch;
  s.max_q_len = p.max_q_len;
  s.max_kv_len = p.max_kv_len;
  s.total_q = p.total_q;
  s.total_kv = 0;
  s.num_heads = p.num_heads;
  s.num_kv_heads = p.num_kv_heads;
  s.head_dim = p.head_dim;
  s.mask = p.mask;
  s.scale = p.scale;
  s.has_lengths = true;
  s.return_lse = p.return_lse;
  return s;
}

}  // namespace

std::string FusedPlan::Describe() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "fused h%lld v%d bm%d bn%d w%d smem%d",
                static_cast<long long>(shape.head_dim), variant, block_m, block_n, warps,
                smem_bytes);
  return buf;
}

int FusedDefaultVariant(const AttentionShape& shape, int sm_count) {
  const bool causal = shape.mask.causal != CausalAlignment::kNone;
  const double blocks128 = static_cast<double>((shape.max_q_len + 127) / 128) *
                           static_cast<double>(shape.num_heads) *
                           static_cast<double>(shape.batch);
  const double load = blocks128 / static_cast<double>(sm_count > 0 ? sm_count : 1);
  for (const DefaultRule& r : kDefaultRules) {
    if (r.head_dim != shape.head_dim || r.causal != causal || !(load < r.max_load)) continue;
    const int index = VariantIndexOf(r.head_dim, r.block_m, r.block_n, r.warps);
    if (index >= 0) return index;
  }
  return 0;
}

int FusedVariantCount(int64_t head_dim) {
  int n = 0;
  for (const Variant& v : kVariants) n += v.head_dim == head_dim ? 1 : 0;
  return n;
}

Status FusedSupports(const AttentionShape& s) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return FailedPrecondition(std::string("fused: dtype ") + DTypeName(s.dtype) +
                              " is not supported (float16 and bfloat16 only)");
  }
  if (s.head_dim <= 0 || s.num_heads <= 0 || s.num_kv_heads <= 0) {
    return InvalidArgument("fused: head_dim, num_heads and num_kv_heads must be positive");
  }
  if (FusedVariantCount(s.head_dim) == 0) {
    return FailedPrecondition("fused: head dim " + std::to_string(s.head_dim) +
                              " is not supported (32, 64, 80, 96, 128, 256)");
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return InvalidArgument("fused: num_heads " + std::to_string(s.num_heads) +
                           " is not a multiple of num_kv_heads " +
                           std::to_string(s.num_kv_heads));
  }
  if (!(s.scale > 0.f) || !std::isfinite(s.scale)) {
    return FailedPrecondition("fused: the softmax scale must be positive and finite (got " +
                              std::to_string(s.scale) + ")");
  }
  if (s.batch < 0 || s.max_q_len < 0 || s.max_kv_len < 0 || s.total_q < 0 || s.total_kv < 0) {
    return InvalidArgument("fused: negative sizes");
  }
  if (s.batch > 65535 || s.num_heads > 65535) {
    return InvalidArgument("fused: batch and num_heads must be at most 65535 (grid limits)");
  }
  constexpr int64_t kMaxLen = int64_t{1} << 30;
  if (s.max_q_len >= kMaxLen || s.max_kv_len >= kMaxLen) {
    return InvalidArgument("fused: max_q_len and max_kv_len must be below 2^30");
  }
  if (s.layout != Layout::kPadded && s.layout != Layout::kVarlen) {
    return InvalidArgument("fused: unknown layout");
  }
  return Status::Ok();
}

StatusOr<FusedPlan> FusedPlanFor(const AttentionShape& shape, int device,
                                 const FusedPlanOptions& options) {
  ATTN_RETURN_IF_ERROR(FusedSupports(shape));
  const int count = FusedVariantCount(shape.head_dim);
  if (options.variant < -1 || options.variant >= count) {
    return InvalidArgument("fused: variant " + std::to_string(options.variant) +
                           " out of range for head dim " + std::to_string(shape.head_dim) +
                           " (" + std::to_string(count) + " variants)");
  }
  StatusOr<DeviceLimits> limits = GetDeviceLimits(device);
  if (!limits.ok()) return limits.status();
  const int index =
      options.variant < 0 ? FusedDefaultVariant(shape, limits->sm_count) : options.variant;
  const Variant* v = FindVariant(shape.head_dim, index);
  const int smem = fused::FusedSmemBytes(v->head_dim, v->block_m, v->block_n);
  const bool bf16 = shape.dtype == DType::kBFloat16;
  ATTN_RETURN_IF_ERROR(PrepareOnDevice(device, *limits, v->head_dim, v->block_m, v->block_n,
                                       smem, bf16 ? v->prepare_bf16 : v->prepare_f16));

  FusedPlan plan;
  plan.shape = shape;
  plan.device = device;
  plan.variant = index;
  plan.block_m = v->block_m;
  plan.block_n = v->block_n;
  plan.warps = v->warps;
  plan.smem_bytes = smem;
  plan.grid_x = (shape.max_q_len + v->block_m - 1) / v->block_m;
  plan.grid_y = shape.num_heads;
  plan.grid_z = shape.batch;
  plan.launch = reinterpret_cast<const void*>(bf16 ? v->launch_bf16 : v->launch_f16);
  return plan;
}

Status FusedRun(const FusedPlan& plan, const AttentionTensors& t, cudaStream_t stream) {
  const AttentionShape& s = plan.shape;
  if (plan.launch == nullptr) return InvalidArgument("fused: plan was not made by FusedPlanFor");
  if (plan.grid_x == 0 || plan.grid_y == 0 || plan.grid_z == 0) return Status::Ok();
  if (t.q == nullptr || t.k == nullptr || t.v == nullptr || t.o == nullptr) {
    return InvalidArgument("fused: q, k, v and o must be non-null device pointers");
  }
  if (s.return_lse && t.lse == nullptr) {
    return InvalidArgument("fused: return_lse is set but lse is null");
  }
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(t.q) || misaligned(t.k) || misaligned(t.v) || misaligned(t.o)) {
    return InvalidArgument("fused: q, k, v and o must be 16-byte aligned");
  }
  const bool varlen = s.layout == Layout::kVarlen;
  if (varlen && (t.q_offsets == nullptr || t.kv_offsets == nullptr)) {
    return InvalidArgument("fused: varlen needs q_offsets and kv_offsets");
  }

  FusedParams p;
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.o = t.o;
  p.lse = s.return_lse ? t.lse : nullptr;
  p.q_lengths = (!varlen && s.has_lengths) ? t.q_lengths : nullptr;
  p.kv_lengths = (!varlen && s.has_lengths) ? t.kv_lengths : nullptr;
  p.q_offsets = varlen ? t.q_offsets : nullptr;
  p.kv_offsets = varlen ? t.kv_offsets : nullptr;
  p.q_row_stride = s.num_heads * s.head_dim;
  p.kv_row_stride = s.num_kv_heads * s.head_dim;
  p.total_q = varlen ? s.total_q : s.batch * s.max_q_len;
  p.max_q_len = static_cast<int32_t>(s.max_q_len);
  p.max_kv_len = static_cast<int32_t>(s.max_kv_len);
  p.num_heads = static_cast<int32_t>(s.num_heads);
  p.group_size = static_cast<int32_t>(s.num_heads / s.num_kv_heads);
  p.num_m_blocks = static_cast<int32_t>(plan.grid_x);
  p.varlen = varlen ? 1 : 0;
  p.scale = s.scale;
  p.scale_log2 = static_cast<float>(static_cast<double>(s.scale) * 1.4426950408889634);
  p.mask = s.mask;

  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y),
                  static_cast<unsigned>(plan.grid_z));
  const auto launch = reinterpret_cast<FusedLaunchFn>(plan.launch);
  const cudaError_t e = launch(p, grid, plan.smem_bytes, stream);
  if (e != cudaSuccess) return CudaInternal("kernel launch", e);
  return Status::Ok();
}

// ---- Paged K/V ----------------------------------------------------------------------------

std::string FusedPagedPlan::Describe() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "fused-paged %s h%lld bm%d bn%d w%d pt%lld smem%d",
                DTypeName(shape.dtype), static_cast<long long>(shape.head_dim), block_m, block_n,
                warps, static_cast<long long>(shape.page_tokens), smem_bytes);
  return buf;
}

Status FusedPagedSupports(const FusedPagedShape& s) {
  if (s.kv_dtype == DType::kFloat8E4M3) {
    return Unimplemented(
        "fused paged: FP8 E4M3 pages are not implemented (16-bit pages in the query dtype "
        "only); FP8 pages run on the paged decode kernels");
  }
  if (s.kv_dtype != s.dtype) {
    return InvalidArgument(std::string("fused paged: kv dtype ") + DTypeName(s.kv_dtype) +
                           " must be the query dtype " + DTypeName(s.dtype));
  }
  if (s.head_dim > 0 && FindPagedVariant(s.head_dim) == nullptr) {
    return Unimplemented("fused paged: head dim " + std::to_string(s.head_dim) +
                         " is not implemented (paged K/V is compiled for head dims 64 and 128)");
  }
  ATTN_RETURN_IF_ERROR(FusedSupports(ContiguousEquivalent(s)));
  if (!IsPow2InRange(s.page_tokens, 65536)) {
    return InvalidArgument("fused paged: page_tokens " + std::to_string(s.page_tokens) +
                           " must be a power of two in [1, 65536]");
  }
  if (s.total_q < 0) return InvalidArgument("fused paged: negative total_q");
  return Status::Ok();
}

StatusOr<FusedPagedPlan> FusedPagedPlanFor(const FusedPagedShape& shape, int device) {
  ATTN_RETURN_IF_ERROR(FusedPagedSupports(shape));
  const PagedVariant* v = FindPagedVariant(shape.head_dim);
  const int index = VariantIndexOf(v->head_dim, v->block_m, v->block_n, v->warps);
  if (index < 0) return Internal("fused paged: the paged tile is not a contiguous variant");
  StatusOr<DeviceLimits> limits = GetDeviceLimits(device);
  if (!limits.ok()) return limits.status();
  const int smem = fused::FusedSmemBytes(v->head_dim, v->block_m, v->block_n);
  const bool bf16 = shape.dtype == DType::kBFloat16;
  ATTN_RETURN_IF_ERROR(PrepareOnDevice(device, *limits, v->head_dim, v->block_m, v->block_n,
                                       smem, bf16 ? v->prepare_bf16 : v->prepare_f16));
  FusedPagedPlan plan;
  plan.shape = shape;
  plan.device = device;
  plan.variant = index;
  plan.block_m = v->block_m;
  plan.block_n = v->block_n;
  plan.warps = v->warps;
  plan.smem_bytes = smem;
  plan.grid_x = (shape.max_q_len + v->block_m - 1) / v->block_m;
  plan.grid_y = shape.num_heads;
  plan.grid_z = shape.batch;
  plan.launch = reinterpret_cast<const void*>(bf16 ? v->launch_bf16 : v->launch_f16);
  return plan;
}

Status FusedPagedRun(const FusedPagedPlan& plan, const PagedKvPool& pool, const PagedBatch& batch,
                     const FusedPagedQueries& q, cudaStream_t stream) {
  const FusedPagedShape& s = plan.shape;
  if (plan.launch == nullptr) {
    return InvalidArgument("fused paged: plan was not made by FusedPagedPlanFor");
  }
  if (batch.batch != s.batch) {
    return InvalidArgument("fused paged: batch.batch " + std::to_string(batch.batch) +
                           " differs from the plan's " + std::to_string(s.batch));
  }
  if (pool.num_kv_heads != s.num_kv_heads || pool.head_dim != s.head_dim ||
      pool.kv_dtype != s.kv_dtype || pool.page_tokens != s.page_tokens) {
    return InvalidArgument("fused paged: the pool (K " + std::to_string(pool.num_kv_heads) +
                           ", H " + std::to_string(pool.head_dim) + ", " +
                           DTypeName(pool.kv_dtype) + ", page " +
                           std::to_string(pool.page_tokens) + ") does not match the plan");
  }
  if (plan.grid_x == 0 || plan.grid_y == 0 || plan.grid_z == 0) return Status::Ok();
  if (q.q == nullptr || q.o == nullptr || q.q_offsets == nullptr) {
    return InvalidArgument("fused paged: q, o and q_offsets must be non-null device pointers");
  }
  if (s.return_lse && q.lse == nullptr) {
    return InvalidArgument("fused paged: return_lse is set but lse is null");
  }
  if (pool.k_pages == nullptr || pool.v_pages == nullptr || batch.block_tables == nullptr ||
      batch.kv_lengths == nullptr) {
    return InvalidArgument("fused paged: pages, block tables and kv_lengths must be non-null");
  }
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(q.q) || misaligned(q.o) || misaligned(pool.k_pages) ||
      misaligned(pool.v_pages)) {
    return InvalidArgument("fused paged: q, o and the pages must be 16-byte aligned");
  }

  FusedPagedParams p;
  p.q = q.q;
  p.k = pool.k_pages;
  p.v = pool.v_pages;
  p.o = q.o;
  p.lse = s.return_lse ? q.lse : nullptr;
  p.kv_lengths = batch.kv_lengths;
  p.q_offsets = q.q_offsets;
  p.q_row_stride = s.num_heads * s.head_dim;
  p.total_q = s.total_q;
  p.max_q_len = static_cast<int32_t>(s.max_q_len);
  p.max_kv_len = static_cast<int32_t>(s.max_kv_len);
  p.num_heads = static_cast<int32_t>(s.num_heads);
  p.group_size = static_cast<int32_t>(s.num_heads / s.num_kv_heads);
  p.num_m_blocks = static_cast<int32_t>(plan.grid_x);
  p.varlen = 1;
  p.scale = s.scale;
  p.scale_log2 = static_cast<float>(static_cast<double>(s.scale) * 1.4426950408889634);
  p.mask = s.mask;
  p.block_tables = batch.block_tables;
  p.bt_stride = batch.block_table_stride;
  p.page_shift = Log2(s.page_tokens);
  p.num_kv_heads = static_cast<int32_t>(s.num_kv_heads);

  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y),
                  static_cast<unsigned>(plan.grid_z));
  const auto launch = reinterpret_cast<FusedPagedLaunchFn>(plan.launch);
  const cudaError_t e = launch(p, grid, plan.smem_bytes, stream);
  if (e != cudaSuccess) return CudaInternal("paged kernel launch", e);
  return Status::Ok();
}

}  // namespace attn::kernels
