#include "loadgen/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace attn::loadgen {
namespace {

std::string Format(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, value);
  return buf;
}

std::string Row(const std::string& label, const std::string& value) {
  std::string line = "  " + label;
  if (line.size() < 22) line.resize(22, ' ');
  if (line.back() != ' ') line += ' ';  // long labels (e.g. FAILED_PRECONDITION) keep a gap
  return line + value + "\n";
}

nlohmann::json SummaryJson(const Summary& s, bool with_tail) {
  if (s.count == 0) return nullptr;
  nlohmann::json j = {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50}};
  if (with_tail) {
    j["p90"] = s.p90;
    j["p99"] = s.p99;
    j["max"] = s.max;
  }
  return j;
}

// JSON has no infinity: write non-finite errors as null.
nlohmann::json Number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nullptr; }

}  // namespace

Report BuildReport(const RunInfo& info, const std::vector<Sample>& samples, double wall_s,
                   int64_t client_overload) {
  Report r;
  r.info = info;
  r.wall_s = wall_s;
  r.client_overload = client_overload;
  HdrHistogram latency_us;
  double latency_sum_ms = 0;
  double latency_max_ms = 0;
  std::array<std::vector<double>, 7> phases;
  std::vector<double> batch_sizes;
  for (const Sample& s : samples) {
    ++r.sent;
    if (s.status != "OK") {
      ++r.errors[s.status];
      r.first_messages.emplace(s.status, s.error_message);
      continue;
    }
    ++r.ok;
    r.query_tokens += s.query_tokens;
    latency_us.Record(static_cast<int64_t>(std::llround(s.latency_ms * 1000.0)));
    latency_sum_ms += s.latency_ms;
    latency_max_ms = std::max(latency_max_ms, s.latency_ms);
    r.flops += s.flops;
    // The call's share of its launch's kernel time (see Report::kernel_s); batch_size 0 (a
    // server that does not say) counts as a launch of its own.
    r.kernel_s += static_cast<double>(s.phase_us[3]) * 1e-6 /
                  static_cast<double>(std::max<int64_t>(1, s.batch_size));
    for (size_t p = 0; p < phases.size(); ++p)
      phases[p].push_back(static_cast<double>(s.phase_us[p]));
    batch_sizes.push_back(static_cast<double>(s.batch_size));
    ++r.backends[s.backend.empty() ? "(none)"
                                   : s.backend + " on " + (s.device.empty() ? "?" : s.device)];
    if (s.verified) {
      ++r.verified;
      if (s.mismatch) {
        ++r.mismatches;
        if (r.first_mismatch.empty()) {
          r.first_mismatch = "request " + std::to_string(s.index) + ": " + s.mismatch_detail;
        }
      }
      if (!(s.rel_error <= r.worst_rel_error)) r.worst_rel_error = s.rel_error;
      if (!(s.worst_row_rel_error <= r.worst_row_rel_error)) {
        r.worst_row_rel_error = s.worst_row_rel_error;
      }
    }
  }
  if (latency_us.count() > 0) {
    r.latency_ms.count = latency_us.count();
    r.latency_ms.mean = latency_sum_ms / static_cast<double>(latency_us.count());
    r.latency_ms.p50 = latency_us.Percentile(50) / 1000.0;
    r.latency_ms.p90 = latency_us.Percentile(90) / 1000.0;
    r.latency_ms.p99 = latency_us.Percentile(99) / 1000.0;
    r.latency_ms.max = latency_max_ms;
  }
  if (r.kernel_s > 0) r.tflops = r.flops / r.kernel_s / 1e12;
  r.completed = r.sent;
  if (!info.interrupted_by.empty() && r.errors.count("CANCELLED") > 0) {
    r.completed -= r.errors.at("CANCELLED");
  }
  for (size_t p = 0; p < phases.size(); ++p) r.phases_us[kPhaseNames[p]] = Summarize(phases[p]);
  r.batch_size = Summarize(std::move(batch_sizes));
  if (wall_s > 0) {
    r.requests_per_s = static_cast<double>(r.ok) / wall_s;
    r.tokens_per_s = static_cast<double>(r.query_tokens) / wall_s;
  }
  if (info.mode == "open" && info.rate > 0 && r.ok >= kRateWarnMinCalls) {
    // Rates between the first and the last event, so neither the first call's latency nor the
    // last one's counts as a gap: a loop that keeps up completes calls as fast as they arrive.
    double first = 0, last = 0;
    bool any = false;
    for (const Sample& s : samples) {
      if (s.status != "OK") continue;
      first = any ? std::min(first, s.done_s) : s.done_s;
      last = any ? std::max(last, s.done_s) : s.done_s;
      any = true;
    }
    const double achieved = last > first ? static_cast<double>(r.ok - 1) / (last - first) : 0;
    double offered = info.rate;
    if (info.schedule_s > 0 && r.sent > 1) {
      offered = std::min(offered, static_cast<double>(r.sent - 1) / info.schedule_s);
    }
    if (last > first && achieved < kRateWarnFraction * offered) {
      std::string w =
          Format("offered %.1f/s, ", info.rate) +
          Format("achieved %.1f/s: the server or the loadgen could not keep up", achieved);
      if (r.ok < r.sent) w += " (" + std::to_string(r.sent - r.ok) + " calls failed)";
      if (r.client_overload > 0) {
        w += "; " + std::to_string(r.client_overload) +
             " arrivals waited for a --max-in-flight slot";
      }
      w += "; latencies include the queueing; lower --rate or use a faster backend";
      r.warnings.push_back(w);
    }
  }
  return r;
}

