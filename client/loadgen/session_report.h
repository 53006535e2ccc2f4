// What a session or mooncake run did (SessionReport) and its text, JSON and CSV forms.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "loadgen/hdr_histogram.h"

namespace attn::loadgen {

/// Latency summary in ms from a histogram of µs.
struct LatencySummary {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
LatencySummary Summarize(const HdrHistogram& us);
/// Summary of `h` with every value multiplied by `scale` (1.0: counts such as batch sizes).
LatencySummary SummarizeScaled(const HdrHistogram& h, double scale);

/// What a session run did.
struct SessionReport {
  std::string target, workload, shape, decode_api;
  int concurrency = 1;
  int layers = 1;
  int batch_sessions = 0;
  int batches_in_flight = 0;  ///< packed-stream: micro-batches in flight (0: other APIs)
  std::string region = "none";  ///< packed APIs: where the tensors' bytes went (--region)
  double verify_fraction = 0;
  double tolerance = 0;  ///< relative L2 a verified o passes within (--tolerance or the dtype's)
  double wall_s = 0;
  double start_unix_s = 0;  // the run's start, wall clock (s since the Unix epoch)
  int64_t sessions = 0;      // started
  int64_t sessions_ok = 0;   // every call OK
  int64_t sessions_cut = 0;  // stopped at a step boundary by SIGINT/SIGTERM (not errors)
  int64_t planned = -1;      // sessions/requests the run was to make; -1: open-ended (set by main)
  std::string interrupted_by;  // "SIGINT" / "SIGTERM" when a signal cut the run short (main)
  int64_t prefill_tokens = 0;
  int64_t decode_steps = 0;  // OK session-steps (one token through every layer)
  double decode_steps_per_s = 0;
  // Steady state (SteadyWindow): steps completed while every session was decoding, between the
  // last prefill's completion and the first session's end of decoding; 0 when no such window.
  double steady_from_s = 0;  // the window's start, s after the run's start (start_unix_s)
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
  // The server_* summaries above are of decode steps; this one of the prefill calls (one per
  // layer and session): ExecutionReport total_us.
  LatencySummary prefill_server_total_ms;
  std::map<std::string, int64_t> errors;
  std::map<std::string, std::string> first_messages;
  int64_t verified = 0;  // outputs checked against the oracle
  int64_t mismatches = 0;
  double worst_rel_error = 0;
  std::string first_mismatch;
  int64_t forks = 0;         // mooncake
  int64_t tokens_saved = 0;  // mooncake: forked tokens (per layer) not sent again
  int64_t prefix_evictions = 0;
  int64_t release_retries = 0;  // ReleaseSequence tries beyond the first (UNAVAILABLE retried)
  int64_t releases_failed = 0;  // releases that failed after their retries (sequences left held)
  int64_t kv_pages_used_after = -1;  // --check-kv-released: pages_used at the end
  int64_t sequences_after = -1;      // --check-kv-released: GetLoad.sequences at the end
  std::string stop_reason;
};

/// The human-readable report (stdout).
std::string FormatSessionReport(const SessionReport& report);
/// The report as JSON (--json; main adds the seed).
nlohmann::json SessionReportToJson(const SessionReport& report);
/// The CSV header and the one summary row (--csv).
std::string SessionCsvHeader();
std::string SessionCsvRow(const SessionReport& report);

}  // namespace attn::loadgen
