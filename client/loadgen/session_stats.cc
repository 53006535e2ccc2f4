#include "loadgen/session_stats.h"

#include <algorithm>
#include <cmath>

#include "loadgen/runner.h"

namespace attn::loadgen {

namespace av1 = attention::v1;

int64_t SessionMicros(SessionClock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

void SessionStats::StepDone(int64_t us) {
  step_us.Record(us);
  if (progress != nullptr) progress->Record(static_cast<double>(us) / 1000.0, true);
}

void SessionStats::Error(grpc::StatusCode code, const std::string& where,
                         const std::string& message) {
  if (progress != nullptr) progress->Record(0, false);
  const std::string name = StatusCodeName(code);
  ++errors[name];
  first_messages.emplace(name, where + ": " + message);
}

void SessionStats::Check(const Comparison& c, const std::string& where) {
  ++verified;
  if (std::isfinite(c.rel_error)) worst = std::max(worst, c.rel_error);
  if (!c.pass) {
    ++mismatches;
    if (first_mismatch.empty()) first_mismatch = where + ": " + c.detail;
  }
}

void SessionStats::Server(const av1::ExecutionReport& report, bool prefill) {
  if (prefill) {
    prefill_server_total_us.Record(std::max<int64_t>(report.times().total_us(), 0));
    return;
  }
  server_batch.Record(std::max<int64_t>(report.batch_size(), 0));
  server_queue_us.Record(std::max<int64_t>(report.times().queue_us(), 0));
  server_total_us.Record(std::max<int64_t>(report.times().total_us(), 0));
  const auto& t = report.times();
  if (t.batch_us() > 0) {
    server_batch_us.Record(t.batch_us());
    // A step the server ran without device timing (--kv-timing-every) has no kernel or copy
    // time: it counts toward the batch wall time only.
    if (t.device_untimed()) return;
    server_batch_kernel_us.Record(std::max<int64_t>(t.batch_kernel_us(), 0));
    server_overhead_us.Record(std::max<int64_t>(t.batch_us() - t.batch_kernel_us(), 0));
    server_copy_us.Record(std::max<int64_t>(t.host_to_device_us(), 0) +
                          std::max<int64_t>(t.device_to_host_us(), 0));
  }
}

void SessionStats::Merge(const SessionStats& o) {
  sessions += o.sessions;
  sessions_ok += o.sessions_ok;
  sessions_cut += o.sessions_cut;
  prefill_tokens += o.prefill_tokens;
  decode_steps += o.decode_steps;
  prefill_us.Merge(o.prefill_us);
  step_us.Merge(o.step_us);
  message_us.Merge(o.message_us);
  server_batch.Merge(o.server_batch);
  server_queue_us.Merge(o.server_queue_us);
  server_total_us.Merge(o.server_total_us);
  server_batch_us.Merge(o.server_batch_us);
  server_batch_kernel_us.Merge(o.server_batch_kernel_us);
  server_overhead_us.Merge(o.server_overhead_us);
  server_copy_us.Merge(o.server_copy_us);
  prefill_server_total_us.Merge(o.prefill_server_total_us);
  step_done_us.insert(step_done_us.end(), o.step_done_us.begin(), o.step_done_us.end());
  prefill_done_us.insert(prefill_done_us.end(), o.prefill_done_us.begin(), o.prefill_done_us.end());
  decode_end_us.insert(decode_end_us.end(), o.decode_end_us.begin(), o.decode_end_us.end());
  for (const auto& [k, v] : o.errors) errors[k] += v;
  for (const auto& [k, v] : o.first_messages) first_messages.emplace(k, v);
  verified += o.verified;
  mismatches += o.mismatches;
  worst = std::max(worst, o.worst);
  if (first_mismatch.empty()) first_mismatch = o.first_mismatch;
  forks += o.forks;
  tokens_saved += o.tokens_saved;
  evictions += o.evictions;
  release_retries += o.release_retries;
  releases_failed += o.releases_failed;
}

void SteadyWindow(const SessionStats& all, SessionReport* r) {
  if (all.prefill_done_us.empty() || all.decode_end_us.empty()) return;
  const int64_t from = *std::max_element(all.prefill_done_us.begin(), all.prefill_done_us.end());
  const int64_t to = *std::min_element(all.decode_end_us.begin(), all.decode_end_us.end());
  if (to <= from) return;
  int64_t n = 0;
  for (int64_t t : all.step_done_us) n += (t > from && t <= to) ? 1 : 0;
  r->steady_from_s = static_cast<double>(from) * 1e-6;
  r->steady_window_s = static_cast<double>(to - from) * 1e-6;
  r->steady_decode_steps = n;
  r->steady_decode_steps_per_s = static_cast<double>(n) / r->steady_window_s;
}

void FillSessionReport(const SessionStats& all, double wall, SessionReport* r) {
  r->wall_s = wall;
  r->sessions = all.sessions;
  r->sessions_ok = all.sessions_ok;
  r->sessions_cut = all.sessions_cut;
  r->prefill_tokens = all.prefill_tokens;
  r->decode_steps = all.decode_steps;
  r->decode_steps_per_s = wall > 0 ? all.decode_steps / wall : 0;
  SteadyWindow(all, r);
  r->prefill_ms = Summarize(all.prefill_us);
  r->step_ms = Summarize(all.step_us);
  r->message_ms = Summarize(all.message_us);
  r->server_batch_size = SummarizeScaled(all.server_batch, 1.0);
  r->server_queue_ms = Summarize(all.server_queue_us);
  r->server_total_ms = Summarize(all.server_total_us);
  r->server_batch_ms = Summarize(all.server_batch_us);
  r->server_batch_kernel_ms = Summarize(all.server_batch_kernel_us);
  r->server_overhead_ms = Summarize(all.server_overhead_us);
  r->server_copy_ms = Summarize(all.server_copy_us);
  r->prefill_server_total_ms = Summarize(all.prefill_server_total_us);
  r->errors = all.errors;
  r->first_messages = all.first_messages;
  r->verified = all.verified;
  r->mismatches = all.mismatches;
  r->worst_rel_error = all.worst;
  r->first_mismatch = all.first_mismatch;
  r->forks = all.forks;
  r->tokens_saved = all.tokens_saved;
  r->prefix_evictions = all.evictions;
  r->release_retries = all.release_retries;
  r->releases_failed = all.releases_failed;
}

}  // namespace attn::loadgen
