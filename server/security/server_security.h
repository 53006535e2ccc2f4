// Everything the flags say about securing the gRPC listener, built once at
// start (server/main.cc): the listener's credentials (plaintext, TLS or mutual
// TLS: tls_credentials.h), the Authenticator (token file, client certificate
// or none: authenticator.h) and the CallGate that every handler passes
// (authentication + --max-tensor-elements: call_gate.h). The metrics listener
// (--metrics-address) and the health-only listener (--health-address) are
// never behind any of this.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>

#include "attn/kernels/status.h"
#include "config/server_config.h"
#include "security/authenticator.h"
#include "security/call_gate.h"

namespace attn::security {

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::shared_ptr<Authenticator> authenticator;
  std::unique_ptr<CallGate> gate;
};

/// Reads and checks the certificate, key, CA and token files. Errors:
/// INVALID_ARGUMENT naming the flag and file (the server then exits 2).
/// Logs the resulting mode.
StatusOr<ServerSecurity> BuildServerSecurity(const ServerConfig& config);

/// SIGHUP: reloads the token file (token mode); logs the outcome. On error the
/// previous tokens stay in force. Returns the identities that lost their last token (empty on
/// error and in other modes); the caller ends their streams and releases their sequences.
std::vector<std::string> ReloadTokens(Authenticator* authenticator);

}  // namespace attn::security
