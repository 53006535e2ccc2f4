#include "loadgen/session_report.h"

#include <cstdio>
#include <sstream>

#include "loadgen/report.h"

namespace attn::loadgen {

/// Summary of `h` with every value multiplied by `scale`.
LatencySummary SummarizeScaled(const HdrHistogram& h, double scale) {
  LatencySummary s;
  s.count = h.count();
  s.mean = h.mean() * scale;
  s.p50 = h.Percentile(50) * scale;
  s.p90 = h.Percentile(90) * scale;
  s.p99 = h.Percentile(99) * scale;
  s.max = static_cast<double>(h.max()) * scale;
  return s;
}

/// µs recorded, ms reported.
LatencySummary Summarize(const HdrHistogram& us) { return SummarizeScaled(us, 1e-3); }

namespace {

std::string Fmt(double x, int precision = 3) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, x);
  return buf;
}

std::string LatencyLine(const std::string& name, const LatencySummary& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%-22s n=%-8lld p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f ms\n",
                name.c_str(), static_cast<long long>(s.count), s.p50, s.p90, s.p99, s.max, s.mean);
  return buf;
}

}  // namespace

std::string FormatSessionReport(const SessionReport& r) {
  std::ostringstream out;
  out << "target                 " << r.target << "\n"
      << "workload               " << r.workload << "\n"
      << "shape                  " << r.shape << " layers=" << r.layers << "\n"
      << "decode api             " << r.decode_api
      << (r.batch_sessions > 0 ? " (up to " + std::to_string(r.batch_sessions) + " sessions)"
                               : "")
      << (r.batches_in_flight > 0
              ? ", " + std::to_string(r.batches_in_flight) + " micro-batches in flight"
              : "")
      << (r.region != "none" ? ", tensors through a " + r.region + " shared-memory region" : "")
      << "\n"
      << "concurrency            " << r.concurrency << "\n";
  if (!r.stop_reason.empty()) out << "stopped                " << r.stop_reason << "\n";
  if (!r.interrupted_by.empty()) {
    out << "INTERRUPTED            by " << r.interrupted_by << ": partial report; planned "
        << (r.planned >= 0 ? std::to_string(r.planned) + " sessions"
                           : std::string("open-ended (--duration)"))
        << ", completed " << r.sessions - r.sessions_cut << ", cut short " << r.sessions_cut
        << "\n";
  }
  out << "sessions               " << r.sessions << " (" << r.sessions_ok << " ok)\n"
      << "wall                   " << Fmt(r.wall_s) << " s\n"
      << "prefill tokens         " << r.prefill_tokens << "\n"
      << "decode steps           " << r.decode_steps << " (" << Fmt(r.decode_steps_per_s, 1)
      << " steps/s)\n";
  if (r.steady_window_s > 0) {
    out << "steady decode          " << r.steady_decode_steps << " steps in "
        << Fmt(r.steady_window_s, 3) << " s (" << Fmt(r.steady_decode_steps_per_s, 1)
        << " steps/s, all sessions decoding: after the last prefill, before the first "
           "session ended)\n";
  }
  out << LatencyLine("prefill latency", r.prefill_ms)
      << LatencyLine("decode step latency", r.step_ms);
  if (r.message_ms.count > 0) out << LatencyLine("message latency", r.message_ms);
  if (r.server_batch_size.count > 0) {
    out << "server batch size      mean " << Fmt(r.server_batch_size.mean, 2) << "  p50 "
        << Fmt(r.server_batch_size.p50, 0) << "  p99 " << Fmt(r.server_batch_size.p99, 0)
        << "  max " << Fmt(r.server_batch_size.max, 0)
        << " (sequence steps per launch, from ExecutionReport)\n";
    out << LatencyLine("server queue time", r.server_queue_ms)
        << LatencyLine("server time/step", r.server_total_ms);
  }
  if (r.prefill_server_total_ms.count > 0) {
    out << LatencyLine("server time/prefill", r.prefill_server_total_ms);
  }
  if (r.server_batch_ms.count > 0) {
    out << LatencyLine("server batch wall", r.server_batch_ms)
        << LatencyLine("server batch kernels", r.server_batch_kernel_ms)
        << LatencyLine("server own time/batch", r.server_overhead_ms)
        << LatencyLine("  of which copies", r.server_copy_ms);
  }
  if (r.workload.rfind("mooncake", 0) == 0) {
    out << "forks                  " << r.forks << " (" << r.tokens_saved
        << " tokens per layer shared, " << r.prefix_evictions << " prefix-cache evictions)\n";
  }
  int64_t errors = 0;
  for (const auto& [code, n] : r.errors) errors += n;
  out << "errors                 " << errors << "\n";
  for (const auto& [code, n] : r.errors) {
    out << "  " << code << " x " << n << ": " << r.first_messages.at(code) << "\n";
  }
  if (r.release_retries > 0 || r.releases_failed > 0) {
    out << "releases failed        " << r.releases_failed << " (after " << r.release_retries
        << " retries on UNAVAILABLE; a failed release's sequence stays held until the "
           "server's --sequence-ttl-s)\n";
  }
  if (r.verify_fraction <= 0 && r.verified == 0) {
    out << "verification           off (--verify-fraction 0)\n";  // as Attend runs say
  } else {
    out << "verified               " << r.verified << " outputs, " << r.mismatches
        << " mismatches (worst rel error " << r.worst_rel_error << ", tol " << r.tolerance
        << ")\n";
  }
  if (!r.first_mismatch.empty()) out << "  first mismatch: " << r.first_mismatch << "\n";
  if (r.kv_pages_used_after >= 0) {
    out << "kv pages used after    " << r.kv_pages_used_after << "\n";
  }
  if (r.sequences_after >= 0) {
    out << "live sequences after   " << r.sequences_after << "\n";
  }
  return out.str();
}

std::string SessionCsvHeader() {
  return "workload,decode_api,layers,concurrency,sessions,sessions_ok,errors,wall_s,"
         "prefill_tokens,decode_steps,decode_steps_per_s,prefill_p50_ms,prefill_p90_ms,"
         "prefill_p99_ms,step_p50_ms,step_p90_ms,step_p99_ms,message_p50_ms,message_p99_ms,"
         "verified,mismatches,forks,tokens_saved";
}

std::string SessionCsvRow(const SessionReport& r) {
  int64_t errors = 0;
  for (const auto& [code, n] : r.errors) errors += n;
  std::ostringstream o;
  o << CsvField(r.workload) << "," << r.decode_api << "," << r.layers << "," << r.concurrency << ","
    << r.sessions << "," << r.sessions_ok << "," << errors << "," << Fmt(r.wall_s) << ","
    << r.prefill_tokens << "," << r.decode_steps << "," << Fmt(r.decode_steps_per_s) << ","
    << Fmt(r.prefill_ms.p50) << "," << Fmt(r.prefill_ms.p90) << "," << Fmt(r.prefill_ms.p99) << ","
    << Fmt(r.step_ms.p50) << "," << Fmt(r.step_ms.p90) << "," << Fmt(r.step_ms.p99) << ","
    << Fmt(r.message_ms.p50) << "," << Fmt(r.message_ms.p99) << "," << r.verified << ","
    << r.mismatches << "," << r.forks << "," << r.tokens_saved;
  return o.str();
}

}  // namespace attn::loadgen
