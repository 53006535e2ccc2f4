// Stateful workloads over attention.v1.SequenceService (sequence.proto):
//   session   generation sessions: CreateSequence, prefill the context (one Extend per layer),
//             decode the generated tokens one at a time (Extend, ExtendBatch or ExtendStream),
//             ReleaseSequence.
//   mooncake  Mooncake trace replay: a request whose leading hash_ids match a live earlier
//             request forks that sequence (ForkSequence, shared prefix) and extends only the rest.
// Token contents are deterministic functions of (seed, token key, layer), so any output can be
// checked afterwards against the float64 oracle over the whole regenerated history.
// The pieces: mooncake_trace.h (the trace, fork lengths), prefix_cache.h, token_keys.h,
// session_requests.h / session_verify.h (requests and their check), session_stats.h,
// session_runner.h (workers and decode APIs), session_report.h (text, JSON, CSV).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/mooncake_trace.h"
#include "loadgen/prefix_cache.h"
#include "loadgen/runner.h"
#include "loadgen/session_report.h"
#include "loadgen/token_keys.h"
#include "loadgen/trace.h"
#include "loadgen/workload.h"

namespace attn::loadgen {

/// One session: prefill `context_tokens`, then `generated_tokens` decode steps of T = 1.
struct SessionPlan {
  int64_t context_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t reserve_tokens() const { return context_tokens + generated_tokens; }
};

/// Generated tokens: round(generated × gen_scale) (halves away from zero) clamped to
/// [0, max_gen].
int64_t ScaleGenerated(int64_t generated, double gen_scale, int64_t max_gen);

/// A session from a trace row: context = ScaleTokens(row.context_tokens, scaling),
/// generated = ScaleGenerated(row.generated_tokens, gen_scale, max_gen).
SessionPlan PlanSession(const TraceRecord& row, const TokenScaling& scaling, double gen_scale,
                        int64_t max_gen);

/// Position of decode step `step` (0-based): the sequence length before it, context + step.
inline int64_t DecodePosition(const SessionPlan& plan, int64_t step) {
  return plan.context_tokens + step;
}

/// Options of a session or mooncake run (shape: heads, kv_heads, head_dim, dtype; batch and
/// causal are not used: sequences are always bottom-right causal).
struct SessionOptions {
  RunOptions run;
  std::string workload = "session";   // session | mooncake
  std::string decode_api = "extend";  // extend | batch | stream | packed | packed-stream
  int layers = 1;
  int batch_sessions = 8;
  int batches_in_flight = 2;  // packed-stream: micro-batches of a group in flight
  std::string region = "none";  // packed APIs: none (bytes in the message) | host (ShmRegion)
  double gen_scale = 1.0;
  int64_t max_gen = 64;
  TokenScaling scaling;
  int64_t prefix_cache_sequences = 64;
  bool check_kv_released = false;
  bool progress = true;  // the once-a-second progress line on stderr (--quiet: false)
};

/// Runs the workload: `plans` for session (index i uses plans[i % size]), `requests` for
/// mooncake (cycling); `count` sessions/requests (< 0: until duration_s, needs duration_s > 0).
SessionReport RunSessions(const SessionOptions& options, const std::vector<SessionPlan>& plans,
                          const std::vector<MooncakeRequest>& requests, int64_t count);

}  // namespace attn::loadgen
