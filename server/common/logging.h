// spdlog setup for the server: level and format (text, or one JSON object per line with the
// message JSON-escaped so every line parses).
#pragma once

#include <string>

#include "attn/kernels/status.h"

namespace attn {

/// Installs the default logger on stderr. `level`: trace..off; `format`: "text" or "json".
/// Also routes libprotobuf's own log messages (SetLogHandler) through it.
Status ConfigureLogging(const std::string& level, const std::string& format);

}  // namespace attn
