#include "common/logging.h"

#include <google/protobuf/stubs/logging.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>

namespace attn {

const char* SeverityName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
    case spdlog::level::debug:
      return "DEBUG";
    case spdlog::level::info:
      return "INFO";
    case spdlog::level::warn:
      return "WARNING";
    case spdlog::level::err:
      return "ERROR";
    case spdlog::level::critical:
      return "CRITICAL";
    default:
      return "DEFAULT";
  }
}

namespace {

// Appends the log message JSON-escaped (RFC 8259 §7).
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static const char kHex[] = "0123456789abcdef";
    for (char ch : msg.payload) {
      const unsigned char c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"':
          dest.append(std::string_view("\\\""));
          break;
        case '\\':
          dest.append(std::string_view("\\\\"));
          break;
        case '\n':
          dest.append(std::string_view("\\n"));
          break;
        case '\r':
          dest.append(std::string_view("\\r"));
          break;
        case '\t':
          dest.append(std::string_view("\\t"));
          break;
        default:
          if (c < 0x20) {
            const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
            dest.append(esc, esc + 6);
          } else {
            dest.push_back(ch);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

// Appends Cloud Logging's severity name for the level (LogSeverity): trace and debug DEBUG, info
// INFO, warn WARNING, err ERROR, critical CRITICAL.
class CloudSeverity final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    dest.append(std::string_view(SeverityName(msg.level)));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<CloudSeverity>();
  }
};

// protobuf's own messages (e.g. "String field ... contains invalid UTF-8 data" when a client
// sends bad bytes in a string field) go through spdlog, so --log-format json holds for them too;
// by default libprotobuf writes raw "[libprotobuf ERROR ...]" lines to stderr.
void ProtobufToSpdlog(google::protobuf::LogLevel level, const char* filename, int line,
                      const std::string& message) {
  spdlog::level::level_enum lvl = spdlog::level::info;
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      lvl = spdlog::level::info;
      break;
    case google::protobuf::LOGLEVEL_WARNING:
      lvl = spdlog::level::warn;
      break;
    case google::protobuf::LOGLEVEL_ERROR:
      lvl = spdlog::level::err;
      break;
    default:
      lvl = spdlog::level::critical;
      break;  // FATAL: protobuf aborts after this
  }
  // FATAL is always written (protobuf aborts after it); the rest at most 20 lines per 10 s.
  static LineRateLimit limit(20, std::chrono::seconds(10));
  int64_t left_out = 0;
  if (lvl != spdlog::level::critical && !limit.Admit(LineRateLimit::Clock::now(), &left_out)) {
    return;
  }
  if (left_out > 0) {
    spdlog::log(lvl, "protobuf ({}:{}): {} ({} more libprotobuf messages left out since the last "
                "one written: at most 20 per 10 s)",
                filename != nullptr ? filename : "?", line, message, left_out);
    return;
  }
  spdlog::log(lvl, "protobuf ({}:{}): {}", filename != nullptr ? filename : "?", line, message);
}

}  // namespace

bool LineRateLimit::Admit(Clock::time_point now, int64_t* suppressed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_ || now - start_ >= window_) {
    started_ = true;
    start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= max_) {
    ++refused_;
    return false;
  }
  ++in_window_;
  *suppressed = refused_;
  refused_ = 0;
  return true;
}

Status ConfigureLogging(const std::string& level, const std::string& format) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return InvalidArgument("--log-level: unknown level " + level);
  }
  auto logger =
      std::make_shared<spdlog::logger>("attn", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (format == "json") {
    auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    f->add_flag<JsonEscapedMessage>('*');
    f->add_flag<CloudSeverity>('&');
    // Field names Cloud Logging (GKE) reads: severity, message, time (RFC 3339).
    f->set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","severity":"%&","thread":%t,"message":"%*"})");
    logger->set_formatter(std::move(f));
  } else if (format == "text") {
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  } else {
    return InvalidArgument("--log-format: expected text or json, got " + format);
  }
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  google::protobuf::SetLogHandler(&ProtobufToSpdlog);
  return Status::Ok();
}

}  // namespace attn
