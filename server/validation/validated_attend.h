// ValidatedAttend: an Attend problem that passed validation (validation/attend_validator.h
// ValidateAttend), as the batching stage sees it: an AttentionShape plus host
// pointers into the request's own bytes. Kept apart from the validator so that code below the
// service (batching/) sees the problem without the protos.
// Thread-safety: a value type; Tensors() is const.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/kernels/attention_problem.h"

namespace attn {

/// A request that passed validation. q/k/v alias the request's bytes: keep the request alive
/// while they are used.
struct ValidatedAttend {
  kernels::AttentionShape shape;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  std::vector<int32_t> q_lengths;  ///< empty when absent (padded)
  std::vector<int32_t> kv_lengths;
  std::vector<int64_t> q_offsets;  ///< varlen only
  std::vector<int64_t> kv_offsets;
  uint64_t o_bytes = 0;            ///< bytes of the output tensor
  std::vector<int64_t> o_shape;    ///< q's shape
  std::vector<int64_t> lse_shape;  ///< (B,N,T) or (N,total_q)
  double flops = 0;                ///< 4·Σ_b T_b·S_b·N·H, halved when causal
  /// Query-key pairs scored: Σ_b T_b·S_b·N, halved when causal, at most T_b·(window width)·N
  /// per entry with a window. The cost the cpu backend's work bound counts.
  double score_pairs = 0;
  int64_t query_tokens = 0;  ///< Σ_b T_b

  /// Host tensors over this object's buffers with outputs `o` and `lse` (may be null).
  kernels::AttentionTensors Tensors(void* o, float* lse) const;
};

}  // namespace attn
