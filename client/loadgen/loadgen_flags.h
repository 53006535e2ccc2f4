// attention-loadgen's command line: every flag of the main command (the `sweep` subcommand's
// are in sweep_command.h), parsing with exit 2 on a bad flag, and the checks of flag
// combinations made before anything is sent.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "loadgen/runner.h"
#include "loadgen/session_workload.h"
#include "loadgen/sweep_command.h"
#include "loadgen/workload.h"

namespace attn::loadgen {

/// The main command's flags (defaults as --help shows them).
struct LoadgenFlags {
  RunOptions run;                  // target, security, shape, rate, concurrency, deadlines, ...
  SessionOptions session;          // session/mooncake: layers, decode API, gen scale, ...
  std::string workload = "trace";  // trace | fixed | session | mooncake
  std::string trace_path;          // empty: the workload's default trace
  int64_t trace_offset = 0;
  int64_t requests = -1;  // < 0: every trace row (unlimited with --duration); fixed: 100
  double duration_s = 0;  // > 0: stop issuing after this many seconds
  TokenScaling scaling;
  double time_scale = 0;
  int64_t fixed_tokens = 1024;
  CLI::Option* fixed_option = nullptr;  // --fixed-tokens (count() > 0: given)
  std::string dtype_name = "bf16";
  std::string causal_name = "bottom_right";
  std::string json_path;        // empty: no JSON
  std::string csv_path;         // empty: no CSV
  std::string mode = "closed";  // closed | open
  bool quiet = false;
  bool fail_on_error = false;
  SweepArgs sweep;  // the sweep subcommand

  /// --fixed-tokens was given on the command line.
  bool fixed_given() const { return fixed_option != nullptr && fixed_option->count() > 0; }
};

/// The main command's description (the head of --help).
extern const char kLoadgenDescription[];

/// Adds --version, the sweep subcommand and every flag (bound to `f`) to `app`, in --help order,
/// then the finite-number check on all of them.
void AddLoadgenFlags(CLI::App* app, LoadgenFlags* f);

/// Parses argv. Returns -1 to continue; 0 after --help / --version (printed on stdout);
/// kExitCannotStart (2) after a bad flag, with CLI11's message on stderr.
int ParseLoadgenFlags(CLI::App* app, int argc, char** argv);

/// The CausalAlignment named by --causal (top_left, bottom_right, none).
attention::v1::CausalAlignment ParseCausal(const std::string& name);

/// After parsing: resolves --dtype and --causal into run.shape, checks the shape, the token
/// clamps, open-loop --rate and that the largest request fits --max-message-mb, and copies
/// --duration into run. Returns -1 to continue, else kExitCannotStart (the reason on stderr).
int CheckRunFlags(LoadgenFlags* f);

}  // namespace attn::loadgen
