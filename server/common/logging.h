// spdlog setup for the server: level and format (text, or one JSON object per line with the
// message JSON-escaped so every line parses; fields time, severity, thread, message, the names
// Cloud Logging on GKE reads, so a line's severity is not taken from the stream).
#pragma once

#include <spdlog/common.h>

#include <chrono>
#include <cstdint>
#include <mutex>
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

/// At most `max_lines` lines per fixed `window` (starting at the first line after the previous
/// window ended). For libprotobuf's own messages, which a client can trigger once per request
/// (a string field with invalid UTF-8 logs one ERROR line in libprotobuf's parser), so that a
/// client cannot make the server write a line per request it sends. Thread-safe.
class LineRateLimit {
 public:
  using Clock = std::chrono::steady_clock;
  LineRateLimit(int64_t max_lines, Clock::duration window) : max_(max_lines), window_(window) {}
  /// True when a line at `now` may be written; then `*suppressed` is the number of lines refused
  /// since the last admitted one (0: none), for the admitted line to say so.
  bool Admit(Clock::time_point now, int64_t* suppressed);

 private:
  const int64_t max_;
  const Clock::duration window_;
  std::mutex mu_;
  Clock::time_point start_{};
  int64_t in_window_ = 0;
  int64_t refused_ = 0;
  bool started_ = false;
};

}  // namespace attn
