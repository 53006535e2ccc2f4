// Throwaway certificates for security tests, made with the openssl command line: a CA, a server
// certificate for localhost / 127.0.0.1 signed by it, two client certificates (SAN
// DNS:alice.clients.test and DNS:bob.clients.test) signed by it, and a client certificate signed
// by an unrelated CA. EC P-256 keys, valid one day, written to a fresh temporary directory.
#pragma once

#include <string>

namespace attn::testing {

struct TlsTestCerts {
  std::string dir;
  std::string ca_pem;                          ///< the CA that signed server and clients
  std::string server_pem, server_key;          ///< SAN DNS:localhost, IP:127.0.0.1
  std::string alice_pem, alice_key;            ///< client, SAN DNS:alice.clients.test
  std::string bob_pem, bob_key;                ///< client, SAN DNS:bob.clients.test
  std::string rogue_pem, rogue_key;            ///< client signed by another CA
  std::string error;                           ///< non-empty when generation failed
};

/// Generates the set (takes about a second). Check `error`.
TlsTestCerts MakeTlsTestCerts();

/// The contents of a file ("" when unreadable).
std::string ReadTextFile(const std::string& path);

}  // namespace attn::testing
