#include "security/tls_credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

namespace attn::security {
namespace {

StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(std::string(flag) + ": cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return InvalidArgument(std::string(flag) + ": error reading " + path);
  return ss.str();
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM block found";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

/// The first certificate of `pem`, or INVALID_ARGUMENT; *count gets how many parse.
StatusOr<std::shared_ptr<X509>> FirstCertificate(const char* flag, const std::string& path,
                                                 const std::string& pem, int* count) {
  ERR_clear_error();
  BioPtr bio = MemBio(pem);
  std::shared_ptr<X509> first;
  *count = 0;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (!first) first.reset(x, X509_free); else X509_free(x);
    ++*count;
  }
  ERR_clear_error();  // the loop ends on "no start line"
  if (*count == 0) {
    return InvalidArgument(std::string(flag) + ": " + path + " holds no PEM certificate");
  }
  return first;
}

}  // namespace

StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& f) {
  if (f.cert_file.empty() && f.key_file.empty()) {
    if (!f.client_ca_file.empty()) {
      return InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS)");
    }
    return grpc::InsecureServerCredentials();
  }
  if (f.cert_file.empty() || f.key_file.empty()) {
    return InvalidArgument("--tls-cert and --tls-key must be given together");
  }
  auto cert = ReadFile("--tls-cert", f.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadFile("--tls-key", f.key_file);
  if (!key.ok()) return key.status();
  int count = 0;
  auto leaf = FirstCertificate("--tls-cert", f.cert_file, *cert, &count);
  if (!leaf.ok()) return leaf.status();
  ERR_clear_error();
  BioPtr key_bio = MemBio(*key);
  KeyPtr pkey(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (!pkey) {
    return InvalidArgument("--tls-key: " + f.key_file +
                           " holds no unencrypted PEM private key (" + OpenSslError() + ")");
  }
  if (X509_check_private_key(leaf->get(), pkey.get()) != 1) {
    ERR_clear_error();
    return InvalidArgument("--tls-key: " + f.key_file +
                           " does not match the certificate in --tls-cert " + f.cert_file);
  }
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!f.client_ca_file.empty()) {
    auto ca = ReadFile("--tls-client-ca", f.client_ca_file);
    if (!ca.ok()) return ca.status();
    int cas = 0;
    auto first_ca = FirstCertificate("--tls-client-ca", f.client_ca_file, *ca, &cas);
    if (!first_ca.ok()) return first_ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace attn::security
