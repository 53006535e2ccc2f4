// Command-line flags of attention-server (CLI11).
#pragma once

#include <CLI/CLI.hpp>

#include "config/server_config.h"

namespace attn {

/// Adds every flag to `app`, bound to `config`: its ATTN_ variable, size suffixes on the -bytes
/// flags (config/byte_size.h), the finite-number check and its --help group.
void AddServerFlags(CLI::App& app, ServerConfig* config);

/// Parses argv into `config`. Returns -1 to continue, or the exit code to return now (0 for
/// --help/--version, 2 for a bad flag, after printing the error; a bad value from an ATTN_ variable
/// is reported with the variable's name and value). ATTN_METRICS_ADDRESS= and ATTN_CUDNN_WARMUP=
/// (set, empty) set their flags to empty (metrics off, no warm-up); other empty variables are
/// unset.
int ParseServerFlags(int argc, char** argv, ServerConfig* config);

}  // namespace attn
