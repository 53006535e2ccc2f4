// Fp8AttentionSupports / Fp8AttentionPlanFor / Fp8AttentionRun: host side of our FP8 kernel.
#include "attn/kernels/fp8_attention.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "attn/kernels/device_limits.h"
#include "fp8_params.h"

namespace attn::kernels {
namespace {

using fp8::Fp8LaunchFn;
using fp8::Fp8Params;
using fp8::Fp8PrepareFn;
using fp8::Fp8TransposeFn;

struct Variant {
  int head_dim, block_m, block_n, warps;
  Fp8LaunchFn launch;
  Fp8PrepareFn prepare;
  Fp8TransposeFn transpose;
};

#define ATTN_FP8_TABLE_ROW(H, BM, BN, W)                                                       \
  Variant{H, BM, BN, W, &fp8::Fp8Launch<H, BM, BN, W>, &fp8::Fp8Prepare<H, BM, BN, W>,         \
          &fp8::Fp8TransposeV<H>},
const Variant kVariants[] = {ATTN_FP8_ALL_VARIANTS(ATTN_FP8_TABLE_ROW)};
#undef ATTN_FP8_TABLE_ROW

const Variant* FindVariant(int64_t head_dim, int index) {
  int seen = 0;
  for (const Variant& v : kVariants) {
    if (v.head_dim != head_dim) continue;
    if (seen++ == index) return &v;
  }
  return nullptr;
}

// Default variant per head dim, for the L4 (sm_89, the production target of this kernel):
//   H=64:  v1 128x64/4w (32-row warps): 234 registers, no spill on sm_89; fastest of the H=64
//          variants on every shape measured (below), by 9-17 %.
//   H=128: v1 128x64/8w (16-row warps): 205 registers, no spill on sm_89. v2 (128x64/4w) was
//          up to 6 % faster in the measurement below but spills 60 bytes per thread on sm_89
//          (255 registers), v0 (128x128/8w) was never faster.
// Measurement: H200, L4 build (sm_89 PTX JIT-compiled; bench/NOTES.md "FP8 kernel",
// bench/results/nvidia-h200-2026-11-29-fp8-l4build-quick.jsonl). CAVEAT: Hopper has no native
// e4m3 mma.sync (ptxas lowers m16n8k32 e4m3 to F2FP unpacks + two f16 HMMA.16816 + FADDs on
// sm_90), so that ranking is for the emulated path; on a real L4 the MMAs are native QMMA and
// the choice must be re-measured there.
int DefaultVariant(int64_t /*head_dim*/) { return 1; }

Status CudaInternal(const char* what, cudaError_t e) {
  return Internal(std::string("fp8: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

std::string CcString(int cc) { return std::to_string(cc / 100) + "." + std::to_string(cc % 100 / 10); }

}  // namespace

std::string Fp8AttentionPlan::Describe() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "fp8 h%lld v%d bm%d bn%d w%d smem%d",
                static_cast<long long>(shape.head_dim), variant, block_m, block_n, warps,
                smem_bytes);
  return buf;
}

int Fp8AttentionVariantCount(int64_t head_dim) {
  int n = 0;
  for (const Variant& v : kVariants) n += v.head_dim == head_dim ? 1 : 0;
  return n;
}

Status Fp8AttentionSupports(const AttentionShape& s, int compute_capability) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return FailedPrecondition(std::string("fp8: output dtype ") + DTypeName(s.dtype) +
                              " is not supported (float16 and bfloat16; q, k, v are e4m3)");
  }
  if (s.head_dim <= 0 || s.num_heads <= 0 || s.num_kv_heads <= 0) {
    return InvalidArgument("fp8: head_dim, num_heads and num_kv_heads must be positive");
  }
  if (Fp8AttentionVariantCount(s.head_dim) == 0) {
    return FailedPrecondition(
        "fp8: head dim " + std::to_string(s.head_dim) +
        " is not supported (64 and 128 only: the e4m3 MMA consumes 32 head-dim values per step "
        "and the kernel's tiles are instantiated for 64- and 128-byte rows)");
  }
  if (compute_capability != 0 && compute_capability < 890) {
    return FailedPrecondition("fp8: needs compute capability 8.9 or newer for the e4m3 "
                              "tensor-core MMA (device has " +
                              CcString(compute_capability) + ")");
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return InvalidArgument("fp8: num_heads " + std::to_string(s.num_heads) +
                           " is not a multiple of num_kv_heads " +
                           std::to_string(s.num_kv_heads));
  }
  if (!(s.scale > 0.f) || !std::isfinite(s.scale)) {
    return FailedPrecondition("fp8: the softmax scale must be positive and finite (got " +
                              std::to_string(s.scale) + ")");
  }
  if (s.batch < 0 || s.max_q_len < 0 || s.max_kv_len < 0 || s.total_q < 0 || s.total_kv < 0) {
    return InvalidArgument("fp8: negative sizes");
  }
  if (s.batch > 65535 || s.num_heads > 65535) {
    return InvalidArgument("fp8: batch and num_heads must be at most 65535 (grid limits)");
  }
  constexpr int64_t kMaxLen = int64_t{1} << 30;
  if (s.max_q_len >= kMaxLen || s.max_kv_len >= kMaxLen) {
    return InvalidArgument("fp8: max_q_len and max_kv_len must be below 2^30");
  }
  if (s.layout != Layout::kPadded && s.layout != Layout::kVarlen) {
    return InvalidArgument("fp8: unknown layout");
  }
  return Status::Ok();
}

