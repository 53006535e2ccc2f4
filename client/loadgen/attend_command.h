// `attention-loadgen --workload trace|fixed` (the default command): Attend calls, closed or open
// loop, from the trace's rows or of a fixed size; prints the report and writes --csv / --json.
#pragma once

#include <string>

#include "loadgen/loadgen_flags.h"

namespace attn::loadgen {

/// Runs it with `f` checked by CheckRunFlags; `command` is the command line recorded in the
/// JSON. Returns the exit status: 0; 1 when the run stopped early or nothing succeeded (with
/// --fail-on-error also on any failed or mismatched call); 2 when it cannot start (bad trace,
/// unwritable output); 128 + signal when SIGINT/SIGTERM interrupted it (the partial report is
/// still printed and written).
int RunAttendCommand(LoadgenFlags f, const std::string& command);

}  // namespace attn::loadgen
