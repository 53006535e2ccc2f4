// Server credentials for the gRPC listener: plaintext, TLS, or mutual TLS
// (--tls-cert, --tls-key, --tls-client-ca).
//
// The PEM files are read and checked at start (certificate chain parses, key
// parses and matches the certificate, client CA parses), so a bad file is a
// clear start-up error rather than a failed handshake later. With a client CA,
// clients must present a certificate that chains to it
// (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY); without one,
// TLS authenticates the server only. Files are read once; restart to rotate.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "attn/common/status.h"

namespace attn::security {

struct TlsFiles {
  std::string cert_file;       ///< PEM certificate chain of the server; empty: plaintext
  std::string key_file;        ///< PEM private key of cert_file
  std::string client_ca_file;  ///< PEM CA bundle; non-empty: mutual TLS, client certs required
};

/// Plaintext credentials when every file is empty; TLS otherwise. Errors:
/// INVALID_ARGUMENT naming the flag and file (cert without key or the other
/// way round, client CA without a certificate, unreadable file, not PEM, key
/// that does not match the certificate).
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& files);

/// True when `files` asks for TLS.
inline bool TlsEnabled(const TlsFiles& files) { return !files.cert_file.empty(); }

}  // namespace attn::security
