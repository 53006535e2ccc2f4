// Everything the flags say about securing the gRPC listener, built once at
// start (server/main.cc): the listener's credentials (plaintext, TLS or mutual
// TLS: tls_credentials.h), the Authenticator (token file, client certificate
// or none: authenticator.h) and the CallGate that every handler passes
// (authentication + --max-tensor-elements: call_gate.h). The metrics listener
// (--metrics-address) and the health-only listener (--health-address) are
// never behind any of this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>

#include "attn/common/status.h"
#include "security/authenticator.h"
#include "security/call_gate.h"

namespace attn::security {

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::shared_ptr<Authenticator> authenticator;
  std::unique_ptr<CallGate> gate;
};

/// What the flags say about securing the listeners (filled from ServerConfig by server/main.cc;
/// empty strings: not given).
struct SecurityOptions {
  std::string tls_cert_file;       ///< --tls-cert (PEM chain); with tls_key_file: TLS
  std::string tls_key_file;        ///< --tls-key
  std::string tls_client_ca_file;  ///< --tls-client-ca: mutual TLS, identities from certificates
  std::string auth_token_file;     ///< --auth-token-file: bearer tokens required
  int64_t max_tensor_elements = 0; ///< --max-tensor-elements (0: unlimited)
  std::string listen_address;      ///< --listen, for the log line and the plaintext warning
  std::string metrics_address;     ///< --metrics-address, for the unauthenticated warning
};

/// Reads and checks the certificate, key, CA and token files. Errors:
/// INVALID_ARGUMENT naming the flag and file (the server then exits 2).
/// Logs the resulting mode.
StatusOr<ServerSecurity> BuildServerSecurity(const SecurityOptions& config);

/// SIGHUP: reloads the token file (token mode); logs the outcome. On error the
/// previous tokens stay in force. Returns the identities that lost their last token (empty on
/// error and in other modes); the caller ends their streams and releases their sequences.
std::vector<std::string> ReloadTokens(Authenticator* authenticator);

}  // namespace attn::security
