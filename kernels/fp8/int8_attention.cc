// Int8AttentionSupports / Int8AttentionPlanFor / Int8AttentionRun: host side of the INT8 Q·Kᵀ
// modes of our 8-bit kernel (attn/kernels/int8_attention.h). Shape rules are the FP8 kernel's
// (Fp8AttentionSupports): the same kernel, tiles and grid.
#include "attn/kernels/int8_attention.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "attn/kernels/device_limits.h"
#include "attn/kernels/fp8_attention.h"
#include "fp8_params.h"

namespace attn::kernels {
namespace {

using fp8::Fp8LaunchFn;
using fp8::Fp8Params;
using fp8::Fp8PrepareFn;
using fp8::Fp8TransposeFn;

struct Variant {
  int pv16, head_dim, block_m, block_n, warps;
  Fp8LaunchFn launch;
  Fp8PrepareFn prepare;
  Fp8TransposeFn transpose;
};

#define ATTN_INT8_TABLE_ROW(PV16, H, BM, BN, W)                                                \
  Variant{PV16, H, BM, BN, W, &fp8::Int8Launch<PV16, H, BM, BN, W>,                            \
          &fp8::Int8Prepare<PV16, H, BM, BN, W>, &fp8::Fp8TransposeV<H>},
const Variant kVariants[] = {ATTN_INT8_ALL_VARIANTS(ATTN_INT8_TABLE_ROW)};
#undef ATTN_INT8_TABLE_ROW

int Pv16(Int8PvFormat pv) { return pv == Int8PvFormat::k16Bit ? 1 : 0; }

const Variant* FindVariant(Int8PvFormat pv, int64_t head_dim, int index) {
  int seen = 0;
  for (const Variant& v : kVariants) {
    if (v.head_dim != head_dim || v.pv16 != Pv16(pv)) continue;
    if (seen++ == index) return &v;
  }
  return nullptr;
}

int ModeOf(Int8PvFormat pv, DType dtype) {
  if (pv == Int8PvFormat::kE4M3) return fp8::kModeInt8E4M3Pv;
  return dtype == DType::kFloat16 ? fp8::kModeInt8F16Pv : fp8::kModeInt8Bf16Pv;
}

// Default variant: v0 everywhere (16-row warps, 128x64 tiles: Q fragments in registers, no
// spill at -warn-spills on sm_89). Not yet ranked by measurement: bench/int8_bench.cu times
// every variant (`int8/<pv>/v<i>`); re-rank there, on an L4 for the E4M3 P·V variants.
int DefaultVariant(Int8PvFormat /*pv*/, int64_t /*head_dim*/) { return 0; }

Status CudaInternal(const char* what, cudaError_t e) {
  return Internal(std::string("int8: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

std::string CcString(int cc) {
  return std::to_string(cc / 100) + "." + std::to_string(cc % 100 / 10);
}

bool Misaligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; }

}  // namespace

std::string Int8AttentionPlan::Describe() const {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "int8 %s-pv h%lld v%d bm%d bn%d w%d smem%d",
                pv == Int8PvFormat::kE4M3 ? "e4m3" : "16bit",
                static_cast<long long>(shape.head_dim), variant, block_m, block_n, warps,
                smem_bytes);
  return buf;
}

int Int8AttentionVariantCount(Int8PvFormat pv, int64_t head_dim) {
  int n = 0;
  for (const Variant& v : kVariants) n += (v.head_dim == head_dim && v.pv16 == Pv16(pv)) ? 1 : 0;
  return n;
}

Status Int8AttentionSupports(const AttentionShape& s, Int8PvFormat pv, int compute_capability) {
  if (pv != Int8PvFormat::kE4M3 && pv != Int8PvFormat::k16Bit) {
    return InvalidArgument("int8: unknown P·V format");
  }
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return FailedPrecondition(std::string("int8: dtype ") + DTypeName(s.dtype) +
                              " is not supported (float16 and bfloat16: the output and, for "
                              "16-bit P·V, v; q and k are int8)");
  }
  // The rest are the FP8 kernel's rules (same kernel, tiles, grid and device floor).
  const Status st = Fp8AttentionSupports(s, compute_capability);
  if (!st.ok()) return Status(st.code(), "int8 (8-bit kernel): " + st.message());
  if (Int8AttentionVariantCount(pv, s.head_dim) == 0) {
    return FailedPrecondition("int8: head dim " + std::to_string(s.head_dim) +
                              " has no " + Int8PvFormatName(pv) + " P·V variant (64 and 128)");
  }
  return Status::Ok();
}

int64_t Int8AttentionWorkspaceBytes(const AttentionShape& s, Int8PvFormat pv) {
  return pv == Int8PvFormat::kE4M3 ? Fp8AttentionWorkspaceBytes(s) : 0;
}

StatusOr<Int8AttentionPlan> Int8AttentionPlanFor(const AttentionShape& shape, int device,
                                                 const Int8AttentionPlanOptions& options) {
  ATTN_RETURN_IF_ERROR(Int8AttentionSupports(shape, options.pv));
  const int count = Int8AttentionVariantCount(options.pv, shape.head_dim);
  if (options.variant < -1 || options.variant >= count) {
    return InvalidArgument("int8: variant " + std::to_string(options.variant) +
                           " out of range for head dim " + std::to_string(shape.head_dim) +
                           " (" + std::to_string(count) + " variants)");
  }
  StatusOr<DeviceLimits> limits = GetDeviceLimits(device);
  if (!limits.ok()) return limits.status();
  ATTN_RETURN_IF_ERROR(Int8AttentionSupports(shape, options.pv, limits->compute_capability));
  const int index =
      options.variant < 0 ? DefaultVariant(options.pv, shape.head_dim) : options.variant;
  const Variant* v = FindVariant(options.pv, shape.head_dim, index);
  const int smem = fp8::EightBitSmemBytes(ModeOf(options.pv, shape.dtype), v->head_dim,
                                          v->block_m, v->block_n);
  if (smem > limits->max_dynamic_smem_per_block_bytes) {
    return FailedPrecondition(
        "int8: tile bm" + std::to_string(v->block_m) + " bn" + std::to_string(v->block_n) +
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
    return FailedPrecondition("int8: no kernel image for this device (compute capability " +
                              CcString(limits->compute_capability) +
                              "; the build's CMAKE_CUDA_ARCHITECTURES lacks it)");
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaInternal("cudaFuncSetAttribute", e);
  }
  Int8AttentionPlan plan;
  plan.shape = shape;
  plan.device = device;
  plan.pv = options.pv;
  plan.variant = index;
  plan.block_m = v->block_m;
  plan.block_n = v->block_n;
  plan.warps = v->warps;
  plan.smem_bytes = smem;
  plan.grid_x = (shape.max_q_len + v->block_m - 1) / v->block_m;
  plan.grid_y = shape.num_heads;
  plan.grid_z = shape.batch;
  plan.workspace_bytes = Int8AttentionWorkspaceBytes(shape, options.pv);
  plan.launch = reinterpret_cast<const void*>(v->launch);
  plan.transpose = reinterpret_cast<const void*>(v->transpose);
  return plan;
}

Status Int8AttentionRun(const Int8AttentionPlan& plan, const AttentionTensors& t,
                        const Int8Scales& scales, void* workspace, int64_t workspace_bytes,
                        cudaStream_t stream) {
  const AttentionShape& s = plan.shape;
  const bool e4m3 = plan.pv == Int8PvFormat::kE4M3;
  if (plan.launch == nullptr || plan.transpose == nullptr) {
    return InvalidArgument("int8: plan was not made by Int8AttentionPlanFor");
  }
  if (plan.grid_x == 0 || plan.grid_y == 0 || plan.grid_z == 0) return Status::Ok();
  if (t.q == nullptr || t.k == nullptr || t.v == nullptr || t.o == nullptr) {
    return InvalidArgument("int8: q8, k8, v and o must be non-null device pointers");
  }
  if (scales.q == nullptr || scales.k == nullptr || (e4m3 && scales.v_descale == nullptr)) {
    return InvalidArgument("int8: the q and k scales (and the v descale for E4M3 P·V) must be "
                           "non-null device pointers");
  }
  if (s.return_lse && t.lse == nullptr) {
    return InvalidArgument("int8: return_lse is set but lse is null");
  }
  if (Misaligned(t.q) || Misaligned(t.k) || Misaligned(t.v) || Misaligned(t.o)) {
    return InvalidArgument("int8: q8, k8, v and o must be 16-byte aligned");
  }
  if (workspace_bytes < plan.workspace_bytes || (plan.workspace_bytes > 0 && !workspace) ||
      Misaligned(workspace)) {
    return InvalidArgument("int8: the workspace must be 16-byte aligned device memory of at "
                           "least " + std::to_string(plan.workspace_bytes) + " bytes (got " +
                           std::to_string(workspace_bytes) + ")");
  }
  const bool varlen = s.layout == Layout::kVarlen;
  if (varlen && (t.q_offsets == nullptr || t.kv_offsets == nullptr)) {
    return InvalidArgument("int8: varlen needs q_offsets and kv_offsets");
  }
  Fp8Params p;
  p.q = static_cast<const uint8_t*>(t.q);
  p.k = static_cast<const uint8_t*>(t.k);
  p.v = static_cast<const uint8_t*>(t.v);
  p.vt = static_cast<uint8_t*>(workspace);
  p.o = t.o;
  p.lse = s.return_lse ? t.lse : nullptr;
  p.v_descale = e4m3 ? scales.v_descale : nullptr;
  p.q_scale = scales.q;
  p.k_scale = scales.k;
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
  cudaError_t e;
  if (e4m3) {
    e = reinterpret_cast<Fp8TransposeFn>(plan.transpose)(p, stream);
    if (e != cudaSuccess) return CudaInternal("V transpose launch", e);
  }
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y),
                  static_cast<unsigned>(plan.grid_z));
  e = reinterpret_cast<Fp8LaunchFn>(plan.launch)(p, grid, plan.smem_bytes, stream);
  if (e != cudaSuccess) return CudaInternal("kernel launch", e);
  return Status::Ok();
}

}  // namespace attn::kernels
