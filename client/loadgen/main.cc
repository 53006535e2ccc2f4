// attention-loadgen: closed- and open-loop load generator for attention.v1.AttentionService.
// Replays the Azure LLM inference 2023 traces (or a fixed size), optionally verifies a sample of
// responses against a float64 oracle, and prints a report; `sweep` reproduces the codelab's
// tables (CSV + PNG). See `attention-loadgen --help` and `attention-loadgen sweep --help`.
// The flags are in loadgen_flags.h; this file dispatches to the command that runs:
// sweep_command.h, session_command.h (session, mooncake) or attend_command.h (trace, fixed).
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "loadgen/attend_command.h"
#include "loadgen/cli_common.h"
#include "loadgen/dtype_codec.h"
#include "loadgen/interrupt.h"
#include "loadgen/loadgen_flags.h"
#include "loadgen/session_command.h"
#include "loadgen/sweep_command.h"

namespace attn::loadgen {
namespace {

// After SIGINT/SIGTERM, how long calls in flight may finish before they are cancelled.
constexpr double kInterruptGraceS = 2.0;

SessionCommand MakeSessionCommand(const LoadgenFlags& f) {
  SessionCommand c;
  c.session = f.session;
  c.session.run = f.run;
  c.session.workload = f.workload;
  c.session.scaling = f.scaling;
  c.trace_path = f.trace_path;
  c.trace_offset = f.trace_offset;
  c.requests = f.requests;
  c.fixed = f.fixed_given();
  c.fixed_tokens = f.fixed_tokens;
  c.csv_path = f.csv_path;
  c.json_path = f.json_path;
  c.fail_on_error = f.fail_on_error;
  c.session.progress = !f.quiet;
  return c;
}

int Main(int argc, char** argv) {
  CLI::App app{kLoadgenDescription, "attention-loadgen"};
  LoadgenFlags f;
  AddLoadgenFlags(&app, &f);
  if (const int code = ParseLoadgenFlags(&app, argc, argv); code >= 0) return code;
  // SIGINT/SIGTERM from here on: stop, let calls in flight finish (2 s at most), report.
  Interrupt::Install(kInterruptGraceS);
  for (ChannelSecurity* s : {&f.run.security, &f.sweep.run.security}) {
    if (const std::string e = LoadChannelSecurity(s); !e.empty()) {
      std::cerr << "attention-loadgen: " << e << "\n";
      return kExitCannotStart;
    }
  }
  if (app.got_subcommand("sweep")) {
    SweepArgs& a = f.sweep;
    if (!ParseDType(a.dtype_name, &a.run.shape.dtype)) return kExitCannotStart;
    a.run.shape.causal = ParseCausal(a.causal_name);
    return RunSweep(a);
  }
  if (const int code = CheckRunFlags(&f); code >= 0) return code;
  if (f.workload == "session" || f.workload == "mooncake") {
    return RunSessionCommand(MakeSessionCommand(f));
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  return RunAttendCommand(std::move(f), command);
}

}  // namespace
}  // namespace attn::loadgen

int main(int argc, char** argv) { return attn::loadgen::Main(argc, argv); }
