#include "loadgen/release_retry.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace attn::loadgen {

ReleaseOutcome ReleaseWithRetry(attention::v1::SequenceService::StubInterface* stub,
                                const std::string& sequence_id, const ReleaseRetryPolicy& policy) {
  using Clock = std::chrono::system_clock;
  const Clock::time_point end = Clock::now() + std::chrono::milliseconds(policy.budget_ms);
  attention::v1::ReleaseSequenceRequest req;
  req.set_sequence_id(sequence_id);
  ReleaseOutcome out;
  int64_t backoff_ms = policy.first_backoff_ms;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(end);
    attention::v1::ReleaseSequenceResponse resp;
    out.status = stub->ReleaseSequence(&ctx, req, &resp);
    ++out.attempts;
    if (out.attempts > 1 && out.status.error_code() == grpc::StatusCode::NOT_FOUND) {
      out.status = grpc::Status::OK;  // an earlier try released it; its reply was lost
    }
    if (out.status.error_code() != grpc::StatusCode::UNAVAILABLE) return out;
    if (out.attempts >= std::max(policy.max_attempts, 1)) return out;
    const Clock::time_point wake = Clock::now() + std::chrono::milliseconds(backoff_ms);
    if (wake >= end) return out;
    std::this_thread::sleep_until(wake);
    backoff_ms *= 2;
  }
}

}  // namespace attn::loadgen
