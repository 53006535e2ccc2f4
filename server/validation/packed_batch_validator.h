// Validation of a packed ExtendBatch (sequence.proto PackedExtendBatch) as one piece, before any
// work: the batch's layer, its steps (ids, positions, query_tokens, no sequence twice), its
// tensors (q (total_tokens, N, H), k and v (total_tokens, K, H), one dtype, sizes) and where
// their bytes are (the message's data, or a shared-memory RegionSlice resolved through a
// RegionResolver). The first violation is returned (INVALID_ARGUMENT naming the field, what was
// expected and what was received; the resolver's own errors as it gives them) and nothing is
// touched. Checks against each step's live sequence (layer in range, N/K/H/dtype matching the
// sequence, position = the layer's length) happen later, per step, in ExtendStep.
// Pure functions of the request and the resolver; thread-safe when the resolver is.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "attention/v1/sequence.pb.h"
#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"
#include "kv_cache/extend_args.h"

namespace attn {

/// The shared-memory seam: resolves the RegionSlice in field `field` ("q_region", "k_region",
/// "v_region", "o_region") of the caller's request to the address of its first byte. The slice
/// must name a region the caller holds a SharedMemoryLease on, lie inside it and be exactly
/// `expected_bytes` long (the tensor's shape times its dtype size); `writable`: the range is
/// written (o_region). The bytes stay mapped until the call's response is sent. Errors:
/// INVALID_ARGUMENT (range outside the region, wrong size), NOT_FOUND (unknown, released or
/// another identity's region). Provided by the shared-memory registry (server/shm/).
using RegionResolver = std::function<StatusOr<void *>(
    const char *field, const attention::v1::RegionSlice &slice, uint64_t expected_bytes,
    bool writable)>;

/// A resolver for validation that takes inline bytes only (the validator's tests; the service
/// resolves regions through service/call_regions instead): refuses every region field with
/// INVALID_ARGUMENT "shared-memory regions: ...".
RegionResolver RefuseRegions();

/// A validated packed batch. Every step's ExtendArgs aliases its rows of the batch's tensors
/// (the request's bytes or the regions': keep both alive while the steps run).
struct PackedBatch {
  std::vector<ExtendArgs> steps;    ///< one per PackedStep, in request order
  std::vector<int64_t> first_row;   ///< row of the tensors where each step's tokens start
  int64_t total_tokens = 0;         ///< rows of q, k, v and o (the sum of query_tokens)
  kernels::DType dtype = kernels::DType::kFloat32;  ///< of q, k, v and o
  int64_t num_heads = 0;            ///< N (0 when append_only)
  int64_t num_kv_heads = 0;         ///< K
  int64_t head_dim = 0;             ///< H
  bool append_only = false;
  /// o_region's bytes ((total_tokens, N, H) of dtype) when o_region is set; else null (o goes
  /// into the response's o tensor).
  void *o = nullptr;
  /// Bytes of one row of o: N * H * dtype size (0 when append_only).
  uint64_t o_row_bytes = 0;
};

/// PackedExtendBatch → PackedBatch. Checks (INVALID_ARGUMENT unless the resolver says
/// otherwise): layer >= 0; at least one step; each step's sequence_id 32 lowercase hex digits,
/// no sequence twice, position >= 0, query_tokens in [1, 2^24]; k and v rank 3, a known dtype,
/// extents in [1, 2^24], k.shape[0] = the sum of query_tokens, v's shape = k's; q unset when
/// append_only, else rank 3 (total_tokens, N, H) with k's dtype and H; o_region unset when
/// append_only; each tensor's bytes either in its data (size = shape times dtype size) or in its
/// *_region (data empty; resolved by `regions` with that size), never both.
StatusOr<PackedBatch> ValidatePackedExtendBatch(const attention::v1::PackedExtendBatch &p,
                                                const RegionResolver &regions);

}  // namespace attn
