// Validation of an AttendRequest before any work (issue 2, DESIGN.md §3): every field is
// checked and the first violation is returned as INVALID_ARGUMENT naming the field, what was
// expected and what was received. On success the request is described as an AttentionShape
// plus host pointers into the request's own bytes (no copies).
// Pure function of the request and limits; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "attn/kernels/attention_problem.h"
#include "attn/kernels/status.h"

namespace attn {

/// Limits applied during validation.
struct ValidationLimits {
  int64_t max_head_dim = 1024;       ///< H above this: INVALID_ARGUMENT
  int64_t max_heads = 1024;          ///< N above this: INVALID_ARGUMENT
  int64_t max_batch = 1 << 20;       ///< B above this: INVALID_ARGUMENT
  int64_t max_tokens = 1ll << 24;    ///< T or S (or totals) above this: INVALID_ARGUMENT
};

/// A request that passed validation. q/k/v alias the request's bytes: keep the request alive
/// while they are used.
struct ValidatedAttend {
  kernels::AttentionShape shape;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  std::vector<int32_t> q_lengths;    ///< empty when absent (padded)
  std::vector<int32_t> kv_lengths;
  std::vector<int64_t> q_offsets;    ///< varlen only
  std::vector<int64_t> kv_offsets;
  uint64_t o_bytes = 0;              ///< bytes of the output tensor
  std::vector<int64_t> o_shape;      ///< q's shape
  std::vector<int64_t> lse_shape;    ///< (B,N,T) or (N,total_q)
  double flops = 0;                  ///< 4·Σ_b T_b·S_b·N·H, halved when causal
  /// Query-key pairs scored: Σ_b T_b·S_b·N, halved when causal, at most T_b·(window width)·N
  /// per entry with a window. The cost the cpu backend's work bound counts.
  double score_pairs = 0;
  int64_t query_tokens = 0;          ///< Σ_b T_b

  /// Host tensors over this object's buffers with outputs `o` and `lse` (may be null).
  kernels::AttentionTensors Tensors(void* o, float* lse) const;
};

/// Maps a proto DType to the kernel dtype; INVALID_ARGUMENT naming `field` when unknown.
StatusOr<kernels::DType> DTypeFromProto(int dtype, const std::string& field);
/// Maps a kernel dtype to the proto enum.
attention::v1::DType DTypeToProto(kernels::DType dtype);

/// Validates `request`. Errors: INVALID_ARGUMENT as described above.
StatusOr<ValidatedAttend> ValidateAttend(const attention::v1::AttendRequest& request,
                                         const ValidationLimits& limits = {});

}  // namespace attn
