// Per-token keys of the stateful workloads: token contents are deterministic functions of
// (seed, token key, layer), so any output can be checked afterwards against the float64 oracle
// over the whole regenerated history (session_verify.h).
#pragma once

#include <cstdint>

#include "loadgen/mooncake_trace.h"

namespace attn::loadgen {

/// Per-token key of a session's token at `position`.
uint64_t SessionTokenKey(uint64_t seed, int64_t session, int64_t position);
/// Per-token key of a Mooncake request's token: hash-backed positions (block
/// floor(position / (512 × token_scale)) < hash_ids.size() and position < context) depend only
/// on (seed, that block's hash id, position), so equal prefixes have equal contents; other
/// positions on (seed, request, position).
uint64_t MooncakeTokenKey(uint64_t seed, const MooncakeRequest& request, double token_scale,
                          int64_t context, int64_t request_index, int64_t position);

}  // namespace attn::loadgen
