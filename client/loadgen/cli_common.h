// Small pieces the attention-loadgen commands (main.cc, sweep_command.cc, session_command.cc)
// share: the exit status for a run that cannot start, the security flags, file helpers, the
// default trace's location and a few formatting helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "loadgen/channel_security.h"

namespace attn::loadgen {

/// Exit status when the run cannot start (bad flags, unknown backend, unwritable output).
inline constexpr int kExitCannotStart = 2;

/// The default trace of the trace and session workloads.
inline constexpr char kDefaultTrace[] = "AzureLLMInferenceTrace_conv.csv";

/// --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --token-file (channel_security.h).
void AddSecurityFlags(CLI::App* app, ChannelSecurity* s);

/// True when `path` can be opened for reading.
bool FileExists(const std::string& path);

/// The directory of the running binary (/proc/self/exe), "" when unknown.
std::string ExecutableDir();

/// Writes `text` to `path`; false on any error.
bool WriteFile(const std::string& path, const std::string& text);

/// Where trace file `name` is: the source tree's client/data (compile definition), else data/
/// next to the binary, else ../data (a scripts/bundle.sh bundle), else
/// ../share/attention-server/data (an installed tree); the first candidate when none exists.
std::string DefaultTracePath(const std::string& name = kDefaultTrace);

/// The last component of `path`.
std::string BaseName(const std::string& path);

/// `x` printed with %g.
std::string Trim(double x);

}  // namespace attn::loadgen
