// How attention-loadgen connects: plaintext, TLS (--tls / --tls-ca), mutual TLS (--tls-cert,
// --tls-key) and a bearer token (--token-file) sent as "authorization: Bearer <token>" on every
// call by a client interceptor (so it works on plaintext loopback channels too, where gRPC's
// own call credentials would refuse to send it). Mirrors the server's --tls-cert,
// --tls-client-ca and --auth-token-file (README "Security").
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace attn::loadgen {

struct ChannelSecurity {
  bool tls = false;          ///< TLS with the system roots unless ca_file is set
  std::string ca_file;       ///< PEM roots that sign the server certificate (implies tls)
  std::string cert_file;     ///< PEM client certificate (mutual TLS; with key_file)
  std::string key_file;      ///< PEM private key of cert_file
  std::string server_name;   ///< name checked against the server certificate (default: target)
  std::string token_file;    ///< file holding the bearer token (whitespace trimmed)
  // Filled by Load().
  std::string ca_pem, cert_pem, key_pem, token;
};

/// Reads the files named in `s`. Returns "" on success, else an error message naming the flag.
std::string LoadChannelSecurity(ChannelSecurity* s);

/// A channel to `target` with `args`, secured as `s` says (after LoadChannelSecurity).
std::shared_ptr<grpc::Channel> MakeSecureChannel(const std::string& target,
                                                 const ChannelSecurity& s,
                                                 grpc::ChannelArguments args);

}  // namespace attn::loadgen
