// attention-loadgen: closed- and open-loop load generator for attention.v1.AttentionService.
// Replays the Azure LLM inference 2023 traces (or a fixed size), optionally verifies a sample of
// responses against a float64 oracle, and prints a report; `sweep` reproduces the codelab's
// tables (CSV + PNG). See `attention-loadgen --help` and `attention-loadgen sweep --help`.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attn/common/cli_finite.h"
#include "loadgen/dtype_codec.h"
#include "loadgen/interrupt.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/session_command.h"
#include "loadgen/session_workload.h"
#include "loadgen/sweep_command.h"
#include "loadgen/trace.h"
#include "loadgen/verify.h"
#include "loadgen/workload.h"

namespace attn::loadgen {
namespace {

// After SIGINT/SIGTERM, how long calls in flight may finish before they are cancelled.
constexpr double kInterruptGraceS = 2.0;



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


int Main(int argc, char** argv) {
  CLI::App app{
      "attention-loadgen: closed- and open-loop load generator for "
      "attention.v1.AttentionService.\n"
      "Each request is one causal self-attention problem (T = S = its tokens) with random normal\n"
      "inputs; the trace workload takes the tokens (and optionally the arrival times) from a\n"
      "real request trace. Prints a report (requests, errors by status code, throughput,\n"
      "latency percentiles, server phase times, backends, verification).",
      "attention-loadgen"};
  // Same source as the server's version (the CMake PROJECT_VERSION).
  app.set_version_flag("--version", ATTN_LOADGEN_VERSION);
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
  std::string csv_path;
  std::string mode = "closed";
  bool quiet = false;
  bool fail_on_error = false;
  SweepArgs sweep_args;
  AddSweepCommand(&app, &sweep_args);
  app.require_subcommand(0, 1);

  app.add_option("--target", run.target, "Server address host:port or unix:PATH (Unix-domain socket)")->capture_default_str();
  AddSecurityFlags(&app, &run.security);
  app.add_option("--workload", workload,
                 "trace: replay --trace; fixed: --fixed-tokens each; session: generation "
                 "sessions on SequenceService (create, prefill, decode, release); mooncake: "
                 "Mooncake trace replay with shared prefixes forked (ForkSequence)")
      ->check(CLI::IsMember({"trace", "fixed", "session", "mooncake"}))
      ->capture_default_str();
  SessionOptions session;
  app.add_option("--layers", session.layers, "session/mooncake: layers per sequence")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--decode-api", session.decode_api,
                 "session/mooncake: decode steps through extend (unary Extend), batch "
                 "(ExtendBatch over up to --batch-sessions sessions of a worker; session only) "
                 "or stream (one ExtendStream per session, per-message latency)")
      ->check(CLI::IsMember({"extend", "batch", "stream"}))
      ->capture_default_str();
  app.add_option("--batch-sessions", session.batch_sessions,
                 "session, --decode-api batch: concurrent sessions per worker decoded together")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--gen-scale", session.gen_scale,
                 "session/mooncake: multiply the trace's generated tokens by this (rounded)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-gen", session.max_gen,
                 "session/mooncake: upper clamp of decode steps per session (also the steps of "
                 "each session when --fixed-tokens is given)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--prefix-cache-sequences", session.prefix_cache_sequences,
                 "mooncake: live sequences kept for prefix sharing (LRU; evicted ones released)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_flag("--check-kv-released", session.check_kv_released,
               "session/mooncake: at the end, call GetServerInfo and exit 1 unless the KV cache "
               "has 0 pages used");
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
  app.add_option("--mode", mode,
                 "closed: --concurrency workers, one call each in flight; open: Poisson "
                 "arrivals at --rate through async calls, latency from the scheduled send time")
      ->check(CLI::IsMember({"closed", "open"}))
      ->capture_default_str();
  app.add_option("--rate", run.rate, "Open loop: mean arrivals per second (required there)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-in-flight", run.max_in_flight,
                 "Open loop: cap on outstanding calls; an arrival finding it full waits for a "
                 "slot (counted as client overload; latency still from its scheduled time)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
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
  CLI::Option* fixed_opt =
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
  app.add_option("--csv", csv_path, "Also write the summary as CSV (header + one row) here");
  app.add_flag("--quiet", quiet, "No progress line on stderr (printed once a second otherwise)");
  app.add_flag("--fail-on-error", fail_on_error,
               "Exit 1 if any request failed or any verified response mismatched (without it, "
               "exit 1 only when the run stopped early or nothing succeeded)");
  attn::RejectNonFiniteNumbers(app);
  CLI11_PARSE(app, argc, argv);
  // SIGINT/SIGTERM from here on: stop, let calls in flight finish (2 s at most), report.
  Interrupt::Install(kInterruptGraceS);
  for (ChannelSecurity* s : {&run.security, &sweep_args.run.security}) {
    if (const std::string e = LoadChannelSecurity(s); !e.empty()) {
      std::cerr << "attention-loadgen: " << e << "\n";
      return kExitCannotStart;
    }
  }

  if (app.got_subcommand("sweep")) {
    SweepArgs& a = sweep_args;
    if (!ParseDType(a.dtype_name, &a.run.shape.dtype)) return kExitCannotStart;
    a.run.shape.causal = a.causal_name == "top_left"       ? attention::v1::CAUSAL_TOP_LEFT
                         : a.causal_name == "bottom_right" ? attention::v1::CAUSAL_BOTTOM_RIGHT
                                                           : attention::v1::CAUSAL_NONE;
    return RunSweep(a);
  }
  if (mode == "open" && run.rate <= 0) {
    std::cerr << "attention-loadgen: --mode open needs --rate R (requests/s)\n";
    return kExitCannotStart;
  }
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
  {
    // The largest request of this run (q, k and v of its most tokens) must fit the message
    // limit: refused here rather than built and aborted (2^40 tokens made std::bad_alloc).
    const bool fixed = workload == "fixed" || fixed_opt->count() > 0;
    const int64_t most = fixed ? fixed_tokens : scaling.max_tokens;
    const double bytes = static_cast<double>(std::max<int64_t>(1, run.shape.batch)) *
                         static_cast<double>(most) *
                         static_cast<double>(run.shape.heads + 2 * run.shape.kv_heads) *
                         static_cast<double>(run.shape.head_dim) * DTypeSize(run.shape.dtype);
    const double limit = static_cast<double>(std::min(run.max_message_mb, 2047)) * (1 << 20);
    if (bytes > limit) {
      std::cerr << "attention-loadgen: a request of " << most << " tokens is " << bytes / (1 << 20)
                << " MiB (batch x tokens x (heads + 2 kv-heads) x head-dim x dtype), more than "
                   "--max-message-mb "
                << std::min(run.max_message_mb, 2047)
                << "; use fewer tokens (--fixed-tokens / --max-tokens) or a smaller shape\n";
      return kExitCannotStart;
    }
  }
  run.duration_s = duration_s;

  if (workload == "session" || workload == "mooncake") {
    SessionCommand c;
    c.session = session;
    c.session.run = run;
    c.session.workload = workload;
    c.session.scaling = scaling;
    c.trace_path = trace_path;
    c.trace_offset = trace_offset;
    c.requests = requests;
    c.fixed = fixed_opt->count() > 0;
    c.fixed_tokens = fixed_tokens;
    c.csv_path = csv_path;
    c.json_path = json_path;
    c.fail_on_error = fail_on_error;
    return RunSessionCommand(c);
  }

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
  info.mode = mode;
  info.concurrency = run.concurrency;
  info.rate = mode == "open" ? run.rate : 0;
  info.max_in_flight = mode == "open" ? run.max_in_flight : 0;
  info.verify_fraction = run.verify_fraction;
  info.tolerance = ToleranceFor(run.shape.dtype);

  Progress progress(!quiet);
  run.progress = &progress;
  progress.Start();
  RunResult result =
      mode == "open" ? RunOpenLoop(run, plans.front()) : RunClosedLoop(run, plans.front());
  progress.Stop();
  info.stop_reason = result.stop_reason;
  info.planned = run.max_requests;
  info.schedule_s = result.schedule_s;
  info.interrupted_by = Interrupt::SignalName();
  const Report report = BuildReport(info, result.samples, result.wall_s, result.client_overload);
  std::cout << FormatReport(report) << std::flush;
  for (const std::string& w : report.warnings)
    std::cerr << "attention-loadgen: warning: " << w << "\n";

  if (!csv_path.empty() && !WriteFile(csv_path, CsvHeader() + "\n" + CsvRow(report) + "\n")) {
    std::cerr << "attention-loadgen: cannot write " << csv_path << "\n";
    return kExitCannotStart;
  }

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
  if (Interrupt::Requested()) return Interrupt::ExitCode();
  if (fail_on_error && (report.ok != report.sent || report.mismatches > 0)) return 1;
  // Stopped early (target unreachable) or nothing succeeded: a failure whatever
  // --fail-on-error says.
  if (!report.info.stop_reason.empty() || (report.sent > 0 && report.ok == 0)) return 1;
  return 0;
}

}  // namespace
}  // namespace attn::loadgen

int main(int argc, char** argv) { return attn::loadgen::Main(argc, argv); }
