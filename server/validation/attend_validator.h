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
#include "attn/common/status.h"
#include "validation/validated_attend.h"

namespace attn {

/// Limits applied during validation.
struct ValidationLimits {
  int64_t max_head_dim = 1024;       ///< H above this: INVALID_ARGUMENT
  int64_t max_heads = 1024;          ///< N above this: INVALID_ARGUMENT
  int64_t max_batch = 1 << 20;       ///< B above this: INVALID_ARGUMENT
  int64_t max_tokens = 1ll << 24;    ///< T or S (or totals) above this: INVALID_ARGUMENT
};

/// Maps a proto DType to the kernel dtype; INVALID_ARGUMENT naming `field` when unknown.
StatusOr<kernels::DType> DTypeFromProto(int dtype, const std::string& field);
/// Maps a kernel dtype to the proto enum.
attention::v1::DType DTypeToProto(kernels::DType dtype);

/// Validates `request`. Errors: INVALID_ARGUMENT as described above.
StatusOr<ValidatedAttend> ValidateAttend(const attention::v1::AttendRequest& request,
                                         const ValidationLimits& limits = {});

}  // namespace attn