int64_t Fp8AttentionWorkspaceBytes(const AttentionShape& s) {
  if (s.batch <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0) return 0;
  const bool varlen = s.layout == Layout::kVarlen;
  return s.num_kv_heads * s.head_dim *
         fp8::VtRowLen(varlen, s.batch, s.max_kv_len, s.total_kv);
}

StatusOr<Fp8AttentionPlan> Fp8AttentionPlanFor(const AttentionShape& shape, int device,
                                               const Fp8AttentionPlanOptions& options) {
  ATTN_RETURN_IF_ERROR(Fp8AttentionSupports(shape));
  const int count = Fp8AttentionVariantCount(shape.head_dim);
  if (options.variant < -1 || options.variant >= count) {
    return InvalidArgument("fp8: variant " + std::to_string(options.variant) +
                           " out of range for head dim " + std::to_string(shape.head_dim) +
                           " (" + std::to_string(count) + " variants)");
  }
  StatusOr<DeviceLimits> limits = GetDeviceLimits(device);
  if (!limits.ok()) return limits.status();
  ATTN_RETURN_IF_ERROR(Fp8AttentionSupports(shape, limits->compute_capability));
  const int index = options.variant < 0 ? DefaultVariant(shape.head_dim) : options.variant;
  const Variant* v = FindVariant(shape.head_dim, index);
  const int smem = fp8::Fp8SmemBytes(v->head_dim, v->block_m, v->block_n);
  if (smem > limits->max_dynamic_smem_per_block_bytes) {
    return FailedPrecondition(
        "fp8: tile bm" + std::to_string(v->block_m) + " bn" + std::to_string(v->block_n) +
        " h" + std::to_string(v->head_dim) + " needs " + std::to_string(smem) +
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
  e = v->prepare(smem);
  if (previous != device) (void)cudaSetDevice(previous);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
    (void)cudaGetLastError();
    return FailedPrecondition("fp8: no kernel image for this device (compute capability " +
                              CcString(limits->compute_capability) +
                              "; the build's CMAKE_CUDA_ARCHITECTURES lacks it)");
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaInternal("cudaFuncSetAttribute", e);
  }

  Fp8AttentionPlan plan;
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
  plan.workspace_bytes = Fp8AttentionWorkspaceBytes(shape);
  plan.launch = reinterpret_cast<const void*>(v->launch);
  plan.transpose = reinterpret_cast<const void*>(v->transpose);
  return plan;
}

Status Fp8AttentionRun(const Fp8AttentionPlan& plan, const AttentionTensors& t,
                       const Fp8Descales& descales, void* workspace, int64_t workspace_bytes,
                       cudaStream_t stream) {
  const AttentionShape& s = plan.shape;
  if (plan.launch == nullptr || plan.transpose == nullptr) {
    return InvalidArgument("fp8: plan was not made by Fp8AttentionPlanFor");
  }
  if (plan.grid_x == 0 || plan.grid_y == 0 || plan.grid_z == 0) return Status::Ok();
  if (t.q == nullptr || t.k == nullptr || t.v == nullptr || t.o == nullptr) {
    return InvalidArgument("fp8: q, k, v and o must be non-null device pointers");
  }
  if (descales.q == nullptr || descales.k == nullptr || descales.v == nullptr) {
    return InvalidArgument("fp8: the q, k and v descales must be non-null device pointers");
  }
  if (s.return_lse && t.lse == nullptr) {
    return InvalidArgument("fp8: return_lse is set but lse is null");
  }
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(t.q) || misaligned(t.k) || misaligned(t.v) || misaligned(t.o)) {
    return InvalidArgument("fp8: q, k, v and o must be 16-byte aligned");
  }
  if (workspace_bytes < plan.workspace_bytes || (plan.workspace_bytes > 0 && !workspace) ||
      misaligned(workspace)) {
    return InvalidArgument("fp8: the workspace must be 16-byte aligned device memory of at least " +
                           std::to_string(plan.workspace_bytes) + " bytes (got " +
                           std::to_string(workspace_bytes) + ")");
  }
  const bool varlen = s.layout == Layout::kVarlen;
  if (varlen && (t.q_offsets == nullptr || t.kv_offsets == nullptr)) {
    return InvalidArgument("fp8: varlen needs q_offsets and kv_offsets");
  }

  Fp8Params p;
  p.q = static_cast<const uint8_t*>(t.q);
  p.k = static_cast<const uint8_t*>(t.k);
  p.v = static_cast<const uint8_t*>(t.v);
  p.vt = static_cast<uint8_t*>(workspace);
  p.o = t.o;
  p.lse = s.return_lse ? t.lse : nullptr;
  p.q_descale = descales.q;
  p.k_descale = descales.k;
  p.v_descale = descales.v;
  p.q_lengths = (!varlen && s.has_lengths) ? t.q_lengths : nullptr;
  p.kv_lengths = (!varlen && s.has_lengths) ? t.kv_lengths : nullptr;
  p.q_offsets = varlen ? t.q_offsets : nullptr;
  p.kv_offsets = varlen ? t.kv_offsets : nullptr;
  p.q_row_stride = s.num_heads * s.head_dim;
  p.kv_row_stride = s.num_kv_heads * s.head_dim;
  p.total_q = varlen ? s.total_q : s.batch * s.max_q_len;
  p.vt_row_len = fp8::VtRowLen(varlen, s.batch, s.max_kv_len, s.total_kv);
  p.batch = static_cast<int32_t>(s.batch);
  p.max_q_len = static_cast<int32_t>(s.max_q_len);
  p.max_kv_len = static_cast<int32_t>(s.max_kv_len);
  p.num_heads = static_cast<int32_t>(s.num_heads);
  p.num_kv_heads = static_cast<int32_t>(s.num_kv_heads);
  p.group_size = static_cast<int32_t>(s.num_heads / s.num_kv_heads);
  p.num_m_blocks = static_cast<int32_t>(plan.grid_x);
  p.varlen = varlen ? 1 : 0;
  p.out_bf16 = s.dtype == DType::kBFloat16 ? 1 : 0;
  p.scale = s.scale;
  p.mask = s.mask;

  cudaError_t e = reinterpret_cast<Fp8TransposeFn>(plan.transpose)(p, stream);
  if (e != cudaSuccess) return CudaInternal("V transpose launch", e);
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y),
                  static_cast<unsigned>(plan.grid_z));
  e = reinterpret_cast<Fp8LaunchFn>(plan.launch)(p, grid, plan.smem_bytes, stream);
  if (e != cudaSuccess) return CudaInternal("kernel launch", e);
  return Status::Ok();
}

}  // namespace attn::kernels
