// Validation of SequenceService requests (sequence.proto, DESIGN.md §3, §7) before any work:
// the first violation is returned as INVALID_ARGUMENT naming the field, what was expected and
// what was received. Checks against a live sequence (layer in range, shapes matching the
// sequence, position) happen later, in ExtendStep, under the sequence's lock.
// Pure functions of the request; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "attention/v1/sequence.pb.h"
#include "attn/common/status.h"
#include "kv_cache/extend_args.h"
#include "kv_cache/sequence.h"

namespace attn {

/// Limits of CreateSequence.
constexpr int32_t kMaxSequenceLayers = 4096;
constexpr int32_t kMaxSequenceHeads = 1024;
constexpr int32_t kMaxSequenceHeadDim = 1024;
constexpr int64_t kMaxReserveTokens = int64_t{1} << 24;
/// Largest extent of one Extend tensor dimension (T, N or K, H).
constexpr int64_t kMaxExtendExtent = int64_t{1} << 24;

/// `s` made safe to put in a protobuf string field (which must be valid UTF-8, or the client
/// cannot parse the message and loses the whole response): every byte that is not part of a
/// valid UTF-8 character becomes the four characters "\xNN"; when the result would exceed
/// `max_bytes` it is cut at a character boundary and "... (N bytes)" is appended, N being
/// s.size(). The result is always valid UTF-8. (Local to the sequence id echo and the sequence
/// service's result messages; issue 16 item 2.)
std::string Utf8SafeEcho(std::string_view s, size_t max_bytes);

/// A sequence id as the server issues it: 32 lowercase hex digits; else INVALID_ARGUMENT whose
/// message quotes at most the first 64 bytes of the id (Utf8SafeEcho).
Status ValidateSequenceId(const std::string& id);

/// CreateSequenceRequest → the sequence's configuration (scale resolved to 1/sqrt(H) when
/// unset). Errors: INVALID_ARGUMENT for counts out of range ([1, 4096] layers, [1, 1024]
/// heads and head_dim, [0, 2^24] reserve_tokens), N % K != 0, an unknown or FP8 dtype, a
/// kv_cache_dtype other than dtype or FLOAT8_E4M3, FP8 scales of the wrong count or not
/// finite > 0, a scale not finite > 0.
StatusOr<SequenceConfig> ValidateCreateSequence(const attention::v1::CreateSequenceRequest& r);

/// ExtendRequest → ExtendArgs whose q/k/v pointers alias `r`'s bytes (keep `r` alive).
/// q (T,N,H), k and v (T,K,H): rank 3, known dtype, extents in [1, 2^24], data size equal to
/// the shape times the dtype size, one T for all three. append_only: q must be unset, T comes
/// from k (k and v of one T) and the args are SetAppendOnly's. Errors: INVALID_ARGUMENT.
StatusOr<ExtendArgs> ValidateExtend(const attention::v1::ExtendRequest& r);

/// Request-level checks of an ExtendBatchRequest's form: `steps` and `packed` not both set.
/// The per-step form (each step is validated on its own when it runs): at least one step,
/// every step on the same layer, no sequence twice. The packed form is checked whole by
/// ValidatePackedExtendBatch (packed_batch_validator.h); this returns Ok for it.
/// Errors: INVALID_ARGUMENT.
Status ValidateExtendBatch(const attention::v1::ExtendBatchRequest& r);

}  // namespace attn
