// The final report of a load run: aggregation of per-request samples, text and JSON output.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loadgen/hdr_histogram.h"
#include "loadgen/stats.h"

namespace attn::loadgen {

/// Server phases, in ExecutionReport.times order.
inline constexpr std::array<const char*, 7> kPhaseNames = {
    "decode", "queue", "host_to_device", "kernel", "device_to_host", "encode", "total"};

/// What happened to one request.
struct Sample {
  int64_t index = 0;                  // request number in the plan
  std::string status = "OK";          // gRPC status code name
  std::string error_message;          // empty when OK
  double latency_ms = 0;              // from the scheduled (or actual) send to the response
  double done_s = 0;                  // when the response came, seconds from the run's start
  int64_t query_tokens = 0;           // B × T
  double flops = 0;                   // ExecutionReport.flops
  std::array<int64_t, 7> phase_us{};  // ExecutionReport.times, kPhaseNames order
  std::string backend;                // ExecutionReport.backend
  std::string device;                 // ExecutionReport.device
  int64_t batch_size = 0;             // ExecutionReport.batch_size (calls in its launch)
  bool verified = false;
  bool mismatch = false;
  double rel_error = 0;            // when verified
  double worst_row_rel_error = 0;  // when verified
  std::string mismatch_detail;     // first reason when mismatch
};

/// Run description printed at the head of the report.
struct RunInfo {
  std::string target;
  std::string workload;  // e.g. "trace AzureLLMInferenceTrace_conv.csv" or "fixed 1024 tokens"
  std::string shape;     // e.g. "B=1 N=8 K=8 H=64 bf16 causal=bottom_right"
  std::string backend;   // requested backend, empty: server default
  std::string mode = "closed";  // closed | open
  int concurrency = 1;          // closed loop
  double rate = 0;              // open loop: requests/s
  int max_in_flight = 0;        // open loop
  double schedule_s = 0;        // open loop: scheduled time of the last arrival sent, s
  double verify_fraction = 0;
  double tolerance = 0;     // verification tolerance for the dtype
  std::string stop_reason;  // why the run ended early (empty if it ran to completion)
  // Requests the run was to make (--requests, or the trace's rows); -1 when open-ended (a
  // --duration run).
  int64_t planned = -1;
  std::string interrupted_by;  // "SIGINT" / "SIGTERM" when a signal cut the run short, else ""
};

/// Aggregated results.
struct Report {
  RunInfo info;
  int64_t sent = 0;  // calls made (each has a sample: OK or an error)
  int64_t ok = 0;
  int64_t completed = 0;  // calls answered by the server: sent less those the interrupt cancelled
  std::map<std::string, int64_t> errors;              // by status code name
  std::map<std::string, std::string> first_messages;  // first message per error code
  double wall_s = 0;
  int64_t query_tokens = 0;     // over OK requests
  double requests_per_s = 0;    // OK requests / wall time
  double tokens_per_s = 0;      // OK query tokens / wall time
  Summary latency_ms;           // over OK requests (HDR histogram, ~3 digits)
  int64_t client_overload = 0;  // open loop: arrivals that waited for a slot
  double flops = 0;             // sum of ExecutionReport.flops over OK requests
  // Kernel seconds attributable to the OK requests: each call's kernel_us (the time of the
  // whole launch it ran in) divided by its batch_size (the calls in that launch), summed. When
  // every call of each launch is ours this is exactly the sum of the distinct launches' kernel
  // times, so flops / kernel_s is the rate the device achieved; dividing by the plain sum of
  // kernel_us would count each launch batch_size times and understate it by the batch size.
  double kernel_s = 0;
  double tflops = 0;                         // flops / kernel_s / 1e12 (0 without kernel time)
  std::map<std::string, Summary> phases_us;  // by kPhaseNames, over OK requests
  Summary batch_size;                        // ExecutionReport.batch_size over OK requests
  std::map<std::string, int64_t> backends;   // "backend on device" -> count
  int64_t verified = 0;
  int64_t mismatches = 0;
  double worst_rel_error = 0;
  double worst_row_rel_error = 0;
  std::string first_mismatch;
  // Things the reader should know (e.g. an open loop that did not achieve its offered rate);
  // printed in the report, on stderr by main, and as "warnings" in the JSON.
  std::vector<std::string> warnings;
};

/// The achieved rate below which an open loop warns, as a fraction of the offered rate.
inline constexpr double kRateWarnFraction = 0.9;
/// An open loop warns about its rate only with at least this many answered calls (fewer give
/// too noisy a rate to judge).
inline constexpr int64_t kRateWarnMinCalls = 10;

/// Aggregates `samples` of a run that took `wall_s` seconds.
/// Latency percentiles come from an HdrHistogram of microseconds (mean and max exact). An open
/// loop (info.mode "open") gets a warning when its achieved rate, (OK calls - 1) / (last OK
/// response - first OK response), is below kRateWarnFraction x the offered rate; the offered
/// rate is info.rate, or the rate its Poisson schedule actually drew ((sent - 1) /
/// info.schedule_s) when that is lower, so a short run's draw is not taken for overload. When
/// info.interrupted_by is set, CANCELLED samples are the calls the interrupt cancelled and are not
/// counted as completed.
Report BuildReport(const RunInfo& info, const std::vector<Sample>& samples, double wall_s,
                   int64_t client_overload = 0);

/// The report as aligned, human-readable text (ends with a newline).
std::string FormatReport(const Report& report);

/// The report as JSON (same content as the text).
nlohmann::json ReportToJson(const Report& report);

/// The CSV header and one summary row of a report (RFC 4180 quoting), each without newline.
std::string CsvHeader();
std::string CsvRow(const Report& report);

/// Quotes a CSV field when needed.
std::string CsvField(const std::string& field);

}  // namespace attn::loadgen
