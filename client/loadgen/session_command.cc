#include "loadgen/session_command.h"

#include <fstream>
#include <iostream>
#include <vector>

#include "loadgen/cli_common.h"
#include "loadgen/dtype_codec.h"
#include "loadgen/interrupt.h"
#include "loadgen/trace.h"
#include "loadgen/verify.h"

namespace attn::loadgen {
namespace {

// Option combinations CLI11 cannot check on its own; false (said on stderr) when refused.
bool OptionsCombine(const SessionOptions& session) {
  const std::string& api = session.decode_api;
  if (session.workload == "mooncake" && api != "extend" && api != "stream") {
    std::cerr << "attention-loadgen: --workload mooncake decodes with extend or stream\n";
    return false;
  }
  if (session.region != "none" && api != "packed" && api != "packed-stream") {
    std::cerr << "attention-loadgen: --region " << session.region
              << " needs --decode-api packed or packed-stream (only packed batches name regions)\n";
    return false;
  }
  return true;
}

}  // namespace

int RunSessionCommand(const SessionCommand& c) {
  const SessionOptions& session = c.session;
  const RunOptions& run = c.session.run;
  const std::string& workload = c.session.workload;
  const TokenScaling& scaling = c.session.scaling;
  std::string trace_path = c.trace_path;
  const int64_t trace_offset = c.trace_offset;
  const int64_t requests = c.requests;
  const double duration_s = run.duration_s;
  const int64_t fixed_tokens = c.fixed_tokens;
  const std::string& csv_path = c.csv_path;
  const std::string& json_path = c.json_path;
  const bool fail_on_error = c.fail_on_error;
  if (!OptionsCombine(session)) return kExitCannotStart;
  std::vector<SessionPlan> plans;
  std::vector<MooncakeRequest> mooncake;
  std::string description;
  int64_t available = 0;
  std::string error;
  if (workload == "mooncake") {
    if (trace_path.empty()) trace_path = DefaultTracePath("conversation_trace.jsonl");
    if (!ReadMooncakeRequests(trace_path, &mooncake, &error)) {
      std::cerr << "attention-loadgen: " << error << "\n";
      return kExitCannotStart;
    }
    if (trace_offset >= static_cast<int64_t>(mooncake.size())) {
      std::cerr << "attention-loadgen: --trace-offset is past the trace's rows\n";
      return kExitCannotStart;
    }
    mooncake.erase(mooncake.begin(), mooncake.begin() + trace_offset);
    available = static_cast<int64_t>(mooncake.size());
    description = "mooncake " + BaseName(trace_path);
  } else if (c.fixed) {
    plans.push_back(SessionPlan{fixed_tokens, session.max_gen});
    available = 100;
    description = "session fixed " + std::to_string(fixed_tokens) + " + " +
                  std::to_string(session.max_gen) + " tokens";
  } else {
    if (trace_path.empty()) trace_path = DefaultTracePath();
    std::vector<TraceRecord> rows;
    if (!ReadTrace(trace_path, &rows, &error)) {
      std::cerr << "attention-loadgen: " << error << "\n";
      return kExitCannotStart;
    }
    if (trace_offset >= static_cast<int64_t>(rows.size())) {
      std::cerr << "attention-loadgen: --trace-offset is past the trace's rows\n";
      return kExitCannotStart;
    }
    for (size_t i = static_cast<size_t>(trace_offset); i < rows.size(); ++i) {
      plans.push_back(PlanSession(rows[i], scaling, session.gen_scale, session.max_gen));
    }
    available = static_cast<int64_t>(plans.size());
    description = "session " + BaseName(trace_path);
  }
  description += " (rows from " + std::to_string(trace_offset) + "; token scale " +
                 Trim(scaling.scale) + " clamped to [" + std::to_string(scaling.min_tokens) + ", " +
                 std::to_string(scaling.max_tokens) + "]; gen scale " + Trim(session.gen_scale) +
                 ", max " + std::to_string(session.max_gen) + ")";
  const int64_t count = requests >= 0 ? requests : (duration_s > 0 ? -1 : available);
  SessionReport report = RunSessions(session, plans, mooncake, count);
  report.target = run.target;
  report.workload = description;
  report.shape = "N=" + std::to_string(run.shape.heads) +
                 " K=" + std::to_string(run.shape.kv_heads) +
                 " H=" + std::to_string(run.shape.head_dim) + " " + DTypeName(run.shape.dtype);
  report.decode_api = session.decode_api;
  report.concurrency = run.concurrency;
  report.layers = session.layers;
  const bool grouped = session.decode_api == "batch" || session.decode_api == "packed" ||
                       session.decode_api == "packed-stream";
  report.batch_sessions = grouped ? session.batch_sessions : 0;
  report.batches_in_flight = session.decode_api == "packed-stream" ? session.batches_in_flight : 0;
  const bool packed = session.decode_api == "packed" || session.decode_api == "packed-stream";
  report.region = packed ? session.region : "none";
  report.verify_fraction = run.verify_fraction;
  report.tolerance = ResolveTolerance(run.tolerance, run.shape.dtype);
  report.planned = count;
  report.interrupted_by = Interrupt::SignalName();
  std::cout << FormatSessionReport(report) << std::flush;
  if (!csv_path.empty() &&
      !WriteFile(csv_path, SessionCsvHeader() + "\n" + SessionCsvRow(report) + "\n")) {
    std::cerr << "attention-loadgen: cannot write " << csv_path << "\n";
    return kExitCannotStart;
  }
  if (!json_path.empty()) {
    nlohmann::json j = SessionReportToJson(report);
    j["seed"] = run.seed;
    std::ofstream out(json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::cerr << "attention-loadgen: cannot write " << json_path << "\n";
      return kExitCannotStart;
    }
  }
  int64_t errors = 0;
  for (const auto& [code, n] : report.errors) errors += n;
  if (Interrupt::Requested()) return Interrupt::ExitCode();
  if (session.check_kv_released &&
      (report.kv_pages_used_after != 0 || report.sequences_after != 0)) {
    std::cerr << "attention-loadgen: --check-kv-released: "
              << (report.kv_pages_used_after < 0 || report.sequences_after < 0
                      ? report.stop_reason
                      : std::to_string(report.kv_pages_used_after) + " KV pages still used, " +
                            std::to_string(report.sequences_after) + " sequences still live")
              << "\n";
    return 1;
  }
  if (fail_on_error && (errors > 0 || report.mismatches > 0)) return 1;
  // Nothing worked: a failure whatever --fail-on-error says.
  if (report.sessions > 0 && report.sessions_ok == 0) return 1;
  return 0;
}

}  // namespace attn::loadgen
