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

/// Several Attend problems packed into one varlen problem. Plan computes the layout (shape,
/// per-segment lengths and offsets); PackInto writes the inputs into buffers the caller names
/// and ScatterFrom reads the outputs from buffers the caller names, so a backend's own staging
/// can hold them (Backend::ExecuteStaged). Pack is Plan plus buffers of its own
/// (HostTensorBuffers) filled by PackInto.
class PackedAttend {
 public:
  /// The layout of `parts` (>= 1, all with the same AttendSignature; they are read, not
  /// kept) packed in order, without buffers: shape(), IndexTensors(), PackInto, ScatterFrom.
  /// Errors: INVALID_ARGUMENT when parts are empty or incompatible.
  static StatusOr<PackedAttend> Plan(const std::vector<const ValidatedAttend*>& parts);
  /// Plan, plus packed buffers of its own with the inputs written by PackInto (Tensors(),
  /// Scatter). Errors as Plan.
  static StatusOr<PackedAttend> Pack(const std::vector<const ValidatedAttend*>& parts);

  /// The varlen problem: q/o (total_q,N,H), k/v (total_kv,K,H), lse (N,total_q).
  const kernels::AttentionShape& shape() const { return shape_; }
  /// The packed problem's index arrays (host): q_lengths/kv_lengths (B int32: each segment's
  /// real lengths), q_offsets/kv_offsets (B+1 int64); q, k, v, o and lse are null.
  kernels::AttentionTensors IndexTensors() const;
  /// Host tensors over the buffers of Pack (o and lse are written by the backend); only for a
  /// PackedAttend made by Pack.
  kernels::AttentionTensors Tensors();
  /// Query tokens of all parts (Σ T_b).
  int64_t query_tokens() const { return shape_.total_q; }
  size_t parts() const { return parts_.size(); }

  /// Writes the packed inputs of `parts` (the ones given to Plan, in the same order) into
  /// host buffers of shape().q_elements() (`q`) and shape().kv_elements() (`k`, `v`) values
  /// of shape().dtype: each segment's real rows, back to back ((total_q,N,H) and
  /// (total_kv,K,H)). Bytes past those totals are not written.
  void PackInto(const std::vector<const ValidatedAttend*>& parts, void* q, void* k, void* v) const;
  /// Writes part `part`'s output into `o` (v.o_bytes bytes, v's layout) and, when
  /// shape().return_lse and `lse` is not null, its lse into `lse` (v.lse_shape floats), read
  /// from the packed output `packed_o` ((total_q,N,H) of shape().dtype) and `packed_lse`
  /// ((N,total_q) float32; read only when lse is written). Padded rows i >= T_b get zeros and
  /// an lse of -inf, as the unbatched path returns them. `v` must be the ValidatedAttend given
  /// to Plan at that index.
  void ScatterFrom(size_t part, const ValidatedAttend& v, const void* packed_o,
                   const float* packed_lse, void* o, float* lse) const;
  /// ScatterFrom the buffers of Pack (after the backend wrote them); only for a PackedAttend
  /// made by Pack.
  void Scatter(size_t part, const ValidatedAttend& v, void* o, float* lse) const;

 private:
  struct Part {
    int64_t first_entry = 0;  ///< index of its first segment
    int64_t entries = 0;
  };
  kernels::AttentionShape shape_;
  HostTensorBuffers buffers_;  ///< Pack only; empty after Plan
  std::vector<int32_t> q_lengths_, kv_lengths_;
  std::vector<int64_t> q_offsets_, kv_offsets_;
  std::vector<Part> parts_;
};

}  // namespace attn
