#include "tls_test_certs.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace attn::testing {

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TlsTestCerts MakeTlsTestCerts() {
  TlsTestCerts c;
  char tmpl[] = "/tmp/attn-certs-XXXXXX";
  c.dir = mkdtemp(tmpl);
  const std::string d = c.dir;
  // One shell script; every step must succeed (set -e). The log explains a failure.
  const std::string script = R"(set -e
cd ")" + d + R"("
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { key "$1.key"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 1 -subj "/CN=$1"; }
leaf() {  # name ca san
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1"
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 1 \
      -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}
ca ca
ca otherca
leaf server ca "DNS:localhost,IP:127.0.0.1"
leaf alice ca "DNS:alice.clients.test"
leaf bob ca "DNS:bob.clients.test"
leaf rogue otherca "DNS:alice.clients.test"
)";
  {
    std::ofstream(d + "/make.sh") << script;
  }
  const std::string cmd = "bash " + d + "/make.sh > " + d + "/make.log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    c.error = "openssl certificate generation failed: " + ReadTextFile(d + "/make.log");
    return c;
  }
  c.ca_pem = d + "/ca.pem";
  c.server_pem = d + "/server.pem";
  c.server_key = d + "/server.key";
  c.alice_pem = d + "/alice.pem";
  c.alice_key = d + "/alice.key";
  c.bob_pem = d + "/bob.pem";
  c.bob_key = d + "/bob.key";
  c.rogue_pem = d + "/rogue.pem";
  c.rogue_key = d + "/rogue.key";
  return c;
}

}  // namespace attn::testing
