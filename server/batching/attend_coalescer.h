// Coalescing of compatible stateless Attend problems into ONE varlen problem, and scattering
// its output back (DESIGN.md §8).
//
// Each batch entry of each part becomes one varlen segment with its real lengths: a padded
// part (B,T,N,H) with lengths T_b/S_b contributes B segments holding only rows [0, T_b) of q
// and [0, S_b) of k/v; a varlen part contributes its segments as they are. Masks keep their
// meaning because the band is defined per entry from (T_b, S_b) (attention_problem.h), so a
// backend whose rows are computed independently (cpu) gives bitwise the same output batched
// or not. Scatter writes each part's output in its own layout: padded rows i >= T_b are zero
// and their lse is -inf, as the unbatched path returns them.
// Thread-safety: a PackedAttend is used by one thread; functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"
#include "backends/backend.h"
#include "validation/validated_attend.h"

namespace attn {

/// Bytes that are equal exactly when two validated problems may share one varlen launch on
/// `backend`: dtype, N, K, H, mask (causal alignment, windows), scale (bit pattern),
/// return_lse and the backend. Layout and lengths do not matter.
std::string AttendSignature(const ValidatedAttend& v, const std::string& backend);

/// False when a call must run in a launch of its own: FLOAT8_E4M3 inputs (their per-tensor
/// scales cannot be shared) or a backend whose numerics depend on the whole launch
/// (Backend::coalescable() false, e.g. fp8's amax-derived quantisation scales).
bool MayCoalesce(const ValidatedAttend& v, const Backend& backend);

/// Several Attend problems packed into one varlen problem; owns the packed buffers.
class PackedAttend {
 public:
  /// Packs `parts` (>= 1, all with the same AttendSignature; they are read, not kept).
  /// Errors: INVALID_ARGUMENT when parts are empty or incompatible.
  static StatusOr<PackedAttend> Pack(const std::vector<const ValidatedAttend*>& parts);

  /// The varlen problem: q/o (total_q,N,H), k/v (total_kv,K,H), lse (N,total_q).
  const kernels::AttentionShape& shape() const { return shape_; }
  /// Host tensors over the packed buffers (o and lse are written by the backend).
  kernels::AttentionTensors Tensors();
  /// Query tokens of all parts (Σ T_b).
  int64_t query_tokens() const { return shape_.total_q; }
  size_t parts() const { return parts_.size(); }

  /// Writes part `part`'s output into `o` (v.o_bytes bytes, v's layout) and, when
  /// shape().return_lse, its lse into `lse` (v.lse_shape floats). `v` must be the
  /// ValidatedAttend given to Pack at that index.
  void Scatter(size_t part, const ValidatedAttend& v, void* o, float* lse) const;

 private:
  struct Part {
    int64_t first_entry = 0;  ///< index of its first segment
    int64_t entries = 0;
  };
  kernels::AttentionShape shape_;
  std::vector<char> q_, k_, v_, o_;
  std::vector<float> lse_;
  std::vector<int32_t> q_lengths_, kv_lengths_;
  std::vector<int64_t> q_offsets_, kv_offsets_;
  std::vector<Part> parts_;
};

}  // namespace attn
