// Client-supplied text inside error messages (issue 16 item 7).
//
// Every error that echoes a string or list the client sent (a backend name, a tensor shape, a
// sequence id, an identity) passes it through EchoClientText / EchoList, and every status
// message leaving the server passes through CapStatusMessage, so a status never exceeds gRPC's
// metadata limit (~16 KiB: above it the caller sees RESOURCE_EXHAUSTED instead of the real
// code) and is never cut inside a UTF-8 character.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attn {

/// Bytes of client text one echo keeps (before the "...(N bytes)" note).
inline constexpr size_t kMaxEchoBytes = 128;
/// Bytes of a whole status message (well under gRPC's 16 KiB metadata limit).
inline constexpr size_t kMaxStatusMessageBytes = 4096;

/// Length of the longest prefix of `s` of at most `max_bytes` bytes that does not end inside a
/// UTF-8 multi-byte sequence (invalid bytes count as single characters).
size_t Utf8PrefixLength(std::string_view s, size_t max_bytes);

/// `s` itself when it has at most `max_bytes` bytes; else its first bytes, cut at a UTF-8
/// character boundary, followed by "...(N bytes)" where N is s.size().
std::string EchoClientText(std::string_view s, size_t max_bytes = kMaxEchoBytes);

/// "[a,b,c]" for a list of `count` integers read by `at(i)`; above `max_items` entries, the
/// first ones then ",...] (N entries)".
template <typename At>
std::string EchoList(int64_t count, At at, int64_t max_items = 8) {
  std::string out = "[";
  const int64_t shown = count < max_items ? count : max_items;
  for (int64_t i = 0; i < shown; ++i) {
    if (i > 0) out += ",";
    out += std::to_string(at(i));
  }
  if (shown < count) return out + ",...] (" + std::to_string(count) + " entries)";
  return out + "]";
}

/// A status message safe to send: at most kMaxStatusMessageBytes, cut at a UTF-8 boundary.
std::string CapStatusMessage(std::string_view message);

/// A client's float value for an error message, with 9 significant digits ("%.9g": -1e-10
/// stays -1e-10 where std::to_string would print -0.000000; nan, inf as such).
std::string EchoFloat(double value);

}  // namespace attn
