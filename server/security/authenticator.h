// Who is calling: the identity behind each RPC (DESIGN.md §3: a sequence
// belongs to the identity that created it).
//
// Three modes, chosen at start from the flags:
// - token (--auth-token-file): every call must carry the metadata
//   `authorization: Bearer <token>` with a token from the file; the identity is
//   the token's. A missing, malformed or unknown token gets UNAUTHENTICATED
//   with one message for all three (nothing tells which). Tokens are looked up
//   in constant time (TokenTable). The client certificate, if any, only
//   authenticates the connection.
// - client certificate (--tls-client-ca without a token file): TLS has already
//   verified the certificate; the identity is its first subject alternative
//   name, or its common name when it has none (gRPC's peer identity).
// - none: no authentication; the identity is the caller-chosen label in the
//   metadata `x-attn-identity` (absent: ""), a namespace, not a security
//   boundary.
// The identity never comes from `x-attn-identity` in the first two modes.
// Thread-safety: all methods are safe from any thread; Reload swaps the token
// table atomically (calls in flight keep the table they started with).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "attn/common/status.h"
#include "security/token_table.h"

namespace attn::security {

enum class AuthMode { kNone, kToken, kClientCertificate };

/// Name of the mode for logs: "none", "token", "client-certificate".
const char* AuthModeName(AuthMode mode);

class Authenticator {
 public:
  /// No token file and no client CA: AuthMode::kNone.
  Authenticator() = default;
  /// Token mode from `token_file` (non-empty), or client-certificate mode when
  /// `token_file` is empty and `client_certificates` is true. Errors:
  /// INVALID_ARGUMENT from TokenTable::Load.
  static StatusOr<std::unique_ptr<Authenticator>> Create(const std::string& token_file,
                                                         bool client_certificates);

  /// The caller's identity into *identity, or UNAUTHENTICATED.
  grpc::Status Authenticate(const grpc::ServerContextBase& context, std::string* identity) const;

  /// Token mode: reads the token file again and swaps the table in; on error
  /// the old table stays. Other modes: nothing to do, Ok. `revoked` (nullable) gets the
  /// identities the old table had and the new one has not (sorted; they lost every token).
  Status Reload(std::vector<std::string>* revoked = nullptr);

  AuthMode mode() const { return mode_; }
  /// Number of tokens loaded (token mode), else 0.
  size_t tokens() const;

 private:
  std::shared_ptr<const TokenTable> table() const;

  AuthMode mode_ = AuthMode::kNone;
  std::string token_file_;
  mutable std::mutex mu_;
  std::shared_ptr<const TokenTable> table_;
};

/// The token of an `authorization` header value "Bearer <token>" (scheme
/// case-insensitive, one or more spaces), or "" when it has another form.
std::string BearerToken(std::string_view header);

}  // namespace attn::security
