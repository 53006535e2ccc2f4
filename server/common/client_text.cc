#include "common/client_text.h"

#include <cstdio>

namespace attn {

size_t Utf8PrefixLength(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s.size();
  // s[end] is the first byte left out: while it continues a character (10xxxxxx), that
  // character straddles the cut, so cut before its lead byte (at most 3 steps back).
  size_t end = max_bytes;
  for (int steps = 0; end > 0 && steps < 3 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80;
       ++steps) {
    --end;
  }
  return end;
}

std::string EchoClientText(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  std::string out(s.substr(0, Utf8PrefixLength(s, max_bytes)));
  out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string CapStatusMessage(std::string_view message) {
  if (message.size() <= kMaxStatusMessageBytes) return std::string(message);
  constexpr std::string_view kNote = "...(truncated)";
  std::string out(
      message.substr(0, Utf8PrefixLength(message, kMaxStatusMessageBytes - kNote.size())));
  out += kNote;
  return out;
}

std::string EchoFloat(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", value);
  return buf;
}

}  // namespace attn
