// `attention-loadgen --workload session|mooncake`: reads the plans (Azure trace rows, a fixed
// size, or the Mooncake trace), runs the SequenceService workload (session_workload.h), prints
// the report and writes --csv / --json.
#pragma once

#include <cstdint>
#include <string>

#include "loadgen/session_workload.h"

namespace attn::loadgen {

/// What the session and mooncake workloads take from the command line.
struct SessionCommand {
  SessionOptions session;    // run (duration_s included), workload, scaling, decode options
  std::string trace_path;    // empty: the workload's default trace
  int64_t trace_offset = 0;  // first trace row used
  int64_t requests = -1;     // sessions/requests; < 0: the trace's rows (or --duration)
  bool fixed = false;        // --fixed-tokens given: one fixed plan instead of the trace
  int64_t fixed_tokens = 0;  // context tokens of that plan
  std::string csv_path;      // "" : no CSV
  std::string json_path;     // "" : no JSON
  bool fail_on_error = false;
};

/// Runs it and returns the exit status: 0; 1 on failure (any error with fail_on_error, no
/// session OK, or --check-kv-released finding pages still used); 2 when it cannot start (bad
/// trace, unwritable output); 128 + signal when SIGINT/SIGTERM interrupted it (the partial
/// report is still printed and written).
int RunSessionCommand(const SessionCommand& c);

}  // namespace attn::loadgen
