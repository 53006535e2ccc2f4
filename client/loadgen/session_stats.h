// What one worker of a session or mooncake run measured (SessionStats): counts, latency
// histograms, the server's ExecutionReport figures, errors by status code, verification; merged
// over the workers and turned into the SessionReport.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attention/v1/sequence.pb.h"
#include "loadgen/hdr_histogram.h"
#include "loadgen/progress.h"
#include "loadgen/session_report.h"
#include "loadgen/verify.h"

namespace attn::loadgen {

using SessionClock = std::chrono::steady_clock;

/// Whole µs of `d`.
int64_t SessionMicros(SessionClock::duration d);

/// One worker's measurements (not thread-safe: each worker has its own; Merge combines them).
struct SessionStats {
  /// The run's live progress line (not owned; null: none). Each decode step's latency and each
  /// error go to it as well as to the histograms below.
  Progress* progress = nullptr;
  /// Records one decode step of `us` microseconds (step_us and the progress line).
  void StepDone(int64_t us);
  int64_t sessions = 0, sessions_ok = 0, prefill_tokens = 0, decode_steps = 0;
  int64_t sessions_cut = 0;  // cut short at a step boundary by SIGINT/SIGTERM (not an error)
  HdrHistogram prefill_us, step_us, message_us;
  // From each OK step's ExecutionReport: steps in the server launch it ran in, queue time.
  HdrHistogram server_batch, server_queue_us, server_total_us;
  // Batched steps: the batch's wall time, its kernels' device time and the difference (the
  // server's own time per batched step), PhaseTimes.batch_us / batch_kernel_us.
  HdrHistogram server_batch_us, server_batch_kernel_us, server_overhead_us, server_copy_us;
  // The server_* histograms above hold decode steps only; a prefill's report (one per layer and
  // session, thousands of tokens) goes here, so that the decode percentiles are not a mix of
  // both (one packed report per 64 decode steps against 64 prefill reports put the "decode"
  // p50 among the prefills).
  HdrHistogram prefill_server_total_us;
  // Steady-state decode window (µs since the run's start): when each decode step completed,
  // when each session's prefill completed, when each session's decoding ended.
  SessionClock::time_point start;
  std::vector<int64_t> step_done_us, prefill_done_us, decode_end_us;
  int64_t Since(SessionClock::time_point t) const { return SessionMicros(t - start); }
  std::map<std::string, int64_t> errors;
  std::map<std::string, std::string> first_messages;
  int64_t verified = 0, mismatches = 0;
  double worst = 0;
  std::string first_mismatch;
  int64_t forks = 0, tokens_saved = 0, evictions = 0;
  // ReleaseSequence (release_retry.h): tries beyond the first, releases that still failed (their
  // sequences stay held on the server until its --sequence-ttl-s).
  int64_t release_retries = 0, releases_failed = 0;

  /// Counts an error under its status code's name; keeps the first message per code.
  void Error(grpc::StatusCode code, const std::string& where, const std::string& message);
  /// Counts a verified output; keeps the worst finite error and the first mismatch.
  void Check(const Comparison& c, const std::string& where);
  /// Records an OK decode step's ExecutionReport (batch size, queue, total, batch and copy
  /// times); a prefill's (`prefill`) goes to prefill_server_total_us only.
  void Server(const attention::v1::ExtendResponse& r, bool prefill = false) {
    Server(r.report(), prefill);
  }
  /// The same from a report alone (a packed batch's one report).
  void Server(const attention::v1::ExecutionReport& report, bool prefill = false);
  /// Adds another worker's measurements.
  void Merge(const SessionStats& o);
};

/// The steady-state decode rate: decode steps completed between the last prefill's completion
/// and the first session's end of decoding, divided by that window (every session is decoding
/// throughout it when --requests <= --concurrency); the window starts steady_from_s after the
/// run's start. No window (0) otherwise.
void SteadyWindow(const SessionStats& all, SessionReport* r);

/// Fills the measured fields of `r` from the merged `all` over a run of `wall` seconds.
void FillSessionReport(const SessionStats& all, double wall, SessionReport* r);

}  // namespace attn::loadgen
