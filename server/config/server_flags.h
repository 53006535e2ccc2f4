// Command-line flags of attention-server (CLI11).
#pragma once

#include "config/server_config.h"

namespace attn {

/// Parses argv into `config`. Returns -1 to continue, or the exit code to return now (0 for
/// --help/--version, 2 for a bad flag, after printing the error).
int ParseServerFlags(int argc, char** argv, ServerConfig* config);

}  // namespace attn
