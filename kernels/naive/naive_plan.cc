// NaiveSupports and NaivePlanFor: host-only decisions for the naive family.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "attn/kernels/naive_attention.h"
#include "naive_internal.h"

namespace attn::kernels {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/// Workspace for `n` units: scores, then probabilities at an aligned offset.
size_t ChunkBytes(const NaivePlan& p, int64_t n) {
  const size_t un = static_cast<size_t>(n);
  return p.unit_probs_bytes == 0 ? AlignUp(un * p.unit_scores_bytes)
                                 : AlignUp(un * p.unit_scores_bytes) + un * p.unit_probs_bytes;
}

}  // namespace

Status NaiveSupports(const AttentionShape& s) {
  if (s.layout != Layout::kPadded) {
    return FailedPrecondition(
        "naive: packed varlen layout is not supported (the family materialises padded "
        "(B, N, T, S) scores); pad the batch or use the fused family");
  }
  if (s.dtype != DType::kFloat32 && s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return FailedPrecondition(std::string("naive: dtype ") + DTypeName(s.dtype) +
                              " is not supported (float32, float16, bfloat16 only)");
  }
  if (s.batch <= 0 || s.max_q_len <= 0 || s.max_kv_len <= 0 || s.num_heads <= 0 ||
      s.num_kv_heads <= 0 || s.head_dim <= 0) {
    return InvalidArgument(
        "naive: B, T, S, N, K and H must be positive (got B=" + std::to_string(s.batch) +
        " T=" + std::to_string(s.max_q_len) + " S=" + std::to_string(s.max_kv_len) +
        " N=" + std::to_string(s.num_heads) + " K=" + std::to_string(s.num_kv_heads) +
        " H=" + std::to_string(s.head_dim) + ")");
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return InvalidArgument("naive: num_heads " + std::to_string(s.num_heads) +
                           " is not a multiple of num_kv_heads " + std::to_string(s.num_kv_heads));
  }
  if (!std::isfinite(s.scale)) return InvalidArgument("naive: scale must be finite");
  const int64_t ld = (s.max_kv_len + 7) / 8 * 8;
  if (s.max_q_len > INT_MAX || ld > INT_MAX || s.num_heads * s.head_dim > INT_MAX ||
      s.num_kv_heads * s.head_dim > INT_MAX) {
    return InvalidArgument("naive: T, S, N*H and K*H must fit cuBLAS int32 dimensions");
  }
  return Status::Ok();
}

StatusOr<NaivePlan> NaivePlanFor(const AttentionShape& s, size_t workspace_limit_bytes) {
  ATTN_RETURN_IF_ERROR(NaiveSupports(s));
  NaivePlan p;
  p.shape = s;
  p.scores_ld = (s.max_kv_len + 7) / 8 * 8;
  p.num_units = s.batch * s.num_kv_heads;
  const double unit_elems = static_cast<double>(s.group_size()) * static_cast<double>(s.max_q_len) *
                            static_cast<double>(p.scores_ld);
  if (unit_elems * 8.0 > 9.0e18) {
    return ResourceExhausted("naive: one (batch entry, kv head) unit needs ~" +
                             std::to_string(unit_elems * 4.0) + " bytes of scores");
  }
  const size_t elems = static_cast<size_t>(unit_elems);
  p.unit_scores_bytes = elems * 4;
  p.unit_probs_bytes = s.dtype == DType::kFloat32 ? 0 : elems * DTypeSize(s.dtype);
  // Per-unit non-finite V flags (naive_masked_values.cu, int32) after the chunk's
  // scores/probabilities, at a 4-byte aligned offset.
  const size_t flags_bytes = static_cast<size_t>(p.num_units) * sizeof(int32_t);
  auto align4 = [](size_t x) { return (x + 3) / 4 * 4; };
  const size_t one = align4(ChunkBytes(p, 1)) + flags_bytes;
  if (one > workspace_limit_bytes) {
    return ResourceExhausted(
        "naive: one (batch entry, kv head) unit needs " + std::to_string(one - flags_bytes) +
        " bytes of workspace (G=" + std::to_string(s.group_size()) +
        " heads x T=" + std::to_string(s.max_q_len) + " x S=" + std::to_string(s.max_kv_len) +
        " scores + probabilities) plus " + std::to_string(flags_bytes) +
        " bytes of per-unit flags, but the limit is " + std::to_string(workspace_limit_bytes) +
        " bytes");
  }
  const size_t chunk_limit = workspace_limit_bytes - flags_bytes;
  int64_t n = static_cast<int64_t>(std::min<size_t>(
      chunk_limit / (p.unit_scores_bytes + p.unit_probs_bytes), static_cast<size_t>(p.num_units)));
  n = std::max<int64_t>(n, 1);
  while (n > 1 && align4(ChunkBytes(p, n)) > chunk_limit) --n;
  // Whole batch entries per chunk when possible: allows the batched-over-b GEMM variant.
  if (n >= s.num_kv_heads && n < p.num_units) n = n / s.num_kv_heads * s.num_kv_heads;
  p.units_per_chunk = n;
  p.num_chunks = (p.num_units + n - 1) / n;
  p.probs_offset_bytes = p.unit_probs_bytes == 0 ? 0 : AlignUp(n * p.unit_scores_bytes);
  p.flags_offset_bytes = align4(ChunkBytes(p, n));
  p.workspace_bytes = p.flags_offset_bytes + flags_bytes;
  for (int64_t u0 = 0; u0 < p.num_units; u0 += n) {
    const int64_t u1 = std::min(p.num_units, u0 + n);
    naive_internal::ForEachGemmBatch(s, p.scores_ld, u0, u1,
                                     [&](const naive_internal::GemmBatch&) { p.gemm_calls += 2; });
  }
  return p;
}

}  // namespace attn::kernels
