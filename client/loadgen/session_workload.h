// Stateful workloads over attention.v1.SequenceService (sequence.proto):
//   session   generation sessions: CreateSequence, prefill the context (one Extend per layer),
//             decode the generated tokens one at a time (Extend, ExtendBatch or ExtendStream),
//             ReleaseSequence.
//   mooncake  Mooncake trace replay: a request whose leading hash_ids match a live earlier
//             request forks that sequence (ForkSequence, shared prefix) and extends only the rest.
// Token contents are deterministic functions of (seed, token key, layer), so any output can be
// checked afterwards against the float64 oracle over the whole regenerated history.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/hdr_histogram.h"
#include "loadgen/runner.h"
#include "loadgen/trace.h"
#include "loadgen/workload.h"

namespace attn::loadgen {

/// Tokens per Mooncake hash block (before --token-scale).
inline constexpr int64_t kMooncakeBlockTokens = 512;

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

/// One Mooncake request with its prefix block hashes.
struct MooncakeRequest {
  double time_s = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;
};

/// Parses Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids).
bool ParseMooncakeRequests(std::istream& in, std::vector<MooncakeRequest>* out,
                           std::string* error);
bool ReadMooncakeRequests(const std::string& path, std::vector<MooncakeRequest>* out,
                          std::string* error);

/// Number of equal leading hash ids.
int64_t SharedBlocks(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

/// Tokens a child forks from its parent: round(shared_blocks × 512 × token_scale), capped to
/// the parent's context tokens and to child_context − 1 (the child always extends at least one
/// token); never negative.
int64_t ForkLength(int64_t shared_blocks, double token_scale, int64_t parent_context,
                   int64_t child_context);

/// A bounded, thread-safe LRU map from a request's hash-id prefix to the live sequence that
/// holds it. Entries being forked are pinned and never evicted.
class PrefixCache {
 public:
  explicit PrefixCache(size_t capacity) : capacity_(capacity) {}

  struct Match {
    std::string sequence_id;
    int64_t shared_blocks = 0;
    int64_t context_tokens = 0;  // the parent's context (its hash-backed tokens)
  };

  /// The entry sharing the most leading hash ids with `hashes` (at least one), pinned and
  /// marked most recently used; nullopt if none.
  std::optional<Match> Acquire(const std::vector<int64_t>& hashes);
  /// Unpins an entry returned by Acquire.
  void Release(const std::string& sequence_id);
  /// Adds a sequence under `hashes` (replacing an entry with the same hashes) and returns the
  /// sequence ids the caller must release: the replaced entry, and least recently used unpinned
  /// entries beyond the capacity.
  std::vector<std::string> Insert(const std::vector<int64_t>& hashes,
                                  const std::string& sequence_id, int64_t context_tokens);
  /// Removes every entry and returns their sequence ids.
  std::vector<std::string> Drain();
  size_t size() const;

 private:
  struct Entry {
    std::vector<int64_t> hashes;
    std::string sequence_id;
    int64_t context_tokens = 0;
    int pins = 0;
  };
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
};

/// Per-token key of a session's token at `position`.
uint64_t SessionTokenKey(uint64_t seed, int64_t session, int64_t position);
/// Per-token key of a Mooncake request's token: hash-backed positions (block
/// floor(position / (512 × token_scale)) < hash_ids.size() and position < context) depend only
/// on (seed, that block's hash id, position), so equal prefixes have equal contents; other
/// positions on (seed, request, position).
uint64_t MooncakeTokenKey(uint64_t seed, const MooncakeRequest& request, double token_scale,
                          int64_t context, int64_t request_index, int64_t position);

/// Options of a session or mooncake run (shape: heads, kv_heads, head_dim, dtype; batch and
/// causal are not used: sequences are always bottom-right causal).
struct SessionOptions {
  RunOptions run;
  std::string workload = "session";  // session | mooncake
  std::string decode_api = "extend";  // extend | batch | stream
  int layers = 1;
  int batch_sessions = 8;
  double gen_scale = 1.0;
  int64_t max_gen = 64;
  TokenScaling scaling;
  int64_t prefix_cache_sequences = 64;
  bool check_kv_released = false;
};

/// Latency summary in ms from a histogram of µs.
struct LatencySummary {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
LatencySummary Summarize(const HdrHistogram& us);

/// What a session run did.
struct SessionReport {
  std::string target, workload, shape, decode_api;
  int concurrency = 1;
  int layers = 1;
  int batch_sessions = 0;
  double verify_fraction = 0;
  double wall_s = 0;
  int64_t sessions = 0;     // started
  int64_t sessions_ok = 0;  // every call OK
  int64_t sessions_cut = 0;  // stopped at a step boundary by SIGINT/SIGTERM (not errors)
  int64_t planned = -1;      // sessions/requests the run was to make; -1: open-ended (set by main)
  std::string interrupted_by;  // "SIGINT" / "SIGTERM" when a signal cut the run short (main)
  int64_t prefill_tokens = 0;
  int64_t decode_steps = 0;  // OK session-steps (one token through every layer)
  double decode_steps_per_s = 0;
  // Steady state (SteadyWindow): steps completed while every session was decoding, between the
  // last prefill's completion and the first session's end of decoding; 0 when no such window.
  double steady_window_s = 0;
  int64_t steady_decode_steps = 0;
  double steady_decode_steps_per_s = 0;
  LatencySummary prefill_ms;  // CreateSequence/ForkSequence start -> last layer's prefill done
  LatencySummary step_ms;     // one decode step through every layer
  LatencySummary message_ms;  // stream: write of a request -> read of its result
  LatencySummary server_batch_size;  // ExecutionReport.batch_size of OK steps (not ms)
  LatencySummary server_queue_ms;    // ExecutionReport.times.queue_us of OK steps
  // ExecutionReport.times.total_us of OK steps: the server's time from reading the message to
  // handing its response to gRPC (validation, queue, batch, response building). The rest of
  // message_ms is the transport both ways and the client's gRPC read/write.
  LatencySummary server_total_ms;
  // Per OK batched step (PhaseTimes.batch_us / batch_kernel_us): the wall time of the server
  // batch it ran in, that batch's device kernel time, and wall minus kernels (the server's own
  // time per batched step: staging, copies, locking, bookkeeping).
  LatencySummary server_batch_ms;
  LatencySummary server_batch_kernel_ms;
  LatencySummary server_overhead_ms;
  LatencySummary server_copy_ms;  // host->device + device->host copy time of the step's launches
  std::map<std::string, int64_t> errors;
  std::map<std::string, std::string> first_messages;
  int64_t verified = 0;  // outputs checked against the oracle
  int64_t mismatches = 0;
  double worst_rel_error = 0;
  std::string first_mismatch;
  int64_t forks = 0;          // mooncake
  int64_t tokens_saved = 0;   // mooncake: forked tokens (per layer) not sent again
  int64_t prefix_evictions = 0;
  int64_t kv_pages_used_after = -1;  // --check-kv-released: pages_used at the end
  std::string stop_reason;
};

/// Runs the workload: `plans` for session (index i uses plans[i % size]), `requests` for
/// mooncake (cycling); `count` sessions/requests (< 0: until duration_s, needs duration_s > 0).
SessionReport RunSessions(const SessionOptions& options, const std::vector<SessionPlan>& plans,
                          const std::vector<MooncakeRequest>& requests, int64_t count);

std::string FormatSessionReport(const SessionReport& report);
nlohmann::json SessionReportToJson(const SessionReport& report);
std::string SessionCsvHeader();
std::string SessionCsvRow(const SessionReport& report);

}  // namespace attn::loadgen
