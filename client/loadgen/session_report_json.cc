// SessionReportToJson: the --json form of a session or mooncake run's report.
#include "loadgen/session_report.h"

namespace attn::loadgen {

namespace {

nlohmann::json LatencyJson(const LatencySummary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50},
          {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

}  // namespace

nlohmann::json SessionReportToJson(const SessionReport& r) {
  nlohmann::json j;
  j["target"] = r.target;
  j["workload"] = r.workload;
  j["shape"] = r.shape;
  j["layers"] = r.layers;
  j["decode_api"] = r.decode_api;
  j["batch_sessions"] = r.batch_sessions;
  j["batches_in_flight"] = r.batches_in_flight;
  j["region"] = r.region;
  j["concurrency"] = r.concurrency;
  j["verify_fraction"] = r.verify_fraction;
  j["tolerance"] = r.tolerance;
  j["wall_s"] = r.wall_s;
  j["sessions"] = r.sessions;
  j["sessions_ok"] = r.sessions_ok;
  j["interrupted"] = !r.interrupted_by.empty();
  j["interrupted_by"] = r.interrupted_by;
  j["planned"] = r.planned;
  j["completed"] = r.sessions - r.sessions_cut;
  j["sessions_cut"] = r.sessions_cut;
  j["prefill_tokens"] = r.prefill_tokens;
  j["decode_steps"] = r.decode_steps;
  j["decode_steps_per_s"] = r.decode_steps_per_s;
  // The window on the wall clock: [start_unix_s + steady_from_s, + steady_window_s] (several
  // loadgens against one server intersect their windows: scripts/multiproc_summary.py).
  j["start_unix_s"] = r.start_unix_s;
  j["steady_from_s"] = r.steady_from_s;
  j["steady_window_s"] = r.steady_window_s;
  j["steady_decode_steps"] = r.steady_decode_steps;
  j["steady_decode_steps_per_s"] = r.steady_decode_steps_per_s;
  j["prefill_latency_ms"] = LatencyJson(r.prefill_ms);
  j["decode_step_latency_ms"] = LatencyJson(r.step_ms);
  // One stream message's or one packed call's write → reply (ExtendStream, packed,
  // packed-stream); the old key is kept for scripts that read it.
  j["message_latency_ms"] = LatencyJson(r.message_ms);
  j["stream_message_latency_ms"] = LatencyJson(r.message_ms);
  j["server_batch_size"] = LatencyJson(r.server_batch_size);
  j["server_queue_ms"] = LatencyJson(r.server_queue_ms);
  j["server_total_ms"] = LatencyJson(r.server_total_ms);
  j["server_batch_ms"] = LatencyJson(r.server_batch_ms);
  j["server_batch_kernel_ms"] = LatencyJson(r.server_batch_kernel_ms);
  j["server_overhead_ms"] = LatencyJson(r.server_overhead_ms);
  j["server_copy_ms"] = LatencyJson(r.server_copy_ms);
  j["prefill_server_total_ms"] = LatencyJson(r.prefill_server_total_ms);
  j["errors"] = r.errors;
  j["first_error_messages"] = r.first_messages;
  j["verified"] = r.verified;
  j["mismatches"] = r.mismatches;
  j["worst_rel_error"] = r.worst_rel_error;
  j["first_mismatch"] = r.first_mismatch;
  j["forks"] = r.forks;
  j["tokens_saved"] = r.tokens_saved;
  j["prefix_evictions"] = r.prefix_evictions;
  j["release_retries"] = r.release_retries;
  j["releases_failed"] = r.releases_failed;
  if (r.kv_pages_used_after >= 0) j["kv_pages_used_after"] = r.kv_pages_used_after;
  if (r.sequences_after >= 0) j["sequences_after"] = r.sequences_after;
  if (!r.stop_reason.empty()) j["stop_reason"] = r.stop_reason;
  return j;
}

}  // namespace attn::loadgen
