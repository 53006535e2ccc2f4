// NaiveRun: enqueues the non-finite V flags, then per chunk of units the scores GEMMs, the
// mask + softmax kernel, the P·V GEMMs and the repair of rows whose unit's V is non-finite.
// Allocation-free and synchronisation-free; errors converted to Status once, here.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "attn/kernels/naive_attention.h"
#include "naive_internal.h"

namespace attn::kernels {
namespace {

Status FromCuda(cudaError_t e, const char* what) {
  return Internal(std::string("naive: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

Status FromCublas(cublasStatus_t st, const char* what) {
  return Internal(std::string("naive: ") + what + " failed: " + cublasGetStatusName(st) + " (" +
                  cublasGetStatusString(st) + ")");
}

cudaDataType CudaType(DType d) {
  switch (d) {
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

/// Restores the handle's pointer mode on scope exit.
class PointerModeGuard {
 public:
  explicit PointerModeGuard(cublasHandle_t h) : h_(h) {
    ok_ = cublasGetPointerMode(h_, &saved_) == CUBLAS_STATUS_SUCCESS;
  }
  ~PointerModeGuard() {
    if (ok_) (void)cublasSetPointerMode(h_, saved_);
  }
  bool ok() const { return ok_; }

 private:
  cublasHandle_t h_;
  cublasPointerMode_t saved_ = CUBLAS_POINTER_MODE_HOST;
  bool ok_ = false;
};

}  // namespace

Status NaiveRun(const NaivePlan& plan, const AttentionTensors& t, void* workspace,
                size_t workspace_bytes, cublasHandle_t handle, cudaStream_t stream) {
  const AttentionShape& s = plan.shape;
  if (plan.units_per_chunk <= 0 || plan.num_units != s.batch * s.num_kv_heads) {
    return InvalidArgument("naive: plan was not made by NaivePlanFor");
  }
  if (t.q == nullptr || t.k == nullptr || t.v == nullptr || t.o == nullptr) {
    return InvalidArgument("naive: q, k, v and o must be non-null device pointers");
  }
  if (s.return_lse && t.lse == nullptr) {
    return InvalidArgument("naive: shape.return_lse is set but lse is null");
  }
  if (workspace == nullptr || workspace_bytes < plan.workspace_bytes) {
    return InvalidArgument("naive: workspace of " + std::to_string(workspace_bytes) +
                           " bytes is smaller than the plan's " +
                           std::to_string(plan.workspace_bytes));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return InvalidArgument("naive: workspace must be 256-byte aligned");
  }
  if (handle == nullptr) return InvalidArgument("naive: null cuBLAS handle");
  cudaStream_t bound = nullptr;
  cublasStatus_t st = cublasGetStream(handle, &bound);
  if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st, "cublasGetStream");
  if (bound != stream) {
    return InvalidArgument(
        "naive: the cuBLAS handle is bound to another stream "
        "(call cublasSetStream(handle, stream) first)");
  }
  PointerModeGuard guard(handle);
  if (!guard.ok()) return Internal("naive: cublasGetPointerMode failed");
  st = cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST);
  if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st, "cublasSetPointerMode");

  const int64_t T = s.max_q_len, S = s.max_kv_len, N = s.num_heads, K = s.num_kv_heads;
  const int64_t H = s.head_dim, ld = plan.scores_ld;
  const int esize = DTypeSize(s.dtype);
  const cudaDataType io_type = CudaType(s.dtype);
  const cublasComputeType_t compute =
      s.dtype == DType::kFloat32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const float alpha_qk = s.scale, alpha_pv = 1.f, beta = 0.f;
  const auto* q = static_cast<const uint8_t*>(t.q);
  const auto* k = static_cast<const uint8_t*>(t.k);
  const auto* v = static_cast<const uint8_t*>(t.v);
  auto* o = static_cast<uint8_t*>(t.o);
  float* scores = static_cast<float*>(workspace);
  uint8_t* probs = plan.unit_probs_bytes == 0
                       ? reinterpret_cast<uint8_t*>(scores)
                       : static_cast<uint8_t*>(workspace) + plan.probs_offset_bytes;
  const int esize_p = esize;  // probabilities are stored in the input dtype

  naive_internal::SoftmaxParams sp;
  sp.dtype = s.dtype;
  sp.scores = scores;
  sp.probs = probs;
  sp.lse = s.return_lse ? t.lse : nullptr;
  sp.q_lengths = s.has_lengths ? t.q_lengths : nullptr;
  sp.kv_lengths = s.has_lengths ? t.kv_lengths : nullptr;
  sp.mask = s.mask;
  sp.T = T;
  sp.S = S;
  sp.ld = ld;
  sp.G = N / K;
  sp.K = K;
  sp.N = N;

  int32_t* flags =
      reinterpret_cast<int32_t*>(static_cast<uint8_t*>(workspace) + plan.flags_offset_bytes);
  const cudaError_t fe =
      naive_internal::LaunchFlagNonFiniteV(s.dtype, t.v, plan.num_units, S, K, H, flags, stream);
  if (fe != cudaSuccess) return FromCuda(fe, "non-finite V flag kernel launch");
  for (int64_t u0 = 0; u0 < plan.num_units; u0 += plan.units_per_chunk) {
    const int64_t u1 = std::min(plan.num_units, u0 + plan.units_per_chunk);
    // Phase 1: scores(S x T, column-major, ld) = scale * K_blockᵀ-view · Q_block.
    naive_internal::ForEachGemmBatch(s, ld, u0, u1, [&](const naive_internal::GemmBatch& g) {
      if (st != CUBLAS_STATUS_SUCCESS) return;
      st = cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(S), static_cast<int>(T),
          static_cast<int>(H), &alpha_qk, k + g.kv_offset * esize, io_type, static_cast<int>(K * H),
          g.kv_stride, q + g.q_offset * esize, io_type, static_cast<int>(N * H), g.q_stride, &beta,
          scores + g.s_offset, CUDA_R_32F, static_cast<int>(ld), g.s_stride, g.count, compute,
          CUBLAS_GEMM_DEFAULT);
    });
    if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st, "cublasGemmStridedBatchedEx (Q·Kᵀ)");
    sp.first_unit = u0;
    sp.units = u1 - u0;
    const cudaError_t e = naive_internal::LaunchSoftmax(sp, stream);
    if (e != cudaSuccess) return FromCuda(e, "mask+softmax kernel launch");
    // Phase 2: O_block(H x T, column-major, ld N*H) = V_block(H x S) · P(S x T, ld).
    naive_internal::ForEachGemmBatch(s, ld, u0, u1, [&](const naive_internal::GemmBatch& g) {
      if (st != CUBLAS_STATUS_SUCCESS) return;
      st = cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(H), static_cast<int>(T),
          static_cast<int>(S), &alpha_pv, v + g.kv_offset * esize, io_type, static_cast<int>(K * H),
          g.kv_stride, probs + g.s_offset * esize_p, io_type, static_cast<int>(ld), g.s_stride,
          &beta, o + g.q_offset * esize, io_type, static_cast<int>(N * H), g.q_stride, g.count,
          compute, CUBLAS_GEMM_DEFAULT);
    });
    if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st, "cublasGemmStridedBatchedEx (P·V)");
    // Rows of units with a non-finite V: recomputed over their visible keys only.
    const cudaError_t re = naive_internal::LaunchRepairRows(sp, t.v, t.o, flags, H, stream);
    if (re != cudaSuccess) return FromCuda(re, "masked-row repair kernel launch");
  }
  return Status::Ok();
}

}  // namespace attn::kernels