std::string FormatReport(const Report& r) {
  std::ostringstream out;
  out << "attention-loadgen report\n";
  out << Row("target", r.info.target);
  out << Row("workload", r.info.workload);
  out << Row("shape", r.info.shape);
  out << Row("backend", r.info.backend.empty() ? "(server default)" : r.info.backend);
  if (r.info.mode == "open") {
    out << Row("mode", "open loop, Poisson arrivals at " + Format("%.2f", r.info.rate) +
                           " requests/s (max in flight " + std::to_string(r.info.max_in_flight) +
                           "); latency from the scheduled send time");
  } else {
    out << Row("mode", "closed loop, concurrency " + std::to_string(r.info.concurrency));
  }
  if (!r.info.stop_reason.empty()) out << Row("stopped early", r.info.stop_reason);
  if (!r.info.interrupted_by.empty()) {
    out << Row("INTERRUPTED",
               "by " + r.info.interrupted_by + ": partial report; planned " +
                   (r.info.planned >= 0 ? std::to_string(r.info.planned) + " requests"
                                        : std::string("open-ended (--duration)")) +
                   ", completed " + std::to_string(r.completed) +
                   " (calls still in flight after the grace period were cancelled: " +
                   std::to_string(r.sent - r.completed) + ")");
  }
  const int64_t errors = r.sent - r.ok;
  out << Row("requests", "sent " + std::to_string(r.sent) + ", ok " + std::to_string(r.ok) +
                             ", errors " + std::to_string(errors));
  for (const auto& [code, count] : r.errors) {
    std::string msg = r.first_messages.at(code);
    if (msg.size() > 120) msg = msg.substr(0, 117) + "...";
    out << Row("  " + code, std::to_string(count) + "  (first: \"" + msg + "\")");
  }
  if (r.info.mode == "open") {
    out << Row("client overload", std::to_string(r.client_overload) +
                                      " arrivals waited for an in-flight slot (latency still "
                                      "from the scheduled time)");
  }
  out << Row("wall time", Format("%.3f s", r.wall_s));
  out << Row("throughput", Format("%.2f requests/s, ", r.requests_per_s) +
                               Format("%.0f tokens/s", r.tokens_per_s) + " (query tokens " +
                               std::to_string(r.query_tokens) + ")");
  if (r.latency_ms.count > 0) {
    out << Row("latency (ms)",
               Format("p50 %.3f", r.latency_ms.p50) + Format("  p90 %.3f", r.latency_ms.p90) +
                   Format("  p99 %.3f", r.latency_ms.p99) + Format("  max %.3f", r.latency_ms.max) +
                   Format("  mean %.3f", r.latency_ms.mean));
    out << Row("server phases (us)", "      mean        p50");
    for (const char* name : kPhaseNames) {
      const Summary& s = r.phases_us.at(name);
      out << Row("  " + std::string(name), Format("%10.1f", s.mean) + Format(" %10.0f", s.p50));
    }
    out << Row("server batch size",
               Format("mean %.2f", r.batch_size.mean) + Format("  p50 %.0f", r.batch_size.p50) +
                   Format("  p99 %.0f", r.batch_size.p99) + Format("  max %.0f", r.batch_size.max) +
                   " (calls per launch; queue time is the phase above)");
  } else {
    out << Row("latency (ms)", "n/a (no successful request)");
  }
  if (r.kernel_s > 0) {
    out << Row("achieved", Format("%.4f TFLOP/s", r.tflops) +
                               " (server flops / kernel time, each launch counted once)");
  }
  std::string backends;
  for (const auto& [name, count] : r.backends) {
    backends += (backends.empty() ? "" : ", ") + name + ": " + std::to_string(count);
  }
  out << Row("backends seen", backends.empty() ? "none" : backends);
  if (r.info.verify_fraction > 0) {
    out << Row("verification", "checked " + std::to_string(r.verified) + ", mismatches " +
                                   std::to_string(r.mismatches) +
                                   Format(", worst rel error %.3g", r.worst_rel_error) +
                                   Format(" (worst row %.3g", r.worst_row_rel_error) +
                                   Format(", tol %.3g)", r.info.tolerance));
    if (!r.first_mismatch.empty()) out << Row("  first mismatch", r.first_mismatch);
  } else {
    out << Row("verification", "off (--verify-fraction 0)");
  }
  for (const std::string& w : r.warnings) out << Row("WARNING", w);
  return out.str();
}

