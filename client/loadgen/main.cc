// attention-loadgen: closed-loop load generator for attention.v1.AttentionService.
// Replays the Azure LLM inference 2023 traces (or a fixed size), optionally verifies a sample of
// responses against a float64 oracle, and prints a report. See `attention-loadgen --help`.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "loadgen/dtype_codec.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/trace.h"
#include "loadgen/verify.h"
#include "loadgen/workload.h"

#ifndef ATTN_LOADGEN_DATA_DIR
#define ATTN_LOADGEN_DATA_DIR ""
#endif

namespace attn::loadgen {
namespace {

constexpr char kDefaultTrace[] = "AzureLLMInferenceTrace_conv.csv";
constexpr int kExitCannotStart = 2;

bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  const std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// The default trace: the source tree's client/data (compile definition), else data/ next to the
// binary, else ../data (a scripts/bundle.sh bundle), else ../share/attention-server/data (an
// installed tree).
std::string DefaultTracePath() {
  const std::string exe_dir = ExecutableDir();
  const std::vector<std::string> candidates = {
      std::string(ATTN_LOADGEN_DATA_DIR) + "/" + kDefaultTrace, exe_dir + "/data/" + kDefaultTrace,
      exe_dir + "/../data/" + kDefaultTrace,
      exe_dir + "/../share/attention-server/data/" + kDefaultTrace};
  for (const auto& c : candidates) {
    if (FileExists(c)) return c;
  }
  return candidates.front();
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

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

std::string Trim(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "attention-loadgen: closed-loop load generator for attention.v1.AttentionService.\n"
      "Each request is one causal self-attention problem (T = S = its tokens) with random normal\n"
      "inputs; the trace workload takes the tokens (and optionally the arrival times) from a\n"
      "real request trace. Prints a report (requests, errors by status code, throughput,\n"
      "latency percentiles, server phase times, backends, verification).",
      "attention-loadgen"};
  RunOptions run;
  std::string workload = "trace";
  std::string trace_path;
  int64_t trace_offset = 0;
  int64_t requests = -1;
  double duration_s = 0;
  TokenScaling scaling;
  double time_scale = 0;
  int64_t fixed_tokens = 1024;
  std::string dtype_name = "bf16";
  std::string causal_name = "bottom_right";
  std::string json_path;
  bool fail_on_error = false;

  app.add_option("--target", run.target, "Server address host:port")->capture_default_str();
  app.add_option("--workload", workload, "trace: replay --trace; fixed: --fixed-tokens each")
      ->check(CLI::IsMember({"trace", "fixed"}))
      ->capture_default_str();
  app.add_option("--trace", trace_path,
                 "Trace file: Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake "
                 ".jsonl [default: " +
                     DefaultTracePath() + "]");
  app.add_option("--trace-offset", trace_offset, "Trace rows to skip before the first request")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--requests", requests,
                 "Requests to send [default: every trace row after the offset (unlimited with "
                 "--duration); fixed: 100]. More than the trace's rows cycles through it again")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--duration", duration_s, "Stop issuing requests after this many seconds")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--concurrency", run.concurrency,
                 "Closed-loop workers, each with its own channel and one request in flight")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--token-scale", scaling.scale,
                 "Multiply trace context tokens by this (rounded, then clamped)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--min-tokens", scaling.min_tokens, "Lower clamp for scaled tokens")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-tokens", scaling.max_tokens, "Upper clamp for scaled tokens")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--time-scale", time_scale,
                 "0: ignore timestamps, send as fast as the workers allow. >0: request i is sent "
                 "no earlier than (t_i - t_0) x F s after start; latency counts from then")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--fixed-tokens", fixed_tokens, "Tokens per request of the fixed workload")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--batch", run.shape.batch, "B")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--heads", run.shape.heads, "N, query heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--kv-heads", run.shape.kv_heads, "K, key/value heads (N % K == 0)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--head-dim", run.shape.head_dim, "H")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--dtype", dtype_name, "Input/output dtype")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--causal", causal_name, "Causal alignment of the mask")
      ->check(CLI::IsMember({"top_left", "bottom_right", "none"}))
      ->capture_default_str();
  app.add_option("--backend", run.shape.backend, "Backend name; empty: the server's default");
  app.add_flag("--return-lse", run.shape.return_lse, "Ask for lse (and verify it when sampled)");
  app.add_option("--verify-fraction", run.verify_fraction,
                 "Fraction of responses checked against the float64 oracle (on the worker, "
                 "after the latency is taken)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", run.seed, "Seed of the inputs and of the verification sample")
      ->capture_default_str();
  app.add_option("--deadline-ms", run.deadline_ms, "Per-call deadline")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--connect-timeout-ms", run.connect_timeout_ms,
                 "How long a worker waits for its connection; on failure the run stops")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-message-mb", run.max_message_mb, "Client max send/receive message size")
      ->check(CLI::Range(1, 2047))
      ->capture_default_str();
  app.add_option("--json", json_path, "Also write the report as JSON to this path");
  app.add_flag("--fail-on-error", fail_on_error,
               "Exit 1 if any request failed or any verified response mismatched");
  CLI11_PARSE(app, argc, argv);

  if (!ParseDType(dtype_name, &run.shape.dtype)) return kExitCannotStart;
  run.shape.causal = causal_name == "top_left"       ? attention::v1::CAUSAL_TOP_LEFT
                     : causal_name == "bottom_right" ? attention::v1::CAUSAL_BOTTOM_RIGHT
                                                     : attention::v1::CAUSAL_NONE;
  if (const std::string error = ValidateShape(run.shape); !error.empty()) {
    std::cerr << "attention-loadgen: " << error << "\n";
    return kExitCannotStart;
  }
  if (scaling.min_tokens > scaling.max_tokens) {
    std::cerr << "attention-loadgen: --min-tokens exceeds --max-tokens\n";
    return kExitCannotStart;
  }
  run.duration_s = duration_s;

  RunInfo info;
  std::vector<RequestPlan> plans;
  if (workload == "trace") {
    if (trace_path.empty()) trace_path = DefaultTracePath();
    std::vector<TraceRecord> rows;
    std::string error;
    if (!ReadTrace(trace_path, &rows, &error)) {
      std::cerr << "attention-loadgen: " << error << "\n";
      return kExitCannotStart;
    }
    if (trace_offset >= static_cast<int64_t>(rows.size())) {
      std::cerr << "attention-loadgen: --trace-offset " << trace_offset << " is past the "
                << rows.size() << " rows of " << trace_path << "\n";
      return kExitCannotStart;
    }
    const int64_t available = static_cast<int64_t>(rows.size()) - trace_offset;
    rows.erase(rows.begin(), rows.begin() + trace_offset);
    run.max_requests = requests >= 0 ? requests : (duration_s > 0 ? -1 : available);
    plans.emplace_back(std::move(rows), scaling, time_scale);
    info.workload = "trace " + BaseName(trace_path) + " (rows from " +
                    std::to_string(trace_offset) + ", " + std::to_string(available) +
                    " available; token scale " + Trim(scaling.scale) + " clamped to [" +
                    std::to_string(scaling.min_tokens) + ", " + std::to_string(scaling.max_tokens) +
                    "]; time scale " + Trim(time_scale) + ")";
  } else {
    run.max_requests = requests >= 0 ? requests : (duration_s > 0 ? -1 : 100);
    plans.push_back(RequestPlan::Fixed(fixed_tokens));
    info.workload = "fixed " + std::to_string(fixed_tokens) + " tokens per request";
  }

  info.target = run.target;
  info.shape = "B=" + std::to_string(run.shape.batch) + " N=" + std::to_string(run.shape.heads) +
               " K=" + std::to_string(run.shape.kv_heads) +
               " H=" + std::to_string(run.shape.head_dim) + " " + DTypeName(run.shape.dtype) +
               " causal=" + CausalName(run.shape.causal) + (run.shape.return_lse ? " +lse" : "");
  info.backend = run.shape.backend;
  info.concurrency = run.concurrency;
  info.verify_fraction = run.verify_fraction;
  info.tolerance = ToleranceFor(run.shape.dtype);

  RunResult result = RunClosedLoop(run, plans.front());
  info.stop_reason = result.stop_reason;
  const Report report = BuildReport(info, result.samples, result.wall_s);
  std::cout << FormatReport(report) << std::flush;

  if (!json_path.empty()) {
    nlohmann::json j = ReportToJson(report);
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    j["command"] = command;
    j["seed"] = run.seed;
    std::ofstream out(json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::cerr << "attention-loadgen: cannot write " << json_path << "\n";
      return kExitCannotStart;
    }
  }
  if (fail_on_error && (report.ok != report.sent || report.mismatches > 0)) return 1;
  return 0;
}

}  // namespace
}  // namespace attn::loadgen

int main(int argc, char** argv) { return attn::loadgen::Main(argc, argv); }
