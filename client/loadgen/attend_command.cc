#include "loadgen/attend_command.h"

#include <fstream>
#include <iostream>
#include <vector>

#include "loadgen/cli_common.h"
#include "loadgen/dtype_codec.h"
#include "loadgen/interrupt.h"
#include "loadgen/progress.h"
#include "loadgen/report.h"
#include "loadgen/trace.h"
#include "loadgen/verify.h"

namespace attn::loadgen {

namespace {

std::string CausalName(attention::v1::CausalAlignment c) {
  switch (c) {
    case attention::v1::CAUSAL_TOP_LEFT:
      return "top_left";
    case attention::v1::CAUSAL_BOTTOM_RIGHT:
      return "bottom_right";
    default:
      return "none";
  }
}

// The request plan of the trace or fixed workload: sets run.max_requests, adds the plan to
// `plans` and describes it in info->workload. False (the reason on stderr) when the trace
// cannot be read or the offset is past its rows.
bool PlanAttend(LoadgenFlags* f, std::vector<RequestPlan>* plans, RunInfo* info) {
  RunOptions& run = f->run;
  const TokenScaling& scaling = f->scaling;
  if (f->workload != "trace") {
    run.max_requests = f->requests >= 0 ? f->requests : (f->duration_s > 0 ? -1 : 100);
    plans->push_back(RequestPlan::Fixed(f->fixed_tokens));
    info->workload = "fixed " + std::to_string(f->fixed_tokens) + " tokens per request";
    return true;
  }
  std::string& trace_path = f->trace_path;
  if (trace_path.empty()) trace_path = DefaultTracePath();
  std::vector<TraceRecord> rows;
  std::string error;
  if (!ReadTrace(trace_path, &rows, &error)) {
    std::cerr << "attention-loadgen: " << error << "\n";
    return false;
  }
  const int64_t trace_offset = f->trace_offset;
  if (trace_offset >= static_cast<int64_t>(rows.size())) {
    std::cerr << "attention-loadgen: --trace-offset " << trace_offset << " is past the "
              << rows.size() << " rows of " << trace_path << "\n";
    return false;
  }
  const int64_t available = static_cast<int64_t>(rows.size()) - trace_offset;
  rows.erase(rows.begin(), rows.begin() + trace_offset);
  run.max_requests = f->requests >= 0 ? f->requests : (f->duration_s > 0 ? -1 : available);
  plans->emplace_back(std::move(rows), scaling, f->time_scale);
  info->workload = "trace " + BaseName(trace_path) + " (rows from " + std::to_string(trace_offset) +
                   ", " + std::to_string(available) + " available; token scale " +
                   Trim(scaling.scale) + " clamped to [" + std::to_string(scaling.min_tokens) +
                   ", " + std::to_string(scaling.max_tokens) + "]; time scale " +
                   Trim(f->time_scale) + ")";
  return true;
}

// The head of the report: target, shape, backend, mode and verification settings.
void DescribeRun(const LoadgenFlags& f, RunInfo* info) {
  const RunOptions& run = f.run;
  info->target = run.target;
  info->shape = "B=" + std::to_string(run.shape.batch) + " N=" + std::to_string(run.shape.heads) +
                " K=" + std::to_string(run.shape.kv_heads) +
                " H=" + std::to_string(run.shape.head_dim) + " " + DTypeName(run.shape.dtype) +
                " causal=" + CausalName(run.shape.causal) + (run.shape.return_lse ? " +lse" : "");
  info->backend = run.shape.backend;
  info->mode = f.mode;
  info->concurrency = run.concurrency;
  info->rate = f.mode == "open" ? run.rate : 0;
  info->max_in_flight = f.mode == "open" ? run.max_in_flight : 0;
  info->verify_fraction = run.verify_fraction;
  info->tolerance = ResolveTolerance(run.tolerance, run.shape.dtype);
}

// --csv and --json; false (the reason on stderr) when one cannot be written.
bool WriteOutputs(const LoadgenFlags& f, const Report& report, const std::string& command) {
  if (!f.csv_path.empty() && !WriteFile(f.csv_path, CsvHeader() + "\n" + CsvRow(report) + "\n")) {
    std::cerr << "attention-loadgen: cannot write " << f.csv_path << "\n";
    return false;
  }
  if (!f.json_path.empty()) {
    nlohmann::json j = ReportToJson(report);
    j["command"] = command;
    j["seed"] = f.run.seed;
    std::ofstream out(f.json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::cerr << "attention-loadgen: cannot write " << f.json_path << "\n";
      return false;
    }
  }
  return true;
}

}  // namespace

int RunAttendCommand(LoadgenFlags f, const std::string& command) {
  RunInfo info;
  std::vector<RequestPlan> plans;
  if (!PlanAttend(&f, &plans, &info)) return kExitCannotStart;
  DescribeRun(f, &info);
  RunOptions& run = f.run;
  Progress progress(!f.quiet);
  run.progress = &progress;
  progress.Start();
  RunResult result =
      f.mode == "open" ? RunOpenLoop(run, plans.front()) : RunClosedLoop(run, plans.front());
  progress.Stop();
  info.stop_reason = result.stop_reason;
  info.planned = run.max_requests;
  info.schedule_s = result.schedule_s;
  info.interrupted_by = Interrupt::SignalName();
  const Report report = BuildReport(info, result.samples, result.wall_s, result.client_overload);
  std::cout << FormatReport(report) << std::flush;
  for (const std::string& w : report.warnings)
    std::cerr << "attention-loadgen: warning: " << w << "\n";
  if (!WriteOutputs(f, report, command)) return kExitCannotStart;
  if (Interrupt::Requested()) return Interrupt::ExitCode();
  if (f.fail_on_error && (report.ok != report.sent || report.mismatches > 0)) return 1;
  // Stopped early (target unreachable) or nothing succeeded: a failure whatever
  // --fail-on-error says.
  if (!report.info.stop_reason.empty() || (report.sent > 0 && report.ok == 0)) return 1;
  return 0;
}

}  // namespace attn::loadgen
