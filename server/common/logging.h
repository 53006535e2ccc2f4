// spdlog setup for the server: level and format (text, or one JSON object per line with the
// message JSON-escaped so every line parses; fields time, severity, thread, message, the names
// Cloud Logging on GKE reads, so a line's severity is not taken from the stream).
#pragma once

#include <spdlog/common.h>

#include <string>

#include "attn/common/status.h"

namespace attn {

/// Cloud Logging's LogSeverity name of an spdlog level: DEBUG (trace, debug), INFO, WARNING,
/// ERROR, CRITICAL; DEFAULT for off.
const char* SeverityName(spdlog::level::level_enum level);

/// Installs the default logger on stderr. `level`: trace..off; `format`: "text" or "json".
/// With "json" each line is {"time":"...Z","severity":"INFO","thread":N,"message":"..."}.
/// Also routes libprotobuf's own log messages (SetLogHandler) through it.
Status ConfigureLogging(const std::string& level, const std::string& format);

}  // namespace attn
