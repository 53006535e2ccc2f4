// The `attention-loadgen sweep` subcommand: its flags and its run.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/cli_common.h"
#include "loadgen/runner.h"

namespace attn::loadgen {

/// The sweep's flags.
struct SweepArgs {
  RunOptions run;
  std::string backends = "cpu";
  std::string kind;
  std::vector<int64_t> seqs = {128, 256, 512, 1024};
  std::vector<int64_t> batches = {1, 2, 4, 8};
  int64_t tokens = 256;
  int64_t requests = 10;
  int64_t warmup = 1;
  std::string dtype_name = "bf16";
  std::string causal_name = "bottom_right";
  std::string out_dir = ".";
  std::string plot = "required";
  std::string python = "python3";
  std::string plot_script;
  bool quiet = false;
};

/// Adds the `sweep` subcommand and its flags (filling `a`) to `app`.
void AddSweepCommand(CLI::App* app, SweepArgs* a);

/// Runs the sweep: first GetServerInfo (exit 2 naming the missing backend and the server's
/// backends when one of --backends is not on the server or not available there), then every
/// (point, backend); prints the table, writes OUT/sweep-<kind>.csv and the PNG. Returns 0; 1
/// when a call failed; 2 when it cannot start; 3 when --plot required and no PNG; 128 + signal
/// when SIGINT/SIGTERM interrupted it (the points done so far are still written).
int RunSweep(const SweepArgs& a);

}  // namespace attn::loadgen