nlohmann::json ReportToJson(const Report& r) {
  nlohmann::json j;
  j["target"] = r.info.target;
  j["workload"] = r.info.workload;
  j["shape"] = r.info.shape;
  j["backend"] = r.info.backend;
  j["mode"] = r.info.mode;
  j["concurrency"] = r.info.concurrency;
  j["rate"] = r.info.rate;
  j["max_in_flight"] = r.info.max_in_flight;
  j["client_overload"] = r.client_overload;
  j["flops"] = r.flops;
  j["kernel_s"] = r.kernel_s;
  j["tflops"] = r.tflops;
  j["stop_reason"] = r.info.stop_reason;
  j["interrupted"] = !r.info.interrupted_by.empty();
  j["interrupted_by"] = r.info.interrupted_by;
  j["requests"] = {{"planned", r.info.planned},
                   {"sent", r.sent},
                   {"ok", r.ok},
                   {"errors", r.sent - r.ok},
                   {"completed", r.completed}};
  j["warnings"] = r.warnings;
  j["errors"] = nlohmann::json::object();
  for (const auto& [code, count] : r.errors) {
    j["errors"][code] = {{"count", count}, {"first_message", r.first_messages.at(code)}};
  }
  j["wall_s"] = r.wall_s;
  j["throughput"] = {{"requests_per_s", r.requests_per_s},
                     {"tokens_per_s", r.tokens_per_s},
                     {"query_tokens", r.query_tokens}};
  j["latency_ms"] = SummaryJson(r.latency_ms, true);
  j["server_phases_us"] = nlohmann::json::object();
  for (const char* name : kPhaseNames) {
    j["server_phases_us"][name] = SummaryJson(r.phases_us.at(name), false);
  }
  j["backends"] = r.backends;
  j["batch_size"] = SummaryJson(r.batch_size, true);
  j["verification"] = {{"fraction", r.info.verify_fraction},
                       {"tolerance", r.info.tolerance},
                       {"checked", r.verified},
                       {"mismatches", r.mismatches},
                       {"worst_rel_error", Number(r.worst_rel_error)},
                       {"worst_row_rel_error", Number(r.worst_row_rel_error)},
                       {"first_mismatch", r.first_mismatch}};
  return j;
}

std::string CsvField(const std::string& field) {
  if (field.find_first_of(",\"\n\r") == std::string::npos) return field;
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string CsvHeader() {
  return "mode,target,workload,shape,backend,concurrency,rate,max_in_flight,sent,ok,errors,"
         "client_overload,wall_s,requests_per_s,tokens_per_s,latency_p50_ms,latency_p90_ms,"
         "latency_p99_ms,latency_max_ms,latency_mean_ms,tflops,verified,mismatches";
}

std::string CsvRow(const Report& r) {
  auto num = [](double x) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", x);
    return std::string(buf);
  };
  std::string row;
  bool first = true;
  for (const std::string& f :
       {r.info.mode, r.info.target, r.info.workload, r.info.shape, r.info.backend,
        std::to_string(r.info.concurrency), num(r.info.rate), std::to_string(r.info.max_in_flight),
        std::to_string(r.sent), std::to_string(r.ok), std::to_string(r.sent - r.ok),
        std::to_string(r.client_overload), num(r.wall_s), num(r.requests_per_s),
        num(r.tokens_per_s), num(r.latency_ms.p50), num(r.latency_ms.p90), num(r.latency_ms.p99),
        num(r.latency_ms.max), num(r.latency_ms.mean), num(r.tflops), std::to_string(r.verified),
        std::to_string(r.mismatches)}) {
    // clang-format on
    if (!first) row += ",";
    first = false;
    row += CsvField(f);
  }
  return row;
}

}  // namespace attn::loadgen
