// Bearer tokens and the identities they stand for, loaded from a token file
// (--auth-token-file).
//
// File format: UTF-8 text, one `identity token` pair per line, separated by
// spaces or tabs; blank lines and lines whose first non-blank character is `#`
// are ignored. An identity is 1..128 characters of [A-Za-z0-9._@:/+-]; a
// token is 16..4096 printable ASCII characters without spaces. One identity
// may have several tokens (rotation); a token may appear only once.
//
// Tokens are kept only as SHA-256 digests and looked up in constant time: the
// lookup compares the digest with every entry, without an early exit, so the
// time taken does not depend on which entry (if any) matches or on how much of
// a token is right. Thread-safety: immutable after Load/Parse; all const
// methods are safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attn/common/status.h"

namespace attn::security {

class TokenTable {
 public:
  TokenTable() = default;

  /// Parses token file text; `source` names it in errors. Errors:
  /// INVALID_ARGUMENT naming the line (malformed line, bad identity or token,
  /// duplicate token) and when the file holds no token at all.
  static StatusOr<TokenTable> Parse(std::string_view text, const std::string& source);
  /// Reads and parses `path`. Errors: INVALID_ARGUMENT when it cannot be read,
  /// as Parse otherwise.
  static StatusOr<TokenTable> Load(const std::string& path);

  /// The identity whose token is `token`, or nothing. Constant time in the
  /// token's contents (see above).
  std::optional<std::string> Find(std::string_view token) const;

  size_t size() const { return entries_.size(); }
  /// Distinct identities, sorted.
  std::vector<std::string> Identities() const;

 private:
  using Digest = std::array<uint8_t, 32>;
  struct Entry {
    std::string identity;
    Digest digest;
  };
  static Digest Hash(std::string_view token);

  std::vector<Entry> entries_;
};

/// True when the identity is 1..128 characters of [A-Za-z0-9._@:/+-].
bool ValidIdentity(std::string_view identity);

}  // namespace attn::security
