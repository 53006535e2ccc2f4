// Verification of the stateful workloads' outputs: an Extend's o against the float64 oracle over
// the sequence's whole history, regenerated from its token keys (bottom-right causal).
#pragma once

#include <cstdint>

#include "attention/v1/sequence.pb.h"
#include "loadgen/session_requests.h"
#include "loadgen/verify.h"

namespace attn::loadgen {

/// Checks o of an Extend at `position` with `t` tokens on `layer` against the oracle over the
/// regenerated history [0, position + t), within ResolveTolerance(tolerance, s.dtype) (relative
/// L2; 0: the dtype's). Fails when o has the wrong dtype or size (rel_error infinite) and when
/// the response's length is not position + t.
Comparison VerifyExtend(const SessionShape& s, int layer, int64_t position, int64_t t,
                        const TokenKeyFn& key, const attention::v1::ExtendResponse& response,
                        double tolerance);

}  // namespace attn::loadgen
