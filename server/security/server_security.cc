#include "security/server_security.h"

#include <spdlog/spdlog.h>

#include "security/tls_credentials.h"

namespace attn::security {
namespace {

// Loopback TCP or a Unix-domain socket: tokens never leave the machine.
bool IsLoopback(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return true;
  const std::string host = address.substr(0, address.rfind(':'));
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]";
}

}  // namespace

StatusOr<ServerSecurity> BuildServerSecurity(const SecurityOptions& config) {
  const TlsFiles files{config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file};
  auto credentials = MakeServerCredentials(files);
  if (!credentials.ok()) return credentials.status();
  auto auth = Authenticator::Create(config.auth_token_file, !config.tls_client_ca_file.empty());
  if (!auth.ok()) return auth.status();
  ServerSecurity s;
  s.credentials = std::move(*credentials);
  s.authenticator = std::shared_ptr<Authenticator>(std::move(*auth));
  s.gate = std::make_unique<CallGate>(s.authenticator, config.max_tensor_elements);
  const char* transport = !TlsEnabled(files)                     ? "plaintext"
                          : config.tls_client_ca_file.empty() ? "TLS"
                                                              : "mutual TLS";
  spdlog::info("security: {} on {}; authentication {}{}", transport, config.listen_address,
               AuthModeName(s.authenticator->mode()),
               s.authenticator->mode() == AuthMode::kToken
                   ? " (" + std::to_string(s.authenticator->tokens()) + " tokens)"
                   : std::string());
  if (s.authenticator->mode() == AuthMode::kToken && !TlsEnabled(files) &&
      !IsLoopback(config.listen_address)) {
    spdlog::warn("bearer tokens travel in plaintext on {}: use --tls-cert/--tls-key",
                 config.listen_address);
  }
  if (s.authenticator->mode() != AuthMode::kNone && !config.metrics_address.empty() &&
      !IsLoopback(config.metrics_address)) {
    spdlog::warn("metrics on {} are served without authentication: keep that port off public "
                 "networks",
                 config.metrics_address);
  }
  return s;
}

std::vector<std::string> ReloadTokens(Authenticator* authenticator) {
  std::vector<std::string> revoked;
  if (authenticator->mode() != AuthMode::kToken) {
    spdlog::info("SIGHUP: no --auth-token-file to reload");
    return revoked;
  }
  if (Status s = authenticator->Reload(&revoked); !s.ok()) {
    spdlog::error("SIGHUP: token file not reloaded, the previous tokens stay: {}", s.ToString());
    return {};
  }
  spdlog::info("SIGHUP: token file reloaded ({} tokens; {} identities revoked)",
               authenticator->tokens(), revoked.size());
  return revoked;
}

}  // namespace attn::security
