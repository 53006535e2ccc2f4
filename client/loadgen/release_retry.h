// ReleaseSequence with a bounded retry (issue 19): a release that meets a connection being
// closed (the server's --max-connection-age-s GOAWAY past its grace, a reconnect, a restarting
// proxy) fails with UNAVAILABLE; given up at once, the sequence's KV pages would stay held on
// the server until its --sequence-ttl-s. Used by the session and mooncake workloads
// (session_runner.cc) for every release, also after SIGINT/SIGTERM.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "attention/v1/sequence.grpc.pb.h"

namespace attn::loadgen {

/// How a release is retried. Only UNAVAILABLE is retried (the call may not have reached the
/// server, and a second ReleaseSequence is harmless); every other status is final.
struct ReleaseRetryPolicy {
  int max_attempts = 4;            ///< tries in all, >= 1
  int64_t first_backoff_ms = 50;   ///< wait before the 2nd try; doubled before each later one
  int64_t budget_ms = 10000;       ///< every try and wait ends within this of the first try
};

/// What ReleaseWithRetry did.
struct ReleaseOutcome {
  grpc::Status status;  ///< the last try's status; OK also when a retry found NOT_FOUND
  int attempts = 0;     ///< tries made (1 when the first succeeded or failed finally)
};

/// Calls ReleaseSequence(`sequence_id`) on `stub` until it succeeds, fails with a status other
/// than UNAVAILABLE, `policy.max_attempts` tries were made, or the next wait would end past
/// `policy.budget_ms` (each try's deadline is what is left of the budget). NOT_FOUND on a retry
/// counts as released: an earlier try reached the server but its reply was lost.
ReleaseOutcome ReleaseWithRetry(attention::v1::SequenceService::StubInterface* stub,
                                const std::string& sequence_id, const ReleaseRetryPolicy& policy);

}  // namespace attn::loadgen
